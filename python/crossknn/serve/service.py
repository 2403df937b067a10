"""The search service behind the HTTP app: models, index, batcher, admission, request threads.

:class:`SearchService` owns one :class:`crossknn.Searcher` built with a
:class:`~crossknn.serve.proxy.BatchedCE`, the :class:`~crossknn.serve.batcher.Batcher` that runs
the real CE, a pool of request threads (each request's search runs in one, off the event loop)
and the admission of requests (:mod:`crossknn.serve.admission`: ``--max-queue`` and the deadline
check of ``--admit-within``). It knows nothing about HTTP.
"""

from __future__ import annotations

import gc
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

import crossknn
from crossknn.ce.folders import RUN_PRECISIONS, open_index_models
from crossknn.ce.interface import DualEncoder, ModelInfo
from crossknn.ce.model_base import on_cpu
from crossknn.corpus.query_log import QueryLog
from crossknn.corpus.versions import index_version
from crossknn.search import registry
from crossknn.serve.admission import Admission, Decision, Ticket, request_cost
from crossknn.serve.arrays import held_line, hold_arrays
from crossknn.serve.batcher import Batcher
from crossknn.serve.de_thread import DEThread
from crossknn.serve.engine_lock import ENGINE_ORDERS, engine_lock
from crossknn.serve.groups import QueryGroups
from crossknn.serve.metrics import Metrics
from crossknn.serve.proxy import BatchedCE, RequestContext
from crossknn.serve.reload import IndexFollower, VersionCE
from crossknn.serve.schema import MAX_ROUNDS, RerankRequest, SearchRequest

__all__ = ["ServeConfig", "SearchService"]

log = logging.getLogger("crossknn.serve")

# the most queries in one lockstep group by default (docs/serve.md, "On a GPU")
GROUP_QUERIES = 8
# the search run once at load to measure the service time (and warm the models up)
WARM_UP_QUERY = "how long does one search take"
WARM_UP_BUDGET = 32  # small: startup stays short; its fixed costs make the first value high


