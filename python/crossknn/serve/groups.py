"""Query groups: requests that wait to start together run their rounds in lockstep.

The C++ loop runs the rounds of many queries at once (``crossknn.Searcher.search`` with a list):
one pass over the item features per round for all of them, one Python callback per round, and
each round's pairs of every query sent as one CE call. ``crossknn serve`` uses that across
requests, where it pays: a new request queues for the engine lock (ordered by admission,
:class:`~crossknn.serve.engine_lock.EngineLock`) like any engine step. When it gets the lock it
*leads*: it takes along every request still waiting to start that asks for the same search
(method, k, budget, rounds, seed), up to ``max_queries`` queries (those leave the lock's queue:
they *follow*), and runs all of them as one lockstep search in its own thread; each follower's
thread waits for its answer.

So requests are grouped only when they had to wait for the engine anyway: a lone request, or one
arriving while the engine is free, starts at once, alone, as before; under load (the engine lock
busy) the newcomers that pile up behind it start as one group instead of one by one.

Each query's results are those of searching it alone (the loop seeds every query by its own
text; ``tests/test_serve_groups.py`` checks them). A follower keeps its own deadline: when it is
cancelled (timeout, client gone) its thread answers at once; the group stops early only when
every one of its requests is cancelled.

One request's failure is its own: ``run`` answers, per payload, a result or the exception of
that payload alone (it is raised in that request's thread only); and when the lockstep search
itself fails (any exception but a cancellation: a filter a swap made invalid, a MemoryError),
each request of the group is searched again alone, so that only the one that fails alone gets
an error (``tests/test_tenant_isolation.py``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from crossknn.serve.batcher import Cancelled
from crossknn.serve.engine_lock import EngineLock, Waiter
from crossknn.serve.proxy import RequestContext, bind

__all__ = ["GroupContext", "QueryGroups"]


class _Member:
    """One request of a group (its leader included)."""

    def __init__(self, key: tuple, n_queries: int, ctx: RequestContext, payload: Any) -> None:
        self.key = key
        self.n_queries = n_queries
        self.ctx = ctx
        self.payload = payload
        self.waiter = Waiter()  # its place in the engine lock's queue (withdrawn: it follows)
        self.done = threading.Event()  # set by the leader, or by ctx.cancel()
        self.result: Any = None
        self.error: BaseException | None = None
        self.t_queued = time.perf_counter()


class GroupContext(RequestContext):
    """The request context of a group's lockstep search: it waits for the CE like a request
    (the engine lock released meanwhile, taken back in the order of its oldest member), and
    counts as cancelled once every member is."""

    def __init__(self, members: list[_Member], engine_lock) -> None:
        super().__init__(max(m.ctx.deadline for m in members), engine_lock)
        self.members = members
        self.priority = min(m.ctx.priority for m in members)

    def check(self) -> None:
        if all(m.ctx.cancelled for m in self.members):
            self.cancel("every request of the group was cancelled")
        super().check()


class QueryGroups:
    """Grouping at the engine lock; see the module docstring.

    ``run(payloads, ctx)`` runs one group (the payloads of its members, leader first) under the
    group context, in the leader's thread with the engine lock held, and returns one result per
    payload."""

    def __init__(
        self,
        run: Callable[[list[Any], GroupContext], list[Any]],
        engine_lock: EngineLock,
        *,
        max_queries: int = 32,
    ) -> None:
        if max_queries < 1:
            raise ValueError(f"max_queries must be >= 1; got {max_queries}")
        if not isinstance(engine_lock, EngineLock):
            raise TypeError(
                "query groups need the engine lock that orders by request age "
                "(--engine-order oldest)"
            )
        self._run = run
        self.engine_lock = engine_lock
        self.max_queries = int(max_queries)
        self._mu = threading.Lock()
        self._starting: list[_Member] = []  # waiting for the engine lock to start
        # (both counted by the leader with the engine lock held: one at a time)
        self.groups = 0  # searches run (a lone request is a group of one)
        self.grouped_queries = 0  # queries in groups of two or more requests

    def search(self, key: tuple, n_queries: int, ctx: RequestContext, payload: Any) -> Any:
        """Search ``payload`` (``n_queries`` queries; ``key``: what it must share with the others
        of a group) as a leader or a follower; :class:`Cancelled` if ``ctx`` is cancelled."""
        ctx.check()
        me = _Member(key, n_queries, ctx, payload)
        with self._mu:
            self._starting.append(me)
        t = time.perf_counter()
        leads = self.engine_lock.acquire_for(ctx.priority, me.waiter)
        ctx.lock_wait_seconds += time.perf_counter() - t
        if not leads:
            return self._follow(me)
        try:
            if ctx.cancelled:  # (it waited for the lock past its deadline): lead nobody
                with self._mu:
                    self._starting.remove(me)
                raise Cancelled(ctx.reason or "request cancelled")
            group = self._gather(me)
            return self._lead(group)
        finally:
            self.engine_lock.release()

    # -- a follower -----------------------------------------------------------------------------
    def _follow(self, me: _Member) -> Any:
        ctx = me.ctx
        ctx.attach(me)
        try:
            left = ctx.deadline - time.monotonic()
            if left <= 0 or not me.done.wait(left):
                ctx.cancel("timeout")
        finally:
            ctx.attach(None)
        if ctx.cancelled:
            raise Cancelled(ctx.reason or "request cancelled")
        if me.error is not None:
            raise me.error
        return me.result

    # -- the leader (holding the engine lock) ---------------------------------------------------
    def _gather(self, me: _Member) -> list[_Member]:
        """``me`` and the requests still waiting to start with the same key, oldest first, up
        to ``max_queries`` queries; they leave the lock's queue."""
        with self._mu:
            self._starting.remove(me)
            group, n, keep = [me], me.n_queries, []
            for m in sorted(self._starting, key=lambda m: m.ctx.priority):
                if (
                    m.key == me.key
                    and n + m.n_queries <= self.max_queries
                    and not m.ctx.cancelled
                    and self.engine_lock.withdraw(m.waiter)
                ):
                    group.append(m)
                    n += m.n_queries
                else:
                    keep.append(m)
            self._starting = [m for m in self._starting if m in keep]
        return group

    def _alone(self, m: _Member, ctx: RequestContext) -> Any:
        """``m`` searched alone under ``ctx``: its result, or its own exception."""
        try:
            with bind(ctx, holding=True):
                return self._run([m.payload], ctx)[0]
        except Exception as exc:
            return exc

    def _lead(self, group: list[_Member]) -> Any:
        me = group[0]
        if len(group) == 1:  # alone: the request's own context, as without groups
            self.groups += 1
            got = self._alone(me, me.ctx)
            if isinstance(got, BaseException):
                raise got
            return got
        ctx = GroupContext(group, self.engine_lock)
        t_start = time.perf_counter()
        try:
            with bind(ctx, holding=True):
                results = self._run([m.payload for m in group], ctx)
        except Cancelled as exc:  # every request of the group was cancelled
            for m in group[1:]:
                m.error = exc
                m.done.set()
            raise
        except Exception:  # whose? each request again alone: only its own error reaches it
            # (each under a context of its own: a follower's thread still waits on its member)
            results = [self._alone(m, GroupContext([m], self.engine_lock)) for m in group]
        except BaseException as exc:  # (KeyboardInterrupt, SystemExit) the process is going
            for m in group[1:]:
                m.error = exc
                m.done.set()
            raise
        self.groups += 1
        self.grouped_queries += sum(m.n_queries for m in group)
        n_total = sum(m.n_queries for m in group)
        for m, res in zip(group, results, strict=True):
            mc = m.ctx
            # what each request spent, for its metrics and admission: the group's waits as they
            # were (it waited through all of them; a follower's wait to start counts as waiting
            # for the engine), its share of the group's pairs
            if m is not me:
                mc.lock_wait_seconds += t_start - m.t_queued
            mc.lock_wait_seconds += ctx.lock_wait_seconds
            mc.ce_wait_seconds += ctx.ce_wait_seconds
            mc.ce_queue_seconds += ctx.ce_queue_seconds
            mc.ce_run_seconds += ctx.ce_run_seconds
            mc.ce_wake_seconds += ctx.ce_wake_seconds
            mc.ce_pairs += round(ctx.ce_pairs * m.n_queries / n_total)
            if isinstance(res, BaseException):
                m.error = res
            else:
                m.result = res
            m.done.set()
        if me.error is not None:
            raise me.error
        return me.result
