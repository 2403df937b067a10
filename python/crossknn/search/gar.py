"""GAR: graph-based adaptive re-ranking (MacAvaney, Tonellotto and Macdonald, CIKM 2022).

GAR spends a budget of ``c = B`` CE calls in batches of ``b`` items, alternating between the
*initial ranking* (the first stage's top items, best first) and the *frontier*: the corpus-graph
neighbours (:mod:`crossknn.search.graph`) of the items scored so far, each keyed by the best CE
score of a scored item that points to it. It is Algorithm 1 of the paper as
``pyterrier_adaptive.GAR`` (0.2.x) runs it, step for step:

1. a batch is the next ``min(b, B - scored)`` items of the initial ranking (even batches) or the
   frontier's highest-keyed items (odd batches); a source with nothing left is skipped;
2. the batch is scored by the CE and its items leave both sources;
3. while budget remains, each scored item (by CE score, best first) whose score is at least the
   frontier's lowest adopted score, or any while the frontier holds fewer items than the budget
   left, puts its unscored neighbours in the frontier keyed by its score (a neighbour keeps the
   higher key);
4. until B items are scored or both sources are empty; the final top-k is by exact CE score.

Ties follow the reference: items of equal key leave the frontier in the order they entered it,
and a batch's items update the frontier by (score, item) descending (the reference orders by
(score, docno) descending; its docnos are our item indices written with equal width).

On the product's batch interface: one ``scorer.score_batch`` per batch step for every query of
the call (their batches in lockstep), at most B calls per query, each item once. ``allow`` masks
are honoured as in :func:`crossknn.search.engine.search_rounds`: the first stage searches within
the mask, a neighbour the mask excludes never enters the frontier, and a query whose mask allows
at most B items scores them all in one step.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from operator import itemgetter

import numpy as np

from crossknn.search.engine import check_search_args, query_allow, query_id_list
from crossknn.search.graph import check_graph
from crossknn.search.methods import RoundMethod
from crossknn.search.rounds import STOP_REASONS, SearchResult, Step, query_seed

__all__ = ["DEFAULT_BATCH", "GAR"]

DEFAULT_BATCH = 16  # b of the paper and of pyterrier_adaptive.GAR


class _Query:
    """One query's GAR state: the initial ranking, the frontier, the scored items."""

    __slots__ = ("allow", "frontier", "initial", "iteration", "minscore", "pos", "scored")

    def __init__(self, initial: np.ndarray, allow: np.ndarray | None) -> None:
        self.initial = [int(i) for i in initial if i >= 0]
        self.pos = 0  # the initial ranking's next candidate (items scored since are skipped)
        self.frontier: dict[int, float] = {}  # item -> key, in the order items entered
        self.minscore = float("inf")
        self.iteration = 0
        self.scored: dict[int, float] = {}  # item -> CE score, in scoring order
        self.allow = allow

    def _skip_scored(self) -> None:
        while self.pos < len(self.initial) and self.initial[self.pos] in self.scored:
            self.pos += 1

    def active(self, budget: int) -> bool:
        self._skip_scored()
        return len(self.scored) < budget and (self.pos < len(self.initial) or bool(self.frontier))

    def next_batch(self, budget: int, b: int) -> list[int]:
        size = min(b, budget - len(self.scored))
        while True:
            if self.iteration % 2 == 0:
                self._skip_scored()
                if self.pos < len(self.initial):
                    out, j = [], self.pos
                    while len(out) < size and j < len(self.initial):
                        if self.initial[j] not in self.scored:
                            out.append(self.initial[j])
                        j += 1
                    return out
            elif self.frontier:  # Counter.most_common(n): heapq.nlargest, ties by entry order
                return [i for i, _ in heapq.nlargest(size, self.frontier.items(), itemgetter(1))]
            self.iteration += 1  # nothing in this source: the other one

    def update(self, items: list[int], scores, graph: np.ndarray, budget: int) -> None:
        for i, s in zip(items, scores, strict=True):
            self.scored[i] = float(s)
            self.frontier.pop(i, None)
        if len(self.scored) < budget:
            self._grow_frontier(items, budget, graph)
        self.iteration += 1

    def _grow_frontier(self, items: list[int], budget: int, graph: np.ndarray) -> None:
        left = budget - len(self.scored)
        scored, frontier, allow = self.scored, self.frontier, self.allow
        for score, item in sorted(((scored[i], i) for i in items), reverse=True):
            if len(frontier) < left or score >= self.minscore:
                hit = False
                for t in graph[item].tolist():
                    if t in scored or (allow is not None and not allow[t]):
                        continue
                    if t not in frontier or score > frontier[t]:
                        frontier[t] = score
                        hit = True
                if hit and score < self.minscore:
                    self.minscore = score


