"""The early stop: a query stops when another round is unlikely to change its top-k.

The round loop (``crossknn/search.h``, ``SearchOptions::stop_threshold``) estimates, before each
round, the chance that the round changes the query's top-k: the approximate scores of the best
unscored items against the k-th exact score so far, with the errors the approximate scores of the
last rounds made on the items they chose (out of sample: each error is of an item scored after
it was predicted). A query whose chance falls below the threshold takes no more rounds; the
budget B stays the ceiling (``Hits.ce_calls`` is what was spent, ``Hits.stopped`` why it ended:
``found``, ``budget`` or ``allowed``).

The threshold is not a number a user can read, so it is *calibrated*: ``target_recall`` is the
share of the top-k that the whole budget finds which an early stop keeps, on average. At build
time the index's own complete rows are searched (cross-validated: rows of a fold with an index of
the other rows, their exact top-k known because the rows are complete) at the budgets of
:data:`CAL_BUDGETS` with the stop's estimate recorded at every round (one search gives the outcome
of every threshold); :func:`calibrate` keeps, for each target of :data:`TARGETS`, the largest
threshold whose mean kept share reaches it. The table is stored in the index (``stop_curve``);
test queries are never read. A target between two calibrated ones uses the stricter one's
threshold.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from crossknn.scorers import MatrixScorer
from crossknn.search.engine import search_rounds
from crossknn.search.rounds import STOP_REASONS, SearchResult

__all__ = [
    "CAL_BUDGETS",
    "CAL_K",
    "MAX_ROWS",
    "STOP_REASONS",
    "TARGETS",
    "calibrate",
    "kept_by_threshold",
    "stop_curve",
    "stop_threshold",
    "threshold_for",
]

#: the targets a calibration keeps a threshold for (share of the full budget's top-k kept)
TARGETS = (0.9, 0.95, 0.98, 0.99, 0.995, 0.999)
#: the budgets and k the calibration searches the index's rows with
CAL_BUDGETS = (50, 100, 200)
CAL_K = 10
#: at most this many complete rows are searched by the calibration (a random subset of more)
MAX_ROWS = 200


def _topk(items: np.ndarray, scores: np.ndarray, k: int) -> set:
    order = np.lexsort((items, -scores.astype(np.float64)))[:k]  # exact score, ties: lower id
    return set(items[order].tolist())


def kept_by_threshold(
    res: SearchResult,
    plan_sizes: Sequence[int],
    k: int,
    thresholds: np.ndarray,
    budget: int,
    exact: Sequence | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(found, calls, ref)``: for each threshold (T) and query (Q), what an early stop would
    have found and spent, from one search that ran the whole plan with ``stop_trace``
    (``res.stop_chance``); a query stops before the first step whose chance is below the
    threshold, as the loop does. ``found`` (T, Q): how many items of the query's reference set
    the stopped top-k holds; ``calls`` (T, Q): its CE calls / ``budget``; ``ref`` (Q,): how many
    the full run's top-k holds. The reference set: ``exact[q]`` (the exact top-k ids, known for a
    complete row), or without ``exact`` the full run's own top-k (``ref`` = its size)."""
    thresholds = np.asarray(thresholds, np.float64)
    cum = np.concatenate(([0], np.cumsum(np.asarray(plan_sizes, np.int64))))
    n_steps, nq = len(plan_sizes), len(res.scored_items)
    found = np.zeros((thresholds.size, nq))
    calls = np.zeros((thresholds.size, nq))
    ref = np.zeros(nq)
    for q, (items, scores) in enumerate(zip(res.scored_items, res.scored_scores, strict=True)):
        chance = np.asarray(res.stop_chance[q], np.float64)
        if chance.size != n_steps:
            raise ValueError(f"query {q}: {chance.size} stop estimates for {n_steps} steps")
        full = _topk(items, scores, k)
        target = full if exact is None else set(np.asarray(exact[q]).tolist())
        ref[q] = len(full & target)
        # running minimum of the estimates (NaN: no estimate, never a stop), steps 1..n-1
        pm = np.minimum.accumulate(np.where(np.isnan(chance), np.inf, chance)[1:])
        # the step a threshold stops at: 1 + the number of steps whose running minimum >= it
        stop = np.minimum(1 + np.searchsorted(-pm, -thresholds, side="right"), n_steps)
        n_at = cum[stop].clip(max=int(res.ce_calls[q]))
        for t, n in enumerate(n_at.tolist()):
            calls[t, q] = n
            stopped = n < cum[n_steps]
            found[t, q] = len(_topk(items[:n], scores[:n], k) & target) if stopped else ref[q]
    return found, calls / max(int(budget), 1), ref


def threshold_for(mean_kept: np.ndarray, thresholds: np.ndarray, target: float) -> float:
    """The largest threshold whose mean kept share reaches ``target`` (0.0: none, never stop);
    ``mean_kept`` is non-increasing in the threshold."""
    ok = np.flatnonzero(np.asarray(mean_kept) >= float(target) - 1e-12)
    return float(np.asarray(thresholds)[ok].max()) if ok.size else 0.0


