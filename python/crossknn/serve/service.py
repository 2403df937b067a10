"""The search service behind the HTTP app: models, index, batcher, admission, request threads.

:class:`SearchService` owns one :class:`crossknn.Searcher` built with a
:class:`~crossknn.serve.proxy.BatchedCE`, the :class:`~crossknn.serve.batcher.Batcher` that runs
the real CE, a pool of request threads (each request's search runs in one, off the event loop)
and the admission count behind ``--max-queue``. It knows nothing about HTTP.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from crossknn.search import registry
from crossknn.serve.batcher import Batcher
from crossknn.serve.metrics import Metrics
from crossknn.serve.proxy import BatchedCE, RequestContext
from crossknn.serve.schema import SearchRequest

__all__ = ["ServeConfig", "SearchService"]

log = logging.getLogger("crossknn.serve")

# DE query vectors the searcher keeps between requests (each ~1.5 KB); cleared beyond this
QUERY_VECTOR_CACHE = 10_000


@dataclass
class ServeConfig:
    """Everything ``crossknn serve`` is told on its command line (see docs/serve.md)."""

    index: str
    model: str | None = None  # a crossknn or HF CE folder; default: the index's CE
    precision: str | None = None  # default: the index's
    de_model: str | None = (
        None  # a crossknn / sentence-transformers DE folder; default: the index's
    )
    provider: str = "auto"
    threads: int | None = None  # CE (and DE) intra-op threads; None: one per physical core
    max_batch_pairs: int = 256  # 0: no cross-request merging
    max_wait_ms: float = 2.0
    max_queue: int = 64
    timeout_s: float = 30.0
    max_body_bytes: int = 1 << 20
    method: str | None = None  # None: the index's default (auto when built with it, else axn)
    rounds: int = 5
    max_rounds: int = 20  # each distinct rounds value keeps a method object (and its features)
    round_index: str = "auto"  # the folder's MIPS round index (auto), or exact rounds
    shards: int = 0  # > 0: the items sharded over this many Ray actors
    ray_address: str | None = None  # the Ray cluster of the shards (default: a local one)

    def __post_init__(self) -> None:
        checks = [
            ("max_batch_pairs", self.max_batch_pairs >= 0),
            ("max_wait_ms", self.max_wait_ms >= 0),
            ("max_queue", self.max_queue >= 1),
            ("timeout_s", self.timeout_s > 0),
            ("max_body_bytes", self.max_body_bytes >= 1024),
            ("threads", self.threads is None or self.threads >= 1),
            ("rounds", 1 <= self.rounds <= self.max_rounds),
            ("shards", self.shards >= 0),
            ("round_index", self.round_index in ("auto", "exact", "ivf", "hnsw")),
        ]
        for name, ok in checks:
            if not ok:
                raise ValueError(f"serve: {name}={getattr(self, name)!r} is out of range")
        from crossknn.ce.models import PRECISIONS

        if self.precision is not None and self.precision not in PRECISIONS:
            raise ValueError(
                f"serve: precision must be one of {PRECISIONS}; got {self.precision!r}"
            )


def _model_info(m) -> dict[str, Any]:
    keys = ("model_id", "model_hash", "kind", "precision", "provider", "max_length", "dim")
    return {k: getattr(m, k) for k in keys if getattr(m, k, None) is not None}


class SearchService:
    """See the module docstring. ``load()`` (or ``start_loading()``) before ``search``."""

    def __init__(self, config: ServeConfig, *, index=None, metrics: Metrics | None = None):
        self.config = config
        self.metrics = metrics or Metrics()
        self._index = index  # an already opened crossknn index (the CLI opens it up front)
        self.index = None
        self.searcher = None
        self.batcher: Batcher | None = None
        self.ce = None
        self.de = None
        self.engine_lock = threading.Lock()
        self.executor = ThreadPoolExecutor(
            max_workers=config.max_queue, thread_name_prefix="crossknn-req"
        )
        self.ready = threading.Event()
        self.load_error: BaseException | None = None
        self.load_seconds: float | None = None
        self.started = time.time()
        self._inflight = 0
        self._mu = threading.Lock()
        self._loader: threading.Thread | None = None
        self.metrics.inflight.set_function(lambda: self._inflight)
        self.metrics.pending_pairs.set_function(
            lambda: self.batcher.pending_pairs if self.batcher is not None else 0
        )

    # -- loading --------------------------------------------------------------------------------
    def load(self) -> None:
        import crossknn
        from crossknn.searcher import open_models

        t = time.perf_counter()
        c = self.config
        try:
            index = self._index if self._index is not None else crossknn.open_index(c.index)
            threads = c.threads
            ce, de = open_models(
                index,
                model=c.model,
                de_model=c.de_model,
                precision=c.precision,
                provider=c.provider,
                threads=threads,
            )
            m = self.metrics
            batcher = Batcher(
                ce,
                max_batch_pairs=c.max_batch_pairs,
                max_wait_s=c.max_wait_ms / 1000.0,
                on_batch=m.on_batch,
                on_drop=m.on_drop,
                active=lambda: self._inflight,
            )
            try:
                searcher = crossknn.Searcher(
                    index,
                    ce=BatchedCE(ce, batcher),
                    de=de,
                    method=c.method,
                    rounds=c.rounds,
                    round_index=c.round_index,
                    shards=c.shards,
                    ray_address=c.ray_address,
                )
            except BaseException:
                batcher.stop(1.0)
                raise
        except BaseException as exc:
            self.load_error = exc
            log.error("crossknn serve: loading failed: %s", exc)
            raise
        self.index, self.ce, self.de, self.batcher, self.searcher = index, ce, de, batcher, searcher
        self.load_seconds = time.perf_counter() - t
        self.metrics.ready.set(1)
        self.ready.set()
        log.info(
            "crossknn serve: ready in %.1f s (%d items, CE %s %s on %s)",
            self.load_seconds,
            len(index),
            ce.model_id,
            ce.precision,
            ce.provider,
        )

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
    def has_cur(self) -> bool:
        return self.index is not None and "R" in self.index.arrays

    @property
    def index_kinds(self) -> set[str]:
        """The method indexes the loaded index holds (crossknn.search.registry kinds)."""
        return self.searcher.index_kinds if self.searcher is not None else set()

    # -- admission ------------------------------------------------------------------------------
    def try_admit(self) -> bool:
        with self._mu:
            if self._inflight >= self.config.max_queue:
                return False
            self._inflight += 1
            return True

    def release(self) -> None:
        with self._mu:
            self._inflight -= 1

    @property
    def inflight(self) -> int:
        return self._inflight

    def new_context(self) -> RequestContext:
        return RequestContext(time.monotonic() + self.config.timeout_s, self.engine_lock)

    # -- searching (in a request thread) --------------------------------------------------------
    def _trim_caches(self) -> None:
        # the searcher keeps every query's DE vector; a long-running service must bound that.
        # Safe here: the engine lock is held, so no other request is inside the searcher.
        cache = getattr(getattr(self.searcher, "qvec", None), "cache", None)
        if isinstance(cache, dict) and len(cache) > QUERY_VECTOR_CACHE:
            cache.clear()

    def search(self, req: SearchRequest, ctx: RequestContext) -> dict[str, Any]:
        """The answer of ``crossknn search --json`` for ``req``; runs in a request thread."""
        if self.searcher is None:
            raise RuntimeError("the service is not loaded")
        t = time.perf_counter()
        with ctx:
            ctx.check()
            self._trim_caches()
            hits = self.searcher.search(
                req.texts(),
                k=req.k,
                budget=req.budget,
                method=req.method,
                rounds=req.rounds or self.config.rounds,
                seed=req.seed,
                exact=req.exact,
            )
        wall = time.perf_counter() - t
        m = self.metrics
        m.ce_wait_seconds.inc(ctx.ce_wait_seconds)
        m.engine_seconds.inc(max(wall - ctx.ce_wait_seconds, 0.0))
        m.queries.inc(len(hits))
        return {
            "method": req.method or self.searcher.method,
            "k": req.k,
            "budget": req.budget,
            "hits": [h.to_dict() for h in hits],
        }

    # -- description ----------------------------------------------------------------------------
    def info(self) -> dict[str, Any]:
        import crossknn

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
                "items_sha256": idx.info.get("items_sha256"),
                "arrays": sorted(idx.arrays),
                "params": {k: v for k, v in idx.params.items() if k != "calibration"},
                "methods": registry.available(self.index_kinds),
            }
        if self.ce is not None:
            out["models"] = {"ce": _model_info(self.ce), "de": _model_info(self.de)}
            out["precision"] = self.ce.precision
            out["provider"] = self.ce.provider
            out["load_seconds"] = round(self.load_seconds or 0.0, 2)
        if self.searcher is not None:  # what the rounds scan: exact, a FAISS index or shards
            rf = self.searcher.round_features
            out["round_features"] = {
                "kind": type(rf).__name__,
                "shards": len(getattr(rf, "actors", ())),
            }
        if self.load_error is not None:
            out["load_error"] = str(self.load_error)
        return out

    def close(self, timeout: float = 10.0) -> None:
        """After the HTTP server has drained: finish request threads, stop the CE worker."""
        self.executor.shutdown(wait=True, cancel_futures=True)
        if self.batcher is not None:
            self.batcher.stop(timeout)
