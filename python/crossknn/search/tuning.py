"""Choosing a method's free parameter (anchor/retrieve split, λ) on held-out *train* queries.

The train (anchor) rows are split into index rows and dev rows (``dev_split``); each candidate
value is run on the dev rows with an index built from the index rows only, and the value with the
best mean Top-k-Recall@B wins. Ties (common at small k, where every split finds the top item of
every dev row) are broken by a secondary metric, the mean fraction of the exact top-``2k`` items
(at most B) among all items the search scored, and then toward the later candidate (the grids
are ordered so that later = a larger share of the budget for the index-driven part). Test rows
are never looked at.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from crossknn.scorers import MatrixScorer
from crossknn.topk import exact_top_k, topk_recall

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
    best, best_key = None, (-1.0, -1.0)
    for value in candidates:
        method = make_method(value, index_rows)
        res = method.search(scorer, dev_rows.tolist(), budget=budget, k=k, seed=seed)
        rec = float(topk_recall(scores, dev_rows, res.indices, k).mean())
        table[value] = rec
        key = (
            round(rec, 12),
            round(_candidate_recall(scores, dev_rows, res, min(2 * k, budget)), 12),
        )
        if key >= best_key:  # equal keys: the later candidate wins
            best, best_key = value, key
    return best, table


def _candidate_recall(scores, rows, res, k2: int) -> float:
    """Mean fraction of each row's exact top-``k2`` items among all items the search scored."""
    got = [np.asarray(s, np.int64) for s in res.scored_items]
    if len(got) != len(rows):
        return 0.0
    fr = [
        np.intersect1d(exact_top_k(scores[r], k2), g).size / k2
        for r, g in zip(rows, got, strict=True)
    ]
    return float(np.mean(fr)) if fr else 0.0
