"""Dense CUR index for ANNCUR/ADACUR: exact CE scores R of k_q anchor queries x all items."""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from crossknn.index.files import Index, model_identity, save_index
from crossknn.jobs import DensePairs, ScoreJob

__all__ = ["build_cur_index", "score_dense"]


def score_dense(
    scorer: Any,
    queries: Sequence,
    job_dir: str | os.PathLike,
    *,
    shard_pairs: int = 4096,
    backend: str = "local",
    progress: bool = True,
    ray_workers: int | None = None,
    ray_gpus_per_worker: float = 0.0,
    extra: dict | None = None,
) -> tuple[np.ndarray, dict]:
    """Exact scores of ``queries`` x all ``scorer.n_items`` items via a resumable sharded job
    -> (float32 (len(queries), n_items), run stats)."""
    n_items = int(scorer.n_items)
    job = ScoreJob(
        job_dir,
        scorer,
        queries,
        DensePairs(len(queries), n_items),
        shard_pairs=shard_pairs,
        extra=extra,
    )
    stats = job.run(
        backend=backend,
        progress=progress,
        ray_workers=ray_workers,
        ray_gpus_per_worker=ray_gpus_per_worker,
    )
    return job.result().reshape(len(queries), n_items), stats


def build_cur_index(
    out_dir: str | os.PathLike,
    scorer: Any,
    queries: Sequence,
    *,
    query_ids: Sequence[str] | None = None,
    ce: Any = None,
    de: Any = None,
    job_dir: str | os.PathLike | None = None,
    shard_pairs: int = 4096,
    backend: str = "local",
    progress: bool = True,
    ray_workers: int | None = None,
    ray_gpus_per_worker: float = 0.0,
    info: dict | None = None,
    keep_job: bool = False,
) -> Index:
    """Score R = CE(anchor queries, all items) and save a ``kind="cur"`` index with array ``R``.

    ``ce`` (model identity; defaults to the scorer's own ``model_id``/``model_hash``) and ``de``
    are recorded so search can refuse an index built with another model. The job state lives in
    ``job_dir`` (default ``OUT_DIR/.job``, removed once the index is saved unless ``keep_job``)
    so an interrupted build resumes.
    """
    out_dir = Path(out_dir)
    if len(queries) == 0:
        raise ValueError("build_cur_index needs at least one anchor query")
    own_job = job_dir is None
    job_dir = Path(job_dir) if job_dir is not None else out_dir / ".job"
    # the CE identity is part of the job, so a rerun with another model never reuses its shards
    R, _ = score_dense(
        scorer,
        queries,
        job_dir,
        shard_pairs=shard_pairs,
        backend=backend,
        progress=progress,
        ray_workers=ray_workers,
        ray_gpus_per_worker=ray_gpus_per_worker,
        extra={"ce": model_identity(ce if ce is not None else scorer)},
    )
    ids = [str(q) for q in (query_ids if query_ids is not None else queries)]
    params = {"n_anchor_queries": int(R.shape[0]), "n_items": int(R.shape[1])}
    doc_info = {"anchor_query_ids": ids, **(info or {})}
    save_index(
        out_dir,
        "cur",
        {"R": R},
        ce=ce if ce is not None else scorer,
        de=de,
        params=params,
        ce_calls=int(R.size),
        info=doc_info,
    )
    if own_job and not keep_job:
        shutil.rmtree(job_dir)  # the shards are now in R.npy
    from crossknn.index.files import load_index

    return load_index(out_dir, kind="cur")
