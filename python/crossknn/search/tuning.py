"""Choosing a method's free parameter (anchor/retrieve split, λ) on held-out *train* queries.

The train (anchor) rows are split into index rows and dev rows (``dev_split``); each candidate
value is run on the dev rows with an index built from the index rows only, and the value with the
best mean Top-k-Recall@B wins (ties to the earlier candidate). Test rows are never looked at.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from crossknn.scorers import MatrixScorer
from crossknn.topk import topk_recall

__all__ = ["choose_on_dev", "dev_split"]


def dev_split(train_rows, *, fraction: float = 0.2, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(index_rows, dev_rows): a seeded random ``fraction`` of the train rows held out as dev."""
    rows = np.asarray(train_rows, np.int64).ravel()
    if rows.size < 2:
        raise ValueError(f"need >= 2 train rows to hold some out as dev; got {rows.size}")
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"dev fraction must be in (0, 1); got {fraction}")
    n_dev = int(min(rows.size - 1, max(1, round(fraction * rows.size))))
    perm = np.random.default_rng([int(seed), 0xDE5]).permutation(rows.size)
    return np.sort(rows[perm[n_dev:]]), np.sort(rows[perm[:n_dev]])


def choose_on_dev(
    make_method: Callable[[object, np.ndarray], object],
    candidates: Sequence,
    scores,
    train_rows,
    *,
    budget: int,
    k: int,
    seed: int = 0,
    dev_fraction: float = 0.2,
) -> tuple[object, dict]:
    """Best candidate value by dev recall.

    ``make_method(value, index_rows)`` builds the method with an index made from ``index_rows``
    only. Returns ``(best_value, {value: dev_recall})``.
    """
    if not candidates:
        raise ValueError("no candidate values to choose from")
    scores = np.asarray(scores)
    index_rows, dev_rows = dev_split(train_rows, fraction=dev_fraction, seed=seed)
    scorer = MatrixScorer(scores)
    table: dict = {}
    best, best_recall = None, -1.0
    for value in candidates:
        method = make_method(value, index_rows)
        res = method.search(scorer, dev_rows.tolist(), budget=budget, k=k, seed=seed)
        rec = float(topk_recall(scores, dev_rows, res.indices, k).mean())
        table[value] = rec
        if rec > best_recall + 1e-12:
            best, best_recall = value, rec
    return best, table