@dataclass
class ServeConfig:
    """Everything ``crossknn serve`` is told on its command line (see docs/serve.md)."""

    index: str
    model: str | None = None  # a crossknn or HF CE folder; default: the index's CE
    precision: str | None = None  # the CE's; default: the index's (fp16: its fp32 graph on a GPU)
    de_precision: str | None = None  # the DE's; default: the index's
    max_batch_tokens: int | None = None  # tokens per CE session run; None: the provider's default
    de_model: str | None = (
        None  # a crossknn / sentence-transformers DE folder; default: the index's
    )
    provider: str = "auto"
    backend: str = "onnx"  # what runs the CE and DE: crossknn.ce.backends ("onnx", "torch")
    threads: int | None = None  # CE (and DE) intra-op threads; None: one per physical core
    # pairs merged into one CE call across requests; 0: no merging; None: the provider's
    # default (256 on a CPU and on a GPU: there every merged batch is a captured, warmed CUDA
    # graph; measured against 2048 on an H100 in docs/serve.md)
    max_batch_pairs: int | None = None
    max_wait_ms: float = 2.0
    # threads of the CE batcher (crossknn.serve.batcher): 2 pipelines a GPU (one forms and
    # prepares the next batch while the other's runs); None: 1 on a CPU, 2 on a GPU
    ce_workers: int | None = None
    # which waiting request's (or query group's) engine step runs next
    # (crossknn.serve.engine_lock): "oldest" (the request admitted first) or "any" (a plain lock)
    engine_order: str = "oldest"
    # requests waiting together for the engine start as one lockstep search
    # (crossknn.serve.groups): at most this many queries in one group (<= 1: every request
    # searched alone); needs engine_order "oldest". None: 8 with "oldest", 1 with "any"
    # (docs/serve.md: measured on an H200)
    group_queries: int | None = None
    # on a GPU: capture every CUDA graph bucket of a merged batch and grow the device memory to
    # the largest batch at load, in each CE worker thread (graphs are per thread), so that no
    # request pays a batch shape's first use
    warmup: bool = True
    # encode every query with the DE in one thread of its own (crossknn.serve.de_thread), not in
    # the request threads; None: on a GPU (one provider context per thread), not on a CPU
    de_thread: bool | None = None
    max_queue: int = 64
    timeout_s: float = 30.0
    # admit a request only if its expected time in the server fits in this fraction of
    # timeout_s (0: no deadline check, only max_queue)
    admit_within: float = 0.5
    max_body_bytes: int = 1 << 20
    method: str | None = None  # None: the index's default (auto when built with it, else axn)
    rounds: int | None = None  # None: each method's own (auto: the index's or the target's)
    # auto's latency target per query (ms; crossknn.search.round_plan): "auto" is 8 on a GPU
    # provider and none on a CPU; None or 0: none (the index's rounds)
    latency_target_ms: float | str | None = "auto"
    # the early stop of requests that ask for none (crossknn.search.stopping; None: off)
    target_recall: float | None = None
    # each distinct rounds value keeps a method object (and its features); at least auto's most
    max_rounds: int = MAX_ROUNDS
    round_index: str = "auto"  # the folder's MIPS round index (auto), or exact rounds
    shards: int = 0  # > 0: the items sharded over this many Ray actors
    ray_address: str | None = None  # the Ray cluster of the shards (default: a local one)
    allow_exact: bool = False  # "exact": true in /search (N CE calls per query) is refused unless
    max_rerank_texts: int = 1000  # texts in one /rerank request
    max_query_chars: int = 4096  # characters in one query (/search, /rerank); more: 422
    api_key_file: str | None = None  # a bearer token every request but /healthz, /readyz needs
    cors: tuple[str, ...] = ()  # origins allowed by CORS (none: no CORS headers)
    body_timeout_s: float = 10.0  # the longest pause while a request body comes; then 408
    # append every answered query with its paid-for CE scores here (crossknn.corpus.query_log; off)
    log_queries: str | None = None
    # look for a new index version (index.json renamed) every this many seconds; 0: only on
    # POST /admin/reload (crossknn.serve.reload)
    watch_index_s: float = 2.0

    def __post_init__(self) -> None:
        if self.group_queries is None:
            self.group_queries = GROUP_QUERIES if self.engine_order == "oldest" else 1
        checks = [
            ("max_batch_pairs", self.max_batch_pairs is None or self.max_batch_pairs >= 0),
            ("max_wait_ms", self.max_wait_ms >= 0),
            ("ce_workers", self.ce_workers is None or 1 <= self.ce_workers <= 8),
            ("max_queue", self.max_queue >= 1),
            ("timeout_s", self.timeout_s > 0),
            ("admit_within", 0 <= self.admit_within <= 1),
            ("max_body_bytes", self.max_body_bytes >= 1024),
            ("body_timeout_s", self.body_timeout_s > 0),
            ("watch_index_s", self.watch_index_s >= 0),
            ("threads", self.threads is None or self.threads >= 1),
            ("max_batch_tokens", self.max_batch_tokens is None or self.max_batch_tokens >= 1),
            ("rounds", self.rounds is None or 1 <= self.rounds <= self.max_rounds),
            (
                "latency_target_ms",
                self.latency_target_ms in (None, "auto")
                or (
                    isinstance(self.latency_target_ms, (int, float)) and self.latency_target_ms >= 0
                ),
            ),
            ("shards", self.shards >= 0),
            ("max_rerank_texts", self.max_rerank_texts >= 1),
            ("max_query_chars", self.max_query_chars >= 1),
            ("round_index", self.round_index in ("auto", "exact", "ivf", "hnsw")),
            ("engine_order", self.engine_order in ENGINE_ORDERS),
            ("group_queries", self.group_queries >= 0),
        ]
        for name, ok in checks:
            if not ok:
                raise ValueError(f"serve: {name}={getattr(self, name)!r} is out of range")

        if self.group_queries > 1 and self.engine_order != "oldest":
            raise ValueError(
                f"serve: query groups (group_queries={self.group_queries}) need "
                f"engine_order='oldest'; got {self.engine_order!r} (or set group_queries=1)"
            )
        for name in ("precision", "de_precision"):
            value = getattr(self, name)
            if value is not None and value not in RUN_PRECISIONS:
                raise ValueError(f"serve: {name} must be one of {RUN_PRECISIONS}; got {value!r}")


# on an H100 (session 16, three runs, concurrency 32): 256 pairs and two CE workers gave 311 /
# 340 / 289 q/s against 287 / 306 / 262 with 2048 pairs and one worker (docs/serve.md)
CPU_BATCH_PAIRS, GPU_BATCH_PAIRS = 256, 256


