"""The Python round loop every search ran before the C++ loop took over (the reference).

``run_rounds`` is crossknn's former ``crossknn.search.rounds.run_rounds`` and the per-method query
embeddings its methods computed in numpy (``query_embedding``: the core's least squares, ANNCUR's
fixed-anchor targets, auto's ridge pulled to the DE prior through ``np.linalg.solve``). The tests
and ``bench/overhead_bench.py`` compare the product path (``RoundMethod.search`` ->
``crossknn.search.engine.search_rounds`` -> ``_core.run_search``) against it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from threadpoolctl import threadpool_limits

from crossknn.core import RoundState
from crossknn.scorers import BudgetedScorer
from crossknn.search.rounds import SearchResult, check_plan, query_seed

__all__ = ["auto_embedding", "auto_row_prior", "priors", "query_embedding", "run_rounds"]

_X_CACHE: dict[int, tuple] = {}  # id(index) -> (index, its features in float64)


def auto_embedding(method, state) -> np.ndarray:
    """``auto``'s u = c p0 + w (crossknn.search.auto), solved in numpy as the method did."""
    hit = _X_CACHE.get(id(method.index))
    if hit is None or hit[0] is not method.index:  # an id can be reused once an index is freed
        hit = _X_CACHE[id(method.index)] = (
            method.index,
            method.index.features().astype(np.float64),
        )
    X = hit[1]
    p0 = state.prior
    A = state.items
    if A.size == 0:
        return p0
    XA = X[A]
    Z = np.hstack([XA, (XA @ p0)[:, None]])  # last column: the free slope on the prior
    inv_rho, decay = method.prior_ridge_penalties()
    if decay:
        inv_rho = inv_rho * (A.size / 10.0) ** decay
    ZL = Z * inv_rho
    # ridge solution via the n x n system (n = |A| <= B is small): ZL^T (Z ZL^T + I)^-1 a
    w = ZL.T @ np.linalg.solve(ZL @ Z.T + np.eye(A.size), state.targets)
    return w[:-1] + w[-1] * p0


def auto_row_prior(index, v) -> np.ndarray:
    """``AutoIndex.row_prior`` as it was: the spread as ``np.std`` of a float64 copy of V @ v."""
    if index.prior_alpha == 0 or index.n_rows == 0:
        return np.zeros(index.n_rows)
    W = index.row_vectors.astype(np.float64)
    nv = float(np.linalg.norm(v))
    cos = (W @ v) / (np.maximum(np.linalg.norm(W, axis=1), 1e-12) * max(nv, 1e-12))
    w = np.exp(index.prior_tau * (cos - cos.max()))
    spread = float(np.std(index.item_vectors.astype(np.float64) @ v))
    return index.prior_alpha * spread * w / w.sum()


def priors(method, queries) -> list:
    """``method.priors(queries)`` as it was (``auto``: :func:`auto_row_prior`)."""
    if method.solve != "prior_ridge":
        return method.priors(queries)
    out = []
    for q in queries:
        v = method.prior(q) if callable(method.prior) else np.asarray(method.prior)[int(q)]
        v = np.asarray(v, np.float64).ravel()
        # the query-subspace block's prior entries are zeros, as is the intercept's
        out.append(np.r_[v, auto_row_prior(method.index, v), np.zeros(method.index.n_dirs), 0.0])
    return out


def query_embedding(method, state) -> np.ndarray:
    if method.solve == "targets":  # ANNCUR's fixed anchors: u = e_q
        return state.targets
    if method.solve == "prior_ridge":
        return auto_embedding(method, state)
    return state.solve()


def search(method, scorer, queries, **kw) -> SearchResult:
    """``method.search`` as it was: the Python loop (auto: BLAS limited to one thread)."""
    if method.solve == "prior_ridge":
        with threadpool_limits(1, user_api="blas"):
            return run_rounds(method, scorer, queries, **kw)
    return run_rounds(method, scorer, queries, **kw)


