"""The corpus graph of GAR: each item's k nearest neighbours by DE vectors.

GAR (graph-based adaptive re-ranking, MacAvaney, Tonellotto and Macdonald, CIKM 2022) follows
the edges of a *corpus graph*: for every item, the ``k`` items most similar to it (k = 16 in the
paper). Here the similarity is the DE's own score, the inner product of item vectors, and the
graph is one int32 array ``(N, k)``: row ``i`` holds ``i``'s neighbours, most similar first,
never ``i`` itself (ties broken by the smaller item index). With fewer than ``k + 1`` items a row
has ``N - 1`` neighbours.

``crossknn build`` writes it into a corpus index as the array :data:`GRAPH_ARRAY` (int64, hashed
like every index array, ``crossknn.index.files``), with ``params["gar_graph"]`` naming k and the
sha256 of the ``de_items`` it was made from (:func:`graph_arrays`); :func:`graph_of_index` reads
it back only while it matches the index's items (an index whose items changed since, by ``add``
or a compaction, gets a graph made anew). A method given only DE vectors builds the graph on
first use and keeps it in memory under the vectors' hash (:func:`graph_for`). Exact search (numpy
blocks) up to :data:`EXACT_MAX_ITEMS` items, FAISS (HNSW over inner products) above.
"""

from __future__ import annotations

import importlib.util
import threading
from collections import OrderedDict

import numpy as np

from crossknn.fileio import sha256_array

__all__ = [
    "DEFAULT_GRAPH_K",
    "EXACT_MAX_ITEMS",
    "GRAPH_ARRAY",
    "check_graph",
    "graph_arrays",
    "graph_for",
    "graph_of_index",
    "knn_graph",
]

GRAPH_ARRAY = "gar_graph"
DEFAULT_GRAPH_K = 16
# exact neighbours below this many items: N^2 d multiply-adds in blocks (10^5 items x 384 dims:
# ~4 * 10^12 flops, minutes on 2 cores); FAISS HNSW above
EXACT_MAX_ITEMS = 100_000
_BLOCK = 1024  # query rows per block of the exact search
_CACHE_MAX = 4  # graphs kept in memory by graph_for (keyed by the vectors' hash and k)
_cache: OrderedDict[tuple[str, int], np.ndarray] = OrderedDict()
_lock = threading.Lock()


def _vectors(vectors) -> np.ndarray:
    V = np.asarray(vectors)
    if V.ndim != 2 or V.shape[0] == 0 or V.shape[1] == 0:
        raise ValueError(f"the corpus graph needs item vectors (N x d); got shape {V.shape}")
    if V.dtype.kind != "f":
        raise ValueError(f"item vectors must be floating point; got dtype {V.dtype}")
    V = np.ascontiguousarray(V, np.float32)
    if not np.isfinite(V).all():
        raise ValueError("item vectors contain NaN or inf; the corpus graph needs finite vectors")
    return V


def _exact(V: np.ndarray, k: int) -> np.ndarray:
    n = V.shape[0]
    out = np.empty((n, k), np.int32)
    for lo in range(0, n, _BLOCK):
        S = V[lo : lo + _BLOCK] @ V.T  # (b, N) inner products
        rows = np.arange(S.shape[0])
        S[rows, lo + rows] = -np.inf  # never the item itself
        # the k largest of each row, ordered by (score desc, item asc)
        part = np.argpartition(-S, k - 1, axis=1)[:, :k]  # k <= N - 1
        cand_s = np.take_along_axis(S, part, axis=1)
        order = np.lexsort((part, -cand_s), axis=1)  # (score desc, item asc)
        out[lo : lo + S.shape[0]] = np.take_along_axis(part, order, axis=1)[:, :k]
        # a tie at the k-th score that argpartition cut: that row again over every tied item
        kth = cand_s.min(axis=1)
        for r in np.flatnonzero((S >= kth[:, None]).sum(axis=1) > k).tolist():
            cand = np.flatnonzero(S[r] >= kth[r])
            out[lo + r] = cand[np.lexsort((cand, -S[r, cand]))[:k]]
    return out


def _faiss(V: np.ndarray, k: int) -> np.ndarray:
    # faiss: optional (the scale extra); only corpora above EXACT_MAX_ITEMS need it
    import faiss

    index = faiss.IndexHNSWFlat(V.shape[1], 32, faiss.METRIC_INNER_PRODUCT)
    index.hnsw.efConstruction = 80
    index.add(V)
    index.hnsw.efSearch = max(64, 4 * k)
    _, ids = index.search(V, k + 1)
    out = np.empty((V.shape[0], k), np.int32)
    for i, row in enumerate(ids):
        row = [j for j in row.tolist() if j >= 0 and j != i][:k]
        if len(row) < k:  # HNSW returned too few: the exact row of this item
            s = V @ V[i]
            s[i] = -np.inf
            row = np.lexsort((np.arange(s.size), -s))[:k].tolist()
        out[i] = row
    return out


