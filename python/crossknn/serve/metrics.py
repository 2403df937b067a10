"""Prometheus metrics of the service, in a registry of its own (one per app instance)."""

from __future__ import annotations

import threading
import time
from collections import deque

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

__all__ = ["CONTENT_TYPE_LATEST", "Metrics"]

_LATENCY_BUCKETS = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.25,
    0.4,
    0.6,
    1.0,
    1.5,
    2.5,
    4.0,
    6.0,
    10.0,
    20.0,
    30.0,
    60.0,
)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 2048)


class Metrics:
    """Requests by status, latency, CE pairs and batch sizes, queue depth, engine vs CE time."""

    WINDOW_S = 10.0  # crossknn_ce_pairs_per_second: CE pairs over the last WINDOW_S seconds

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter(
            "crossknn_requests",
            "HTTP requests by path and status code",
            ["path", "status"],
            registry=r,
        )
        self.latency = Histogram(
            "crossknn_request_latency_seconds",
            "latency of POST /search (whole request)",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.queries = Counter("crossknn_queries", "queries answered", registry=r)
        self.ce_pairs = Counter(
            "crossknn_ce_pairs", "(query, item) pairs scored by the CE", registry=r
        )
        self.ce_pairs_per_second = Gauge(
            "crossknn_ce_pairs_per_second",
            "CE pairs/s over the last 10 s",
            registry=r,
        )
        self.ce_batches = Counter(
            "crossknn_ce_batches", "CE batches run by the batcher", registry=r
        )
        self.ce_batch_pairs = Histogram(
            "crossknn_ce_batch_pairs",
            "pairs per CE batch (merged over requests)",
            buckets=_BATCH_BUCKETS,
            registry=r,
        )
        self.ce_batch_requests = Histogram(
            "crossknn_ce_batch_requests",
            "requests whose pairs share one CE batch",
            buckets=(1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 128),
            registry=r,
        )
        self.ce_dropped_pairs = Counter(
            "crossknn_ce_dropped_pairs",
            "pairs not run because their request was cancelled",
            registry=r,
        )
        self.ce_seconds = Counter(
            "crossknn_ce_seconds", "seconds the CE worker spent scoring", registry=r
        )
        self.ce_wait_seconds = Counter(
            "crossknn_ce_wait_seconds",
            "seconds requests waited for CE scores (queue + CE)",
            registry=r,
        )
        self.engine_seconds = Counter(
            "crossknn_engine_seconds",
            "seconds requests ran engine steps (rounds, DE query vectors, top-k): their time "
            "outside the CE and outside the engine lock's queue",
            registry=r,
        )
        # where a request's time went besides its engine steps (seconds, summed over requests)
        split = {
            "engine_lock_wait": "requests waited for the engine lock (another request's or "
            "group's engine step; a follower's wait for its group to start included)",
            "ce_queue": "requests' CE pairs waited for their batch to start",
            "ce_run": "from the start of a request's CE batch to the end of its pairs",
            "ce_wake": "from the end of a request's CE pairs until its thread ran again",
        }
        for name, what in split.items():
            counter = Counter(f"crossknn_{name}_seconds", f"seconds {what}", registry=r)
            setattr(self, f"{name}_seconds", counter)
        gauges = {  # read at scrape time (set_function, by the service)
            "groups": (
                "crossknn_search_groups",
                "searches run by the engine (a lockstep group of requests, or a request alone)",
            ),
            "grouped_queries": (
                "crossknn_grouped_queries",
                "queries searched in lockstep groups of two or more requests",
            ),
            "ce_session_seconds": (
                "crossknn_ce_session_seconds",
                "seconds the CE spent inside its runtime's session runs (the device call; the "
                "rest of crossknn_ce_seconds is host work: pairs, padding, feeds, copies)",
            ),
            "de_session_seconds": (
                "crossknn_de_session_seconds",
                "seconds the DE spent inside its runtime's session runs (query vectors; on a GPU "
                "with CUDA graphs every session run of the process takes one lock, so these "
                "seconds also delay the CE's)",
            ),
        }
        for attr, (name, what) in gauges.items():
            setattr(self, attr, Gauge(name, what, registry=r))
        self.inflight = Gauge(
            "crossknn_queue_depth", "requests admitted and not finished", registry=r
        )
        self.pending_pairs = Gauge(
            "crossknn_ce_pending_pairs", "pairs waiting for the CE", registry=r
        )
        self.rejected = Counter(
            "crossknn_rejected",
            "requests refused with 429 (queue full or expected to miss their deadline)",
            registry=r,
        )
        self.rejected_deadline = Counter(
            "crossknn_rejected_deadline",
            "requests refused with 429 because their expected time in the server did not fit "
            "in --admit-within x --timeout-s",
            registry=r,
        )
        self.service_seconds_per_pair = Gauge(
            "crossknn_service_seconds_per_pair",
            "measured service time per CE pair a request asks for (moving average; 0: none yet)",
            registry=r,
        )
        self.timeouts = Counter(
            "crossknn_timeouts", "requests cancelled at the timeout (504)", registry=r
        )
        self.disconnects = Counter(
            "crossknn_client_disconnects",
            "requests whose client left before the answer",
            registry=r,
        )
        self.ready = Gauge("crossknn_ready", "1 when the index and models are loaded", registry=r)
        self._window: deque[tuple[float, int]] = deque()  # (time, pairs) of the last WINDOW_S
        self._mu = threading.Lock()
        self.ce_pairs_per_second.set_function(self._pairs_per_second)

    def on_batch(self, n_pairs: int, n_jobs: int, seconds: float) -> None:
        self.ce_pairs.inc(n_pairs)
        self.ce_batches.inc()
        self.ce_batch_pairs.observe(n_pairs)
        self.ce_batch_requests.observe(n_jobs)
        self.ce_seconds.inc(seconds)
        now = time.monotonic()
        with self._mu:
            self._window.append((now, n_pairs))
            self._trim(now)  # bounded whether or not /metrics is ever scraped

    def _trim(self, now: float) -> None:
        while self._window and self._window[0][0] < now - self.WINDOW_S:
            self._window.popleft()

    def _pairs_per_second(self) -> float:
        now = time.monotonic()
        with self._mu:
            self._trim(now)
            return sum(n for _, n in self._window) / self.WINDOW_S

    def on_drop(self, n_pairs: int) -> None:
        self.ce_dropped_pairs.inc(n_pairs)

    def render(self) -> bytes:
        return generate_latest(self.registry)
