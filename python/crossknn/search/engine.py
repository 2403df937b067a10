"""The product's round loop: every search method runs on the C++ loop (``crossknn/search.h``).

A method (``crossknn.search.methods``) says *what* to score (its plan of steps, its item
features, how a query's embedding is solved, its first items); :func:`search_rounds` hands that
to ``_core.run_search``, which runs the rounds of a whole batch of queries in lockstep. Python
keeps only what a round asks of the CE: one callback per step with every query's new items, sent
to the scorer as one ``score_batch`` call. Budget accounting (at most B calls per query, each
item once), the solves, the per-round top-k / sampling and the final ranking are the core's.

Item features whose ``top_k`` / ``sample_softmax`` are not the core's own (a FAISS round index,
item shards: ``crossknn.search.round_index``, ``crossknn.search.shards``) are passed to the loop
as its per-round selection hook; everything else stays in C++.

``allow``: the items each query may be given (an allow mask per query, honoured by every kernel
that chooses items, the first items included: a disallowed item is never chosen, scored or
returned). A query whose mask allows at most B items scores them all in one step (its exact
top-k among them); one that allows fewer than k gets them all and -1 padding after.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

from crossknn import _core
from crossknn.core import ItemFeatures, allowed_count, pack_allow
from crossknn.retrievers import query_masks
from crossknn.search.rounds import SearchResult, check_plan, query_seed

__all__ = ["check_search_args", "query_allow", "query_id_int", "query_id_list", "search_rounds"]

_SOLVES = ("lstsq", "targets", "prior_ridge")


def query_id_int(query_id) -> int:
    """The integer a query id seeds with: the id itself, or 8 bytes of BLAKE2b of a string."""
    if isinstance(query_id, str):
        return int.from_bytes(hashlib.blake2b(query_id.encode(), digest_size=8).digest(), "little")
    qid = int(query_id)
    if qid < 0:
        raise ValueError(f"query ids must be >= 0 or strings; got {qid}")
    if qid >= 2**64:
        raise ValueError(f"integer query ids must be < 2**64; got {qid}")
    return qid


def _selector(features: ItemFeatures):
    """The features themselves when they select items their own way (else None: the core's)."""
    cls = type(features)
    own = cls.top_k is ItemFeatures.top_k and cls.sample_softmax is ItemFeatures.sample_softmax
    return None if own else features


def _core_first_stage(method, queries):
    hook = getattr(method, "core_first_stage", None)  # crossknn.search.methods.RoundMethod
    return None if hook is None else hook(queries)


def _uses_own_first(method) -> bool:
    draws = getattr(method, "core_draws_first", None)  # crossknn.search.methods.RoundMethod
    return bool(draws is not None and draws())


def query_allow(allow, n_queries: int, n_items: int) -> list[np.ndarray | None] | None:
    """``allow`` of :func:`search_rounds` as one boolean array (N,) or None per query (None for
    no mask at all)."""
    if allow is None:
        return None
    if isinstance(allow, np.ndarray) and allow.ndim == 1:
        if allow.dtype != np.bool_ or allow.shape != (n_items,):
            raise ValueError(
                f"allow must be a boolean array of shape ({n_items},); got {allow.dtype} "
                f"{allow.shape}"
            )
        return [allow] * n_queries
    if isinstance(allow, np.ndarray) and allow.ndim == 2:
        allow = list(allow)
    masks = query_masks(list(allow), n_queries, n_items)
    return None if all(m is None for m in masks) else masks


def check_search_args(scorer, budget, k) -> tuple[int, int, int]:
    """``(n_items, budget, k)`` as ints, after checking ``1 <= k <= budget <= n_items`` (the
    scorer's items); a ValueError naming the bound otherwise."""
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
    return n_items, budget, k


def query_id_list(queries: list, query_ids: Sequence | None) -> list:
    """The ids of ``queries``: ``query_ids`` (one per query), or by default each query itself
    where it is an int or a string, else its position."""
    if query_ids is None:
        query_ids = [
            q if isinstance(q, (int, np.integer, str)) else i for i, q in enumerate(queries)
        ]
    query_ids = list(query_ids)
    if len(query_ids) != len(queries):
        raise ValueError(f"{len(queries)} queries but {len(query_ids)} query ids")
    return query_ids


def search_rounds(
    method,
    scorer,
    queries: Sequence,
    *,
    budget: int,
    k: int,
    seed: int = 0,
    query_ids: Sequence | None = None,
    allow=None,
    stop: float | None = None,
    stop_trace: bool = False,
) -> SearchResult:
    """Runs ``method`` (a :class:`crossknn.search.methods.RoundMethod`) for a batch of queries
    on the C++ loop; one ``scorer.score_batch`` per step for all of them. ``allow``: None, a
    boolean array (N,) for every query, or a list of Q boolean arrays (N,) or None (see the
    module docstring). ``stop``: the early stop's threshold, a chance in (0, 1] (None or 0: off,
    every query runs its whole plan; ``crossknn.search.stopping``): a query stops before a step
    whose estimated chance of changing its top-k is below it; ``budget`` stays the ceiling.
    ``stop_trace``: record every step's estimate (``SearchResult.stop_chance``) without
    stopping unless ``stop`` is given."""
    queries = list(queries)
    nq = len(queries)
    n_items, budget, k = check_search_args(scorer, budget, k)
    stop = 0.0 if stop is None else float(stop)
    if not 0.0 <= stop <= 1.0:
        raise ValueError(f"the stop threshold is a chance in [0, 1]; got {stop}")
    if method.n_items is not None and method.n_items != n_items:
        raise ValueError(
            f"the method's index has {method.n_items} items but the scorer has {n_items}"
        )
    query_ids = query_id_list(queries, query_ids)
    ids = [query_id_int(q) for q in query_ids]
    plan = method.plan(budget)
    check_plan(plan, budget, n_items)
    if nq == 0:
        empty = np.empty((0, k))
        return SearchResult(
            empty.astype(np.float32),
            empty.astype(np.int64),
            np.zeros(0, np.int64),
            stopped=np.zeros(0, np.int8),
        )

    masks = query_allow(allow, nq, n_items)
    words = None if masks is None else pack_allow(masks, nq, n_items)
    counts = allowed_count(words, n_items) if words is not None else None
    # the queries that run the plan (the others score all their allowed items in one step)
    act = list(range(nq)) if counts is None else [q for q in range(nq) if counts[q] > budget]
    masked = masks is not None and any(masks[q] is not None for q in act)
    method = method.for_masks() if masked and hasattr(method, "for_masks") else method
    features = method.features_for(budget)
    if features is None:  # no rounds (RNR): the loop only needs N for its random first items
        features = method.random_features()
    solve = getattr(method, "solve", "lstsq")
    if solve not in _SOLVES:
        raise ValueError(f"unknown solve {solve!r}; expected one of {_SOLVES}")
    rounds = any(s.kind != "first" for s in plan)
    first = None
    # the DE's top items: the loop's own top-k, no Python round trip (None: first_items)
    dense = None if _uses_own_first(method) else _core_first_stage(method, queries)
    if dense is None and not _uses_own_first(method):
        seeds = [query_seed(seed, query_ids[q]) for q in act]
        first = np.full((nq, plan[0].n), -1, np.int64)  # small queries' rows are never read
        if act:
            got = method.first_items(
                [queries[q] for q in act],
                plan[0].n,
                seeds,
                **({"allow": [masks[q] for q in act]} if masked else {}),
            )
            first[act] = np.stack([np.asarray(c, np.int64).ravel() for c in got])
    priors = None
    mix = float(method.mix) if rounds else 0.0
    if rounds and (mix > 0 or solve == "prior_ridge"):
        priors = np.ascontiguousarray(np.stack(method.priors(queries)), np.float64)
    alpha, beta = method.score_normalization()
    inv_pen, decay = (None, 0.0)
    if solve == "prior_ridge":
        inv_pen, decay = method.prior_ridge_penalties()

    def score(slots, items):
        return scorer.score_batch([queries[i] for i in slots.tolist()], items)

    out = _core.run_search(
        features._f,
        score,
        [(s.kind, int(s.n)) for s in plan],
        ids,
        budget=budget,
        k=k,
        strategy=method.strategy,
        temperature=float(method.temperature),
        ridge=float(method.ridge),
        mix=mix,
        seed=int(seed) & (2**64 - 1),
        first_items=first,
        priors=priors,
        score_alpha=float(alpha),
        score_beta=float(beta),
        solve=solve if rounds else "lstsq",
        inv_penalties=inv_pen,
        penalty_decay=float(decay),
        final_retrieved=method.final == "retrieved",
        selector=_selector(features) if rounds else None,
        allow=words,
        stop_threshold=stop,
        stop_trace=bool(stop_trace),
        **(dense or {}),
    )
    return SearchResult(
        out["scores"],
        out["indices"],
        out["ce_calls"],
        list(out["scored_items"]),
        list(out["scored_scores"]),
        stopped=out["stopped"],
        stop_chance=list(out["stop_chance"]),
    )
