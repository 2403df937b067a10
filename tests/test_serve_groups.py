"""Query groups (concurrent requests searched in lockstep) and the engine lock's order: the
units with fakes, then the real service against the in-process searcher."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

pytest.importorskip("fastapi")

from crossknn.serve.batcher import Cancelled  # noqa: E402
from crossknn.serve.engine_lock import EngineLock, engine_lock  # noqa: E402
from crossknn.serve.groups import QueryGroups  # noqa: E402
from crossknn.serve.proxy import RequestContext  # noqa: E402


def _wait_until(cond, seconds: float = 5.0) -> None:
    end = time.monotonic() + seconds
    while not cond():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.002)


def test_engine_lock_goes_to_the_oldest_waiter():
    lock = EngineLock()
    lock.acquire()
    order: list[float] = []

    def waiter(priority: float) -> None:
        lock.acquire_for(priority)
        order.append(priority)
        lock.release()

    threads = []
    for p in (3.0, 1.0, 2.0):  # queued youngest first
        t = threading.Thread(target=waiter, args=(p,))
        t.start()
        threads.append(t)
        _wait_until(lambda n=len(threads): lock.waiting == n)
    lock.release()
    for t in threads:
        t.join(5)
    assert order == [1.0, 2.0, 3.0]
    with pytest.raises(RuntimeError, match="not held"):
        lock.release()
    with pytest.raises(ValueError, match="oldest"):
        engine_lock("fifo")


def _ctx(lock, seconds: float = 10.0) -> RequestContext:
    return RequestContext(time.monotonic() + seconds, lock)


class Recorder:
    """run(payloads, ctx): blocks the first group until ``gate`` is set; answers payload * 10."""

    def __init__(self) -> None:
        self.groups: list[list[int]] = []
        self.gate = threading.Event()
        self.started = threading.Event()

    def __call__(self, payloads, ctx):
        self.groups.append(list(payloads))
        self.started.set()
        if len(self.groups) == 1:
            assert self.gate.wait(5)
        ctx.check()
        return [p * 10 for p in payloads]


def test_waiting_requests_of_one_kind_share_a_group():
    rec = Recorder()
    lock = engine_lock("oldest")
    groups = QueryGroups(rec, lock, max_queries=4, threads=1)
    try:
        with ThreadPoolExecutor(8) as pool:
            first = pool.submit(groups.search, ("a",), 1, _ctx(lock), 0)
            assert rec.started.wait(5)  # the group thread is busy with request 0
            keys = [("a",), ("b",), ("a",), ("a",), ("a",), ("a",), ("b",)]
            futs = [
                pool.submit(groups.search, k, 1, _ctx(lock), i + 1) for i, k in enumerate(keys)
            ]
            _wait_until(lambda: len(groups._pending) == len(keys))
            rec.gate.set()
            assert first.result(5) == 0
            assert [f.result(5) for f in futs] == [10 * (i + 1) for i in range(len(keys))]
        # after request 0: the oldest "a" with three more (max 4 queries), then "b" x2, then "a"
        assert rec.groups == [[0], [1, 3, 4, 5], [2, 7], [6]]
        assert groups.groups == 4 and groups.grouped_queries == 8
    finally:
        groups.stop()


def test_a_cancelled_request_leaves_its_group_at_once():
    rec = Recorder()
    lock = engine_lock("any")
    groups = QueryGroups(rec, lock, threads=1)
    try:
        with ThreadPoolExecutor(4) as pool:
            first = pool.submit(groups.search, ("a",), 1, _ctx(lock), 0)
            assert rec.started.wait(5)
            ctx = _ctx(lock)
            gone = pool.submit(groups.search, ("a",), 1, ctx, 1)
            kept = pool.submit(groups.search, ("a",), 1, _ctx(lock), 2)
            _wait_until(lambda: len(groups._pending) == 2)
            ctx.cancel("client gone")
            with pytest.raises(Cancelled, match="client gone"):
                gone.result(5)  # answered while the group thread is still busy
            assert not first.done()
            rec.gate.set()
            assert first.result(5) == 0 and kept.result(5) == 20
        assert rec.groups == [[0], [2]]  # the cancelled one was never run
        # a request past its deadline while queued: cancelled with "timeout"
        late = _ctx(lock, seconds=0.05)
        rec.gate.clear()
        rec.groups.clear()  # the next group blocks again
        with ThreadPoolExecutor(2) as pool:
            blocker = pool.submit(groups.search, ("a",), 1, _ctx(lock), 5)
            _wait_until(lambda: len(rec.groups) == 1)
            with pytest.raises(Cancelled, match="timeout"):
                groups.search(("a",), 1, late, 6)
            rec.gate.set()
            assert blocker.result(5) == 50
    finally:
        groups.stop()


def test_a_failing_group_fails_its_requests_and_the_thread_goes_on():
    calls = []

    def run(payloads, ctx):
        calls.append(payloads)
        if payloads == ["bad"]:
            raise ValueError("no such method")
        return [p.upper() for p in payloads]

    lock = engine_lock("any")
    groups = QueryGroups(run, lock, threads=1)
    try:
        with pytest.raises(ValueError, match="no such method"):
            groups.search(("x",), 1, _ctx(lock), "bad")
        assert groups.search(("x",), 1, _ctx(lock), "good") == "GOOD"
    finally:
        groups.stop()
    with pytest.raises(ValueError, match="max_queries"):
        QueryGroups(run, lock, max_queries=0)


# -- the real service: grouped answers equal the searcher's own -------------------------------
QUERIES = [
    "parse a date string into a datetime object",
    "compress data with gzip",
    "send an email through an SMTP server",
    "run a shell command and capture its output",
    "read a CSV file row by row",
    "create a temporary directory",
    "encode bytes as base64",
    "sort a list in place",
]


@pytest.mark.slow
def test_grouped_service_answers_equal_searching_each_alone(model_cache, tmp_path, monkeypatch):
    import crossknn
    from crossknn.demo_corpus import stdlib_docstrings
    from crossknn.serve.schema import SearchRequest
    from crossknn.serve.service import SearchService, ServeConfig

    monkeypatch.setenv("CROSSKNN_CACHE", str(model_cache))
    corpus = stdlib_docstrings(max_items=150)
    crossknn.build_corpus_index(
        corpus, tmp_path / "idx", calibration_queries=4, calibration_items=16, progress=False
    )
    alone = crossknn.Searcher(tmp_path / "idx")
    want = {q: alone.search([q], k=5, budget=30)[0] for q in QUERIES}

    svc = SearchService(
        ServeConfig(index=str(tmp_path / "idx"), group_queries=8, engine_order="oldest")
    )
    svc.load()
    try:
        assert svc.groups is not None

        def one(q: str) -> dict:
            req = SearchRequest(query=q, k=5, budget=30)
            decision = svc.try_admit(req)
            ctx = svc.new_context()
            try:
                return svc.search(req, ctx)
            finally:
                svc.release(decision.ticket, ctx)

        with ThreadPoolExecutor(len(QUERIES)) as pool:
            answers = list(pool.map(one, QUERIES * 2))
        for q, ans in zip(QUERIES * 2, answers, strict=True):
            hit = ans["hits"][0]
            assert hit["query"] == q
            assert [r["id"] for r in hit["results"]] == want[q].ids
            np.testing.assert_allclose(
                [r["score"] for r in hit["results"]], want[q].scores, rtol=1e-6
            )
            assert hit["ce_calls"] == want[q].ce_calls
        # 16 concurrent requests of one kind: fewer groups than requests
        assert svc.groups.grouped_queries >= 16
        assert svc.groups.groups < 16
        text = svc.metrics.render().decode()
        for name in ("crossknn_engine_lock_wait_seconds_total", "crossknn_ce_queue_seconds_total"):
            assert name in text
    finally:
        svc.close()
