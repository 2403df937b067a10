"""Query groups: concurrent ``/search`` requests run their rounds in lockstep.

The C++ loop runs the rounds of many queries at once (``crossknn.Searcher.search`` with a list):
one pass over the item features per round for all of them, one Python callback per round, and
each round's pairs of every query sent as one CE call. ``crossknn serve`` uses that across
requests: a request thread hands its search to the group queue and waits; ``threads`` group
threads each take the oldest waiting request together with every other waiting one that asks for
the same search (method, k, budget, rounds, seed), up to ``max_queries`` queries, and run them as
one lockstep search. With two group threads, one group's engine step runs while the other's CE
batch is on the device; the CE batcher merges their rounds as before.

Each query's results are those of searching it alone (the loop seeds every query by its own
text; ``tests/test_serve_groups.py`` checks them). A request in a group keeps its own deadline:
when it is cancelled (timeout, client gone) its thread answers at once; the group stops early only
when every one of its requests is cancelled. Requests with ``exact`` run alone, as before.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from crossknn.serve.batcher import Cancelled
from crossknn.serve.proxy import RequestContext

__all__ = ["GroupContext", "QueryGroups"]

log = logging.getLogger("crossknn.serve")


class _Member:
    """One request waiting in (or run by) a group."""

    def __init__(self, key: tuple, n_queries: int, ctx: RequestContext, payload: Any) -> None:
        self.key = key
        self.n_queries = n_queries
        self.ctx = ctx
        self.payload = payload
        self.done = threading.Event()  # set by the group, or by ctx.cancel()
        self.result: Any = None
        self.error: BaseException | None = None
        self.t_queued = time.perf_counter()


class GroupContext(RequestContext):
    """The request context of a group thread: the earliest deadline-free view of its members.

    It waits for the CE like a request (the engine lock released meanwhile, taken back in the
    order of its oldest member), and counts as cancelled once every member is."""

    def __init__(self, members: list[_Member], engine_lock) -> None:
        super().__init__(max(m.ctx.deadline for m in members), engine_lock)
        self.members = members
        self.priority = min(m.ctx.priority for m in members)

    def all_cancelled(self) -> bool:
        return all(m.ctx.cancelled for m in self.members)

    def check(self) -> None:
        if self.all_cancelled():
            self.cancel("every request of the group was cancelled")
        super().check()


class QueryGroups:
    """The group queue and its threads; see the module docstring.

    ``run(payloads, ctx)`` runs one group (the payloads of its members, in order) under the group
    context and returns one result per payload; it is called in a group thread."""

    def __init__(
        self,
        run: Callable[[list[Any], GroupContext], list[Any]],
        engine_lock,
        *,
        max_queries: int = 32,
        threads: int = 2,
        name: str = "crossknn-group",
    ) -> None:
        if max_queries < 1:
            raise ValueError(f"max_queries must be >= 1; got {max_queries}")
        if threads < 1:
            raise ValueError(f"threads must be >= 1; got {threads}")
        self._run = run
        self.engine_lock = engine_lock
        self.max_queries = int(max_queries)
        self._pending: deque[_Member] = deque()
        self._cv = threading.Condition()
        self._stop = False
        self.groups = 0  # groups run so far
        self.grouped_queries = 0  # queries in them
        self._threads = [
            threading.Thread(target=self._loop, name=f"{name}-{i}", daemon=True)
            for i in range(threads)
        ]
        for t in self._threads:
            t.start()

    # -- request side ---------------------------------------------------------------------------
    def search(self, key: tuple, n_queries: int, ctx: RequestContext, payload: Any) -> Any:
        """Queue ``payload`` (a search of ``n_queries`` queries; ``key``: what it must share with
        the others of its group) and wait for its result; :class:`Cancelled` if ``ctx`` is."""
        member = _Member(key, n_queries, ctx, payload)
        ctx.check()
        with self._cv:
            if self._stop:
                raise RuntimeError("the query groups are stopped")
            self._pending.append(member)
            self._cv.notify()
        ctx.attach(member)
        try:
            left = ctx.deadline - time.monotonic()
            if left <= 0 or not member.done.wait(left):
                ctx.cancel("timeout")
        finally:
            ctx.attach(None)
        if ctx.cancelled:
            raise Cancelled(ctx.reason or "request cancelled")
        if member.error is not None:
            raise member.error
        return member.result

    def stop(self, timeout: float | None = 10.0) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        for t in self._threads:
            t.join(timeout)

    # -- group threads ----------------------------------------------------------------------------
    def _take(self) -> list[_Member] | None:
        with self._cv:
            while not self._pending:
                if self._stop:
                    return None
                self._cv.wait()
            first = self._pending.popleft()
            group, n = [first], first.n_queries
            rest: deque[_Member] = deque()
            while self._pending:
                m = self._pending.popleft()
                if m.key == first.key and n + m.n_queries <= self.max_queries:
                    group.append(m)
                    n += m.n_queries
                else:
                    rest.append(m)
            self._pending = rest
            if self._pending:  # the others may start a group of their own at once
                self._cv.notify()
            return group

    def _loop(self) -> None:
        while True:
            group = self._take()
            if group is None:
                return
            live = [m for m in group if not m.ctx.cancelled]
            for m in group:
                if m.ctx.cancelled:
                    m.done.set()
            if not live:
                continue
            ctx = GroupContext(live, self.engine_lock)
            t_start = time.perf_counter()
            try:
                with ctx:
                    results = self._run([m.payload for m in live], ctx)
                self.groups += 1
                self.grouped_queries += sum(m.n_queries for m in live)
            except BaseException as exc:  # a failed group fails its requests, not the thread
                if not isinstance(exc, Cancelled):
                    log.exception("crossknn.serve: a group of %d requests failed", len(live))
                for m in live:
                    m.error = exc
                    m.done.set()
                continue
            n_total = sum(m.n_queries for m in live)
            for m, res in zip(live, results, strict=True):
                mc = m.ctx
                share = m.n_queries / n_total
                # what the request spent, for its metrics and admission: the group's waits as
                # they were (it waited through all of them), its share of the group's pairs
                # (waiting for its group to start counts as waiting for the engine)
                mc.lock_wait_seconds += ctx.lock_wait_seconds + (t_start - m.t_queued)
                mc.ce_wait_seconds += ctx.ce_wait_seconds
                mc.ce_queue_seconds += ctx.ce_queue_seconds
                mc.ce_run_seconds += ctx.ce_run_seconds
                mc.ce_wake_seconds += ctx.ce_wake_seconds
                mc.ce_pairs += round(ctx.ce_pairs * share)
                m.result = res
                m.done.set()
