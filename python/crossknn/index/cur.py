"""Dense CUR index for ANNCUR/ADACUR: exact CE scores R of k_q anchor queries x all items."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from crossknn.identity import model_identity
from crossknn.index.files import Index, load_index, save_index
from crossknn.index.job_folder import JobFolder
from crossknn.jobs import DensePairs, JobOptions, ScoreJob

__all__ = ["build_cur_index", "score_dense"]


def score_dense(
    scorer: Any,
    queries: Sequence,
    job_dir: str | os.PathLike,
    *,
    options: JobOptions | None = None,
    extra: dict | None = None,
) -> tuple[np.ndarray, dict]:
    """Exact scores of ``queries`` x all ``scorer.n_items`` items via a resumable sharded job
    -> (float32 (len(queries), n_items), run stats)."""
    options = options or JobOptions()
    n_items = int(scorer.n_items)
    job = ScoreJob(
        job_dir,
        scorer,
        queries,
        DensePairs(len(queries), n_items),
        shard_pairs=options.shard_pairs,
        extra=extra,
    )
    stats = options.run(job)
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
    options: JobOptions | None = None,
    info: dict | None = None,
) -> Index:
    """Score R = CE(anchor queries, all items) and save a ``kind="cur"`` index with array ``R``.

    ``ce`` (model identity; defaults to the scorer's own ``model_id``/``model_hash``) and ``de``
    are recorded so search can refuse an index built with another model. The job state lives in
    ``job_dir`` (default ``OUT_DIR/.job``, removed once the index is saved unless
    ``options.keep_job``) so an interrupted build resumes.
    """
    out_dir = Path(out_dir)
    if len(queries) == 0:
        raise ValueError("build_cur_index needs at least one anchor query")
    options = options or JobOptions()
    folder = JobFolder(out_dir, job_dir, keep=options.keep_job)
    # the CE identity is part of the job, so a rerun with another model never reuses its shards
    R, _ = score_dense(
        scorer,
        queries,
        folder.path,
        options=options,
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
    folder.done()  # the shards are now in R.npy
    return load_index(out_dir, kind="cur")
