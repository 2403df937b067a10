"""Searching a corpus index with the CE on a budget of CE calls per query.

Three lines from Python::

    index = crossknn.open_index("INDEX_DIR")
    searcher = crossknn.Searcher(index)
    hits = searcher.search("how do I parse a date?", k=10, budget=100)

The index comes from :func:`crossknn.corpus_index.build_corpus_index`; the methods from
:func:`crossknn.search.make_method`; the exact ground truth of ``exact=True`` from
:mod:`crossknn.exact_cache`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from crossknn.corpus_index import CorpusIndex, open_index
from crossknn.exact_cache import ExactScores
from crossknn.retrievers import DenseRetriever
from crossknn.score_map import ScoreMap
from crossknn.scorers import TimedScorer
from crossknn.search import DEFAULT_MIX, CurIndex, make_method

__all__ = ["METHODS", "Hits", "Searcher"]

#: the methods a corpus index can serve (ADACUR/ANNCUR need its CUR rows)
METHODS = ("auto", "axn", "rnr", "adacur", "anncur")


@dataclass
class Hits:
    """One query's result: the top-k item ids with exact CE scores, and what it cost."""

    query: str
    ids: list[str]
    indices: np.ndarray
    scores: np.ndarray
    ce_calls: int
    seconds_ce: float
    seconds_other: float
    exact_ids: list[str] | None = None
    recall: float | None = None
    texts: list[str] = field(default_factory=list, repr=False)

    def to_dict(self) -> dict[str, Any]:
        out = {
            "query": self.query,
            "results": [
                {"id": i, "score": float(s)} for i, s in zip(self.ids, self.scores, strict=False)
            ],
            "ce_calls": int(self.ce_calls),
            "seconds_ce": round(self.seconds_ce, 4),
            "seconds_other": round(self.seconds_other, 4),
        }
        if self.exact_ids is not None:
            out["exact_ids"] = self.exact_ids
            out["recall"] = self.recall
        return out


class _QueryVectors:
    """DE query vectors by text, encoded once per text (the first stage and AXN's prior)."""

    def __init__(self, de) -> None:
        self.de = de
        self.cache: dict[str, np.ndarray] = {}

    def prefetch(self, texts: Sequence[str]) -> None:
        todo = [t for t in dict.fromkeys(texts) if t not in self.cache]
        if todo:
            for t, v in zip(todo, np.asarray(self.de.encode(todo), np.float32), strict=False):
                self.cache[t] = v

    def __call__(self, text: str) -> np.ndarray:
        self.prefetch([text])
        return self.cache[text]

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        self.prefetch(texts)
        return np.stack([self.cache[t] for t in texts])


