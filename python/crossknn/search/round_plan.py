"""How many rounds ``auto`` runs: its recall per round count against what a round costs.

Every round of a search is one CE call for its new items: on a GPU one session run, whose cost
has a floor (kernel launches, host to device copies, the synchronisation) far above the cost of
the few pairs a round scores, so 30 rounds of 3 pairs cost about 30 floors; on a CPU the pairs
dominate and rounds are nearly free. A :class:`RoundCost` is that cost, measured on the CE itself
(:func:`measure_round_cost`: a run of one pair and a run of many, and the loop's own host time per
round), and predicts a plan's latency::

    latency(R, B) = R * (floor + host per round) + B * per pair

An ``auto`` index keeps its *rounds curve*: the cross-validated recall over its own complete rows
for each round count of :data:`ROUNDS_GRID` (:func:`crossknn.search.auto.rounds_curve`).
:func:`choose_rounds` takes the round count whose curve value is highest among those predicted to
answer within a latency target, the fewest rounds among equals; without a target (the CPU default)
or without a curve, the index's own rounds. What was chosen, and why, is a :class:`RoundChoice`,
which ``search --json``, ``serve``'s ``/info`` and its ``Server-Timing`` header report.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass

import numpy as np

__all__ = [
    "DEFAULT_GPU_TARGET_MS",
    "ROUNDS_GRID",
    "RoundChoice",
    "RoundCost",
    "choose_rounds",
    "measure_round_cost",
    "monotone_curve",
]

#: the round counts a rounds curve holds (the index's own rounds are added to them)
ROUNDS_GRID = (3, 4, 5, 6, 8, 10, 12, 15, 20, 30)
#: the latency target of the default path when the CE runs on a GPU (per query, milliseconds);
#: a CPU has none (its pairs dominate: the index's rounds run)
DEFAULT_GPU_TARGET_MS = 8.0
#: curve values closer than this are equal (the fewer rounds win)
CURVE_TIE = 1e-4


@dataclass(frozen=True)
class RoundCost:
    """What one query's rounds cost, in seconds: ``floor_s`` a CE call of any size (one session
    run), ``pair_s`` each pair in it, ``round_host_s`` the loop's own work per round (solve,
    approximate scores, top-k, the callback), ``fixed_s`` once per query (the DE, the final
    ranking). ``source`` says how it was obtained."""

    floor_s: float
    pair_s: float
    round_host_s: float = 0.0
    fixed_s: float = 0.0
    source: str = "given"

    def __post_init__(self) -> None:
        for name in ("floor_s", "pair_s", "round_host_s", "fixed_s"):
            v = getattr(self, name)
            if not (np.isfinite(v) and v >= 0):
                raise ValueError(f"RoundCost.{name} must be a finite number >= 0; got {v!r}")

    def latency_s(self, rounds: int, budget: int) -> float:
        """Predicted seconds of one query searched alone with ``rounds`` rounds of ``budget``."""
        return (
            self.fixed_s
            + int(rounds) * (self.floor_s + self.round_host_s)
            + int(budget) * self.pair_s
        )

    def to_dict(self) -> dict:
        return {k: (round(v * 1e3, 4) if k.endswith("_s") else v) for k, v in asdict(self).items()}


@dataclass(frozen=True)
class RoundChoice:
    """The rounds a search runs and why: ``by`` is ``"rounds"`` (asked for), ``"index"`` (the
    index's own choice: no latency target, or no curve to trade recall for time with) or
    ``"latency_target"``; ``predicted_ms`` the cost model's latency of it (None without one);
    ``curve_recall`` its cross-validated recall (None without a curve)."""

    rounds: int
    by: str
    target_ms: float | None = None
    predicted_ms: float | None = None
    curve_recall: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def monotone_curve(curve: Mapping) -> dict[int, float]:
    """``{rounds: recall}`` made non-decreasing in rounds (each value the best of it and every
    smaller round count): a round count never looks worse than fewer rounds because of the
    noise of a cross-validation over a few rows."""
    items = sorted((int(r), float(v)) for r, v in curve.items())
    out, best = {}, -np.inf
    for r, v in items:
        if r < 1 or not np.isfinite(v):
            raise ValueError(f"a rounds curve maps rounds >= 1 to finite recall; got {r}: {v}")
        best = max(best, v)
        out[r] = best
    return out


def choose_rounds(
    curve: Mapping | None,
    index_rounds: int,
    *,
    budget: int,
    cost: RoundCost | None = None,
    target_ms: float | None = None,
    rounds: int | None = None,
) -> RoundChoice:
    """The rounds of one search (see the module docstring); ``rounds`` asked for wins, capped at
    the budget. Under a target that no round count meets, the fewest rounds of the curve."""
    budget = int(budget)
    if budget < 1:
        raise ValueError(f"the budget must be >= 1; got {budget}")

    def pred(r: int) -> float | None:
        return None if cost is None else round(cost.latency_s(r, budget) * 1e3, 3)

    if rounds is not None:
        if int(rounds) < 1:
            raise ValueError(f"rounds must be >= 1; got {rounds}")
        r = min(int(rounds), budget)
        return RoundChoice(r, "rounds", target_ms, pred(r), _at(curve, r))
    r_index = min(int(index_rounds), budget)
    if not curve or cost is None or target_ms is None:
        return RoundChoice(r_index, "index", target_ms, pred(r_index), _at(curve, r_index))
    if target_ms <= 0:
        raise ValueError(f"the latency target must be > 0 ms; got {target_ms}")
    mono = monotone_curve(curve)
    fits = [r for r in mono if r <= budget and cost.latency_s(r, budget) * 1e3 <= target_ms]
    if not fits:
        r = min(r for r in mono if r <= budget) if any(r <= budget for r in mono) else 1
        return RoundChoice(r, "latency_target", target_ms, pred(r), _at(curve, r))
    best = max(mono[r] for r in fits)
    r = min(r for r in fits if mono[r] >= best - CURVE_TIE)
    return RoundChoice(r, "latency_target", target_ms, pred(r), _at(curve, r))


def _at(curve: Mapping | None, r: int) -> float | None:
    if not curve:
        return None
    mono = monotone_curve(curve)
    below = [k for k in mono if k <= r]
    return round(mono[max(below)], 6) if below else None


def measure_round_cost(
    ce, n_items: int, *, pairs: int = 64, repeats: int = 5, query: str = "cost probe"
) -> RoundCost:
    """The CE's floor and per-pair cost (``ce.score_batch`` over its items: one call of one pair
    and one of ``pairs`` pairs, the fastest of ``repeats`` after a warm-up of each); the loop's
    host time per round is not in it (:meth:`RoundCost` ``round_host_s`` = 0)."""
    n = max(1, min(int(pairs), int(n_items)))
    one = np.array([0], np.int64)
    many = np.arange(n, dtype=np.int64)

    def best(items) -> float:
        ce.score_batch([query], [items])  # warm-up: shapes, graphs, caches
        t = np.inf
        for _ in range(max(1, int(repeats))):
            t0 = time.perf_counter()
            ce.score_batch([query], [items])
            t = min(t, time.perf_counter() - t0)
        return t

    t1, tn = best(one), best(many)
    pair = max(0.0, (tn - t1) / max(n - 1, 1))
    floor = max(0.0, t1 - pair)
    return RoundCost(floor, pair, source=f"measured: 1 and {n} pairs, best of {repeats}")
