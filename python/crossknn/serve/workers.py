"""``crossknn serve --workers W``: W server processes sharing one port.

One server process runs every request's Python (HTTP, the round loop's callbacks, the result)
under one interpreter lock, and one CE worker thread feeds the device. On a GPU that process,
not the device, is the limit: on an H200 one process answered about 170 B=100 queries/s at
concurrency 32 with its CE worker busy 95% of the time on batches of about 65 pairs, while the
device scores about 60,000 pairs/s (bench/results/gpu_bench.json). ``--workers`` starts W such
processes (uvicorn's multi-process mode: the port is bound once and each worker accepts on it),
each with its own index, models, CE batcher and admission control, all sharing the device.

The configuration reaches the workers through one environment variable (``CROSSKNN_SERVE_WORKER``,
JSON): uvicorn starts a worker by importing :func:`worker_app`. ``/metrics`` and ``/info`` answer
for the worker that took the request: their counters are per process. A worker whose loading
fails stops the whole server.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal

from crossknn.serve.app import create_app, http_protocol
from crossknn.serve.log_format import configure
from crossknn.serve.service import ServeConfig

__all__ = ["ENV", "run_workers", "worker_app"]

ENV = "CROSSKNN_SERVE_WORKER"

log = logging.getLogger("crossknn.serve")


def encode(config: ServeConfig, *, log_level: str) -> str:
    """What a worker process needs, as the JSON of :data:`ENV`."""
    return json.dumps({"config": dataclasses.asdict(config), "log_level": log_level})


def decode(text: str) -> tuple[ServeConfig, str]:
    d = json.loads(text)
    fields = dict(d["config"])
    fields["cors"] = tuple(fields.get("cors") or ())
    return ServeConfig(**fields), d["log_level"]


def worker_app():
    """The app of one worker process (uvicorn's factory): the configuration from :data:`ENV`."""
    text = os.environ.get(ENV)
    if not text:
        raise RuntimeError(f"{ENV} is not set: worker_app runs under `crossknn serve --workers`")
    config, log_level = decode(text)
    configure(log_level)

    def on_load_error(exc: BaseException) -> None:
        log.error("crossknn serve: worker %d: loading failed: %s; stopping", os.getpid(), exc)
        os.kill(os.getppid(), signal.SIGTERM)  # the supervisor stops every worker

    # crossknn serve printed the key file's warning once, before starting the workers
    return create_app(config, on_load_error=on_load_error, warn_key_file=False)


def run_workers(
    config: ServeConfig,
    *,
    host: str,
    port: int,
    workers: int,
    log_level: str,
) -> int:
    """Serve with ``workers`` processes (uvicorn's supervisor) until SIGINT/SIGTERM."""
    # uvicorn (serve extra): only the command that starts a server needs it
    import uvicorn

    os.environ[ENV] = encode(config, log_level=log_level)
    uvicorn.run(
        "crossknn.serve.workers:worker_app",
        factory=True,
        workers=workers,
        host=host,
        port=port,
        log_level=log_level,
        access_log=log_level == "debug",
        http=http_protocol(),  # its 400s to malformed HTTP in the JSON error shape
        server_header=False,
        timeout_graceful_shutdown=int(config.timeout_s) + 5,
        timeout_keep_alive=30,
    )
    return 0
