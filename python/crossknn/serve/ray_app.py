"""``crossknn serve INDEX --ray --replicas R``: the same FastAPI app as a Ray Serve deployment.

Each replica is a Ray actor (its own process) that builds the app with its own models, index
and CE batcher (cross-request batching happens inside a replica); Ray Serve's HTTP proxy spreads
requests over the replicas. Needs ``pip install 'ray[serve]'``.

The CE threads of a replica default to ``cores // R`` (at least 1), so R replicas on one machine
do not oversubscribe it; pass ``--threads`` to choose.
"""

from __future__ import annotations

import os
import signal
import threading
from dataclasses import replace

import crossknn
from crossknn.serve.app import create_app
from crossknn.serve.service import ServeConfig

__all__ = ["deployment", "run_ray"]


def deployment(config: ServeConfig, *, replicas: int = 1, name: str = "crossknn"):
    """A bound Ray Serve application: ``replicas`` copies of the app of ``config``."""
    # ray: optional (ray extra), slow to import
    from ray import serve

    if replicas < 1:
        raise ValueError(f"--replicas must be >= 1; got {replicas}")
    if config.threads is None:
        config = replace(config, threads=max(1, (os.cpu_count() or 1) // replicas))

    def build_app():  # runs on each replica

        return create_app(config, load="now")

    ingress = serve.ingress(build_app)(type("CrossknnReplica", (), {}))
    dep = serve.deployment(
        ingress,
        name=name,
        num_replicas=replicas,
        # admission (429) is the app's own; let Ray pass enough requests to each replica
        max_ongoing_requests=config.max_queue + 8,
        ray_actor_options={"num_cpus": 0},
    )
    return dep.bind()


def run_ray(
    config: ServeConfig,
    *,
    host: str = "127.0.0.1",
    port: int = 8080,
    replicas: int = 1,
    address: str | None = None,
) -> int:
    """Start (or join) Ray, deploy, serve until SIGTERM/SIGINT, then shut the deployment down."""
    try:
        # ray: optional (ray extra), slow to import
        import ray
        from ray import serve
    except ModuleNotFoundError as exc:
        raise ValueError(
            f"--ray needs Ray Serve ({exc.name} is missing): pip install 'ray[serve]'"
        ) from None

    crossknn.open_index(config.index)  # a wrong path is one clear line, before Ray starts
    config = replace(config, index=os.path.abspath(config.index))
    # "local": a new cluster of our own, never one another program started on this machine
    ray.init(address=address or "local", include_dashboard=False, log_to_driver=False)
    try:
        serve.start(http_options={"host": host, "port": port})
        serve.run(deployment(config, replicas=replicas), name="crossknn", route_prefix="/")
        print(
            f"crossknn serve: {replicas} Ray Serve replica(s) on http://{host}:{port}", flush=True
        )
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        stop.wait()
    finally:
        try:
            serve.shutdown()
        finally:
            ray.shutdown()
    return 0
