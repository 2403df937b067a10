"""The AXN paper's index: score the sparse CE matrix G, factorize it, save a ``kind="mf"`` index.

Which entries G holds: :mod:`crossknn.index.mf_entries`; the factorization:
:mod:`crossknn.index.mf_fit`. At search time the index gives AXN its item embeddings
(``items``), the prior query embeddings of new queries (:func:`query_embeddings`) and the CE
score map (:func:`mf_score_map`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from crossknn.identity import model_identity
from crossknn.index.files import load_index, save_index
from crossknn.index.job_folder import JobFolder
from crossknn.index.mf_entries import sample_g
from crossknn.index.mf_fit import fit_mf, gated_mlp_numpy
from crossknn.jobs import JobOptions, ScoreJob, SparsePairs
from crossknn.score_map import ScoreMap

__all__ = ["build_mf_index", "mf_score_map", "query_embeddings"]


def build_mf_index(
    out_dir,
    scorer,
    queries: Sequence,
    *,
    de_queries: np.ndarray,
    de_items: np.ndarray,
    k_d: int,
    per: str = "query",
    strategy: str = "topk",
    vectors=None,
    mode: str = "transductive",
    epochs: int = 20,
    lr: float = 0.005,
    batch_size: int = 1024,
    weight_decay: float = 0.0,
    normalize: bool = False,
    seed: int = 0,
    ce=None,
    de=None,
    query_ids: Sequence[str] | None = None,
    job_dir=None,
    options: JobOptions | None = None,
    info: dict | None = None,
):
    """Choose G, score it with ``scorer`` (resumable sharded job), fit MF, save a ``kind="mf"``
    index. ``queries`` are the train queries (scorer query objects) aligned with ``de_queries``;
    ``vectors`` ranks for ``strategy="topk"`` (default: the DE vectors).
    Returns ``(Index, MFResult)``."""
    out_dir = Path(out_dir)
    n_train, n_items = len(queries), int(scorer.n_items)
    if de_queries.shape[0] != n_train or de_items.shape[0] != n_items:
        raise ValueError(
            f"de_queries must have one row per train query ({n_train}) and de_items one per item "
            f"({n_items}); got {de_queries.shape} and {de_items.shape}"
        )
    if strategy == "topk" and vectors is None:
        vectors = (de_queries, de_items)
    qpos, items = sample_g(
        n_train, n_items, k_d, per=per, strategy=strategy, vectors=vectors, seed=seed
    )
    options = options or JobOptions()
    folder = JobFolder(out_dir, job_dir, keep=options.keep_job)
    job = ScoreJob(
        folder.path,
        scorer,
        queries,
        SparsePairs(qpos, items),
        shard_pairs=options.shard_pairs,
        extra={"ce": model_identity(ce if ce is not None else scorer)},
    )
    options.run(job, desc="scoring G")
    g = job.result()
    res = fit_mf(
        qpos,
        items,
        g,
        de_queries=de_queries,
        de_items=de_items,
        mode=mode,
        epochs=epochs,
        lr=lr,
        batch_size=batch_size,
        weight_decay=weight_decay,
        normalize=normalize,
        seed=seed,
        progress=options.progress,
    )
    arrays = {
        "items": res.item_embeddings,
        "train_queries": res.query_embeddings,
        "g_query_pos": qpos,
        "g_items": items,
        "g_scores": g,
        **res.mlp,
    }
    params = {
        **res.params,
        "k_d": int(k_d),
        "per": per,
        "strategy": strategy,
        "n_train": n_train,
        "n_items": n_items,
        "dim": int(res.item_embeddings.shape[1]),
        "score_map": None if res.score_map is None else res.score_map.to_list(),
    }
    ids = [str(q) for q in (query_ids if query_ids is not None else queries)]
    doc_info = {
        "loss_curve": [float(x) for x in res.loss_curve],
        "fit_seconds": round(res.seconds, 3),
        "train_query_ids": ids,
        **(info or {}),
    }
    save_index(
        out_dir,
        "mf",
        arrays,
        ce=ce if ce is not None else scorer,
        de=de,
        params=params,
        ce_calls=int(g.size),
        info=doc_info,
    )
    folder.done()  # G is now in g_scores.npy
    return load_index(out_dir, kind="mf"), res


def query_embeddings(index, de_queries: np.ndarray) -> np.ndarray:
    """Prior embeddings for (test) queries from their DE vectors: the inductive query MLP of an
    MF index, or the DE vectors themselves for a transductive one (its embedding space)."""
    if index.params.get("mode") == "inductive":
        a = index.arrays
        return gated_mlp_numpy(
            de_queries, a["q_W1"], a["q_b1"], a["q_W2"], a["q_b2"], a["q_w_skip"]
        )
    return np.asarray(de_queries, np.float32)


def mf_score_map(index) -> ScoreMap | None:
    """The CE score map an MF index was fitted with (``None`` without normalization)."""
    return ScoreMap.from_params(index.params, what=f"MF index {index.path}")