def calibrate(
    runs: Sequence[tuple[SearchResult, Sequence[int], int, int, Sequence | None]],
    targets: Sequence[float] = TARGETS,
) -> dict:
    """The stop table of one budget from ``runs``: ``(result, plan sizes, k, budget, exact)`` of
    searches that ran the whole plan with ``stop_trace`` (``exact``: each query's exact top-k
    ids, or None: the full run's top-k is the reference). The kept share of a threshold is the
    reference items the stopped searches find over those the full searches find (with exact
    top-k: the stopped recall over the full budget's recall). Returns ``{"thresholds": {target:
    threshold}, "calls_share": {target: mean calls / B}, "kept": {target: kept share},
    "queries": n}`` (targets as strings, JSON)."""
    chances = [c for res, *_ in runs for c in res.stop_chance]
    seen = np.concatenate([c[np.isfinite(c)] for c in chances]) if chances else np.zeros(0)
    # every threshold that changes an outcome: just above each estimate seen
    grid = np.unique(np.nextafter(seen.clip(0.0, 1.0), 2.0).clip(max=1.0))
    grid = np.concatenate(([0.0], grid))
    found, share, refs = [], [], []
    for res, sizes, k, budget, exact in runs:
        f, c, r = kept_by_threshold(res, sizes, k, grid, budget, exact)
        found.append(f)
        share.append(c)
        refs.append(r)
    out: dict = {"thresholds": {}, "calls_share": {}, "kept": {}, "queries": 0}
    if not found or sum(r.size for r in refs) == 0:
        return out
    F, C, R = np.concatenate(found, 1), np.concatenate(share, 1), np.concatenate(refs)
    out["queries"] = int(R.size)
    # one loss more than seen (a Laplace-style margin: with a few hundred reference items the
    # share seen is optimistic for the threshold picked as the largest that reaches it)
    lost = R.sum() - F.sum(1)
    mean_kept = 1.0 - (lost + (lost > 0)) / max(float(R.sum()), 1.0)
    mean_share = C.mean(1)
    for t in targets:
        thr = threshold_for(mean_kept, grid, t)
        j = int(np.flatnonzero(grid == thr)[0]) if thr > 0 else 0
        out["thresholds"][str(float(t))] = thr
        out["calls_share"][str(float(t))] = round(float(mean_share[j]), 6)
        out["kept"][str(float(t))] = round(float(mean_kept[j]), 6)
    return out


def stop_curve(
    method_for: Callable[[np.ndarray], object],
    rows: np.ndarray,
    folds: Sequence[np.ndarray],
    *,
    budgets: Sequence[int] = CAL_BUDGETS,
    k: int = CAL_K,
    seed: int = 0,
    targets: Sequence[float] = TARGETS,
) -> dict:
    """The stop table of an index with complete ``rows`` (m x N): the rows of each fold
    (positions among the rows) searched by ``method_for(fold)`` (a method over an index of the
    other rows) at each budget, the whole plan with the stop's estimate traced, calibrated per
    budget (:func:`calibrate`) against each row's exact top-k. Uses no CE call beyond the rows."""
    rows = np.asarray(rows, np.float32)
    scorer, n_items = MatrixScorer(rows), rows.shape[1]
    budgets = [int(b) for b in budgets if k <= int(b) <= n_items]
    runs: dict[int, list] = {b: [] for b in budgets}
    for f in folds:
        f = np.asarray(f, np.int64)
        meth = method_for(f)
        exact = [np.lexsort((np.arange(n_items), -rows[q].astype(np.float64)))[:k] for q in f]
        for b in budgets:
            res = search_rounds(meth, scorer, f.tolist(), budget=b, k=k, seed=seed, stop_trace=True)
            runs[b].append((res, [s.n for s in meth.plan(b)], k, b, exact))
    by_budget = {str(b): calibrate(runs[b], targets) for b in budgets}
    return {
        "k": int(k),
        "budgets": budgets,
        "queries": sum(int(v["queries"]) for v in by_budget.values()),
        "reference": "exact top-k of the complete rows",
        "by_budget": by_budget,
    }


def stop_threshold(curve: Mapping | None, target: float, budget: int) -> float:
    """The threshold of ``target`` at ``budget`` in a stop table: the calibrated budget nearest
    ``budget`` (in ratio), and there the calibrated target at or above ``target`` (the stricter
    one); above every calibrated target, 0 (never stop). ValueError without a table or for a
    target outside (0, 1]."""
    target = float(target)
    if not 0.0 < target <= 1.0:
        raise ValueError(f"target_recall must be in (0, 1]; got {target}")
    if not curve or not curve.get("by_budget"):
        raise ValueError(
            "target_recall needs an index whose build calibrated the early stop (an auto index "
            "with at least 4 complete rows, built by this version); this one has none"
        )
    b = max(int(budget), 1)
    near = min(curve["by_budget"], key=lambda x: (abs(np.log(int(x) / b)), int(x)))
    table = sorted((float(t), float(v)) for t, v in curve["by_budget"][near]["thresholds"].items())
    above = [v for t, v in table if t >= target - 1e-12]
    return above[0] if above else 0.0