CE_WORKERS_GPU = 2


def merged_pairs(configured: int | None, provider: str | None) -> int:
    """The batcher's ``max_batch_pairs``: as configured, else by where the CE runs."""
    if configured is not None:
        return int(configured)
    return CPU_BATCH_PAIRS if on_cpu(provider) else GPU_BATCH_PAIRS


def ce_workers(configured: int | None, provider: str | None) -> int:
    """The batcher's worker threads: as configured, else by where the CE runs (on a CPU one, so
    that the CE's intra-op threads are all the CPU it takes)."""
    if configured is not None:
        return int(configured)
    return 1 if on_cpu(provider) else CE_WORKERS_GPU


def use_de_thread(configured: bool | None, provider: str | None) -> bool:
    """Whether the DE encodes in one thread of its own: as configured, else on a GPU."""
    if configured is not None:
        return bool(configured)
    return not on_cpu(provider)


def _model_info(m: ModelInfo) -> dict[str, Any]:
    info = {
        "backend": m.backend,
        "model_id": m.model_id,
        "model_hash": m.model_hash,
        "kind": m.kind,
        "precision": m.precision,
        "provider": m.provider,
        "max_length": m.max_length,
        "dim": m.dim if isinstance(m, DualEncoder) else None,
    }
    return {k: v for k, v in info.items() if v is not None}


def _warn_line(line: str) -> None:
    log.warning("crossknn serve: %s", line)