class GAR(RoundMethod):
    """Graph-based adaptive re-ranking over a corpus graph ``graph`` (N x k item indices,
    :func:`crossknn.search.graph.knn_graph`), batches of ``batch_size`` (b), the budget B as the
    paper's ``c``; ``first``: the initial ranking (a retriever, e.g. the DE's, or ``"random"``).
    """

    name = "gar"

    def __init__(
        self, graph, *, first="random", batch_size: int = DEFAULT_BATCH, n_items: int | None = None
    ) -> None:
        G = np.asarray(graph)
        n = G.shape[0] if n_items is None else int(n_items)
        super().__init__(first=first, n_items=n)
        self.graph = check_graph(G, n)
        if isinstance(batch_size, bool) or int(batch_size) < 1:
            raise ValueError(f"GAR's batch size b must be >= 1; got {batch_size!r}")
        self.batch_size = int(batch_size)

    def __repr__(self) -> str:
        first = self.first if isinstance(self.first, str) else type(self.first).__name__
        return (
            f"GAR(first={first!r}, n_items={self.n_items}, k={self.graph.shape[1]}, "
            f"batch_size={self.batch_size})"
        )

    def plan(self, budget: int) -> list[Step]:
        """The batches of a query that spends the whole budget (b items each, the last what is
        left): GAR's steps, each a CE batch."""
        budget = int(budget)
        if budget < 1:
            raise ValueError(f"the budget must be >= 1 CE call; got {budget}")
        sizes = [min(self.batch_size, budget - lo) for lo in range(0, budget, self.batch_size)]
        return [Step("first", sizes[0])] + [Step("round", s) for s in sizes[1:]]

    def _initial(self, queries, n, seeds, masks) -> list[np.ndarray]:
        """The initial ranking of each query: the first stage's top ``n`` (within its mask);
        a retriever may return fewer (-1 padded)."""
        if isinstance(self.first, str):
            return self.first_items(queries, n, seeds, allow=masks)
        kw = {} if masks is None else {"allow": masks}
        top = np.asarray(self.first.retrieve(list(queries), n, **kw), np.int64)
        if top.ndim != 2 or top.shape[0] != len(queries):
            raise ValueError(
                f"the first-stage retriever returned {top.shape}; expected ({len(queries)}, {n})"
            )
        return list(top)

    def search(
        self,
        scorer,
        queries: Sequence,
        *,
        budget: int,
        k: int,
        seed: int = 0,
        query_ids: Sequence | None = None,
        allow=None,
    ) -> SearchResult:
        """Top-k items per query by exact CE score after GAR's batches, at most ``budget`` CE
        calls each (``allow`` as in :func:`crossknn.search.engine.search_rounds`)."""
        queries = list(queries)
        nq = len(queries)
        n_items, budget, k = check_search_args(scorer, budget, k)
        if self.n_items != n_items:
            raise ValueError(
                f"the method's index has {self.n_items} items but the scorer has {n_items}"
            )
        query_ids = query_id_list(queries, query_ids)
        masks = query_allow(allow, nq, n_items)
        mask_of = [None] * nq if masks is None else masks
        # a query whose mask allows at most B items scores them all in one step (exact)
        small = {
            q: np.flatnonzero(m)
            for q, m in enumerate(mask_of)
            if m is not None and int(m.sum()) <= budget
        }
        act = [q for q in range(nq) if q not in small]
        states: dict[int, _Query] = {}
        if act:
            got = self._initial(
                [queries[q] for q in act],
                budget,
                [query_seed(seed, query_ids[q]) for q in act],
                None if masks is None else [mask_of[q] for q in act],
            )
            for q, items in zip(act, got, strict=True):
                m = mask_of[q]
                items = np.asarray(items, np.int64).ravel()
                if m is not None:  # a first stage that ignored the mask: its items never scored
                    items = items[(items >= 0) & m[np.clip(items, 0, n_items - 1)]]
                states[q] = _Query(items, m)
        scored_small: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        first_call = True
        while True:
            slots, batches = [], []
            if first_call:
                for q, items in small.items():
                    if items.size:
                        slots.append(q)
                        batches.append(items.astype(np.int64))
            for q in act:
                st = states[q]
                if st.active(budget):
                    slots.append(q)
                    batches.append(np.asarray(st.next_batch(budget, self.batch_size), np.int64))
            first_call = False
            if not slots:
                break
            scores = scorer.score_batch([queries[q] for q in slots], batches)
            if len(scores) != len(slots):
                raise ValueError(
                    f"the scorer returned {len(scores)} score lists for {len(slots)} queries"
                )
            for q, items, s in zip(slots, batches, scores, strict=True):
                s = np.asarray(s, np.float64).ravel()
                if s.shape != items.shape:
                    raise ValueError(f"the scorer returned {s.size} scores for {items.size} items")
                if q in small:
                    scored_small[q] = (items, s)
                else:
                    states[q].update(items.tolist(), s.tolist(), self.graph, budget)
        return _result(nq, k, states, scored_small)


def _result(nq: int, k: int, states: dict, scored_small: dict) -> SearchResult:
    scores = np.full((nq, k), -np.inf, np.float32)
    indices = np.full((nq, k), -1, np.int64)
    calls = np.zeros(nq, np.int64)
    # why each query ended: its budget (or both sources empty), or a mask allowing <= B items
    stopped = np.full(nq, STOP_REASONS.index("budget"), np.int8)
    items_all: list[np.ndarray] = []
    scores_all: list[np.ndarray] = []
    for q in range(nq):
        if q in states:
            d = states[q].scored
            it = np.fromiter(d.keys(), np.int64, len(d))
            sc = np.fromiter(d.values(), np.float64, len(d))
        else:
            it, sc = scored_small.get(q, (np.empty(0, np.int64), np.empty(0)))
            stopped[q] = STOP_REASONS.index("allowed")
        sc32 = sc.astype(np.float32)
        top = np.lexsort((it, -sc32))[:k]  # by exact CE score, then the smaller item
        scores[q, : top.size] = sc32[top]
        indices[q, : top.size] = it[top]
        calls[q] = it.size
        items_all.append(it)
        scores_all.append(sc32)
    return SearchResult(scores, indices, calls, items_all, scores_all, stopped=stopped)
