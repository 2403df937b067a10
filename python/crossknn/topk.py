"""Top-k and recall: the one home of "the k best" in Python.

Every ranking here is best first with ties broken toward the lower index, the same rule as the C++
streaming top-k (``crossknn.core.ItemFeatures.top_k``), so results agree wherever both are used.

- :func:`top_k_rows` — the k largest entries of each row of a score array;
- :func:`exact_top_k` — the exact top-k items of one CE score row (``k`` may exceed the row);
- :func:`topk_by_vectors` — the top-k rows of ``B`` by inner product with each row of ``A`` (dense
  or scipy-sparse), over blocks of ``B`` (no full score matrix);
- :func:`topk_recall` — Top-k-Recall (``shared/BENCHMARKS.md``) of returned items per query.
"""

from __future__ import annotations

import numpy as np

__all__ = ["exact_top_k", "top_k_rows", "topk_by_vectors", "topk_recall"]


def top_k_rows(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest entries of each row, best first, ties to the lower index."""
    scores = np.atleast_2d(np.asarray(scores, np.float64))
    n = scores.shape[1]
    if not 0 <= k <= n:
        raise ValueError(f"k={k} must be between 0 and the number of items ({n})")
    out = np.empty((scores.shape[0], k), np.int64)
    for r, s in enumerate(scores):
        if k == 0:
            continue
        thr = np.partition(s, n - k)[n - k]  # k-th largest value
        above = np.flatnonzero(s > thr)
        tied = np.flatnonzero(s == thr)[: k - above.size]
        cand = np.concatenate([above, tied])
        out[r] = cand[np.lexsort((cand, -s[cand]))]
    return out


def _dense_block(A, B) -> np.ndarray:
    """A @ B.T for dense or scipy-sparse A, B, as a dense float32 array."""
    S = A @ B.T
    if hasattr(S, "toarray"):
        S = S.toarray()
    return np.asarray(S, dtype=np.float32)


def topk_by_vectors(A, B, k: int, *, block: int = 65536) -> np.ndarray:
    """For every row a of A, the indices of the k rows of B with the largest a . b
    (ties to the lower index), computed over blocks of B -> int64 (len(A), k)."""
    n_b = B.shape[0]
    if not 1 <= k <= n_b:
        raise ValueError(f"k must be in [1, {n_b}] (rows of B); got {k}")
    n_a = A.shape[0]
    best_s = np.full((n_a, 0), -np.inf, np.float32)
    best_i = np.empty((n_a, 0), np.int64)
    for s in range(0, n_b, block):
        e = min(s + block, n_b)
        sc = np.concatenate([best_s, _dense_block(A, B[s:e])], axis=1)
        ix = np.concatenate(
            [best_i, np.broadcast_to(np.arange(s, e, dtype=np.int64), (n_a, e - s))], axis=1
        )
        if sc.shape[1] > k:
            part = np.argpartition(-sc, k - 1, axis=1)[:, :k]
            # argpartition breaks ties arbitrarily: redo the boundary with a stable sort
            kth = np.take_along_axis(sc, part, 1).min(axis=1, keepdims=True)
            cand = sc >= kth
            order = np.lexsort((ix, -np.where(cand, sc, -np.inf)), axis=1)[:, :k]
            sc, ix = np.take_along_axis(sc, order, 1), np.take_along_axis(ix, order, 1)
        best_s, best_i = sc, ix
    order = np.lexsort((best_i, -best_s), axis=1)
    return np.take_along_axis(best_i, order, 1)


def exact_top_k(scores_row, k: int) -> np.ndarray:
    """The exact top-k item indices of one score row (at most the row's length)."""
    s = np.asarray(scores_row, np.float64).ravel()
    return top_k_rows(s, min(int(k), s.size))[0]


def topk_recall(scores, rows, indices, k: int) -> np.ndarray:
    """Top-k-Recall per query: |exact top-k ∩ returned top-k| / k (BENCHMARKS.md). ``scores``:
    the exact score matrix; ``rows``: the query rows; ``indices[j]``: items returned for row
    ``rows[j]`` (``-1`` padding ignored)."""
    out = np.empty(len(rows), np.float64)
    for j, r in enumerate(rows):
        exact = exact_top_k(scores[r], k)
        got = np.asarray(indices[j][:k])
        out[j] = np.intersect1d(exact, got[got >= 0]).size / k
    return out
