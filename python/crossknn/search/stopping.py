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
    res: SearchResult, plan_sizes: Sequence[int], k: int, thresholds: np.ndarray, budget: int
) -> tuple[np.ndarray, np.ndarray]:
    """``(kept, calls)``, each (T, Q): for each threshold, what an early stop would have kept
    of each query's full-budget top-k (a share) and the CE calls it would have spent, from one
    search that ran the whole plan with ``stop_trace`` (``res.stop_chance``). A query stops
    before the first step whose chance is below the threshold (as the loop does)."""
    thresholds = np.asarray(thresholds, np.float64)
    cum = np.concatenate(([0], np.cumsum(np.asarray(plan_sizes, np.int64))))
    n_steps = len(plan_sizes)
    kept = np.ones((thresholds.size, len(res.scored_items)))
    calls = np.zeros((thresholds.size, len(res.scored_items)))
    for q, (items, scores) in enumerate(zip(res.scored_items, res.scored_scores, strict=True)):
        chance = np.asarray(res.stop_chance[q], np.float64)
        if chance.size != n_steps:
            raise ValueError(f"query {q}: {chance.size} stop estimates for {n_steps} steps")
        full = _topk(items, scores, k)
        # running minimum of the estimates (NaN: no estimate, never a stop), steps 1..n-1
        pm = np.minimum.accumulate(np.where(np.isnan(chance), np.inf, chance)[1:])
        # the step a threshold stops at: 1 + the number of steps whose running minimum >= it
        stop = 1 + np.searchsorted(-pm, -thresholds, side="right")
        stop = np.minimum(stop, n_steps)  # n_steps: ran the whole plan
        n_at = cum[stop].clip(max=int(res.ce_calls[q]))
        for t, n in enumerate(n_at.tolist()):
            calls[t, q] = n
            if n < cum[n_steps]:
                kept[t, q] = len(_topk(items[:n], scores[:n], k) & full) / max(len(full), 1)
    return kept, calls / max(int(budget), 1)


def threshold_for(mean_kept: np.ndarray, thresholds: np.ndarray, target: float) -> float:
    """The largest threshold whose mean kept share reaches ``target`` (0.0: none, never stop);
    ``mean_kept`` is non-increasing in the threshold."""
    ok = np.flatnonzero(np.asarray(mean_kept) >= float(target) - 1e-12)
    return float(np.asarray(thresholds)[ok].max()) if ok.size else 0.0


def calibrate(
    runs: Sequence[tuple[SearchResult, Sequence[int], int, int]],
    targets: Sequence[float] = TARGETS,
) -> dict:
    """The stop table of an index from ``runs``: ``(result, plan sizes, k, budget)`` of searches
    of its complete rows that ran the whole plan with ``stop_trace``. Every query of every run
    weighs the same. Returns ``{"thresholds": {target: threshold}, "calls_share": {target: mean
    calls / B}, "kept": {target: mean kept share}, "queries": n}`` (targets as strings, JSON)."""
    chances = [c for res, *_ in runs for c in res.stop_chance]
    seen = np.concatenate([c[np.isfinite(c)] for c in chances]) if chances else np.zeros(0)
    # every threshold that changes an outcome: just above each estimate seen
    grid = np.unique(np.nextafter(seen.clip(0.0, 1.0), 2.0).clip(max=1.0))
    grid = np.concatenate(([0.0], grid))
    kept, share = [], []
    for res, sizes, k, budget in runs:
        kq, cq = kept_by_threshold(res, sizes, k, grid, budget)
        kept.append(kq)
        share.append(cq)
    K = np.concatenate(kept, axis=1) if kept else np.ones((grid.size, 0))
    C = np.concatenate(share, axis=1) if share else np.ones((grid.size, 0))
    out: dict = {"thresholds": {}, "calls_share": {}, "kept": {}, "queries": int(K.shape[1])}
    if K.shape[1] == 0:
        return out
    mean_kept, mean_share = K.mean(1), C.mean(1)
    for t in targets:
        thr = threshold_for(mean_kept, grid, t)
        j = int(np.flatnonzero(grid == thr)[0]) if thr > 0 else 0
        out["thresholds"][str(float(t))] = thr
        out["calls_share"][str(float(t))] = round(float(mean_share[j]), 6)
        out["kept"][str(float(t))] = round(float(mean_kept[j]), 6)
    return out


def stop_curve(
    method_for: Callable[[np.ndarray], object],
    scorer,
    folds: Sequence[np.ndarray],
    *,
    budgets: Sequence[int] = CAL_BUDGETS,
    k: int = CAL_K,
    seed: int = 0,
    targets: Sequence[float] = TARGETS,
) -> dict:
    """The stop table (:func:`calibrate`) of cross-validated searches: the rows of each fold
    (positions among the complete rows, ``scorer`` over those rows) searched by
    ``method_for(fold)`` (a method over an index of the other rows) at each budget, the whole
    plan with the stop's estimate traced. Uses no CE call beyond the rows."""
    from crossknn.search.engine import search_rounds  # the engine imports this module's users

    n_items = int(scorer.n_items)
    budgets = [int(b) for b in budgets if k <= int(b) <= n_items]
    runs = []
    for f in folds:
        meth = method_for(np.asarray(f))
        for b in budgets:
            res = search_rounds(
                meth, scorer, np.asarray(f).tolist(), budget=b, k=k, seed=seed, stop_trace=True
            )
            runs.append((res, [s.n for s in meth.plan(b)], k, b))
    out = calibrate(runs, targets)
    out["budgets"], out["k"] = budgets, int(k)
    return out


def stop_threshold(curve: Mapping | None, target: float) -> float:
    """The threshold of ``target`` in a stop table: the calibrated target at or above it (the
    stricter one) gives it; above every calibrated target, 0 (never stop). ValueError without
    a table or for a target outside (0, 1]."""
    target = float(target)
    if not 0.0 < target <= 1.0:
        raise ValueError(f"target_recall must be in (0, 1]; got {target}")
    if not curve or not curve.get("thresholds"):
        raise ValueError(
            "target_recall needs an index whose build calibrated the early stop (an auto index "
            "with at least 4 complete rows, built by this version); this one has none"
        )
    table = sorted((float(t), float(v)) for t, v in curve["thresholds"].items())
    above = [v for t, v in table if t >= target - 1e-12]
    return above[0] if above else 0.0
