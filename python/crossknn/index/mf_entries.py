"""Which entries of the sparse CE matrix G the AXN index buys (its CE calls offline).

``k_d`` items per train query (``per="query"``) or ``k_d`` train queries per item
(``per="item"``), chosen as the top-``k_d`` by a cheap retriever (DE or TF-IDF vectors) or
uniformly at random. G costs ``len(G)`` CE calls.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from crossknn.topk import topk_by_vectors

__all__ = ["sample_g", "tfidf_vectors"]


def tfidf_vectors(query_texts: Sequence[str], item_texts: Sequence[str]):
    """TF-IDF vectors (scipy sparse, L2-normalized rows), fit on the items."""
    # scikit-learn: about 0.7 s to import, only this function needs it
    from sklearn.feature_extraction.text import TfidfVectorizer

    vec = TfidfVectorizer(sublinear_tf=True, dtype=np.float32)
    items = vec.fit_transform(list(item_texts))
    return vec.transform(list(query_texts)), items


def sample_g(
    n_train: int,
    n_items: int,
    k_d: int,
    *,
    per: str = "query",
    strategy: str = "topk",
    vectors=None,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """The observed entries of G as ``(query_pos, items)`` int64 arrays, sorted by query then item.

    ``per="query"``: k_d items per train query; ``per="item"``: k_d train queries per item.
    ``strategy="topk"`` ranks by ``vectors = (query_vectors, item_vectors)`` (DE or TF-IDF; dense
    or scipy sparse); ``strategy="uniform"`` draws uniformly with ``seed``.
    """
    if per not in ("query", "item"):
        raise ValueError(f"per must be 'query' or 'item'; got {per!r}")
    if strategy not in ("topk", "uniform"):
        raise ValueError(f"strategy must be 'topk' or 'uniform'; got {strategy!r}")
    n_from, n_to = (n_train, n_items) if per == "query" else (n_items, n_train)
    if not 1 <= k_d <= n_to:
        other = "items" if per == "query" else "train queries"
        raise ValueError(f"k_d must be in [1, {n_to}] ({other} available); got {k_d}")
    if strategy == "topk":
        if vectors is None or len(vectors) != 2:
            raise ValueError("strategy='topk' needs vectors=(query_vectors, item_vectors)")
        qv, iv = vectors
        if qv.shape[0] != n_train or iv.shape[0] != n_items or qv.shape[1] != iv.shape[1]:
            raise ValueError(
                f"vectors: expected shapes ({n_train}, d) and ({n_items}, d); "
                f"got {qv.shape} and {iv.shape}"
            )
        A, B = (qv, iv) if per == "query" else (iv, qv)
        chosen = topk_by_vectors(A, B, k_d)
    else:
        rng = np.random.default_rng(seed)
        chosen = np.stack([rng.choice(n_to, size=k_d, replace=False) for _ in range(n_from)])
    src = np.repeat(np.arange(n_from, dtype=np.int64), k_d)
    dst = chosen.astype(np.int64).ravel()
    qpos, items = (src, dst) if per == "query" else (dst, src)
    order = np.lexsort((items, qpos))
    return qpos[order], items[order]
