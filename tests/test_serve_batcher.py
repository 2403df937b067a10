"""The cross-request CE batcher and the CE proxy, with a fake CE (no model, no server)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

pytest.importorskip("fastapi")

from crossknn.serve.batcher import Batcher, Cancelled  # noqa: E402
from crossknn.serve.proxy import BatchedCE, RequestContext  # noqa: E402


class FakeCE:
    """score(query, item) = len(query) * 1000 + item; records every score_batch call."""

    model_id = "fake"
    model_hash = "0" * 64
    precision = "fp32"

    def __init__(self, n_items: int = 1000, delay: float = 0.0) -> None:
        self.n_items = n_items
        self.delay = delay
        self.calls: list[int] = []
        self.threads: set[str] = set()

    def score_batch(self, queries, items):
        self.threads.add(threading.current_thread().name)
        self.calls.append(int(sum(len(x) for x in items)))
        if self.delay:
            time.sleep(self.delay)
        return [
            (len(q) * 1000 + np.asarray(x, np.float64)).astype(np.float32)
            for q, x in zip(queries, items, strict=True)
        ]


def expected(q: str, items) -> np.ndarray:
    return (len(q) * 1000 + np.asarray(items, np.float64)).astype(np.float32)


def _many(batcher: Batcher, n_jobs: int, pairs: int):
    jobs = []
    for j in range(n_jobs):
        q = "q" * (j + 1)
        items = [np.arange(j, j + pairs), np.arange(pairs)[::-1]]
        jobs.append((q, items, batcher.submit([q, q + "x"], items)))
    for q, items, job in jobs:
        out = job.wait(5)
        np.testing.assert_array_equal(out[0], expected(q, items[0]))
        np.testing.assert_array_equal(out[1], expected(q + "x", items[1]))


def test_merges_jobs_into_batches_and_scatters_back():
    ce = FakeCE(delay=0.05)
    b = Batcher(ce, max_batch_pairs=64, max_wait_s=0.01)
    try:
        _many(b, 8, 10)  # 8 jobs x 20 pairs: at most 64 pairs a batch, fewer calls than jobs
        assert max(ce.calls) <= 64
        assert sum(ce.calls) == 160
        assert len(ce.calls) < 8
        assert ce.threads == {"crossknn-ce-0"}  # only the worker thread runs the CE
    finally:
        b.stop()


def test_a_job_larger_than_the_batch_is_cut():
    ce = FakeCE()
    b = Batcher(ce, max_batch_pairs=16, max_wait_s=0.0)
    try:
        items = np.arange(100)
        np.testing.assert_array_equal(b.submit(["abc"], [items]).wait(5)[0], expected("abc", items))
        assert max(ce.calls) <= 16 and sum(ce.calls) == 100
    finally:
        b.stop()


class OverlapCE(FakeCE):
    """A FakeCE that records how many of its calls ran at the same time."""

    def __init__(self, delay: float) -> None:
        super().__init__(delay=delay)
        self._lock = threading.Lock()
        self.running = 0
        self.most = 0

    def score_batch(self, queries, items):
        with self._lock:
            self.running += 1
            self.most = max(self.most, self.running)
        try:
            return super().score_batch(queries, items)
        finally:
            with self._lock:
                self.running -= 1


def test_two_workers_overlap_their_calls_and_answer_every_job():
    ce = OverlapCE(delay=0.02)
    b = Batcher(ce, max_batch_pairs=16, max_wait_s=0.0, workers=2)
    try:
        # 12 jobs of 2 x 10 pairs in batches of 16: pieces of one job end on either worker
        _many(b, 12, 10)
        items = np.arange(200)  # one job cut into 13 pieces
        np.testing.assert_array_equal(b.submit(["abc"], [items]).wait(5)[0], expected("abc", items))
        assert sum(ce.calls) == 240 + 200 and max(ce.calls) <= 16
        assert ce.most == 2  # one worker's call ran while the other's did
        assert ce.threads == {"crossknn-ce-0", "crossknn-ce-1"}
    finally:
        b.stop()
    with pytest.raises(ValueError, match="workers must be >= 1; got 0"):
        Batcher(ce, workers=0)


def test_no_merging_runs_one_job_per_call():
    ce = FakeCE(delay=0.01)
    b = Batcher(ce, max_batch_pairs=0)
    try:
        _many(b, 6, 30)
        assert ce.calls == [60] * 6
    finally:
        b.stop()


def test_cancelled_work_is_dropped_and_the_waiter_woken():
    ce = FakeCE(delay=0.2)
    dropped = []
    b = Batcher(ce, max_batch_pairs=8, max_wait_s=0.0, on_drop=dropped.append)
    lock = threading.Lock()
    try:
        first = b.submit(["a"], [np.arange(8)])  # occupies the worker for 0.2 s
        ctx = RequestContext(time.monotonic() + 10, lock)
        job = b.submit(["b"], [np.arange(40)], is_cancelled=lambda: ctx.cancelled)
        threading.Timer(0.05, ctx.cancel).start()
        t = time.monotonic()
        with pytest.raises(Cancelled):
            with ctx:
                ctx.wait_for(job)
        assert time.monotonic() - t < 0.15  # woken by the cancel, not by the CE
        first.wait(5)
        b.submit(["c"], [np.arange(3)]).wait(5)  # the worker goes on
        assert sum(dropped) >= 32  # all or most of the 40 pairs never reached the CE
        assert sum(ce.calls) + sum(dropped) == 8 + 40 + 3
    finally:
        b.stop()


def test_deadline_in_the_proxy_gives_cancelled():
    ce = FakeCE(delay=0.3)
    b = Batcher(ce, max_batch_pairs=32)
    proxy = BatchedCE(ce, b)
    assert proxy.model_hash == ce.model_hash and proxy.n_items == ce.n_items
    try:
        ctx = RequestContext(time.monotonic() + 0.1, threading.Lock())
        with ctx, pytest.raises(Cancelled):
            proxy.score_batch(["q"], [np.arange(5)])
        assert ctx.cancelled and ctx.reason == "timeout"
        # outside any request the proxy scores with no deadline
        np.testing.assert_array_equal(proxy.score("zz", np.arange(4)), expected("zz", range(4)))
    finally:
        b.stop()


def test_engine_lock_is_released_while_waiting_for_the_ce():
    ce = FakeCE(delay=0.1)
    b = Batcher(ce, max_batch_pairs=64, max_wait_s=0.02)
    proxy = BatchedCE(ce, b)
    lock = threading.Lock()
    results = {}

    def request(name: str) -> None:
        with RequestContext(time.monotonic() + 10, lock):
            assert lock.locked()
            results[name] = proxy.score_batch([name], [np.arange(10)])[0]

    try:
        threads = [threading.Thread(target=request, args=(f"r{i}",)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(5)
        assert sorted(results) == ["r0", "r1", "r2", "r3"]
        for name, s in results.items():
            np.testing.assert_array_equal(s, expected(name, range(10)))
        # all four waited at once (the lock was free while they waited): merged batches
        assert len(ce.calls) < 4
        assert not lock.locked()
    finally:
        b.stop()


def test_ce_workers_resolve_by_provider_and_are_checked():
    from crossknn.serve.service import CE_WORKERS_GPU, ServeConfig, ce_workers

    assert ce_workers(None, "CPUExecutionProvider") == 1 and ce_workers(None, None) == 1
    assert ce_workers(None, "CUDAExecutionProvider") == CE_WORKERS_GPU
    assert ce_workers(2, "CPUExecutionProvider") == 2
    with pytest.raises(ValueError, match=r"serve: ce_workers=0 is out of range"):
        ServeConfig(index="x", ce_workers=0)


def test_each_worker_warms_up_in_its_own_thread_before_its_first_batch():
    ce = FakeCE()
    seen: list[str] = []

    def warmup():
        seen.append(threading.current_thread().name)
        return {"thread": threading.current_thread().name}

    b = Batcher(ce, max_batch_pairs=16, max_wait_s=0.0, workers=2, warmup=warmup)
    try:
        got = b.wait_warm(5)
        assert sorted(g["thread"] for g in got) == ["crossknn-ce-0", "crossknn-ce-1"]
        assert sorted(seen) == ["crossknn-ce-0", "crossknn-ce-1"]
        _many(b, 4, 10)  # then the workers serve as before
    finally:
        b.stop()
    assert Batcher(ce).wait_warm(1) == []  # no warm-up: nothing to wait for

    def broken():
        raise RuntimeError("no device")

    b = Batcher(ce, warmup=broken)
    try:
        with pytest.raises(RuntimeError, match="no device"):
            b.wait_warm(5)
        _many(b, 2, 5)  # a failed warm-up does not stop the worker
    finally:
        b.stop()


class TextCE:
    """A CE stand-in for text jobs: ``predict`` scores pairs by text length, each call taking
    ``delay`` seconds; it records the size of every call."""

    batch_size = 4

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.calls: list[int] = []
        self.started = threading.Event()

    def predict(self, pairs):
        self.calls.append(len(pairs))
        self.started.set()
        time.sleep(self.delay)
        return np.array([len(t) for _, t in pairs], np.float32)


def test_text_jobs_run_in_chunks_and_scores_come_back_in_order():
    ce = TextCE()
    b = Batcher(ce, max_batch_pairs=256)
    try:
        texts = ["x" * (i + 1) for i in range(50)]
        job = b.submit(["q"], None, texts=texts)
        out = job.wait(10)
        np.testing.assert_array_equal(out[0], np.arange(1, 51, dtype=np.float32))
        assert b.text_chunk_pairs == 2 * TextCE.batch_size
        assert max(ce.calls) <= b.text_chunk_pairs and sum(ce.calls) == 50
    finally:
        b.stop()


def test_a_cancelled_text_job_stops_after_the_chunk_that_is_running():
    """Issue 46, case 2: 300 texts, the client leaves while the first chunk runs: only that
    chunk is scored (before: the whole merged batch of 256 pairs ran)."""
    ce = TextCE(delay=0.2)
    dropped = []
    b = Batcher(ce, max_batch_pairs=256, on_drop=dropped.append)
    try:
        gone = threading.Event()
        job = b.submit(["q"], None, texts=["t"] * 300, is_cancelled=gone.is_set)
        assert ce.started.wait(10)
        gone.set()
        with pytest.raises(Cancelled):
            job.wait(10)
        deadline = time.monotonic() + 10
        while sum(ce.calls) + sum(dropped) < 300 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sum(ce.calls) == b.text_chunk_pairs  # the chunk that was running when it left
        assert sum(dropped) == 300 - b.text_chunk_pairs
    finally:
        b.stop()


def test_the_pairs_per_second_window_stays_bounded_without_scrapes(monkeypatch):
    """A server nobody scrapes must not keep one entry per CE batch forever."""
    from crossknn.serve import metrics as metrics_mod

    clock = {"t": 1000.0}
    monkeypatch.setattr(metrics_mod.time, "monotonic", lambda: clock["t"])
    m = metrics_mod.Metrics()
    for _ in range(5000):
        m.on_batch(10, 1, 0.01)
        clock["t"] += 0.1  # 10 batches a second for 500 s
    assert len(m._window) <= int(m.WINDOW_S / 0.1) + 1
    assert m._pairs_per_second() == pytest.approx(10 * 100 / m.WINDOW_S, rel=0.02)
