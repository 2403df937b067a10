"""First-stage retrievers: dual-encoder (DE) vectors, TF-IDF (scikit-learn), BM25 (bm25s).

A *retriever* has ``n_items`` and ``retrieve(queries, k) -> int64 (Q, k)``: the k best items per
query, best first, ties to the lower item index. A query is a row index into the query
vectors/texts the retriever was built with (score-matrix experiments), a text, or (DE only) a
vector. Retrievers are looked up by name in :data:`RETRIEVERS` (``make_retriever``); register
another one (e.g. a CMC first stage) with :func:`register_retriever`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from crossknn.core import ItemFeatures, unpack_allow
from crossknn.topk import top_k_rows

__all__ = [
    "RETRIEVERS",
    "query_masks",
    "Bm25Retriever",
    "DenseRetriever",
    "Retriever",
    "TfidfRetriever",
    "make_retriever",
    "register_retriever",
]


@runtime_checkable
class Retriever(Protocol):
    """``retrieve(queries, k, allow=None)``: ``allow`` None, or one entry per query: a boolean
    array (N,) of the items it may return (None: every item); each query's k best among them."""

    n_items: int

    def retrieve(self, queries: Sequence, k: int, *, allow=None) -> np.ndarray: ...


def query_masks(allow, n_queries: int, n_items: int) -> list[np.ndarray | None]:
    """``allow`` of :meth:`Retriever.retrieve` as a list of Q boolean arrays (N,) or None."""
    if allow is None:
        return [None] * n_queries
    if len(allow) != n_queries:
        raise ValueError(f"allow: {len(allow)} masks for {n_queries} queries")
    out = []
    for q, a in enumerate(allow):
        if a is not None:
            a = np.asarray(a)
            if a.dtype == np.uint64 and a.ndim == 1:  # packed words (the C++ loop's masks)
                a = unpack_allow(a, n_items)
            if a.dtype != np.bool_ or a.shape != (n_items,):
                raise ValueError(
                    f"allow[{q}] must be a boolean array of shape ({n_items},); got {a.dtype} "
                    f"{a.shape}"
                )
        out.append(a)
    return out


def _check_k(k: int, n_items: int) -> int:
    k = int(k)
    if not 0 <= k <= n_items:
        raise ValueError(f"cannot retrieve k={k} items from {n_items}")
    return k


class DenseRetriever:
    """Inner product of query vectors with item vectors (e.g. DE embeddings)."""

    def __init__(self, item_vectors, *, query_vectors=None, encode: Callable | None = None):
        self.features = ItemFeatures(np.asarray(item_vectors, np.float32))
        self.n_items, self.dim = self.features.n_items, self.features.dim
        self.query_vectors = (
            None if query_vectors is None else np.asarray(query_vectors, np.float32)
        )
        if self.query_vectors is not None and self.query_vectors.shape[1:] != (self.dim,):
            raise ValueError(
                f"query vectors must have dim {self.dim} like the items; "
                f"got {self.query_vectors.shape}"
            )
        self.encode = encode

    def __repr__(self) -> str:
        return f"DenseRetriever(n_items={self.n_items}, dim={self.dim})"

    def query_vector(self, query) -> np.ndarray:
        if isinstance(query, (int, np.integer)) and not isinstance(query, bool):
            if self.query_vectors is None:
                raise ValueError("this DenseRetriever has no query vectors; pass texts or vectors")
            return self.query_vectors[int(query)]
        if isinstance(query, str):
            if self.encode is None:
                raise ValueError("this DenseRetriever has no text encoder; pass row ids or vectors")
            return np.asarray(self.encode([query]), np.float32).reshape(self.dim)
        v = np.asarray(query, np.float32)
        if v.shape != (self.dim,):
            raise ValueError(f"query vector must have shape ({self.dim},); got {v.shape}")
        return v

    def query_matrix(self, queries: Sequence) -> np.ndarray:
        """The queries' vectors, float32 C-contiguous (Q, d): what :meth:`retrieve` searches
        with."""
        if len(queries) == 0:
            return np.empty((0, self.dim), np.float32)
        return np.ascontiguousarray(np.stack([self.query_vector(q) for q in queries]), np.float32)

    def loop_first_stage(self, queries: Sequence) -> dict:
        """What the C++ loop needs to take :meth:`retrieve`'s items itself
        (``_core.run_search``'s ``first_features``, ``first_queries``, ``first_vmax``)."""
        return {
            "first_features": self.features._f,
            "first_queries": self.query_matrix(queries),
            "first_vmax": float(self.features._vmax),
        }

    def retrieve(self, queries: Sequence, k: int, *, allow=None) -> np.ndarray:
        k = _check_k(k, self.n_items)
        if len(queries) == 0:
            return np.empty((0, k), np.int64)
        U = np.stack([self.query_vector(q) for q in queries])
        masks = query_masks(allow, len(queries), self.n_items)
        if not k:
            return np.empty((len(queries), 0), np.int64)
        return self.features.top_k(U, k, allow=None if allow is None else masks)[1]


