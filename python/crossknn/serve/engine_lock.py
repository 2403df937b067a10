"""The engine lock of ``crossknn serve``: which waiting request runs its next engine step.

Every request thread holds the engine lock while it runs searcher code and gives it up while it
waits for the CE (:mod:`crossknn.serve.proxy`). With many requests in flight, each one takes the
lock once per round, so the order in which waiters get it decides how latency is spread:

- ``"any"``: a plain ``threading.Lock``; whichever thread the operating system wakes (or one that
  was already running) takes it. A request can lose several times in a row.
- ``"oldest"``: the lock passes to the waiting request that was admitted first (ties: first to
  wait). A request that has been in the server longest is never passed over by a younger one,
  which bounds the tail; the price is a direct hand-over (the next owner must be woken before the
  engine runs again) instead of letting a running thread take a free lock.
"""

from __future__ import annotations

import heapq
import itertools
import threading

__all__ = ["ENGINE_ORDERS", "EngineLock", "engine_lock"]

ENGINE_ORDERS = ("any", "oldest")


class _AnyOrder:
    """A plain lock; the priority is ignored."""

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def acquire_for(self, priority: float) -> None:
        self._lock.acquire()

    def acquire(self) -> None:
        self._lock.acquire()

    def release(self) -> None:
        self._lock.release()


class EngineLock:
    """A lock handed to the waiter of lowest ``priority`` (a request's admission time)."""

    def __init__(self) -> None:
        self._mu = threading.Lock()
        self._held = False
        self._waiting: list[tuple[float, int, threading.Lock]] = []
        self._seq = itertools.count()

    def acquire(self) -> None:
        self.acquire_for(0.0)

    def acquire_for(self, priority: float) -> None:
        with self._mu:
            if not self._held:
                self._held = True
                return
            gate = threading.Lock()
            gate.acquire()
            heapq.heappush(self._waiting, (float(priority), next(self._seq), gate))
        gate.acquire()  # released by release(): the lock is ours, still marked held

    def release(self) -> None:
        with self._mu:
            if not self._held:
                raise RuntimeError("release of an engine lock that is not held")
            if self._waiting:
                heapq.heappop(self._waiting)[2].release()  # hand over; stays held
            else:
                self._held = False

    @property
    def waiting(self) -> int:
        return len(self._waiting)


def engine_lock(order: str):
    """The engine lock for ``order`` (one of :data:`ENGINE_ORDERS`)."""
    if order == "oldest":
        return EngineLock()
    if order == "any":
        return _AnyOrder()
    raise ValueError(f"engine order must be one of {ENGINE_ORDERS}; got {order!r}")
