"""Searching a corpus index with the CE on a budget of CE calls per query.

Three lines from Python::

    index = crossknn.open_index("INDEX_DIR")
    searcher = crossknn.Searcher(index)
    hits = searcher.search("how do I parse a date?", k=10, budget=100)

The index comes from :func:`crossknn.corpus.build.build_corpus_index`; the methods from
:func:`crossknn.search.make_method`; the exact ground truth of ``exact=True`` from
:mod:`crossknn.exact_cache`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import pairwise, repeat
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from crossknn.ce.folders import (
    RUN_PRECISIONS,
    model_record,
    open_cross_encoder,
    open_index_model,
    open_index_models,
)
from crossknn.ce.interface import is_model
from crossknn.ce.manifest import MANIFEST, read_manifest
from crossknn.ce.model_base import on_cpu
from crossknn.cmc import CmcRetriever
from crossknn.corpus_folder import CorpusIndex, open_index
from crossknn.exact_cache import ExactScores
from crossknn.filters import parse_filter
from crossknn.index.auto import auto_index_of
from crossknn.retrievers import DenseRetriever
from crossknn.score_map import ScoreMap
from crossknn.scorers import TimedScorer
from crossknn.search import DEFAULT_MIX, CurIndex, registry
from crossknn.search.engine import search_rounds
from crossknn.search.features import search_features
from crossknn.search.graph import graph_of_index
from crossknn.search.round_index import (
    TUNE_CANDIDATES,
    IndexedFeatures,
    RecordingFeatures,
    tune_round_widths,
)
from crossknn.search.round_plan import DEFAULT_GPU_TARGET_MS, RoundCost, measure_round_cost
from crossknn.search.rounds import SearchResult
from crossknn.topk import exact_top_k

__all__ = ["METHODS", "Hits", "Searcher"]

#: every method (crossknn.search.registry); which ones an index serves: Searcher.methods
METHODS = registry.names()


@dataclass
class Hits:
    """One query's result: the top-k item ids with exact CE scores, and what it cost.

    Attributes:
        query (str): the query.
        ids (list[str]): the top-k item ids, best first.
        indices (numpy.ndarray): their positions in the index (int64).
        scores (numpy.ndarray): their exact CE scores (float32; with a rescore, the rescore
            CE's).
        ce_calls (int): the CE calls this query spent (at most the budget, plus a rescore's).
        seconds_ce (float): this query's own CE time (with ``query_batch`` > 1: the group's
            divided by its queries).
        seconds_other (float): the rest of its search time, likewise.
        texts (list[str]): the items' texts (empty with ``return_documents=False``).
        qid (str | None): the query's id (``query_ids``; default "1", "2", ...).
        exact_ids (list[str] | None): with ``exact=True``: the exact top-k ids.
        exact_scores (numpy.ndarray | None): with ``exact=True``: their CE scores.
        recall (float | None): with ``exact=True``: the Top-k-Recall of ``ids``.
        rescore_calls (int | None): with a rescore (:class:`Searcher`'s ``rescore``): its CE
            calls (also counted in ``ce_calls``).
        plan (dict | None): what ran for this query: the method, the rounds it ran and the CE
            calls each step spent (``plan``; :meth:`Searcher.plan_info` as spent: a filter
            allowing at most B items is one round of as many calls, an early stop ends it
            sooner).
        allowed (int | None): with a filter, ``ids`` or removed items: how many items the
            query could be given (None: every item).
        unknown_ids (int): how many distinct ids of the query's id allow-list (``ids``) the
            index does not hold (never added, or removed); 0 without ``ids``.
        stopped (str): why the search ended: ``budget`` (its whole plan ran), ``found`` (the
            early stop of ``target_recall`` found its top-k before the budget) or ``allowed``
            (its filter allowed at most B items, all scored).
    """

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
    qid: str | None = None
    exact_scores: np.ndarray | None = None
    rescore_calls: int | None = None
    # what ran: the method, its rounds, the plan's step sizes and why those rounds
    # (Searcher.plan_info)
    plan: dict | None = field(default=None, repr=False)
    # (item indices, CE scores) of every item this search scored for the query: the entries it
    # paid for (with Searcher.record_paid; the query log, crossknn.corpus.query_log)
    paid: tuple[np.ndarray, np.ndarray] | None = field(default=None, repr=False)
    # the items this query could be given (its filter / ids, less removed items): None when it
    # could be given every item; fewer than k: every one of them came back
    allowed: int | None = None
    unknown_ids: int = 0
    stopped: str = "budget"

    def __repr__(self) -> str:
        """The fields, with ``texts`` (each cut at 60 characters) when the search returned them."""
        parts = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "texts":
                if not value:
                    continue
                value = [t if len(t) <= 60 else t[:57] + "..." for t in value]
            elif not f.repr:
                continue
            parts.append(f"{f.name}={value!r}")
        return f"Hits({', '.join(parts)})"

    @property
    def missed_ids(self) -> list[str] | None:
        """The exact top-k ids the search did not return (``None`` without ``exact``)."""
        if self.exact_ids is None:
            return None
        got = set(self.ids)
        return [i for i in self.exact_ids if i not in got]

    def to_dict(self, *, titles: Sequence[str | None] | None = None) -> dict[str, Any]:
        results = []
        for r, (i, s) in enumerate(zip(self.ids, self.scores, strict=False), start=1):
            row: dict[str, Any] = {"rank": r, "id": i, "score": float(s)}
            if titles is not None and titles[r - 1]:
                row["title"] = titles[r - 1]
            results.append(row)
        out = {
            "qid": self.qid,
            "query": self.query,
            "results": results,
            "ce_calls": int(self.ce_calls),
            "ce_s": round(self.seconds_ce, 4),
            "other_s": round(self.seconds_other, 4),
        }
        if self.rescore_calls is not None:
            out["rescore_calls"] = int(self.rescore_calls)
        if self.plan is not None:  # what this query ran: its rounds, each step's CE calls
            out["rounds"] = int(self.plan["rounds"])
            out["round_calls"] = [int(n) for n in self.plan["plan"]]
        if self.allowed is not None:
            out["allowed"] = int(self.allowed)
        out["unknown_ids"] = int(self.unknown_ids)
        out["stopped"] = self.stopped
        if self.exact_ids is not None:
            out["exact"] = {
                "ids": self.exact_ids,
                "scores": [float(x) for x in self.exact_scores]
                if self.exact_scores is not None
                else None,
                "missed_ids": self.missed_ids,
                "recall": self.recall,
            }
        return out


#: DE query vectors kept by text (about 1.5 KB each at d = 384)
QUERY_CACHE = 4096
#: and at most this many bytes of them, texts included (a few very long queries cannot fill the
#: memory either)
QUERY_CACHE_BYTES = 32 << 20


class _QueryVectors:
    """DE query vectors by text, encoded once per text (the first stage and AXN's prior); the
    last :data:`QUERY_CACHE` texts are kept, and at most :data:`QUERY_CACHE_BYTES` of texts and
    vectors (a long-running service sees endless new texts, some of them long)."""

    def __init__(self, de, *, max_texts: int = QUERY_CACHE, max_bytes: int = QUERY_CACHE_BYTES):
        self.de = de
        self.max_texts = int(max_texts)
        self.max_bytes = int(max_bytes)
        self.cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self.nbytes = 0  # of the texts (UTF-8 size, about) and vectors kept

    @staticmethod
    def _size(text: str, vec: np.ndarray) -> int:
        return len(text) + int(vec.nbytes)

    def prefetch(self, texts: Sequence[str]) -> None:
        todo = [t for t in dict.fromkeys(texts) if t not in self.cache]
        if todo:
            for t, v in zip(todo, np.asarray(self.de.encode(todo), np.float32), strict=False):
                self.cache[t] = v
                self.nbytes += self._size(t, v)
        for t in texts:  # most recently used last; the oldest go once over a cap
            if t in self.cache:
                self.cache.move_to_end(t)
        keep = len(dict.fromkeys(texts))  # this call's texts stay, whatever their size
        while len(self.cache) > keep and (
            len(self.cache) > self.max_texts or self.nbytes > self.max_bytes
        ):
            t, v = self.cache.popitem(last=False)
            self.nbytes -= self._size(t, v)

    def clear(self) -> None:
        self.cache.clear()
        self.nbytes = 0

    def __call__(self, text: str) -> np.ndarray:
        self.prefetch([text])
        return self.cache[text]

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        self.prefetch(texts)
        return np.stack([self.cache[t] for t in texts])


def _target_recall(value) -> float | None:
    """``target_recall`` checked: None (off) or a share in (0, 1]."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating)):
        raise ValueError(f"target_recall must be a number in (0, 1] or None; got {value!r}")
    if not 0.0 < float(value) <= 1.0:
        raise ValueError(f"target_recall must be in (0, 1]; got {value}")
    return float(value)


def _stop_threshold(method, name: str, target: float | None, budget: int) -> float | None:
    """The early stop's threshold of ``method`` for ``target`` at ``budget`` (None: off)."""
    if target is None:
        return None
    if not hasattr(method, "stop_threshold"):
        raise ValueError(
            f"target_recall needs a method whose index calibrated the early stop (auto); "
            f"{name!r} has none: search it without target_recall"
        )
    return method.stop_threshold(target, int(budget))


def _latency_target(value, ce) -> float | None:
    """The latency target (ms) of ``auto``'s round choice: ``"auto"`` is
    :data:`crossknn.search.round_plan.DEFAULT_GPU_TARGET_MS` when the CE runs on a GPU provider
    and none on a CPU (its pairs dominate); None or 0: none."""
    if value == "auto":
        provider = getattr(ce, "provider", None)
        return None if provider is None or on_cpu(provider) else DEFAULT_GPU_TARGET_MS
    if value is None or value == 0:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"latency_target_ms must be > 0, None or 'auto'; got {value!r}")
    return float(value)


class _FreeScorer:
    """A scorer that costs nothing (random scores): times the loop's own work."""

    def __init__(self, n_items: int) -> None:
        self.n_items = n_items
        self.rng = np.random.default_rng(0)

    def score_batch(self, queries, items):
        return [self.rng.standard_normal(len(it)).astype(np.float32) for it in items]


def _probe_host(method, qvec, n_items: int) -> tuple[float, float]:
    """(host seconds per round, fixed seconds per query) of ``method`` (auto): a probe query
    searched at budget 100 with 4 and with 30 rounds through a :class:`_FreeScorer`, the
    faster of three each; the method's own rounds are restored after."""
    q = "round cost probe query"
    qvec.prefetch([q])
    b = min(100, n_items)
    asked = method.asked_rounds
    times = {}
    try:
        for r in (min(4, b), min(30, b)):
            method.set_rounds(r)
            best = np.inf
            for _ in range(3):
                t0 = time.perf_counter()
                method.search(_FreeScorer(n_items), [q], budget=b, k=min(10, b), seed=0)
                best = min(best, time.perf_counter() - t0)
            times[r] = best
    finally:
        method.set_rounds(asked)
    (r1, t1), (r2, t2) = sorted(times.items())
    per = max(0.0, (t2 - t1) / max(r2 - r1, 1))
    return per, max(0.0, t1 - per * r1)


def open_models(
    index: CorpusIndex,
    *,
    model=None,
    de_model=None,
    precision: str | None = None,
    de_precision: str | None = None,
    provider: str = "auto",
    threads: int | None = None,
    batch_size: int | None = None,
    backend: str | None = None,
    max_batch_tokens: int | None = None,
):
    """``(ce, de)`` of a search of ``index``: the recorded models, or ``model`` / ``de_model``
    (folders), checked against the index (see :class:`Searcher`)."""
    ce, de = open_index_models(
        index,
        model=model,
        de_model=de_model,
        precision=precision,
        de_precision=de_precision,
        provider=provider,
        threads=threads,
        batch_size=batch_size,
        backend=backend,
        max_batch_tokens=max_batch_tokens,
    )
    index.check_models(ce=ce, de=de)
    return ce, de


def _top_k(k: int | None, top_k: int | None) -> int:
    """``k`` (crossknn's name) or ``top_k`` (sentence-transformers' and rerankers'); default 10."""
    if k is not None and top_k is not None and k != top_k:
        raise ValueError(f"k={k!r} and top_k={top_k!r} disagree; give one")
    return 10 if k is None and top_k is None else (k if k is not None else top_k)


class Searcher:
    """Searches a corpus index with the CE on a budget of CE calls per query.

    The CE and DE are the ones the index records (reopened from where they were found), unless
    given; a model that differs from the recorded one (precision, model id or hash) is refused.

    Args:
        index: a corpus index (:func:`crossknn.open_index`) or its folder.
        ce (CrossEncoder | None): a CE object to search with (default: the one the index
            records).
        de (DualEncoder | None): a DE object for the query vectors (default: the one the index
            records).
        model: the CE as a folder or a Hugging Face Hub id, where it moved since the build.
        de_model: the DE as a folder or a Hub id, likewise.
        method: ``auto`` (the default when the index has auto's rows, as a default build of
            100 items or more has), ``axn`` (the default otherwise: rounds over the DE item
            vectors, DE first round, least squares mixed with the DE query vector), ``rnr``
            (rerank the DE top-B), ``adacur`` / ``anncur`` (need an index built with train
            queries and ``cur=True``); :attr:`methods` lists what the index serves.
        rounds: the rounds of every search (default: each method's own; auto chooses them).
        mix: AXN's weight of the DE query vector in its least squares.
        precision: the CE's precision (default: the index's; fp16 runs its fp32 graph on a GPU).
        provider: where the models run: ``auto`` (the first that opens), ``cpu``, ``cuda``,
            ``tensorrt``.
        threads: the models' intra-op threads (default: one per core).
        batch_size: CE pairs per batch.
        cmc_model: a CMC model folder (``crossknn cmc export``) trained on this DE; the first
            round then takes the DE's top ``cmc_candidates`` reranked by CMC.
        cmc_candidates: how many DE candidates CMC reranks.
        round_index: what the rounds search: ``auto`` (the folder's FAISS round index if it has
            one), ``exact``, ``ivf`` or ``hnsw``.
        shards: item shards on Ray actors (0: none).
        ray_address: the Ray cluster of ``shards`` (default: a local one).
        backend: ``onnx`` (default) or ``torch`` (:mod:`crossknn.ce.backends`).
        de_precision: the DE's precision (default: the index's).
        max_batch_tokens: the most tokens in one CE batch.
        rescore: ``(precision, N)``: after each search the top N of its scored items (by the
            search CE's score) are scored again by the CE of the same model at ``precision``
            (e.g. ``("fp32", 20)`` over an int8 search) and the top-k is ranked by those
            scores; the N calls come on top of the budget and are reported
            (``Hits.rescore_calls``, counted in ``Hits.ce_calls``).
        latency_target_ms: auto's round choice: the most recall predicted within this many ms
            per query (``"auto"``: a target on a GPU provider, none on a CPU; None: none).
        target_recall: the early stop (:mod:`crossknn.search.stopping`): a query stops once
            another round is unlikely to change its top-k, keeping on average this share of the
            top-k the whole budget finds (calibrated on the index's own rows at build time; the
            budget stays the ceiling). None: off, every query spends its budget.
    """

    def __init__(
        self,
        index: CorpusIndex | str | os.PathLike,
        *,
        ce=None,
        de=None,
        model: str | os.PathLike | None = None,
        de_model: str | os.PathLike | None = None,
        method: str | None = None,
        rounds: int | None = None,
        mix: float = DEFAULT_MIX,
        precision: str | None = None,
        provider: str = "auto",
        threads: int | None = None,
        batch_size: int | None = None,
        cmc_model: str | os.PathLike | None = None,
        cmc_candidates: int = 512,
        round_index: str = "auto",
        shards: int = 0,
        ray_address: str | None = None,
        backend: str | None = None,
        de_precision: str | None = None,
        max_batch_tokens: int | None = None,
        rescore: tuple[str, int] | None = None,
        latency_target_ms: float | str | None = "auto",
        target_recall: float | None = None,
    ) -> None:
        if not isinstance(index, CorpusIndex):
            index = open_index(index)
        self.index = index
        self.corpus = index.corpus

        opts = {
            "provider": provider,
            "threads": threads,
            "batch_size": batch_size,
            "backend": backend,
            "max_batch_tokens": max_batch_tokens,
        }
        de_opts = {**opts, "batch_size": None}  # batch_size counts CE pairs
        if de is None:
            de = open_index_model(index, "de", de_model, de_precision, de_opts)
        if ce is None:
            ce = open_index_model(index, "ce", model, precision, opts)
        self.ce, self.de = ce, de
        self.model_records = {"ce": model_record(self.ce), "de": model_record(self.de)}
        index.check_models(ce=self.ce, de=self.de)
        self.rescore_ce, self.rescore_top = _open_rescore(index, self.ce, model, rescore, opts)
        method = method or ("auto" if "auto" in index.params else "axn")  # the default method
        self._check_method(method)
        if rounds is not None and (isinstance(rounds, bool) or int(rounds) < 1):
            raise ValueError(f"rounds must be a positive int or None; got {rounds!r}")
        self.method, self.mix = method, float(mix)
        self.rounds = None if rounds is None else int(rounds)  # None: each method's own
        self.latency_target_ms = _latency_target(latency_target_ms, self.ce)
        self.target_recall = _target_recall(target_recall)
        self._round_cost: RoundCost | None = None
        self.ce.set_items(list(self.corpus.texts))
        if self.rescore_ce is not None:
            self.rescore_ce.set_items(list(self.corpus.texts))
        self.V = np.ascontiguousarray(index["de_items"], np.float32)
        # removed items (crossknn remove): an allow mask of the live items, so that no search
        # chooses, scores or returns one (crossknn.corpus.edit)
        self.dead = tombstones_of(index)
        self._n_dead = 0 if self.dead is None else int(self.dead.sum())
        self.live = None if self.dead is None else ~self.dead
        self._masks = _MaskCache()  # filter key hash -> allowed items
        self._id_pos: dict[str, int] | None = None  # item id -> position (made at first need)
        self.record_paid = False  # Hits.paid: the query log's entries (crossknn.corpus.query_log)
        self.qvec = _QueryVectors(self.de)
        # what the rounds search: exact, the folder's MIPS index, or shards (search.round_index)
        self.round_features = search_features(
            index.index, self.V, round_index=round_index, shards=shards, ray_address=ray_address
        )
        self._methods: dict[tuple, Any] = {}
        self._indexes: dict[str, Any] = {}
        self.first = self._first_stage(cmc_model, cmc_candidates)

    def _first_stage(self, cmc_model, cmc_candidates: int):
        if cmc_model is None:
            return DenseRetriever(self.V, encode=self.qvec.encode)

        de_id = (self.index.index.models.get("de") or {}).get("model_id")
        return CmcRetriever(
            cmc_model,
            self.V,
            encode=self.qvec.encode,
            candidates=min(int(cmc_candidates), self.n_items),
            encoder_id=de_id,
        )

    def __repr__(self) -> str:
        ce = self.ce.model_id if is_model(self.ce) else "?"
        return (
            f"Searcher(n_items={len(self.corpus)}, method={self.method!r}, "
            f"rounds={self.rounds}, ce={ce!r})"
        )

    @property
    def n_items(self) -> int:
        return len(self.corpus)

    @property
    def n_dead(self) -> int:
        return self._n_dead

    @property
    def index_kinds(self) -> set[str]:
        """The kinds of method index this corpus index holds (crossknn.search.registry)."""
        kinds = set()
        if "R" in self.index.arrays:
            kinds.add("cur")
        if "auto" in self.index.params:
            kinds.add("auto")
        return kinds

    @property
    def methods(self) -> list[str]:
        """The methods this index can run (the registry's, less those whose index it lacks)."""
        return registry.available(self.index_kinds)

    def _check_method(self, method: str) -> registry.MethodSpec:
        return registry.check_available(method, self.index_kinds, where=f"index {self.index.path}")

    def _method_index(self, kind: str):
        """The method index of ``kind`` (loaded once)."""
        if kind not in self._indexes:
            if kind == "cur":
                self._indexes[kind] = CurIndex(np.asarray(self.index["R"], np.float32))
            elif kind == "auto":
                self._indexes[kind] = auto_index_of(self.index)
            else:
                self._indexes[kind] = None
        return self._indexes[kind]

    def _make(self, method: str, rounds: int | None):
        key = (method, rounds)
        if key not in self._methods:
            spec = self._check_method(method)
            index = self._method_index(spec.index)
            made = spec.build(
                registry.Resources(
                    first=self.first,
                    rounds=rounds,
                    cur=index if spec.index == "cur" else None,
                    auto_index=index if spec.index == "auto" else None,
                    item_vectors=self.round_features,
                    prior=self.qvec,
                    mix=self.mix,
                    score_map=ScoreMap.from_params(
                        self.index.params, what=f"index {self.index.path}"
                    ),
                    n_items=self.n_items,
                    # GAR's corpus graph as build wrote it (rebuilt from de_items when stale)
                    graph=graph_of_index(self.index)
                    if spec.name == "gar" and "de_items" in self.index.arrays
                    else None,
                )
            )
            if rounds is None and self.latency_target_ms is not None and hasattr(made, "set_cost"):
                # auto chooses its rounds under the target: the round cost, measured once
                made.set_cost(self.round_cost(made), self.latency_target_ms)
            self._methods[key] = made
        return self._methods[key]

    def round_cost(self, method=None) -> RoundCost:
        """What a round costs on this searcher's CE (measured once, at the first need): the
        CE's floor per call and cost per pair (:func:`crossknn.search.round_plan.
        measure_round_cost`), the loop's host time per round and the fixed time per query (a
        query's DE encoding; two searches of a probe query at the fewest and most rounds through
        a scorer that costs nothing, ``method``: the one to probe)."""
        if self._round_cost is None:
            ce = measure_round_cost(self.ce, self.n_items)
            host, fixed = 0.0, 0.0
            if method is not None and hasattr(method, "set_rounds"):
                host, fixed = _probe_host(method, self.qvec, self.n_items)
            t0 = time.perf_counter()
            self.de.encode(["round cost probe query"])
            fixed += time.perf_counter() - t0
            self._round_cost = RoundCost(
                ce.floor_s, ce.pair_s, host, fixed, source=ce.source + "; host: probe searches"
            )
        return self._round_cost

    def plan_info(self, method: str | None = None, *, budget: int = 100, rounds=None) -> dict:
        """What a search of ``budget`` CE calls runs: ``method``, ``rounds``, ``plan`` (new
        items per step) and, for ``auto``, ``round_choice`` (why those rounds:
        :class:`crossknn.search.round_plan.RoundChoice`)."""
        name = method or self.method
        m = self._make(name, self.rounds if rounds is None else int(rounds))
        steps = m.plan(int(budget))
        out: dict[str, Any] = {
            "method": name,
            "rounds": sum(1 for st in steps if st.kind != "retrieve"),
            "plan": [int(st.n) for st in steps],
        }
        if hasattr(m, "choice"):
            out["round_choice"] = m.choice(int(budget)).to_dict()
        return out

    def prepare(self, method: str | None = None, *, budget: int = 100) -> list[str]:
        """Build the method's engine caches now (see ``RoundMethod.prepare``); ``serve`` calls
        it at load so that no request pays for them. Returns what is ready."""
        method = method or self.method
        self._check_method(method)
        return self._make(method, self.rounds).prepare(int(budget))

    def tune_round_widths(
        self,
        queries: Sequence[str],
        *,
        k: int = 10,
        budget: int = 100,
        method: str | None = None,
        rounds: int | None = None,
        target: float = 0.995,
        candidates: Sequence[int] | None = None,
        progress: bool = False,
    ) -> tuple[dict[int, int], int]:
        """Tunes the round index's width per round step on ``queries`` (held-out train or
        pseudo-queries, never the test queries): searches them with exact rounds (``budget`` CE
        calls each), records every round step's least-squares query and takes, per step, the
        narrowest width whose recall of the exact top-n reaches ``target``
        (:func:`crossknn.search.round_index.tune_round_widths`). Sets the widths this searcher
        uses and returns ``({items scored: width}, CE calls spent)``."""
        feats = self.round_features
        if not isinstance(feats, IndexedFeatures):
            raise ValueError(
                "tuning round widths needs a FAISS round index: this searcher's rounds are "
                f"{type(feats).__name__} (build with --round-index ivf|hnsw)"
            )
        if not queries:
            raise ValueError("tuning round widths needs at least one query")
        recording = RecordingFeatures(feats.base)
        methods, self._methods = self._methods, {}
        self.round_features = recording
        try:
            hits = self.search(
                list(queries), k=k, budget=budget, method=method, rounds=rounds, progress=progress
            )
        finally:
            self.round_features, self._methods = feats, methods
        if not recording.records:
            raise ValueError(
                f"method {method or self.method!r} made no round steps through the item "
                "features: nothing to tune"
            )
        schedule, _ = tune_round_widths(
            feats,
            recording.records,
            candidates=candidates or TUNE_CANDIDATES[feats.kind],
            target=target,
        )
        return schedule, int(sum(h.ce_calls for h in hits))

    def search(
        self,
        queries: str | Sequence[str],
        *,
        k: int | None = None,
        budget: int = 100,
        method: str | None = None,
        rounds: int | None = None,
        seed: int = 0,
        exact: bool = False,
        exact_cache: str | os.PathLike | None = None,
        progress: bool = False,
        query_ids: Sequence[str] | None = None,
        batch_size: int | None = None,
        show_progress_bar: bool | None = None,
        query_batch: int = 1,
        top_k: int | None = None,
        return_documents: bool = True,
        rescore_top: int | None = None,
        filter: Any = None,
        ids: Sequence[str] | None = None,
        target_recall: float | None = None,
    ) -> Hits | list[Hits]:
        """Top-k items by exact CE score for each query, spending at most ``budget`` CE calls
        each. Queries are searched ``query_batch`` at a time (default 1: every query's own CE
        and other time is measured; more: one CE batch per round for the group, times shared).
        ``exact=True`` also scores every item for each query (N CE calls each, not counted in
        ``ce_calls``) and reports the exact top-k, its scores and Top-k-Recall@budget.
        ``query_ids`` name the queries (default "1", "2", ...); ``batch_size`` pairs per CE batch
        for this call; ``show_progress_bar`` (alias ``progress``) a bar over the queries with
        pairs/s and ETA (and by pairs for ``exact``).

        sentence-transformers' and rerankers' names are accepted with their meaning: ``top_k``
        for ``k`` (default 10), ``return_documents`` (default True here: ``Hits.texts`` holds the
        item texts; False leaves it empty). One query string gives one :class:`Hits`, a list of
        queries a list. ``rescore_top``: this call's N of the searcher's ``rescore`` (0: none).

        ``filter``: the items a query may be given, by their metadata (:mod:`crossknn.filters`:
        a JSON object such as ``{"lang": "en", "year": {"$gte": 2020}}``), one for every query or
        a list (one filter or None per query); ``ids``: an id allow-list for every query. Both
        are allow masks inside the engine (removed items are never allowed): no other item is
        scored or returned, a query whose filter allows at most ``budget`` items gets its exact
        top-k, and one that allows fewer than k gets them all (``Hits.allowed`` says how many
        it could be given).

        ``target_recall``: this call's early stop (None: the searcher's; see :class:`Searcher`);
        ``Hits.ce_calls`` is what each query spent, ``Hits.stopped`` why it ended."""
        k = _top_k(k, top_k)
        hits = self._search_list(
            [queries] if isinstance(queries, str) else queries,
            k=k,
            budget=budget,
            method=method,
            rounds=rounds,
            seed=seed,
            exact=exact,
            exact_cache=exact_cache,
            progress=progress,
            query_ids=query_ids,
            batch_size=batch_size,
            show_progress_bar=show_progress_bar,
            query_batch=query_batch,
            rescore_top=rescore_top,
            filter=filter,
            ids=ids,
            target_recall=target_recall,
        )
        if not return_documents:
            hits = [dataclasses.replace(h, texts=[]) for h in hits]
        return hits[0] if isinstance(queries, str) else hits

    def _search_list(
        self,
        queries: Sequence[str],
        *,
        k: int,
        budget: int,
        method: str | None,
        rounds: int | None,
        seed: int,
        exact: bool,
        exact_cache: str | os.PathLike | None,
        progress: bool,
        query_ids: Sequence[str] | None,
        batch_size: int | None,
        show_progress_bar: bool | None,
        query_batch: int,
        rescore_top: int | None,
        filter: Any = None,
        ids: Sequence[str] | None = None,
        target_recall: float | None = None,
    ) -> list[Hits]:
        """The body of :meth:`search` for a list of queries: one :class:`Hits` each."""
        qs = list(queries)
        bad = [i for i, q in enumerate(qs) if not isinstance(q, str) or not q.strip()]
        if bad:
            raise ValueError(f"queries must be non-empty strings; query {bad[0]} is {qs[bad[0]]!r}")
        if query_ids is None:
            qids = [str(i) for i in range(1, len(qs) + 1)]
        else:
            qids = [str(q) for q in query_ids]
            if len(qids) != len(qs):
                raise ValueError(f"{len(qids)} query ids for {len(qs)} queries")
        if isinstance(query_batch, bool) or not isinstance(query_batch, int) or query_batch < 1:
            raise ValueError(f"query_batch must be a positive int; got {query_batch!r}")
        method = method or self.method
        self._check_method(method)
        rounds = self.rounds if rounds is None else int(rounds)
        show = progress if show_progress_bar is None else bool(show_progress_bar)
        t_masks = time.perf_counter()
        masks, unknown = self._allow(len(qs), filter, ids)
        t_masks = (time.perf_counter() - t_masks) / max(len(qs), 1)  # in each query's other time
        search = self._make(method, rounds)
        target = self.target_recall if target_recall is None else _target_recall(target_recall)
        stop = _stop_threshold(search, method, target, budget)
        plan = self.plan_info(method, budget=budget, rounds=rounds)
        kinds = [st.kind for st in search.plan(int(budget))]  # the plan's steps, as plan_info's
        n_rescore = self._rescore_n(rescore_top, k, budget)
        hits: list[Hits] = []
        old_bs = self.ce.batch_size if batch_size is not None else None
        if batch_size is not None:
            if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
                raise ValueError(f"batch_size must be a positive int; got {batch_size!r}")
            self.ce.batch_size = batch_size
        try:
            with _bar(len(qs), show) as bar:
                t_all, pairs = time.perf_counter(), 0
                for lo in range(0, len(qs), query_batch):
                    group = qs[lo : lo + query_batch]
                    t0 = time.perf_counter()
                    self.qvec.prefetch(group)
                    scorer = timed = TimedScorer(self.ce)
                    want = max(k, n_rescore)
                    allow = None if masks is None else masks[lo : lo + query_batch]
                    if stop is None:
                        res = search.search(
                            scorer, group, budget=budget, k=want, seed=seed, allow=allow
                        )
                    else:  # the early stop: the round loop itself (RoundMethod.search's)
                        res = search_rounds(
                            search,
                            scorer,
                            group,
                            budget=budget,
                            k=want,
                            seed=seed,
                            allow=allow,
                            stop=stop,
                        )
                    extra = [self._rescore(q, res, i, k, n_rescore) for i, q in enumerate(group)]
                    total = time.perf_counter() - t0
                    n = len(group)
                    t_ce = timed.seconds + sum(e[3] for e in extra)
                    for i, q in enumerate(group):
                        idx, scores, calls, _ = extra[i]
                        hits.append(
                            Hits(
                                query=q,
                                ids=[self.corpus.ids[j] for j in idx],
                                indices=idx,
                                scores=scores,
                                ce_calls=int(res.ce_calls[i]) + calls,
                                seconds_ce=t_ce / n,
                                seconds_other=(total - t_ce) / n + t_masks,
                                texts=[self.corpus.texts[j] for j in idx],
                                qid=qids[lo + i],
                                rescore_calls=calls if self.rescore_ce is not None else None,
                                plan=_as_spent(plan, kinds, res, i),
                                paid=_paid(res, i) if self.record_paid else None,
                                allowed=None
                                if allow is None or allow[i] is None
                                else int(allow[i].sum()),
                                unknown_ids=unknown[lo + i],
                                stopped=res.stop_reason(i)
                                if isinstance(res, SearchResult)
                                else "budget",
                            )
                        )
                    pairs += sum(h.ce_calls for h in hits[-n:])
                    bar.update(n)
                    rate = pairs / max(time.perf_counter() - t_all, 1e-9)
                    bar.set_postfix_str(f"{rate:.1f} pairs/s", refresh=False)
        finally:
            if batch_size is not None:
                self.ce.batch_size = old_bs
        if exact:
            rows = self._exact_rows(qs, masks, progress=show, cache_dir=exact_cache)
            for j, (h, row) in enumerate(zip(hits, rows, strict=True)):
                n_ok = self.n_items
                if masks is not None and masks[j] is not None:  # within the items it may get
                    n_ok = int(masks[j].sum())
                top = exact_top_k(row, min(k, n_ok)).astype(np.int64)
                h.exact_ids = [self.corpus.ids[j] for j in top]
                h.exact_scores = row[top].astype(np.float32)
                h.recall = len(set(h.indices.tolist()) & set(top.tolist())) / len(top)
        return hits

    def _rescore_n(self, rescore_top: int | None, k: int, budget: int) -> int:
        """This call's rescore N (0: none), refused in one line if it cannot be."""
        n = self.rescore_top if rescore_top is None else rescore_top
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
            raise ValueError(f"rescore_top must be an int >= 0; got {n!r}")
        if n and self.rescore_ce is None:
            raise ValueError(f"rescore_top={n} needs a Searcher made with rescore=(precision, N)")
        if n and n < k:
            raise ValueError(f"rescore N={n} is less than k={k}: N must be >= k (k <= N <= B)")
        if n > budget:
            raise ValueError(
                f"rescore N={n} exceeds the budget B={budget}: only the B scored items can be "
                "rescored (k <= N <= B)"
            )
        return int(n)

    def _rescore(self, query: str, res, i: int, k: int, n: int):
        """Query ``i`` of ``res``: ``(indices, scores, rescore calls, rescore seconds)`` of its
        top-k, after rescoring its top ``n`` (ranked by the search CE) with the rescore CE."""
        keep = res.indices[i] >= 0  # -1: fewer allowed items than asked for
        idx, scores = res.indices[i][keep], res.scores[i][keep]
        if not n:
            return idx, scores, 0, 0.0
        t0 = time.perf_counter()
        idx = idx[:n]
        new = np.asarray(self.rescore_ce.score(query, idx), np.float32)
        order = np.lexsort((idx, -new))[:k]  # by rescore CE score, ties to the lower index
        return idx[order], new[order], int(idx.size), time.perf_counter() - t0

    #: bytes of filter masks kept between searches (a service sees the same filters again),
    #: their keys included (:class:`_MaskCache`)
    MASK_CACHE_BYTES = 64 << 20

    def filter_mask(self, spec: Any) -> np.ndarray:
        """The items a filter allows (boolean (N,); :mod:`crossknn.filters`, checked against
        this index's metadata fields), kept for the next search with the same filter."""
        f = parse_filter(spec, self.index.metadata.fields)
        key = _mask_key(f.key)
        mask = self._masks.get(key)
        if mask is None:
            mask = f.mask(self.index.metadata, self.corpus.ids)
            mask.setflags(write=False)
            self._masks.put(key, mask, self.MASK_CACHE_BYTES)
        return mask

    def ids_mask(self, ids: Sequence[str]) -> np.ndarray:
        """The items of an id allow-list (boolean (N,); ids the index lacks allow nothing)."""
        return self._ids_mask(ids)[0]

    def _ids_mask(self, ids: Sequence[str]) -> tuple[np.ndarray, int]:
        """(the items of an id allow-list, how many of its distinct ids the index does not hold:
        never added, or removed)."""
        if isinstance(ids, str) or not all(isinstance(i, str) for i in ids):
            raise ValueError("ids must be a list of item id strings")
        if self._id_pos is None:  # once per searcher: the position of every item id
            self._id_pos = {iid: j for j, iid in enumerate(self.corpus.ids)}
        # (no set of the ids: 10^5 of them would take 4 MB more than the list they came in)
        pos = np.fromiter(map(self._id_pos.get, ids, repeat(-1)), np.int64, len(ids))
        mask = np.zeros(self.n_items, bool)
        mask[pos[pos >= 0]] = True
        removed = 0
        if self.live is not None:  # a removed item is not held
            removed = int((mask & ~self.live).sum())
            mask &= self.live
        unknown = sorted(i for i in ids if i not in self._id_pos)
        distinct = min(len(unknown), 1) + sum(1 for a, b in pairwise(unknown) if a != b)
        return mask, distinct + removed

    def allow_masks(
        self, n_queries: int, *, filter: Any = None, ids: Sequence | None = None
    ) -> list[np.ndarray | None] | None:
        """One boolean (N,) allow mask per query: its filter (one for all, or a list of one
        filter or None per query) and ``ids`` (one id list for all, or a list of one id list or
        None per query), less the removed items (None for a query that may be given every
        item); None when every query may."""
        return self._allow(n_queries, filter, ids)[0]

    def _allow(
        self, n_queries: int, filter: Any, ids: Sequence | None
    ) -> tuple[list[np.ndarray | None] | None, list[int]]:
        """:meth:`allow_masks` and the unknown ids of each query (0 without ids)."""
        if isinstance(filter, list):
            if len(filter) != n_queries:
                raise ValueError(f"{len(filter)} filters for {n_queries} queries")
            filters = filter
        else:
            filters = [filter] * n_queries
        if _per_query_ids(ids):
            if len(ids) != n_queries:
                raise ValueError(f"{len(ids)} id lists for {n_queries} queries")
            id_lists = list(ids)
        else:
            id_lists = [ids] * n_queries
        unknown = [0] * n_queries
        if (
            self.live is None
            and all(f is None for f in filters)
            and all(i is None for i in id_lists)
        ):
            return None, unknown
        out: list[np.ndarray | None] = []
        seen: dict[int, tuple[np.ndarray, int]] = {}  # one id list given for many queries
        for q, (f, i) in enumerate(zip(filters, id_lists, strict=True)):
            m = self.live
            if i is not None:
                if id(i) not in seen:
                    seen[id(i)] = self._ids_mask(i)
                im, unknown[q] = seen[id(i)]
                m = im if m is None else m & im
            if f is not None:
                fm = self.filter_mask(f)
                m = fm if m is None else m & fm
            out.append(m)
        return out, unknown

    def exact_scores(self, query: str) -> np.ndarray:
        """CE scores of ``query`` against every item (N CE calls)."""
        return np.asarray(self.ce.score(query, np.arange(self.n_items, dtype=np.int64)), np.float32)

    def _exact_rows(self, queries, masks, *, progress: bool, cache_dir) -> list[np.ndarray]:
        """Each query's exact CE scores over every item (``-inf`` where it may not be given
        one): a query with an allow mask scores only its allowed items; the others every item
        (through the exact-score cache)."""
        masked = [] if masks is None else [j for j, m in enumerate(masks) if m is not None]
        free = sorted(set(range(len(queries))) - set(masked))
        rows: list[np.ndarray | None] = [None] * len(queries)
        if free:
            got = self._exact([queries[j] for j in free], progress=progress, cache_dir=cache_dir)
            for j, row in zip(free, got, strict=True):
                rows[j] = row
        for j in masked:
            allowed = np.flatnonzero(masks[j]).astype(np.int64)
            row = np.full(self.n_items, -np.inf, np.float32)
            if allowed.size:
                row[allowed] = np.asarray(self.ce.score(queries[j], allowed), np.float32)
            rows[j] = row
        return rows

    def _exact(self, queries, *, progress: bool, cache_dir) -> list[np.ndarray]:
        exact = ExactScores(
            self.exact_scores,
            self.n_items,
            items_key=self.index.info.get("items_sha256", ""),
            model_key=str(self.ce.model_hash),
            cache_dir=cache_dir,
        )
        return exact.rows(queries, progress=progress)

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
        rows = self._exact(queries, progress=progress, cache_dir=cache_dir)
        return [exact_top_k(r, k).astype(np.int64) for r in rows]


def tombstones_of(index: CorpusIndex) -> np.ndarray | None:
    """The removed items of ``index`` as a boolean mask (None: none removed)."""
    t = index.arrays.get("tombstones")
    if t is None:
        return None
    mask = np.asarray(t, bool)
    return mask if mask.any() else None


def _as_spent(plan: dict, kinds: list[str], res, i: int) -> dict:
    """``plan`` (:meth:`Searcher.plan_info`) as query ``i`` of ``res`` spent it: its rounds and
    the CE calls of each step it ran. A query whose allow mask allowed at most B items scored
    them all in one round; one stopped early ran the steps its CE calls paid for; the others
    ran the whole plan (the loop spends each step's calls in full then)."""
    calls = int(res.ce_calls[i])
    reason = res.stop_reason(i) if hasattr(res, "stop_reason") else "budget"
    if reason == "allowed":
        steps, ran = [calls], ["first"]
    else:
        steps, ran, total = [], [], 0
        for n, kind in zip(plan["plan"], kinds, strict=True):
            if total + n > calls:
                break
            steps.append(int(n))
            ran.append(kind)
            total += n
        if total < calls:  # a step cut short (never on the C++ loop): its calls as spent
            steps.append(calls - total)
            ran.append("round")
    if steps == plan["plan"]:
        return plan
    return {**plan, "rounds": sum(1 for k in ran if k != "retrieve"), "plan": steps}


def _paid(res, i: int) -> tuple[np.ndarray, np.ndarray]:
    """(item indices, CE scores) of every item the search ``res`` scored for its query ``i``
    (the loop's own record of that query: never another query's, whatever its text)."""
    return (
        np.asarray(res.scored_items[i], np.int64).ravel(),
        np.asarray(res.scored_scores[i], np.float32).ravel(),
    )


def _mask_key(key: str) -> bytes:
    """A filter mask's cache key: a 16-byte hash of the filter's canonical text (a filter can
    be a megabyte of ids; its text is never kept)."""
    return hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=16).digest()


def _per_query_ids(ids) -> bool:
    """Whether ``ids`` is one id list (or None) per query rather than one list for all."""
    return (
        isinstance(ids, (list, tuple))
        and len(ids) > 0
        and all(i is None or isinstance(i, (list, tuple)) for i in ids)
    )


class _MaskCache:
    """Filter masks by key hash, the least recently used first out: at most ``max_bytes`` of
    masks and keys (with a per-entry overhead), always at least the newest."""

    ENTRY_BYTES = 200  # an entry's own cost besides its mask and key (dict slot, objects)

    def __init__(self) -> None:
        self._d: OrderedDict[bytes, np.ndarray] = OrderedDict()
        self.nbytes = 0

    def _size(self, key: bytes, mask: np.ndarray) -> int:
        return len(key) + int(mask.nbytes) + self.ENTRY_BYTES

    def get(self, key: bytes) -> np.ndarray | None:
        mask = self._d.get(key)
        if mask is not None:
            self._d.move_to_end(key)
        return mask

    def put(self, key: bytes, mask: np.ndarray, max_bytes: int) -> None:
        if key in self._d:
            return
        self._d[key] = mask
        self.nbytes += self._size(key, mask)
        while len(self._d) > 1 and self.nbytes > max_bytes:
            k, m = self._d.popitem(last=False)
            self.nbytes -= self._size(k, m)

    def clear(self) -> None:
        self._d.clear()
        self.nbytes = 0

    def __len__(self) -> int:
        return len(self._d)


def _open_rescore(index: CorpusIndex, ce, model, rescore, opts: dict[str, Any]):
    """``(rescore CE, N)`` of ``rescore=(precision, N)``: the search CE's model at that
    precision, refused in one line if it is the search's precision or the folder lacks it."""
    if rescore is None:
        return None, 0

    if not isinstance(rescore, (tuple, list)) or len(rescore) != 2:
        raise ValueError(f"rescore must be (precision, N), e.g. ('fp32', 20); got {rescore!r}")
    precision, n = rescore
    if precision not in RUN_PRECISIONS:
        raise ValueError(f"rescore precision must be one of {RUN_PRECISIONS}; got {precision!r}")
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"rescore N must be a positive int; got {n!r}")
    searched = getattr(ce, "precision", None)
    if precision == searched:
        raise ValueError(
            f"rescore precision {precision!r} is the search's own precision: nothing to rescore "
            "(rescore an int8 search with fp32)"
        )
    rec = model_record(ce)
    if not rec.get("model_hash"):  # a bare scorer: the model the index records
        rec = index.model_records.get("ce") or {}
    if model is not None:
        where = Path(model)
    elif rec.get("embedded") or not (rec.get("path") or rec.get("source")):
        where = None  # the embedded default: every variant is exported on demand
    else:  # the Hugging Face source (any variant is exported from it), else the crossknn folder
        src = rec.get("source")
        where = Path(src) if src and Path(src).is_dir() else Path(rec["path"])
    if where is not None and (where / MANIFEST).is_file():
        variants = sorted(read_manifest(where)["variants"])
        variant = "fp32" if precision == "fp16" else precision
        if variant not in variants:
            raise ValueError(
                f"rescore precision {precision!r}: model folder {where} has no {variant!r} "
                f"variant (has {variants})"
            )
    return open_cross_encoder(where, precision=precision, **opts), int(n)


def _bar(total: int, enabled: bool):
    return tqdm(total=total, desc="search", unit="query", disable=not enabled or total < 2)