def run_rounds(
    method,
    scorer,
    queries: Sequence,
    *,
    budget: int,
    k: int,
    seed: int = 0,
    query_ids: Sequence | None = None,
) -> SearchResult:
    """The old Python loop (crossknn.search.rounds.run_rounds before the C++ loop ran every
    search), kept verbatim as the reference for ``method`` over a batch of queries."""
    queries = list(queries)
    nq = len(queries)
    n_items = int(scorer.n_items)
    budget, k = int(budget), int(k)
    if k < 1:
        raise ValueError(f"k must be >= 1; got {k}")
    if budget < 1:
        raise ValueError(f"the budget must be >= 1 CE call; got {budget}")
    if k > budget:
        raise ValueError(f"k={k} exceeds the budget B={budget}: at most B items can be ranked")
    if budget > n_items:
        raise ValueError(f"the budget B={budget} exceeds the number of items ({n_items})")
    if method.n_items is not None and method.n_items != n_items:
        raise ValueError(
            f"the method's index has {method.n_items} items but the scorer has {n_items}"
        )
    if query_ids is None:
        query_ids = [
            q if isinstance(q, (int, np.integer, str)) else i for i, q in enumerate(queries)
        ]
    query_ids = list(query_ids)
    if len(query_ids) != nq:
        raise ValueError(f"{nq} queries but {len(query_ids)} query ids")
    seeds = [query_seed(seed, qid) for qid in query_ids]

    plan = method.plan(budget)
    check_plan(plan, budget, n_items)
    ce = BudgetedScorer(scorer, queries, budget)
    features = method.features_for(budget)
    states = None
    if features is not None and any(s.kind != "first" for s in plan):
        prior_vectors = priors(method, queries)
        states = [
            RoundState(features, ridge=method.ridge, prior=prior_vectors[i], mix=method.mix)
            for i in range(nq)
        ]
    # items of the final 'retrieve' step and anchors that would have been retrieved (paper mode)
    retrieved: list[np.ndarray] | None = None

    for r, step in enumerate(plan):
        if nq == 0:
            break
        exclude = [ce.scored(i)[0] for i in range(nq)]
        if step.kind == "first":
            chosen = method.first_items(queries, step.n, seeds)
        else:
            U = np.stack([query_embedding(method, s) for s in states]).astype(np.float32)
            strategy = "topk" if step.kind == "retrieve" else method.strategy
            if strategy == "topk":
                chosen = list(features.top_k(U, step.n, exclude=exclude)[1])
            elif strategy == "softmax":
                chosen = [
                    features.sample_softmax(
                        U[i],
                        step.n,
                        exclude=exclude[i],
                        temperature=method.temperature,
                        seed=query_seed(seeds[i], r),
                    )[1]
                    for i in range(nq)
                ]
            elif strategy == "random":
                chosen = [
                    features.sample_random(step.n, exclude=exclude[i], seed=query_seed(seeds[i], r))
                    for i in range(nq)
                ]
            else:
                raise ValueError(f"unknown strategy {strategy!r}; expected topk, softmax or random")
            if step.kind == "retrieve" and method.final == "retrieved":
                retrieved = []
                for i in range(nq):
                    prev = exclude[i]
                    approx_prev = features.rows(prev) @ U[i].astype(np.float64)
                    approx_ret = features.rows(chosen[i]) @ U[i].astype(np.float64)
                    floor = approx_ret.min() if approx_ret.size else np.inf
                    retrieved.append(np.concatenate([chosen[i], prev[approx_prev >= floor]]))
        chosen = [np.asarray(c, np.int64).ravel() for c in chosen]
        for i, c in enumerate(chosen):
            if c.shape != (step.n,) or np.unique(c).size != step.n:
                raise ValueError(
                    f"step {r} ({step.kind}) chose {c.size} items for query {i}; "
                    f"expected {step.n} distinct"
                )
            if np.isin(c, exclude[i], kind="sort").any():  # "table" clears N bytes per call
                raise ValueError(f"step {r} ({step.kind}) chose an item already scored (query {i})")
        new_scores = ce.score_batch(range(nq), chosen)
        if states is not None:
            for i in range(nq):
                states[i].append(chosen[i], method.transform_targets(new_scores[i]))

    # final ranking by exact CE scores among the candidates
    S = np.full((nq, k), -np.inf, np.float32)
    idx = np.full((nq, k), -1, np.int64)
    all_items, all_scores = [], []
    for i in range(nq):
        items, scores = ce.scored(i)
        all_items.append(items)
        all_scores.append(scores)
        if retrieved is not None:
            keep = np.isin(items, retrieved[i])
            items, scores = items[keep], scores[keep]
        order = np.lexsort((items, -scores))[:k]
        S[i, : order.size] = scores[order]
        idx[i, : order.size] = items[order]
    return SearchResult(S, idx, ce.calls, all_items, all_scores)
