"""Deadline-aware admission: take a request only if it can be answered before its deadline.

A request's *cost* is the CE work it asks for: ``queries x (budget + N if exact)`` pairs. The
server's *service time per unit of cost* is measured from the requests it finishes: the busy
seconds (time with at least one request in the server) between two finished requests over the
cost of the one that finished, both summed as exponentially weighted moving averages over about
``tau_s`` seconds of busy time (a ratio of averages: requests finishing together in one merged
CE batch count as the work of that interval, not as zero-second requests). The time since the
last finished request counts too (the server may have slowed down: while nothing finishes the
estimate grows).

A new request's *expected time in the server* is ``(cost of the admitted, unfinished requests +
its own cost) x service time per unit``: requests share the CE round by round, so each one in
the server delays the newcomer by about its whole cost. It is admitted when that fits in
``within x timeout_s`` (and fewer than ``max_queue`` are in the server); otherwise it is refused
at once (429) with ``Retry-After``: the seconds until enough of the work ahead has drained.

A request alone in the server is admitted unless its own expected time is over ``lone_margin``
(2) x ``timeout_s`` (reason ``"too_large"``: it would only run into the timeout, holding the CE
for nothing; it is refused at once, whatever the queue). The margin: the estimate extrapolates
linearly from the requests measured so far, and their fixed costs (a query's DE vector, the
engine steps) make it high for a request much larger than they were. Before the first request
has finished nothing is known: at most ``cold_limit`` are admitted then.

Pure bookkeeping with an injectable clock: :mod:`crossknn.serve.service` calls it under HTTP.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Admission", "Decision", "Ticket", "request_cost"]


def request_cost(n_queries: int, budget: int, exact: bool, n_items: int) -> float:
    """CE pairs a request asks for (the unit of the service time)."""
    return float(n_queries * (budget + (n_items if exact else 0)))


@dataclass(eq=False)
class Ticket:
    """One admitted request: its cost counts toward the wait of newcomers while ``live``."""

    cost: float
    admitted_at: float
    live: bool = True


@dataclass(frozen=True)
class Decision:
    """What :meth:`Admission.try_admit` decided; ``ticket`` is None when refused."""

    ticket: Ticket | None
    expected_s: float | None  # expected time in the server (None: nothing measured yet)
    retry_after_s: int  # for a refusal: whole seconds, at least 1
    reason: str  # "" when admitted, else "queue_full", "deadline" or "too_large" (alone)

    @property
    def admitted(self) -> bool:
        return self.ticket is not None


class Admission:
    """See the module docstring. Thread-safe. ``within=0`` turns the deadline check off
    (only ``max_queue`` limits what is admitted, as before this check existed)."""

    def __init__(
        self,
        *,
        max_queue: int,
        timeout_s: float,
        within: float = 0.5,
        tau_s: float = 10.0,
        cold_limit: int = 2,
        lone_margin: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_queue < 1:
            raise ValueError(f"max_queue must be >= 1; got {max_queue}")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0; got {timeout_s}")
        if not 0 <= within <= 1:
            raise ValueError(f"within must be in [0, 1] (a fraction of the timeout); got {within}")
        if tau_s <= 0:
            raise ValueError(f"tau_s must be > 0; got {tau_s}")
        self.max_queue = int(max_queue)
        self.timeout_s = float(timeout_s)
        self.within = float(within)
        self.tau_s = float(tau_s)
        self.cold_limit = max(1, int(cold_limit))
        if lone_margin < 1:
            raise ValueError(f"lone_margin must be >= 1; got {lone_margin}")
        self.lone_margin = float(lone_margin)
        self.clock = clock
        self._mu = threading.Lock()
        self._n = 0  # requests in the server (a cancelled one stays until its thread ends)
        self._live = 0  # of which not cancelled
        self._work = 0.0  # cost of the live ones
        self._busy_since: float | None = None  # start of the current busy period
        self._open = 0.0  # busy seconds since the last finished request (before _busy_since)
        self._w = 0.0  # EWMA of busy seconds per finished request (weights decay in busy time)
        self._c = 0.0  # EWMA of the cost of finished requests, same weights
        self.finished = 0

    # -- the estimate ---------------------------------------------------------------------------
    def _open_seconds(self, now: float) -> float:
        return self._open + (now - self._busy_since if self._busy_since is not None else 0.0)

    def _per_unit(self, now: float) -> float | None:
        if self._c <= 0:
            return None
        return (self._w + self._open_seconds(now)) / self._c

    def seconds_per_unit(self) -> float | None:
        """Measured service seconds per unit of cost (None before the first finished request)."""
        with self._mu:
            return self._per_unit(self.clock())

    @property
    def in_server(self) -> int:
        return self._n

    @property
    def work(self) -> float:
        return self._work

    # -- the decision ---------------------------------------------------------------------------
    def try_admit(self, cost: float) -> Decision:
        with self._mu:
            now = self.clock()
            per_unit = self._per_unit(now)
            expected = None if per_unit is None else (self._work + cost) * per_unit
            if self._n >= self.max_queue:
                wait = per_unit * cost if per_unit is not None else 1.0
                return Decision(None, expected, _whole(wait), "queue_full")
            own = None if per_unit is None else cost * per_unit
            if self.within > 0 and own is not None and own > self.lone_margin * self.timeout_s:
                # over the limit even alone: no wait makes it fit (it would end in a 504)
                return Decision(None, own, _whole(own - self.timeout_s), "too_large")
            if self.within > 0 and self._live > 0:
                if per_unit is None:
                    if self._live >= self.cold_limit:
                        return Decision(None, None, 1, "deadline")
                else:
                    bound = self.within * self.timeout_s
                    if expected > bound:
                        return Decision(None, expected, _whole(expected - bound), "deadline")
            ticket = Ticket(float(cost), now)
            if self._n == 0:
                self._busy_since = now
            self._n += 1
            self._live += 1
            self._work += ticket.cost
            return Decision(ticket, expected, 0, "")

    def cancel(self, ticket: Ticket) -> None:
        """The request was cancelled (timeout, client gone): its pending work is dropped, so it
        no longer delays newcomers; it stays in the server until :meth:`done`."""
        with self._mu:
            self._drop(ticket)

    def _drop(self, ticket: Ticket) -> None:
        if ticket.live:
            ticket.live = False
            self._live -= 1
            self._work = max(self._work - ticket.cost, 0.0) if self._live else 0.0

    def done(self, ticket: Ticket, work: float | None = None) -> None:
        """The request's thread has ended, after doing ``work`` units of its cost (None: all of
        it; a cancelled request did part): one sample of the service time."""
        work = ticket.cost if work is None else float(work)
        with self._mu:
            now = self.clock()
            self._drop(ticket)
            self._n -= 1
            if work > 0:
                dt = self._open_seconds(now)
                decay = math.exp(-dt / self.tau_s)
                self._w = self._w * decay + dt
                self._c = self._c * decay + work
                self._open = 0.0
                self.finished += 1
            elif self._busy_since is not None:  # no work done: its time goes to the next one
                self._open += now - self._busy_since
            self._busy_since = now if self._n > 0 else None


def _whole(seconds: float) -> int:
    return max(1, math.ceil(seconds))
