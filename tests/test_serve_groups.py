"""Query groups (requests waiting together for the engine start as one lockstep search) and
the engine lock's order: the units with fakes, then the real service against the searcher."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

pytest.importorskip("fastapi")

from crossknn.serve.batcher import Cancelled  # noqa: E402
from crossknn.serve.engine_lock import EngineLock, Waiter, engine_lock  # noqa: E402
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
    for i, p in enumerate((3.0, 1.0, 2.0)):  # queued youngest first
        t = threading.Thread(target=waiter, args=(p,))
        t.start()
        threads.append(t)
        _wait_until(lambda n=i + 1: lock.waiting == n)
    lock.release()
    for t in threads:
        t.join(5)
    assert order == [1.0, 2.0, 3.0]
    with pytest.raises(RuntimeError, match="not held"):
        lock.release()
    with pytest.raises(ValueError, match="oldest"):
        engine_lock("fifo")


def test_a_withdrawn_waiter_gets_false_and_the_lock_skips_it():
    lock = EngineLock()
    lock.acquire()
    early, queued = Waiter(), Waiter()
    assert lock.withdraw(early)  # withdrawn before it asked: it never waits
    assert lock.acquire_for(0.0, early) is False
    got = {}
    t = threading.Thread(target=lambda: got.setdefault("r", lock.acquire_for(1.0, queued)))
    t.start()
    _wait_until(lambda: lock.waiting == 1)
    assert lock.withdraw(queued)
    t.join(5)
    assert got["r"] is False and lock.waiting == 0
    lock.release()  # nobody left: free again
    held = Waiter()
    assert lock.acquire_for(2.0, held) is True
    assert lock.withdraw(held) is False  # it holds the lock: too late to withdraw
    lock.release()


def _ctx(lock, seconds: float = 10.0) -> RequestContext:
    return RequestContext(time.monotonic() + seconds, lock)


def _queue(pool, groups, lock, keys, run_payload=lambda i: i, ctxs=None):
    """Submit one request per key while the engine lock is held elsewhere, each queued (in
    admission order) before the next is submitted; the futures."""
    futs = []
    for i, k in enumerate(keys):
        ctx = ctxs[i] if ctxs else _ctx(lock)
        futs.append(pool.submit(groups.search, k, 1, ctx, run_payload(i)))
        _wait_until(lambda n=i + 1: lock.waiting == n)
    return futs


class Recorder:
    """run(payloads, ctx): records each group; answers payload * 10."""

    def __init__(self) -> None:
        self.groups: list[list[int]] = []

    def __call__(self, payloads, ctx):
        self.groups.append(list(payloads))
        ctx.check()
        return [p * 10 for p in payloads]


def test_requests_waiting_together_start_as_one_group():
    rec = Recorder()
    lock = EngineLock()
    groups = QueryGroups(rec, lock, max_queries=4)
    keys = [("a",), ("b",), ("a",), ("a",), ("a",), ("a",), ("b",)]
    lock.acquire()  # the engine is busy (another request's step): newcomers wait to start
    with ThreadPoolExecutor(8) as pool:
        futs = _queue(pool, groups, lock, keys)
        lock.release()
        assert [f.result(5) for f in futs] == [10 * i for i in range(len(keys))]
    # the oldest "a" leads three more (max 4 queries); then the oldest left, "b", leads the
    # other "b"; the last "a" starts alone
    assert rec.groups == [[0, 2, 3, 4], [1, 6], [5]]
    assert groups.groups == 3 and groups.grouped_queries == 6
    # a request that finds the engine free starts at once, alone
    assert groups.search(("a",), 1, _ctx(lock), 9) == 90
    assert rec.groups[-1] == [9]
    with pytest.raises(TypeError, match="oldest"):
        QueryGroups(rec, engine_lock("any"))
    with pytest.raises(ValueError, match="max_queries"):
        QueryGroups(rec, lock, max_queries=0)


def test_a_cancelled_follower_answers_at_once_and_the_group_goes_on():
    started, gate = threading.Event(), threading.Event()
    seen = []

    def run(payloads, ctx):
        seen.append(list(payloads))
        started.set()
        assert gate.wait(5)
        ctx.check()
        return [p * 10 for p in payloads]

    lock = EngineLock()
    groups = QueryGroups(run, lock)
    ctxs = [_ctx(lock), _ctx(lock)]
    lock.acquire()
    with ThreadPoolExecutor(4) as pool:
        leader, follower = _queue(pool, groups, lock, [("a",), ("a",)], lambda i: i + 1, ctxs)
        lock.release()
        assert started.wait(5)  # the leader runs the group of both
        ctxs[1].cancel("client gone")
        with pytest.raises(Cancelled, match="client gone"):
            follower.result(5)  # answered while the group still runs
        assert not leader.done()
        gate.set()
        assert leader.result(5) == 10
    assert seen == [[1, 2]]
    # every request of a group cancelled: the group stops at its next check
    started.clear()
    gate.clear()
    ctxs = [_ctx(lock), _ctx(lock)]
    lock.acquire()
    with ThreadPoolExecutor(4) as pool:
        futs = _queue(pool, groups, lock, [("a",), ("a",)], ctxs=ctxs)
        lock.release()
        assert started.wait(5)
        for c in ctxs:
            c.cancel("timeout")
        gate.set()
        for f in futs:
            with pytest.raises(Cancelled):
                f.result(5)
    assert lock.acquire_for(0.0) is True  # the leader let go of the engine
    lock.release()


def test_a_failing_group_fails_all_its_requests():
    def run(payloads, ctx):
        raise ValueError("no such method")

    lock = EngineLock()
    groups = QueryGroups(run, lock)
    lock.acquire()
    with ThreadPoolExecutor(2) as pool:
        futs = _queue(pool, groups, lock, [("x",), ("x",)])
        lock.release()
        for f in futs:
            with pytest.raises(ValueError, match="no such method"):
                f.result(5)
    assert lock.acquire_for(0.0) is True
    lock.release()


# -- the real service: grouped answers equal the searcher's own -------------------------------
QUERIES = [
    "split a path into directory and file name",
    "join strings with a separator",
    "wait for a child process to finish",
    "copy a file and its permissions",
    "parse command line options",
    "convert a time tuple to seconds",
    "find all matches of a regular expression",
    "round a float to a given precision",
]


@pytest.mark.slow
def test_grouped_service_answers_equal_searching_each_alone(model_cache, tmp_path, monkeypatch):
    import crossknn
    from crossknn.demo_corpus import stdlib_docstrings
    from crossknn.serve.service import SearchService, ServeConfig
    from shared_fixtures import admitted_search

    monkeypatch.setenv("CROSSKNN_CACHE", str(model_cache))
    corpus = stdlib_docstrings(max_items=150)
    crossknn.build_corpus_index(
        corpus, tmp_path / "idx", calibration_queries=4, calibration_items=16, progress=False
    )
    alone = crossknn.Searcher(tmp_path / "idx")
    want = {q: alone.search([q], k=5, budget=30)[0] for q in QUERIES}

    # (admission by the queue limit alone: this CPU's CE is slow, and the test holds the engine
    # while it queues 16 requests)
    # (the default build of 150 items reads one auto row: the default path, auto, is grouped;
    # a deadline for a loaded machine: 16 requests of 30 CE calls on a CPU)
    svc = SearchService(
        ServeConfig(index=str(tmp_path / "idx"), group_queries=8, admit_within=0, timeout_s=300.0)
    )
    svc.load()
    try:
        assert svc.groups is not None
        lock = svc.engine_lock

        def one(q: str) -> dict:
            return admitted_search(svc, q, k=5, budget=30)

        # 16 requests arrive while the engine is busy: they start as two groups of 8
        lock.acquire()
        with ThreadPoolExecutor(2 * len(QUERIES)) as pool:
            futs = []
            for i, q in enumerate(QUERIES * 2):
                futs.append(pool.submit(one, q))
                _wait_until(lambda n=i + 1: lock.waiting == n)
            lock.release()
            answers = [f.result(120) for f in futs]
        for q, ans in zip(QUERIES * 2, answers, strict=True):
            hit = ans["hits"][0]
            assert hit["query"] == q
            assert [r["id"] for r in hit["results"]] == want[q].ids
            np.testing.assert_allclose(
                [r["score"] for r in hit["results"]], want[q].scores, rtol=1e-6
            )
            assert hit["ce_calls"] == want[q].ce_calls
        assert svc.groups.grouped_queries == 16
        # and one that finds the engine free starts at once, alone, with the same answer
        again = one(QUERIES[0])["hits"][0]
        assert [r["id"] for r in again["results"]] == want[QUERIES[0]].ids
        assert svc.groups.grouped_queries == 16
        text = svc.metrics.render().decode()
        for name in ("crossknn_engine_lock_wait_seconds_total", "crossknn_ce_queue_seconds_total"):
            assert name in text
        assert "crossknn_grouped_queries 16.0" in text
    finally:
        svc.close()


def test_the_cli_and_config_agree_on_groups_and_the_engine_order():
    import argparse

    from crossknn.commands import serve_cmd
    from crossknn.commands.declared import add_arguments
    from crossknn.serve.service import ServeConfig

    p = argparse.ArgumentParser()
    add_arguments(p, "serve")

    def cfg(*argv):
        return serve_cmd.config_from_args(p.parse_args(["idx", *argv]))

    c = cfg()
    assert (c.group_queries, c.engine_order) == (8, "oldest")
    assert cfg("--group-queries", "1").group_queries == 1
    c = cfg("--engine-order", "any")  # a plain lock: every request alone
    assert (c.group_queries, c.engine_order) == (1, "any")
    with pytest.raises(ValueError, match="engine_order='oldest'"):
        cfg("--engine-order", "any", "--group-queries", "4")
    with pytest.raises(ValueError, match="engine_order"):
        ServeConfig(index="idx", engine_order="fifo", group_queries=1)
