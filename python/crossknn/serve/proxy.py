"""The CE proxy a shared :class:`crossknn.Searcher` calls: its CE work goes to the batcher.

The searcher stays untouched: it is built with a :class:`BatchedCE` instead of the real
cross-encoder. The proxy forwards the identity of the real CE (``model_id``, ``model_hash``,
``precision``, ``provider``, ``n_items``...) so the index's model check sees the real model, and
its ``score_batch`` hands the pairs to the :class:`~crossknn.serve.batcher.Batcher` and blocks
the calling request thread until the scores are back.

Concurrency. Each request's search runs in a worker thread; the searcher's own state (its cached
method objects, the DE query-vector cache, ANNCUR's per-budget anchors) is not meant for
concurrent use, so every request thread holds the *engine lock* while it runs searcher code and
gives it up only while it waits for the CE. Engine steps (least squares, top-k, sampling, DE
query encoding) of different requests therefore run one at a time, exactly as between two
sequential calls, while their CE work is merged in the batcher. The lock also keeps the engine's
own threads from being multiplied by the number of requests.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any

from crossknn.serve.batcher import Batcher, Cancelled, Job

__all__ = ["BatchedCE", "RequestContext", "bind", "current_request"]

_local = threading.local()


class RequestContext:
    """One request's deadline, cancellation flag and time split, bound to its worker thread."""

    def __init__(self, deadline: float, engine_lock) -> None:
        self.deadline = float(deadline)  # time.monotonic() clock
        self.engine_lock = engine_lock
        # the engine lock's order (crossknn.serve.engine_lock "oldest"): admitted first, first
        self.priority = time.monotonic()
        self.holds_engine = False
        self.cancelled = False
        self.reason = ""
        # where the request's time went (seconds, summed over its CE jobs): waiting for the
        # engine lock; its CE pairs queued before their batch started; that batch (or batches)
        # running; from the job's end until this thread ran again
        self.ce_wait_seconds = 0.0
        self.lock_wait_seconds = 0.0
        self.ce_queue_seconds = 0.0
        self.ce_run_seconds = 0.0
        self.ce_wake_seconds = 0.0
        # perf_counter when the search began in its thread (None: not yet), and its engine time
        self.t_started: float | None = None
        self.engine_seconds = 0.0
        self.ce_pairs = 0
        self.plan: dict | None = None  # what a /search ran (Searcher.plan_info): Server-Timing
        self._job: Job | None = None
        self._mu = threading.Lock()

    def cancel(self, reason: str = "cancelled") -> None:
        """Mark the request cancelled and wake its thread if it waits for the CE."""
        with self._mu:
            if not self.cancelled:
                self.cancelled, self.reason = True, reason
            job = self._job
        if job is not None:
            job.done.set()

    def attach(self, waiter) -> None:
        """``waiter`` (anything with a ``done`` event; None: detach) is woken by :meth:`cancel`
        (at once if the request is cancelled already)."""
        with self._mu:
            self._job = waiter
        if waiter is not None and self.cancelled:
            waiter.done.set()

    def server_timing(self, t_received: float) -> str:
        """The request's time split as an HTTP ``Server-Timing`` header value (ms): ``start``
        from its arrival (``t_received``, perf_counter) to its search starting in a thread
        (body, admission, a free thread), then ``lock`` waiting for the engine (or its query
        group), ``engine`` steps, its CE pairs queued (``ce_queue``), their batches running
        (``ce_run``), waking after them (``ce_wake``), and ``total``; after a search, ``plan``
        with the method, its rounds and why (``desc="auto rounds=8 by=latency_target"``)."""
        now = time.perf_counter()
        start = (self.t_started if self.t_started is not None else now) - t_received
        parts = (
            ("start", start),
            ("lock", self.lock_wait_seconds),
            ("engine", self.engine_seconds),
            ("ce_queue", self.ce_queue_seconds),
            ("ce_run", self.ce_run_seconds),
            ("ce_wake", self.ce_wake_seconds),
            ("total", now - t_received),
        )
        out = ", ".join(f"{name};dur={1e3 * max(sec, 0.0):.2f}" for name, sec in parts)
        if self.plan is not None:
            p = self.plan
            by = (p.get("round_choice") or {}).get("by", "method")
            out += f', plan;desc="{p["method"]} rounds={p["rounds"]} by={by}"'
        return out

    def check(self) -> None:
        if self.cancelled:
            raise Cancelled(self.reason)
        if time.monotonic() >= self.deadline:
            self.cancel("timeout")
            raise Cancelled("timeout")

    # the worker-thread binding -----------------------------------------------------------
    def _take_engine(self) -> None:
        t = time.perf_counter()
        take = getattr(self.engine_lock, "acquire_for", None)
        if take is not None:
            take(self.priority)
        else:
            self.engine_lock.acquire()
        self.lock_wait_seconds += time.perf_counter() - t
        self.holds_engine = True

    def __enter__(self) -> RequestContext:
        _local.ctx = self
        self._take_engine()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.holds_engine:
            self.holds_engine = False
            self.engine_lock.release()
        _local.ctx = None

    def wait_for(self, job: Job):
        """Wait for ``job`` with the engine lock released; the lock is held again after."""
        with self._mu:
            self._job = job
        if self.cancelled:  # cancelled before the job was registered: nothing will wake us
            job.done.set()
        released = self.holds_engine
        if released:
            self.holds_engine = False
            self.engine_lock.release()
        t = time.perf_counter()
        try:
            left = self.deadline - time.monotonic()
            if left <= 0 or not job.done.wait(left):
                self.cancel("timeout")
            return job.wait(0)
        finally:
            now = time.perf_counter()
            self.ce_wait_seconds += now - t
            if job.t_done is not None:
                # the split of this wait (from t): what passed before it (the job submitted,
                # even started, while the engine still ran) is the engine's time, not the CE's
                start = job.t_start if job.t_start is not None else job.t_done
                q0 = max(job.t_submit, t)
                s0, d0 = max(start, q0), max(job.t_done, q0)
                self.ce_queue_seconds += s0 - q0
                self.ce_run_seconds += d0 - s0
                self.ce_wake_seconds += max(now - d0, 0.0)
            with self._mu:
                self._job = None
            if released:
                self._take_engine()


