"""The cross-request CE batcher: one worker thread owns the cross-encoder.

Every CE call of every in-flight request (one ``score_batch`` per search round) becomes a
:class:`Job`. The worker takes the oldest pending pairs, waits at most ``max_wait_s`` (counted from
the arrival of the oldest pending pair) for more to arrive (only while some request in flight
has no work pending: ``active()`` says how many are in flight, so a lone request never waits),
merges up to ``max_batch_pairs`` pairs from any number of jobs into one ``ce.score_batch`` call
(the CE sorts all of them by length and pads each of its inner batches only to its longest pair)
and scatters the scores back to each job's own slots. A job larger than ``max_batch_pairs`` is
cut into pieces that may share batches with other jobs.

``max_batch_pairs=0`` turns merging off: the worker runs one job at a time, first come first
served, on the same CE and thread count (the baseline of the load benchmark).

A second job kind, a *text job* (``POST /rerank``), holds one query and arbitrary texts instead
of item indices: its pieces queue with the others, and every batch runs its text pieces in one
``ce.predict`` call (the model's activation applied, as ``ce.rank``) beside the one
``score_batch`` call of its item pieces.

A job whose request was cancelled (timeout, client gone) is dropped before its pairs are run. A
merged batch that fails is run again job by job: only the job whose own pairs fail gets the
error, never the requests it happened to share a batch with.
Text pairs can be long (a ``/rerank`` text of hundreds of tokens), so the text pieces of a batch
run in chunks of at most ``text_chunk_pairs`` pairs (default: twice the CE's batch size), the
cancellation checked before each: a client that leaves costs at most one chunk more of CE work.
With one worker (``workers=1``, the CPU default) only this thread calls the CE, so the CE's
intra-op thread count, fixed once when it was loaded, is all the CPU the CE ever takes, whatever
the number of concurrent requests.

``workers=2`` (for a GPU) pipelines the host and the device: while one worker's batch runs on the
device (the session run releases the interpreter lock; the device runs one batch at a time), the
other forms the next batch and prepares its inputs (pairs gathered from the token cache, padding,
the copy of the scores back). One worker at a time forms a batch, so batches still merge
everything that is pending.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["Batcher", "Cancelled", "Job"]

log = logging.getLogger("crossknn.serve")


class Cancelled(Exception):
    """The request this CE work belonged to was cancelled (timeout or client gone)."""


@dataclass(eq=False)
class Job:
    """One ``score_batch`` call of one request: queries, their item indices, the scores."""

    queries: list[str]
    items: list[np.ndarray]
    is_cancelled: Callable[[], bool] = lambda: False
    out: list[np.ndarray] = field(default_factory=list)
    remaining: int = 0
    error: BaseException | None = None
    texts: list[str] | None = None  # a text job: pairs (queries[0], texts[i]), items = arange
    done: threading.Event = field(default_factory=threading.Event)
    # perf_counter times: submitted, its first batch started, its last piece finished
    t_submit: float = 0.0
    t_start: float | None = None
    t_done: float | None = None

    @property
    def n_pairs(self) -> int:
        return int(sum(len(x) for x in self.items))

    def wait(self, timeout: float | None = None) -> list[np.ndarray]:
        """The scores, in the order of ``items``; :class:`Cancelled` if the request was."""
        self.done.wait(timeout)
        if self.is_cancelled():
            raise Cancelled("request cancelled")
        if not self.done.is_set():
            raise TimeoutError("CE work did not finish in time")
        if self.error is not None:
            raise self.error
        return self.out


@dataclass(eq=False)
class _Piece:
    """Pairs ``items[q][lo:hi]`` of one job: the unit the worker packs into batches."""

    job: Job
    q: int
    lo: int
    hi: int
    t_arrival: float

    @property
    def n(self) -> int:
        return self.hi - self.lo


class Batcher:
    """Runs the CE for all requests in one worker thread; see the module docstring.

    ``on_batch(n_pairs, n_jobs, seconds)`` is called after every CE batch (metrics);
    ``on_drop(n_pairs)`` for pairs dropped because their request was cancelled.
    """

    def __init__(
        self,
        ce,
        *,
        max_batch_pairs: int = 256,
        max_wait_s: float = 0.002,
        on_batch: Callable[[int, int, float], None] | None = None,
        on_drop: Callable[[int], None] | None = None,
        active: Callable[[], int] | None = None,
        name: str = "crossknn-ce",
        workers: int = 1,
        warmup: Callable[[], Any] | None = None,
        text_chunk_pairs: int | None = None,
    ) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1; got {workers}")
        if max_batch_pairs < 0:
            raise ValueError(f"max_batch_pairs must be >= 0 (0: no merging); got {max_batch_pairs}")
        if max_wait_s < 0:
            raise ValueError(f"max_wait_s must be >= 0; got {max_wait_s}")
        self.ce = ce
        self.max_batch_pairs = int(max_batch_pairs)
        self.max_wait_s = float(max_wait_s)
        self.on_batch = on_batch
        self.on_drop = on_drop
        if text_chunk_pairs is None:
            text_chunk_pairs = 2 * int(getattr(ce, "batch_size", 16) or 16)
        if text_chunk_pairs < 1:
            raise ValueError(f"text_chunk_pairs must be >= 1; got {text_chunk_pairs}")
        self.text_chunk_pairs = int(text_chunk_pairs)
        self.active = active
        self._pending: deque[_Piece] = deque()
        self._pending_pairs = 0
        self._cv = threading.Condition()
        self._forming = threading.Lock()  # one worker at a time forms a batch
        self._done_lock = threading.Lock()  # a job's pieces may finish on different workers
        self._stop = False
        self.workers = int(workers)
        # run by each worker thread before its first batch (a GPU's CUDA graphs are per thread)
        self._warmup = warmup
        self._warm: list[Any] = []
        self._warm_done = threading.Semaphore(0)
        self._threads = [
            threading.Thread(target=self._loop, name=f"{name}-{i}", daemon=True)
            for i in range(self.workers)
        ]
        for t in self._threads:
            t.start()

    def wait_warm(self, timeout: float | None = None) -> list[Any]:
        """What ``warmup`` returned in each worker thread, once all of them ran it (an exception
        raised there is raised here); ``[]`` without a warm-up."""
        if self._warmup is None:
            return []
        end = None if timeout is None else time.monotonic() + timeout
        for _ in range(self.workers):
            left = None if end is None else max(0.0, end - time.monotonic())
            if not self._warm_done.acquire(timeout=left):
                raise TimeoutError(f"the CE workers' warm-up did not finish in {timeout} s")
        for got in self._warm:
            if isinstance(got, BaseException):
                raise got
        return list(self._warm)

    @property
    def merging(self) -> bool:
        return self.max_batch_pairs > 0

    @property
    def pending_pairs(self) -> int:
        return self._pending_pairs

    # -- request side ---------------------------------------------------------------------------
    def submit(
        self,
        queries: Sequence[str],
        items: Sequence,
        *,
        is_cancelled: Callable[[], bool] = lambda: False,
        texts: Sequence[str] | None = None,
    ) -> Job:
        """``texts``: a text job (one query against these texts; ``items`` is ignored)."""
        queries = list(queries)
        if texts is not None:
            if len(queries) != 1:
                raise ValueError(f"a text job has one query; got {len(queries)}")
            texts = list(texts)
            items = [np.arange(len(texts), dtype=np.int64)]
        items = [np.asarray(x, np.int64).ravel() for x in items]
        if len(queries) != len(items):
            raise ValueError(f"queries and items differ in length: {len(queries)} vs {len(items)}")
        job = Job(queries, items, is_cancelled, texts=texts)
        job.out = [np.empty(len(x), np.float32) for x in items]
        now = job.t_submit = time.perf_counter()
        step = self.max_batch_pairs if self.merging else None
        if texts is not None:  # text pieces are run (and their cancellation seen) chunk by chunk
            step = min(step or self.text_chunk_pairs, self.text_chunk_pairs)
        pieces = []
        for q, x in enumerate(items):
            n = len(x)
            cut = step or max(n, 1)
            pieces.extend(_Piece(job, q, lo, min(n, lo + cut), now) for lo in range(0, n, cut))
        job.remaining = len(pieces)
        if not pieces:
            job.done.set()
            return job
        with self._cv:
            if self._stop:
                raise RuntimeError("the CE batcher is stopped")
            self._pending.extend(pieces)
            self._pending_pairs += sum(p.n for p in pieces)
            self._cv.notify()
        return job

    def stop(self, timeout: float | None = 10.0) -> None:
        """Finish the pending work, then end the worker thread."""
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        end = None if timeout is None else time.monotonic() + timeout
        for t in self._threads:
            t.join(None if end is None else max(0.0, end - time.monotonic()))

    # -- worker side ----------------------------------------------------------------------------
    def _take(self) -> list[_Piece] | None:
        """The next batch of pieces (None: stopped and nothing left)."""
        with self._forming:
            return self._form()

    def _form(self) -> list[_Piece] | None:
        with self._cv:
            while not self._pending:
                if self._stop:
                    return None
                self._cv.wait()
            if not self.merging:  # one job, all of its pieces
                job = self._pending[0].job
                batch = [p for p in self._pending if p.job is job]
                self._pending = deque(p for p in self._pending if p.job is not job)
                self._pending_pairs -= sum(p.n for p in batch)
                return batch
            deadline = self._pending[0].t_arrival + self.max_wait_s
            while self._pending_pairs < self.max_batch_pairs and not self._stop:
                left = deadline - time.perf_counter()
                if left <= 0 or not self._others_may_come():
                    break
                self._cv.wait(left)
            batch, total = [], 0
            while self._pending and total + self._pending[0].n <= self.max_batch_pairs:
                p = self._pending.popleft()
                batch.append(p)
                total += p.n
            self._pending_pairs -= total
            return batch

    def _others_may_come(self) -> bool:
        """False when every active request already has work pending: waiting cannot fill the
        batch (a lone request is never delayed)."""
        if self.active is None:
            return True
        return len({id(p.job) for p in self._pending}) < self.active()

    def _finish(self, piece: _Piece) -> None:
        job = piece.job
        with self._done_lock:
            job.remaining -= 1
            last = job.remaining == 0
        if last:
            job.t_done = time.perf_counter()
            job.done.set()

    def _run_items(self, pieces: list[_Piece]) -> list[np.ndarray]:
        return self.ce.score_batch(
            [p.job.queries[p.q] for p in pieces],
            [p.job.items[p.q][p.lo : p.hi] for p in pieces],
        )

    def _run_texts(self, pieces: list[_Piece]) -> list[np.ndarray | None]:
        """Scores of each piece, in chunks of at most ``text_chunk_pairs`` pairs; None for a
        piece whose request was cancelled before its chunk started."""
        out: list[np.ndarray | None] = [None] * len(pieces)
        i = 0
        while i < len(pieces):
            chunk, n = [], 0
            while i < len(pieces) and (not chunk or n + pieces[i].n <= self.text_chunk_pairs):
                if not pieces[i].job.is_cancelled():
                    chunk.append(i)
                    n += pieces[i].n
                i += 1
            if not chunk:
                continue
            pairs = [
                (pieces[j].job.queries[0], t)
                for j in chunk
                for t in pieces[j].job.texts[pieces[j].lo : pieces[j].hi]
            ]
            flat = np.asarray(self.ce.predict(pairs), dtype=np.float32).reshape(-1)
            cuts = np.cumsum([pieces[j].n for j in chunk])[:-1]
            for j, s in zip(chunk, np.split(flat, cuts), strict=True):
                out[j] = s
        return out

    def _apart(self, group: list[_Piece], run, exc: Exception) -> list:
        """After a merged batch failed with ``exc``: the pieces of each job run again on their
        own; per piece its scores, None (cancelled), or its job's own exception."""
        jobs: dict[int, list[int]] = {}
        for i, p in enumerate(group):
            jobs.setdefault(id(p.job), []).append(i)
        if len(jobs) == 1:  # one job: the error is its own
            return [exc] * len(group)
        out: list = [None] * len(group)
        for where in jobs.values():
            try:
                got = run([group[i] for i in where])
            except Exception as own:
                got = [own] * len(where)
            for i, s in zip(where, got, strict=True):
                out[i] = s
        return out

    def _loop(self) -> None:
        if self._warmup is not None:
            try:
                got = self._warmup()
            except BaseException as exc:  # reported by wait_warm; the worker still serves
                log.exception("crossknn.serve: the CE worker's warm-up failed")
                got = exc
            self._warm.append(got)
            self._warm_done.release()
        while True:
            batch = self._take()
            if batch is None:
                return
            live, dropped = [], 0
            for p in batch:
                if p.job.is_cancelled() or p.job.error is not None:
                    dropped += p.n
                    self._finish(p)
                else:
                    live.append(p)
            if dropped and self.on_drop is not None:
                self.on_drop(dropped)
            if not live:
                continue
            t = time.perf_counter()
            for p in live:
                if p.job.t_start is None:
                    p.job.t_start = t
            ran, dropped_late = set(live), 0
            for group, run in (
                ([p for p in live if p.job.texts is None], self._run_items),
                ([p for p in live if p.job.texts is not None], self._run_texts),
            ):
                if not group:
                    continue
                try:
                    scores = run(group)
                except Exception as exc:  # a bad job must not take the worker down
                    log.exception("crossknn.serve: CE batch of %d pieces failed", len(group))
                    scores = self._apart(group, run, exc)
                for p, s in zip(group, scores, strict=True):
                    if isinstance(s, BaseException):  # this job's own pairs failed
                        p.job.error = s
                        ran.discard(p)
                    elif s is None:  # cancelled while the batch ran: never scored
                        dropped_late += p.n
                        ran.discard(p)
                    else:
                        p.job.out[p.q][p.lo : p.hi] = s
                    self._finish(p)
            if dropped_late and self.on_drop is not None:
                self.on_drop(dropped_late)
            seconds = time.perf_counter() - t
            if self.on_batch is not None and ran:
                self.on_batch(sum(p.n for p in ran), len({id(p.job) for p in ran}), seconds)
