"""Hard negatives mined with the dual encoder: each query's DE top-N items minus its positives.

The DE vectors of a corpus are cached (``<cache>/de-items/``, keyed by the DE's hash and the
texts' hash): training again on the same corpus, or benchmarking it, encodes it once.
"""

from __future__ import annotations

import numpy as np

from crossknn.ce.cache import cache_root
from crossknn.fileio import atomic_save_npy, sha256_texts
from crossknn.topk import topk_by_vectors

__all__ = ["item_vectors", "de_top_n", "hard_negatives"]


def item_vectors(de, texts: list[str], cache_dir=None) -> np.ndarray:
    """``de.encode(texts)``, cached on disk."""
    key = f"{de.model_hash[:16]}-{de.max_length}-{sha256_texts(texts)[:16]}"
    path = cache_root(cache_dir) / "de-items" / f"{key}.npy"
    if path.is_file():
        vecs = np.load(path)
        if vecs.shape == (len(texts), de.dim):
            return vecs
    vecs = de.encode(list(texts), show_progress_bar=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_save_npy(path, vecs)
    return vecs


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
