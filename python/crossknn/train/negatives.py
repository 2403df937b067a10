"""Hard negatives mined with the dual encoder: each query's DE top-N items minus its positives."""

from __future__ import annotations

import numpy as np

from crossknn.topk import topk_by_vectors

__all__ = ["de_top_n", "hard_negatives"]


def de_top_n(de, query_texts: list[str], item_vectors: np.ndarray, n: int) -> np.ndarray:
    """The DE's top ``n`` item indices per query (int64, queries x n), best first."""
    n = min(int(n), item_vectors.shape[0])
    q = de.encode(list(query_texts))
    return topk_by_vectors(q, item_vectors, n)


def hard_negatives(top: np.ndarray, positives: list[np.ndarray], explicit=None) -> list[np.ndarray]:
    """Per query: the explicit negatives first, then its DE top-N minus its positives, in order."""
    out = []
    for r, (row, pos) in enumerate(zip(top, positives, strict=True)):
        mined = row[~np.isin(row, pos)]
        if explicit is not None and len(explicit[r]):
            mined = np.concatenate([explicit[r], mined[~np.isin(mined, explicit[r])]])
        out.append(mined.astype(np.int64))
    return out
