"""The one round loop shared by every search method.

A method (``crossknn.search.methods``) describes *what* to score: a plan of steps, each a number of
new items per query, of one of three kinds:

- ``first``: items that need no CE feedback (fixed anchors, a first-stage retriever's top items,
  or uniform random items);
- ``round``: items chosen from the approximate scores ``V u`` of the items not scored yet, where
  ``u`` solves the least squares on the items scored so far (TopK, SoftMax or Random);
- ``retrieve``: the top approximate items not scored yet (the last step of split methods).

:func:`run_rounds` executes the plan for a batch of queries: every step sends the CE calls of all
queries to the scorer in one ``score_batch``, all least squares / top-k / sampling go through the
C++ core (:class:`crossknn.core.ItemFeatures`, :class:`crossknn.core.RoundState`), and the final
top-k is ranked by exact CE scores. Randomness is keyed by ``(seed, query id)`` so a query gets the
same result alone or inside any batch.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from crossknn.core import RoundState
from crossknn.scorers import BudgetedScorer

__all__ = ["SearchResult", "Step", "query_seed", "run_rounds", "split_sizes"]

STEP_KINDS = ("first", "round", "retrieve")


@dataclass(frozen=True)
class Step:
    kind: str  # one of STEP_KINDS
    n: int  # new items per query in this step


@dataclass
class SearchResult:
    """Final top-k per query, FAISS-style, plus the CE calls spent.

    ``scores`` float32 (Q, k) exact CE scores, ``indices`` int64 (Q, k), padded with -inf / -1 when
    fewer than k items were scored; ``ce_calls`` int64 (Q,); ``scored_items`` / ``scored_scores``:
    every item scored for each query (in scoring order) and its CE score.
    """

    scores: np.ndarray
    indices: np.ndarray
    ce_calls: np.ndarray
    scored_items: list[np.ndarray] = field(default_factory=list)
    scored_scores: list[np.ndarray] = field(default_factory=list)

    def __iter__(self):  # scores, indices = method.search(...)
        return iter((self.scores, self.indices))


def query_seed(seed: int, query_id) -> int:
    """A 63-bit seed derived from (seed, query id); query ids may be ints or strings."""
    if isinstance(query_id, str):
        qid = int.from_bytes(hashlib.blake2b(query_id.encode(), digest_size=8).digest(), "little")
    else:
        qid = int(query_id)
        if qid < 0:
            raise ValueError(f"query ids must be >= 0 or strings; got {qid}")
    state = np.random.SeedSequence([int(seed) & (2**64 - 1), qid]).generate_state(2, np.uint32)
    return int((int(state[0]) << 31) ^ int(state[1]))


def split_sizes(n: int, parts: int) -> list[int]:
    """``n`` items over ``parts`` rounds, as even as possible, larger rounds first."""
    if parts <= 0:
        raise ValueError(f"rounds must be >= 1; got {parts}")
    if n < parts:
        raise ValueError(f"cannot spread {n} CE calls over {parts} rounds (rounds > budget)")
    base, extra = divmod(n, parts)
    return [base + (1 if r < extra else 0) for r in range(parts)]


def _check_plan(plan: Sequence[Step], budget: int, n_items: int) -> None:
    total = 0
    for s in plan:
        if s.kind not in STEP_KINDS:
            raise ValueError(f"unknown step kind {s.kind!r}; expected one of {STEP_KINDS}")
        if s.n <= 0:
            raise ValueError(f"every step must score at least one item; got {s}")
        total += s.n
    if total > budget:
        raise ValueError(f"the plan scores {total} items per query; the budget is {budget}")
    if total > n_items:
        raise ValueError(f"the plan scores {total} items per query; there are {n_items} items")
    if plan and plan[0].kind != "first":
        raise ValueError("a plan must start with a 'first' step (nothing to solve on yet)")


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
    """Runs ``method`` (a :class:`crossknn.search.methods.RoundMethod`) for a batch of queries."""
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
    _check_plan(plan, budget, n_items)
    ce = BudgetedScorer(scorer, queries, budget)
    features = method.features_for(budget)
    states = None
    if features is not None and any(s.kind != "first" for s in plan):
        priors = method.priors(queries)
        states = [
            RoundState(features, ridge=method.ridge, prior=priors[i], mix=method.mix)
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
            U = np.stack([method.query_embedding(s) for s in states]).astype(np.float32)
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