class Searcher:
    """Searches a corpus index with the CE on a budget of CE calls per query.

    ``ce``/``de`` default to the embedded models; an index built with other models is refused.
    ``method``: ``auto`` (the default when the index was built with ``index_calls``), ``axn``
    (the default otherwise: rounds over the DE item vectors, DE first round, least squares
    mixed with the DE query vector), ``rnr`` (rerank the DE top-B), ``adacur``/``anncur`` (need
    an index built with train queries and ``cur=True``). ``cmc_model``: a CMC model directory
    (``crossknn cmc export``) trained on this DE; the first round then takes the DE's top
    ``cmc_candidates`` reranked by CMC instead of the DE's top items.
    """

    def __init__(
        self,
        index: CorpusIndex | str | os.PathLike,
        *,
        ce=None,
        de=None,
        method: str | None = None,
        rounds: int = 5,
        mix: float = DEFAULT_MIX,
        precision: str = "fp32",
        threads: int | None = None,
        cmc_model: str | os.PathLike | None = None,
        cmc_candidates: int = 512,
    ) -> None:
        from crossknn.ce import default_cross_encoder, default_dual_encoder

        if not isinstance(index, CorpusIndex):
            index = open_index(index)
        self.index = index
        self.corpus = index.corpus
        self.de = (
            de if de is not None else default_dual_encoder(precision=precision, threads=threads)
        )
        self.ce = (
            ce if ce is not None else default_cross_encoder(precision=precision, threads=threads)
        )
        index.check_models(ce=self.ce, de=self.de)
        method = method or ("auto" if "auto" in index.params else "axn")  # the default method
        self._check_method(method)
        self.method, self.rounds, self.mix = method, int(rounds), float(mix)
        self.ce.set_items(list(self.corpus.texts))
        self.V = np.ascontiguousarray(index["de_items"], np.float32)
        self.qvec = _QueryVectors(self.de)
        self._methods: dict[tuple, Any] = {}
        self.first = self._first_stage(cmc_model, cmc_candidates)

    def _first_stage(self, cmc_model, cmc_candidates: int):
        if cmc_model is None:
            return DenseRetriever(self.V, encode=self.qvec.encode)
        from crossknn.cmc import CmcRetriever

        de_id = (self.index.index.models.get("de") or {}).get("model_id")
        return CmcRetriever(
            cmc_model,
            self.V,
            encode=self.qvec.encode,
            candidates=min(int(cmc_candidates), self.n_items),
            encoder_id=de_id,
        )

    def __repr__(self) -> str:
        return (
            f"Searcher(n_items={len(self.corpus)}, method={self.method!r}, "
            f"rounds={self.rounds}, ce={getattr(self.ce, 'model_id', '?')!r})"
        )

    @property
    def n_items(self) -> int:
        return len(self.corpus)

    def _check_method(self, method: str) -> None:
        if method not in METHODS:
            raise ValueError(f"unknown method {method!r}; expected one of {METHODS}")
        if method in ("adacur", "anncur") and "R" not in self.index.arrays:
            raise ValueError(
                f"method {method!r} needs a CUR index (CE scores of train queries x all items); "
                "rebuild with: crossknn build CORPUS INDEX_DIR --train-queries FILE --cur"
            )
        if method == "auto" and "auto" not in self.index.params:
            raise ValueError(
                "method 'auto' needs an auto index; rebuild with: crossknn build CORPUS "
                "INDEX_DIR --index-calls C"
            )

    def _make(self, method: str, rounds: int):
        key = (method, rounds)
        if key not in self._methods:
            cur = auto = None
            if method == "auto":  # its rounds come from the index (chosen on train queries)
                from crossknn.index.auto import auto_index_of

                auto = auto_index_of(self.index)
            if method in ("adacur", "anncur"):
                cur = CurIndex(np.asarray(self.index["R"], np.float32))
            self._methods[key] = make_method(
                method,
                first=self.first,
                rounds=rounds,
                cur=cur,
                item_vectors=self.V,
                prior=self.qvec,
                mix=self.mix,
                score_map=ScoreMap.from_params(self.index.params, what=f"index {self.index.path}"),
                n_items=self.n_items,
                auto_index=auto,
            )
        return self._methods[key]

    def search(
        self,
        queries: str | Sequence[str],
        *,
        k: int = 10,
        budget: int = 100,
        method: str | None = None,
        rounds: int | None = None,
        seed: int = 0,
        exact: bool = False,
        exact_cache: str | os.PathLike | None = None,
        progress: bool = False,
    ) -> list[Hits]:
        """Top-k items by exact CE score for each query, spending at most ``budget`` CE calls
        each. All queries are searched together (one CE batch per round). ``exact=True`` also
        scores every item for each query (N CE calls each, not counted in ``ce_calls``) and
        reports Top-k-Recall@budget."""
        single = isinstance(queries, str)
        qs = [queries] if single else list(queries)
        bad = [i for i, q in enumerate(qs) if not isinstance(q, str) or not q.strip()]
        if bad:
            raise ValueError(f"queries must be non-empty strings; query {bad[0]} is {qs[bad[0]]!r}")
        method = method or self.method
        self._check_method(method)
        rounds = int(rounds or self.rounds)
        t0 = time.perf_counter()
        self.qvec.prefetch(qs)
        timed = TimedScorer(self.ce)
        res = self._make(method, rounds).search(timed, qs, budget=budget, k=k, seed=seed)
        total = time.perf_counter() - t0
        ce_share = timed.seconds / max(len(qs), 1)
        other_share = (total - timed.seconds) / max(len(qs), 1)
        hits = []
        for i, q in enumerate(qs):
            keep = res.indices[i] >= 0
            idx = res.indices[i][keep]
            hits.append(
                Hits(
                    query=q,
                    ids=[self.corpus.ids[j] for j in idx],
                    indices=idx,
                    scores=res.scores[i][keep],
                    ce_calls=int(res.ce_calls[i]),
                    seconds_ce=ce_share,
                    seconds_other=other_share,
                    texts=[self.corpus.texts[j] for j in idx],
                )
            )
        if exact:
            for h, top in zip(
                hits,
                self.exact_top_k(qs, k=k, progress=progress, cache_dir=exact_cache),
                strict=False,
            ):
                h.exact_ids = [self.corpus.ids[j] for j in top]
                h.recall = len(set(h.indices.tolist()) & set(top.tolist())) / len(top)
        return hits

    def exact_scores(self, query: str) -> np.ndarray:
        """CE scores of ``query`` against every item (N CE calls)."""
        return np.asarray(self.ce.score(query, np.arange(self.n_items, dtype=np.int64)), np.float32)

    def exact_top_k(
        self,
        queries: Sequence[str],
        *,
        k: int,
        progress: bool = False,
        cache_dir: str | os.PathLike | None = None,
    ) -> list[np.ndarray]:
        """The exact CE top-k of each query (ties to the lower index); with ``cache_dir`` the
        full score rows are kept there (:class:`crossknn.exact_cache.ExactScores`)."""
        exact = ExactScores(
            self.exact_scores,
            self.n_items,
            items_key=self.index.info.get("items_sha256", ""),
            model_key=str(getattr(self.ce, "model_hash", "")),
            cache_dir=cache_dir,
        )
        return exact.top_k(queries, k=k, progress=progress)
