"""The engine lock of ``crossknn serve``: which waiting request runs its next engine step.

Every request thread holds the engine lock while it runs searcher code and gives it up while it
waits for the CE (:mod:`crossknn.serve.proxy`). With many requests in flight, each one takes the
lock once per round, so the order in which waiters get it decides how latency is spread:

- ``"oldest"`` (:class:`EngineLock`): the lock passes to the waiting request that was admitted
  first (ties: first to wait). A request that has been in the server longest is never passed over
  by a younger one, which bounds the tail. A waiter can also be *withdrawn* (its ``acquire_for``
  returns False): a request that starts a query group takes the requests still waiting to start
  along (:mod:`crossknn.serve.groups`).
- ``"any"``: a plain ``threading.Lock``; whichever thread the operating system wakes (or one that
  was already running) takes it, so a request can lose several times in a row.
"""

from __future__ import annotations

import heapq
import itertools
import threading

__all__ = ["ENGINE_ORDERS", "EngineLock", "Waiter", "engine_lock"]

ENGINE_ORDERS = ("oldest", "any")

_NEW, _WAITING, _GRANTED, _WITHDRAWN = range(4)


class Waiter:
    """One request's place in the queue of an :class:`EngineLock` (one acquisition)."""

    __slots__ = ("gate", "state")

    def __init__(self) -> None:
        self.gate = threading.Lock()
        self.state = _NEW


class _AnyOrder:
    """A plain lock; the priority is ignored and nobody is withdrawn."""

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def acquire_for(self, priority: float, waiter: Waiter | None = None) -> bool:
        self._lock.acquire()
        return True

    def acquire(self) -> None:
        self._lock.acquire()

    def release(self) -> None:
        self._lock.release()


class EngineLock:
    """A lock handed to the waiter of lowest ``priority`` (a request's admission time)."""

    def __init__(self) -> None:
        self._mu = threading.Lock()
        self._held = False
        self._waiting: list[tuple[float, int, Waiter]] = []
        self._seq = itertools.count()

    def acquire(self) -> None:
        self.acquire_for(0.0)

    def acquire_for(self, priority: float, waiter: Waiter | None = None) -> bool:
        """Wait for the lock: True once held, False if ``waiter`` was withdrawn (before or while
        it waited; the lock is then not held by this thread)."""
        w = waiter if waiter is not None else Waiter()
        with self._mu:
            if w.state == _WITHDRAWN:
                return False
            if not self._held:
                self._held = True
                w.state = _GRANTED
                return True
            w.gate.acquire()  # free until now: this thread will block on it below
            w.state = _WAITING
            heapq.heappush(self._waiting, (float(priority), next(self._seq), w))
        w.gate.acquire()  # released by release() (granted) or withdraw()
        w.gate.release()
        return w.state == _GRANTED

    def release(self) -> None:
        with self._mu:
            if not self._held:
                raise RuntimeError("release of an engine lock that is not held")
            while self._waiting:
                w = heapq.heappop(self._waiting)[2]
                if w.state == _WAITING:  # (withdrawn ones are dropped here)
                    w.state = _GRANTED  # handed over: the lock stays held
                    w.gate.release()
                    return
            self._held = False

    def withdraw(self, waiter: Waiter) -> bool:
        """Take ``waiter`` out of the queue (or keep it from entering): its ``acquire_for``
        returns False. False if it already holds (or was handed) the lock."""
        with self._mu:
            if waiter.state in (_GRANTED, _WITHDRAWN):
                return waiter.state == _WITHDRAWN
            was_waiting = waiter.state == _WAITING
            waiter.state = _WITHDRAWN
            if was_waiting:
                waiter.gate.release()
            return True

    @property
    def waiting(self) -> int:
        with self._mu:
            return sum(1 for *_, w in self._waiting if w.state == _WAITING)


def engine_lock(order: str):
    """The engine lock for ``order`` (one of :data:`ENGINE_ORDERS`)."""
    if order == "oldest":
        return EngineLock()
    if order == "any":
        return _AnyOrder()
    raise ValueError(f"engine order must be one of {ENGINE_ORDERS}; got {order!r}")