def knn_graph(vectors, k: int = DEFAULT_GRAPH_K, *, method: str = "auto") -> np.ndarray:
    """The corpus graph ``(N, min(k, N - 1))`` int32 of ``vectors`` (N x d): each item's
    nearest neighbours by inner product, most similar first, without the item itself.
    ``method``: ``exact`` (numpy blocks), ``faiss`` (HNSW) or ``auto`` (exact up to
    :data:`EXACT_MAX_ITEMS` items)."""
    V = _vectors(vectors)
    if isinstance(k, bool) or int(k) < 1:
        raise ValueError(f"the corpus graph needs k >= 1 neighbours per item; got {k!r}")
    if method not in ("auto", "exact", "faiss"):
        raise ValueError(f"method must be 'auto', 'exact' or 'faiss'; got {method!r}")
    n = V.shape[0]
    k = min(int(k), n - 1)
    if k == 0:
        return np.empty((n, 0), np.int32)
    if method == "faiss" or (method == "auto" and n > EXACT_MAX_ITEMS):
        return _faiss(V, k)
    return _exact(V, k)


def check_graph(graph, n_items: int) -> np.ndarray:
    """``graph`` as a C-contiguous int32 ``(n_items, k)`` array of item indices, refused in one
    line when it is not one."""
    G = np.asarray(graph)
    if G.ndim != 2 or G.shape[0] != n_items:
        raise ValueError(
            f"the corpus graph must have one row per item ({n_items}, k); got shape {G.shape}"
        )
    if G.dtype.kind not in "iu":
        raise ValueError(f"the corpus graph must hold integer item indices; got dtype {G.dtype}")
    if G.size and (int(G.min()) < 0 or int(G.max()) >= n_items):
        raise ValueError(f"the corpus graph has item indices outside [0, {n_items})")
    return np.ascontiguousarray(G, np.int32)


def graph_for(vectors, k: int = DEFAULT_GRAPH_K) -> np.ndarray:
    """The corpus graph of ``vectors``, built on first use and kept in memory under the
    vectors' sha256 and ``k`` (the last few graphs)."""
    V = _vectors(vectors)
    key = (sha256_array(V), int(k))
    with _lock:
        got = _cache.get(key)
        if got is not None:
            _cache.move_to_end(key)
            return got
    G = knn_graph(V, k)
    G.setflags(write=False)
    with _lock:
        _cache[key] = G
        while len(_cache) > _CACHE_MAX:
            _cache.popitem(last=False)
    return G


def _faiss_available() -> bool:
    return importlib.util.find_spec("faiss") is not None


def graph_arrays(vectors, k: int = DEFAULT_GRAPH_K) -> tuple[dict[str, np.ndarray], dict | None]:
    """``({GRAPH_ARRAY: graph int64}, params)`` for a corpus index over ``vectors`` (its
    ``de_items``), or ``({}, None)`` above :data:`EXACT_MAX_ITEMS` items without FAISS (the
    graph is then made at first use)."""
    V = _vectors(vectors)
    if V.shape[0] > EXACT_MAX_ITEMS and not _faiss_available():
        return {}, None
    G = knn_graph(V, k).astype(np.int64)
    params = {
        "k": int(G.shape[1]),
        "similarity": "inner product of de_items",
        "method": "faiss-hnsw" if V.shape[0] > EXACT_MAX_ITEMS else "exact",
        "de_items_sha256": sha256_array(V),
    }
    return {GRAPH_ARRAY: G}, params


def graph_of_index(index, k: int = DEFAULT_GRAPH_K) -> np.ndarray:
    """The corpus graph of a corpus index (``crossknn.corpus_folder.CorpusIndex`` or
    ``crossknn.index.files.Index``): its :data:`GRAPH_ARRAY` when it was made with ``k``
    neighbours from the index's current ``de_items``, else :func:`graph_for` of them."""
    V = np.asarray(index["de_items"], np.float32)
    params = index.params.get("gar_graph") or {}
    G = index.arrays.get(GRAPH_ARRAY)
    n = V.shape[0]
    if (
        G is not None
        and G.shape == (n, min(int(k), n - 1))
        and params.get("de_items_sha256") == sha256_array(V)
    ):
        return check_graph(G, n)
    return graph_for(V, k)