class _TextRetriever:
    def __init__(self, item_texts: Sequence[str], *, query_texts: Sequence[str] | None = None):
        item_texts = list(item_texts)
        if not item_texts:
            raise ValueError("the retriever needs at least one item text")
        bad = [i for i, t in enumerate(item_texts) if not isinstance(t, str)]
        if bad:
            raise ValueError(
                f"items must be strings; got {type(item_texts[bad[0]]).__name__} "
                f"at position {bad[0]}"
            )
        self.n_items = len(item_texts)
        self.query_texts = None if query_texts is None else list(query_texts)

    def query_text(self, query) -> str:
        if isinstance(query, str):
            return query
        if isinstance(query, (int, np.integer)) and not isinstance(query, bool):
            if self.query_texts is None:
                raise ValueError(f"{type(self).__name__} has no query texts; pass texts")
            return self.query_texts[int(query)]
        raise ValueError(f"a query must be a text or a row index; got {type(query).__name__}")

    def scores(self, texts: list[str]) -> np.ndarray:  # (Q, n_items)
        raise NotImplementedError

    def retrieve(self, queries: Sequence, k: int, *, allow=None) -> np.ndarray:
        k = _check_k(k, self.n_items)
        if len(queries) == 0:
            return np.empty((0, k), np.int64)
        S = self.scores([self.query_text(q) for q in queries])
        for q, a in enumerate(query_masks(allow, len(queries), self.n_items)):
            if a is None:
                continue
            if int(a.sum()) < k:
                raise ValueError(f"query {q}: its mask allows {int(a.sum())} items; k={k} asked")
            S[q, ~a] = -np.inf
        return top_k_rows(S, k)


class TfidfRetriever(_TextRetriever):
    """TF-IDF cosine (scikit-learn ``TfidfVectorizer``, English stop words, sublinear tf)."""

    def __init__(self, item_texts, *, query_texts=None):
        super().__init__(item_texts, query_texts=query_texts)
        # scikit-learn: about 0.7 s to import, only this function needs it
        from sklearn.feature_extraction.text import TfidfVectorizer

        self.vectorizer = TfidfVectorizer(stop_words="english", sublinear_tf=True)
        self.X = self.vectorizer.fit_transform(list(item_texts))

    def __repr__(self) -> str:
        return f"TfidfRetriever(n_items={self.n_items}, vocab={len(self.vectorizer.vocabulary_)})"

    def scores(self, texts):
        return (self.vectorizer.transform(texts) @ self.X.T).toarray()


class Bm25Retriever(_TextRetriever):
    """BM25 (bm25s, Lucene variant, English stop words)."""

    def __init__(self, item_texts, *, query_texts=None, k1: float = 1.5, b: float = 0.75):
        super().__init__(item_texts, query_texts=query_texts)
        # bm25s: slow to import, only the BM25 retriever needs it
        import bm25s

        self._bm25s = bm25s
        tokens = bm25s.tokenize(list(item_texts), stopwords="en", show_progress=False)
        self.model = bm25s.BM25(k1=k1, b=b)
        self.model.index(tokens, show_progress=False)

    def __repr__(self) -> str:
        return f"Bm25Retriever(n_items={self.n_items})"

    def scores(self, texts):
        out = np.zeros((len(texts), self.n_items), np.float64)
        for r, t in enumerate(texts):
            toks = self._bm25s.tokenize([t], stopwords="en", return_ids=False, show_progress=False)
            words = [w for w in toks[0] if w in self.model.vocab_dict]
            if words:
                out[r] = self.model.get_scores(words)
        return out


def _dense(*, item_vectors=None, query_vectors=None, encode=None, **_: Any) -> DenseRetriever:
    if item_vectors is None:
        raise ValueError("the 'de' retriever needs item vectors (e.g. de_items.npy)")
    return DenseRetriever(item_vectors, query_vectors=query_vectors, encode=encode)


def _tfidf(*, item_texts=None, query_texts=None, **_: Any) -> TfidfRetriever:
    if item_texts is None:
        raise ValueError("the 'tfidf' retriever needs item texts (a corpus folder)")
    return TfidfRetriever(item_texts, query_texts=query_texts)


def _bm25(*, item_texts=None, query_texts=None, **_: Any) -> Bm25Retriever:
    if item_texts is None:
        raise ValueError("the 'bm25' retriever needs item texts (a corpus folder)")
    return Bm25Retriever(item_texts, query_texts=query_texts)


#: name -> factory(**resources) -> Retriever. Resources: item_vectors, query_vectors, encode,
#: item_texts, query_texts (each factory takes what it needs and ignores the rest).
RETRIEVERS: dict[str, Callable[..., Retriever]] = {"de": _dense, "tfidf": _tfidf, "bm25": _bm25}


def register_retriever(name: str, factory: Callable[..., Retriever]) -> None:
    RETRIEVERS[name] = factory


def make_retriever(name: str, **resources) -> Retriever:
    if name not in RETRIEVERS:
        raise ValueError(f"unknown retriever {name!r}; expected one of {sorted(RETRIEVERS)}")
    return RETRIEVERS[name](**resources)
