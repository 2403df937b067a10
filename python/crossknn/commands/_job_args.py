"""Options shared by the commands that run resumable scoring jobs (score-matrix, index)."""

from __future__ import annotations

import argparse


def add_job_arguments(p: argparse.ArgumentParser) -> None:
    """Shards, Ray and progress options of a :class:`crossknn.jobs.ScoreJob`."""
    p.add_argument(
        "--shard-pairs", type=int, default=2048, help="pairs per shard file (default 2048)"
    )
    p.add_argument("--ray", action="store_true", help="score the shards as Ray actors (ray.init())")
    p.add_argument("--ray-address", help="Ray cluster address (default: start or join a local one)")
    p.add_argument("--ray-workers", type=int, help="Ray actors (default: the cluster's CPUs)")
    p.add_argument(
        "--ray-gpus",
        type=float,
        default=0.0,
        help="GPUs each Ray actor reserves (e.g. 1 on a GPU cluster; default 0)",
    )
    p.add_argument("--keep-job", action="store_true", help="keep OUT_DIR/.job after finishing")
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def init_ray(args: argparse.Namespace) -> None:
    """Join the Ray cluster named by ``--ray-address`` (the job starts a local one otherwise)."""
    if args.ray and args.ray_address:
        import ray

        ray.init(address=args.ray_address, include_dashboard=False, log_to_driver=False)