def current_request() -> RequestContext | None:
    return getattr(_local, "ctx", None)


@contextlib.contextmanager
def bind(ctx: RequestContext, *, holding: bool):
    """Bind ``ctx`` to this thread (the CE proxy finds it) without taking the engine lock:
    ``holding`` says whether this thread holds it already (it is held again on exit, and not
    released: the caller that took it releases it)."""
    _local.ctx = ctx
    ctx.holds_engine = holding
    try:
        yield ctx
    finally:
        ctx.holds_engine = False
        _local.ctx = None


class BatchedCE:
    """A cross-encoder stand-in whose scoring goes through a shared :class:`Batcher`.

    Outside a request (no :class:`RequestContext` bound to the thread) it scores through the
    batcher too, with no deadline.
    """

    def __init__(self, ce, batcher: Batcher) -> None:
        self._ce = ce
        self._batcher = batcher

    # identity: whatever the real CE says (model_id, model_hash, precision, provider, kind...)
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self._ce, name)

    @property
    def real(self):
        return self._ce

    @property
    def n_items(self) -> int:
        return int(self._ce.n_items)

    def __repr__(self) -> str:
        return f"BatchedCE({self._ce!r}, max_batch_pairs={self._batcher.max_batch_pairs})"

    def set_items(self, texts) -> None:
        self._ce.set_items(texts)

    def score(self, query: str, items):
        return self.score_batch([query], [items])[0]

    def score_batch(self, queries, items):
        return self._run(queries, items, None)

    def score_texts(self, query: str, texts):
        """The CE's scores of ``(query, text)`` for each text (``ce.predict``'s, with the
        model's activation), through the batcher as a text job."""
        return self._run([query], None, list(texts))[0]

    def _run(self, queries, items, texts):
        ctx = current_request()
        if ctx is None:
            job = self._batcher.submit(queries, items, texts=texts)
            return job.wait(None)
        ctx.check()
        job = self._batcher.submit(queries, items, is_cancelled=lambda: ctx.cancelled, texts=texts)
        out = ctx.wait_for(job)
        ctx.ce_pairs += job.n_pairs
        return out