class SearchService:
    """See the module docstring. ``load()`` (or ``start_loading()``) before ``search``."""

    def __init__(
        self,
        config: ServeConfig,
        *,
        index=None,
        metrics: Metrics | None = None,
        query_log: QueryLog | None = None,
    ):
        self.config = config
        self.metrics = metrics or Metrics()
        self._index = index  # an already opened crossknn index (the CLI opens it up front)
        self.index = None
        self.searcher = None
        self.batcher: Batcher | None = None
        self.ce = None
        self.de = None
        self.engine_lock = engine_lock(config.engine_order)
        self.groups: QueryGroups | None = None  # made at load (config.group_queries > 1)
        self.executor = ThreadPoolExecutor(
            max_workers=config.max_queue, thread_name_prefix="crossknn-req"
        )
        self.ready = threading.Event()
        self.load_error: BaseException | None = None
        self.load_seconds: float | None = None
        self.warmup: dict | None = None  # what ce.warmup did at load (GPU: graphs captured)
        self.de_thread: DEThread | None = None  # the DE's own thread (on a GPU)
        self.started = time.time()
        self.admission = Admission(
            max_queue=config.max_queue, timeout_s=config.timeout_s, within=config.admit_within
        )
        self._loader: threading.Thread | None = None
        # how the index's arrays are held (crossknn.serve.arrays): read into memory or mapped
        self.arrays_held: dict | None = None
        self.follower: IndexFollower | None = None  # new index versions (made at load)
        # --log-queries (opened by the CLI before anything loads, or first thing in load())
        self.query_log: QueryLog | None = query_log
        self.metrics.inflight.set_function(lambda: self.admission.in_server)
        self.metrics.service_seconds_per_pair.set_function(
            lambda: self.admission.seconds_per_unit() or 0.0
        )
        self.metrics.pending_pairs.set_function(
            lambda: self.batcher.pending_pairs if self.batcher is not None else 0
        )

    # -- loading --------------------------------------------------------------------------------
    def load(self) -> None:
        t = time.perf_counter()
        c = self.config
        try:
            if c.log_queries and self.query_log is None:  # a log it cannot write: no model loads
                self.query_log = QueryLog(c.log_queries, warn=_warn_line)
            index = self._index if self._index is not None else crossknn.open_index(c.index)
            # from here on only self.index holds it: the version loaded at start is released
            # after its swap like any other (crossknn.serve.reload)
            self._index = None
            # a small index is read into memory: a file cut in place cannot kill the server
            self.arrays_held = hold_arrays(index)
            threads = c.threads
            ce, de = open_index_models(
                index,
                model=c.model,
                de_model=c.de_model,
                precision=c.precision,
                de_precision=c.de_precision,
                provider=c.provider,
                threads=threads,
                backend=c.backend,
                max_batch_tokens=c.max_batch_tokens,
                # the DE's query vectors (in the DE thread on a GPU, else in the request
                # threads) without CUDA graphs: none of its runs captures while the CE workers
                # wait
                de_options={"cuda_graph": False} if c.backend == "onnx" else None,
            )
            index.check_models(ce=ce, de=de)
            m = self.metrics
            max_pairs = merged_pairs(c.max_batch_pairs, ce.provider)
            # the largest merged batch one session run can take
            pairs = min(max_pairs or ce.batch_size, ce.batch_size)
            batcher = Batcher(
                ce,
                max_batch_pairs=max_pairs,
                max_wait_s=c.max_wait_ms / 1000.0,
                on_batch=m.on_batch,
                on_drop=m.on_drop,
                active=lambda: self.admission.in_server,
                workers=ce_workers(c.ce_workers, ce.provider),
                # in each CE worker thread: onnxruntime keeps CUDA graphs per thread, so a
                # warm-up in this (loading) thread would leave the workers to capture their own
                # graphs on their first batches of each shape, under load
                warmup=(lambda: ce.warmup(pairs)) if c.warmup else None,
            )
            try:
                if c.warmup:
                    warm = batcher.wait_warm(timeout=600.0)
                    self.warmup = {**warm[0], "threads": len(warm)}
                # from now on no other thread captures graphs: the DE's query batches (in the
                # DE thread or the request threads) would capture their own (holding the CE
                # back; the ONNX DE has none, another backend's is pinned too); without a
                # warm-up the CE workers capture theirs on first use (--no-warmup)
                for model in (ce, de) if c.warmup else (de,):
                    pin = getattr(model, "pin_graphs", None)
                    if pin is not None:
                        pin()
                batched = BatchedCE(ce, batcher)
                # (its provider context is made by the search of _measure_service_time below)
                de_run = de
                if use_de_thread(c.de_thread, getattr(de, "provider", None)):
                    de_run = self.de_thread = DEThread(de)
                searcher = crossknn.Searcher(
                    index,
                    # its own item count: a new index version may extend the CE's items while
                    # this one still serves (crossknn.serve.reload)
                    ce=VersionCE(batched),
                    de=de_run,
                    method=c.method,
                    rounds=c.rounds,
                    latency_target_ms=c.latency_target_ms,
                    target_recall=c.target_recall,
                    round_index=c.round_index,
                    shards=c.shards,
                    ray_address=c.ray_address,
                )
            except BaseException:
                batcher.stop(1.0)
                if self.de_thread is not None:
                    self.de_thread.close()
                raise
        except BaseException as exc:
            self.load_error = exc
            log.error("crossknn serve: loading failed: %s", exc)
            raise
        if c.warmup:  # the engine's caches too (the item Gram cache: ~1 s at 3.6k x 1.7k items)
            self.warmup = {**(self.warmup or {}), "engine": searcher.prepare()}
        self.index, self.ce, self.de, self.batcher, self.searcher = index, ce, de, batcher, searcher
        if self.query_log is not None:
            searcher.record_paid = True
        self.follower = IndexFollower(self, watch_s=c.watch_index_s)
        if c.group_queries > 1:
            groups = self.groups = QueryGroups(
                self._search_group, self.engine_lock, max_queries=c.group_queries
            )
            self.metrics.groups.set_function(lambda: groups.groups)
            self.metrics.grouped_queries.set_function(lambda: groups.grouped_queries)
        self.batched_ce = batched
        self.metrics.ce_session_seconds.set_function(lambda: getattr(ce, "session_seconds", 0.0))
        self.metrics.de_session_seconds.set_function(lambda: getattr(de, "session_seconds", 0.0))
        self._measure_service_time()
        # everything loaded so far lives as long as the server: out of the cyclic collector's
        # reach, so its full collections scan only what requests allocate (a full collection
        # over the loaded server took 64 ms on the 2-core machine, stopping every thread: a
        # latency tail; after the freeze, 0.0 ms)
        gc.freeze()
        self.load_seconds = time.perf_counter() - t
        self.metrics.ready.set(1)
        self.ready.set()
        self.follower.start()
        log.info(
            "crossknn serve: ready in %.1f s (%d items, CE %s %s on %s; %s)",
            self.load_seconds,
            len(index),
            ce.model_id,
            ce.precision,
            ce.provider,
            held_line(self.arrays_held),
        )

    def _measure_service_time(self) -> None:
        """One search of the default size before the first request (it also warms the models
        up): admission then knows the service time from the start, and a burst of requests at
        startup is admitted only as far as it fits its deadline."""
        budget = min(WARM_UP_BUDGET, self.n_items)
        req = SearchRequest(
            query=WARM_UP_QUERY, k=min(10, budget), budget=budget, method=self.config.method
        )
        decision = self.admission.try_admit(request_cost(1, req.budget, req.exact, self.n_items))
        ctx = RequestContext(time.monotonic() + max(self.config.timeout_s, 60.0), self.engine_lock)
        failed = False
        try:
            self.search(req, ctx)
        except Exception as exc:  # not fatal: admission starts unmeasured (cold_limit)
            failed = True
            log.warning("crossknn serve: the warm-up search failed: %s", exc)
        finally:
            self.release(decision.ticket, ctx, failed=failed)

    def start_loading(self, on_error=None) -> threading.Thread:
        def run() -> None:
            try:
                self.load()
            except BaseException as exc:
                if on_error is not None:
                    on_error(exc)

        self._loader = threading.Thread(target=run, name="crossknn-load", daemon=True)
        self._loader.start()
        return self._loader

    @property
    def n_items(self) -> int:
        return len(self.index) if self.index is not None else 0

    @property
    def metadata_fields(self) -> dict[str, str]:
        """The metadata fields a request's filter may name (name -> kind)."""
        return {} if self.index is None else self.index.metadata.fields

    @property
    def has_cur(self) -> bool:
        return self.index is not None and "R" in self.index.arrays

    @property
    def index_kinds(self) -> set[str]:
        """The method indexes the loaded index holds (crossknn.search.registry kinds)."""
        return self.searcher.index_kinds if self.searcher is not None else set()

    # -- admission ------------------------------------------------------------------------------
    def try_admit(self, req: SearchRequest) -> Decision:
        """Admit ``req`` if it fits (see :class:`~crossknn.serve.admission.Admission`)."""
        cost = request_cost(len(req.texts()), req.budget, req.exact, self.n_items)
        return self.admission.try_admit(cost)

    def try_admit_pairs(self, n_pairs: int) -> Decision:
        """Admit a ``/rerank`` request of ``n_pairs`` CE pairs."""
        return self.admission.try_admit(float(n_pairs))

    def release(self, ticket: Ticket, ctx: RequestContext, failed: bool = False) -> None:
        """The request's thread has ended; a cancelled or failed one did ``ctx.ce_pairs`` of
        its work (the rest was never run)."""
        self.admission.done(ticket, ctx.ce_pairs if failed or ctx.cancelled else None)

    @property
    def inflight(self) -> int:
        return self.admission.in_server

    def new_context(self) -> RequestContext:
        return RequestContext(time.monotonic() + self.config.timeout_s, self.engine_lock)

    # -- searching (in a request thread) --------------------------------------------------------
    def _group_key(self, req: SearchRequest) -> tuple:
        """What requests must share to be searched in one lockstep group."""
        # the early stop is one threshold per lockstep search: queries that stop at different
        # rounds stay in one group (the loop drops each as it stops)
        return (
            req.method,
            req.k,
            req.budget,
            req.rounds or self.config.rounds,
            req.seed,
            req.target_recall,
        )

    def _search_group(self, reqs: list[SearchRequest], ctx: RequestContext) -> list:
        """One lockstep search of every query of ``reqs`` (same group key), in the leading
        request's thread, holding the engine lock; per request its hits, or the exception that
        request alone raised (:class:`~crossknn.serve.groups.QueryGroups` answers it to that
        request only). A request whose allow masks cannot be made (a filter a swap made
        invalid, no memory for its ids) is left out of the lockstep search."""
        ctx.check()
        # the version serving now (the requests of the group are pinned to it or to one whose
        # items it extends: a swap that moves items waits for them, crossknn.serve.reload)
        searcher, index = self.searcher, self.index
        out: list = [None] * len(reqs)
        ok = []
        for i, r in enumerate(reqs):
            try:  # each request's own filter and ids, checked before any CE work
                searcher.allow_masks(len(r.texts()), filter=r.filter, ids=r.ids)
            except Exception as exc:
                out[i] = exc
            else:
                ok.append(i)
        if not ok:
            return out
        good = [reqs[i] for i in ok]
        first = good[0]
        texts = [t for r in good for t in r.texts()]
        filters = [r.filter for r in good for _ in r.texts()]
        ids = [r.ids for r in good for _ in r.texts()]
        hits = searcher.search(
            texts,
            k=first.k,
            budget=first.budget,
            method=first.method,
            rounds=first.rounds or self.config.rounds,
            seed=first.seed,
            target_recall=first.target_recall,
            query_batch=len(texts),
            filter=filters if any(f is not None for f in filters) else None,
            ids=ids if any(i is not None for i in ids) else None,
        )
        self._log(hits, searcher, index)
        lo = 0
        for i, r in zip(ok, good, strict=True):
            n = len(r.texts())
            out[i] = hits[lo : lo + n]
            lo += n
        return out

    def search(self, req: SearchRequest, ctx: RequestContext) -> dict[str, Any]:
        """The answer of ``crossknn search --json`` for ``req``; runs in a request thread."""
        if self.searcher is None:
            raise RuntimeError("the service is not loaded")
        t = ctx.t_started = time.perf_counter()
        # the index version this request runs on, taken before the engine lock (a swap that
        # moves items waits for the pinned requests: crossknn.serve.reload)
        with self.follower.pinned() as (searcher, index):
            # the metadata of the version the search runs on
            columns = index.metadata.columns if req.return_metadata else None
            if self.groups is not None and not req.exact:
                hits = self.groups.search(self._group_key(req), len(req.texts()), ctx, req)
            else:
                with ctx:
                    ctx.check()
                    hits = searcher.search(
                        req.texts(),
                        k=req.k,
                        budget=req.budget,
                        method=req.method,
                        rounds=req.rounds or self.config.rounds,
                        seed=req.seed,
                        exact=req.exact,
                        filter=req.filter,
                        ids=req.ids,
                        target_recall=req.target_recall,
                    )
                    self._log(hits, searcher, index)
        wall = time.perf_counter() - t
        m = self.metrics
        m.ce_wait_seconds.inc(ctx.ce_wait_seconds)
        ctx.engine_seconds = max(wall - ctx.ce_wait_seconds - ctx.lock_wait_seconds, 0.0)
        m.engine_seconds.inc(ctx.engine_seconds)
        m.engine_lock_wait_seconds.inc(ctx.lock_wait_seconds)
        m.ce_queue_seconds.inc(ctx.ce_queue_seconds)
        m.ce_run_seconds.inc(ctx.ce_run_seconds)
        m.ce_wake_seconds.inc(ctx.ce_wake_seconds)
        m.queries.inc(len(hits))
        out = [h.to_dict() for h in hits]
        if req.return_documents:
            for h, d in zip(hits, out, strict=True):
                texts = h.texts  # the item texts of the version the search ran on
                for j, row in enumerate(d["results"]):
                    row["text"] = texts[j]
        if columns is not None:
            for h, d in zip(hits, out, strict=True):
                for pos, row in zip(h.indices.tolist(), d["results"], strict=True):
                    values = {name: col.value(pos) for name, col in columns.items()}
                    row["metadata"] = {n: v for n, v in values.items() if v is not None}
        plan = hits[0].plan if hits else None  # what ran: method, rounds, steps, round choice
        ctx.plan = plan
        return {
            "method": req.method or self.searcher.method,
            "k": req.k,
            "budget": req.budget,
            "rounds": None if plan is None else plan["rounds"],
            "plan": plan,
            "hits": out,
            "index_version": getattr(hits[0], "index_version", None) if hits else None,
        }

    @property
    def index_version(self) -> int | None:
        return None if self.index is None else index_version(self.index)

    def _log(self, hits, searcher, index) -> None:
        """Stamps each hit with its index version and appends it to the query log."""
        v = index_version(index)
        for h in hits:
            h.index_version = v
        if self.query_log is not None and self.ready.is_set():  # not the load's warm-up search
            try:
                self.query_log.append_hits(
                    hits,
                    searcher.corpus.ids,
                    searcher.corpus.texts,
                    index_version=v,
                    de_model_hash=getattr(searcher.de, "model_hash", None),
                    ce_model_hash=getattr(searcher.ce, "model_hash", None),
                )
            except OSError as exc:  # a full disk must not fail the answer (the record waits)
                log.error("crossknn serve: --log-queries: %s", exc)

    def rerank(self, req: RerankRequest, ctx: RequestContext) -> Any:
        """The ``/rerank`` answer: the texts by CE score, best first (ties: lower index first),
        TEI-shaped, or Cohere-shaped when the request used ``documents``."""
        if self.searcher is None:
            raise RuntimeError("the service is not loaded")
        ctx.t_started = time.perf_counter()
        texts = req.all_texts()
        with ctx:
            ctx.check()
            scores = np.asarray(self.batched_ce.score_texts(req.query, texts), np.float32)
        order = np.argsort(-scores, kind="stable")[: req.keep()]
        self.metrics.queries.inc()
        with_text = req.with_text()
        if req.cohere:
            results = []
            for i in order:
                row: dict[str, Any] = {"index": int(i), "relevance_score": float(scores[i])}
                if with_text:
                    row["document"] = {"text": texts[i]}
                results.append(row)
            return {"results": results}
        out = []
        for i in order:
            row = {"index": int(i), "score": float(scores[i])}
            if with_text:
                row["text"] = texts[i]
            out.append(row)
        return out

    # -- description ----------------------------------------------------------------------------
    def info(self) -> dict[str, Any]:
        c = self.config
        out: dict[str, Any] = {
            "crossknn": crossknn.__version__,
            "ready": self.ready.is_set(),
            "pid": os.getpid(),
            "uptime_s": round(time.time() - self.started, 1),
            "config": asdict(c),
        }
        if self.index is not None:
            idx = self.index
            out["index"] = {
                "path": str(Path(c.index).resolve()),
                "n_items": len(idx),
                "removed_items": self.searcher.n_dead if self.searcher is not None else None,
                "metadata_fields": idx.metadata.fields,
                "items_sha256": idx.info.get("items_sha256"),
                "arrays": sorted(idx.arrays),
                # "memory" (read at load) or "mapped" (crossknn.serve.arrays)
                "arrays_held": (self.arrays_held or {}).get("held"),
                "params": {k: v for k, v in idx.params.items() if k != "calibration"},
                "methods": registry.available(self.index_kinds),
                "version": index_version(idx),
                "history": (idx.info.get("history") or [])[-10:],
            }
        if self.follower is not None:
            out["reload"] = self.follower.info()
            out["index"]["index_id"] = out["reload"]["index_id"]
        if self.ce is not None:
            out["models"] = {"ce": _model_info(self.ce), "de": _model_info(self.de)}
            out["precision"] = self.ce.precision
            out["provider"] = self.ce.provider
            out["load_seconds"] = round(self.load_seconds or 0.0, 2)
            out["warmup"] = self.warmup
        if self.batcher is not None:  # what the defaults resolved to on this provider
            out["batcher"] = {
                "max_batch_pairs": self.batcher.max_batch_pairs,
                "workers": self.batcher.workers,
                "de_thread": self.de_thread is not None,
            }
        if self.searcher is not None:  # what the rounds scan: exact, a FAISS index or shards
            rf = self.searcher.round_features
            out["round_features"] = {
                "kind": type(rf).__name__,
                "shards": len(getattr(rf, "actors", ())),
            }
            # the plan a default request (budget 100, or the corpus) runs, and the round cost
            # auto's rounds were chosen under (measured at load; None: no latency target)
            s = self.searcher
            try:
                out["plan"] = s.plan_info(budget=min(100, s.n_items))
            except ValueError as exc:  # a method that cannot run at that budget
                out["plan"] = {"error": str(exc)}
            cost = getattr(s, "_round_cost", None)
            out["round_cost_ms"] = None if cost is None else cost.to_dict()
            out["latency_target_ms"] = s.latency_target_ms
        if self.query_log is not None:
            out["query_log"] = self.query_log.info()
        if self.load_error is not None:
            out["load_error"] = str(self.load_error)
        return out

    def close(self, timeout: float = 10.0) -> None:
        """After the HTTP server has drained: finish request threads, stop the CE worker."""
        if self.follower is not None:
            self.follower.stop()
        self.executor.shutdown(wait=True, cancel_futures=True)
        if self.query_log is not None:
            self.query_log.close()
        if self.batcher is not None:
            self.batcher.stop(timeout)
        if self.de_thread is not None:
            self.de_thread.close()
