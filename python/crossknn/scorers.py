"""Scorers: the one interface every cross-encoder (CE) backend implements, and the budget wrapper.

A *scorer* is any object with

- ``n_items: int``
- ``score(query, items) -> float32 (m,)``: CE scores of one query against item indices
  (int64 array);
- ``score_batch(queries, items) -> list[float32 array]``: many queries in one call,
  ``items[i]`` being the item indices for ``queries[i]``.

``query`` is whatever the backend understands: a row index for :class:`MatrixScorer`, a text
for a real CE (``crossknn.ce.OnnxCrossEncoder``).

Search methods never call a scorer directly; they go through :class:`BudgetedScorer`, which
counts CE calls per query, refuses to exceed the budget (:class:`BudgetExceededError`), reuses
the score of an item already scored for a query at no cost, and rejects NaN/inf scores.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

__all__ = [
    "BudgetExceededError",
    "BudgetedScorer",
    "MatrixScorer",
    "Scorer",
    "TimedScorer",
    "as_items",
]


@runtime_checkable
class Scorer(Protocol):
    """What a CE backend provides (see the module docstring)."""

    n_items: int

    def score(self, query: Any, items: np.ndarray) -> np.ndarray: ...

    def score_batch(self, queries: list, items: list[np.ndarray]) -> list[np.ndarray]: ...


class BudgetExceededError(RuntimeError):
    """A search method asked for more CE calls than its budget allows."""


def as_items(items, n_items: int, *, what: str = "items") -> np.ndarray:
    """Item indices as a 1-D int64 array, checked against ``[0, n_items)``."""
    arr = np.asarray(items)
    if arr.size == 0:
        return np.empty(0, np.int64)
    if arr.dtype.kind not in "iu":
        raise ValueError(f"{what} must be integer item indices; got dtype {arr.dtype}")
    arr = arr.astype(np.int64, copy=False).ravel()
    lo, hi = int(arr.min()), int(arr.max())
    if lo < 0 or hi >= n_items:
        bad = lo if lo < 0 else hi
        raise IndexError(f"{what}: item index {bad} is out of range for {n_items} items")
    return arr


class MatrixScorer:
    """Looks CE scores up in a precomputed matrix ``scores[query_row, item]``.

    ``query`` is a row index of the matrix. Use it to evaluate search methods without running a
    model (``BENCHMARKS.md`` score-matrix folders).
    """

    def __init__(self, scores) -> None:
        scores = np.asarray(scores)
        if scores.ndim != 2 or 0 in scores.shape:
            raise ValueError(
                f"scores must be a non-empty 2-D matrix (queries x items); got shape {scores.shape}"
            )
        self.scores = np.ascontiguousarray(scores, dtype=np.float32)
        self.n_queries, self.n_items = self.scores.shape

    def __repr__(self) -> str:
        return f"MatrixScorer(n_queries={self.n_queries}, n_items={self.n_items})"

    def _row(self, query) -> int:
        if isinstance(query, bool) or not isinstance(query, (int, np.integer)):
            raise TypeError(
                f"MatrixScorer queries are row indices (int); got {type(query).__name__}"
            )
        if not 0 <= int(query) < self.n_queries:
            raise IndexError(f"query row {query} is out of range for {self.n_queries} rows")
        return int(query)

    def score(self, query, items) -> np.ndarray:
        return self.scores[self._row(query), as_items(items, self.n_items)].copy()

    def score_batch(self, queries: list, items: list) -> list[np.ndarray]:
        if len(queries) != len(items):
            raise ValueError(f"score_batch: {len(queries)} queries but {len(items)} item lists")
        return [self.score(q, it) for q, it in zip(queries, items, strict=True)]


class TimedScorer:
    """Scorer proxy that adds up the seconds spent inside the wrapped scorer (the CE)."""

    def __init__(self, scorer) -> None:
        self.scorer = scorer
        self.n_items = scorer.n_items
        self.seconds = 0.0

    def score(self, query, items):
        return self.score_batch([query], [items])[0]

    def score_batch(self, queries, items):
        t = time.perf_counter()
        try:
            return self.scorer.score_batch(queries, items)
        finally:
            self.seconds += time.perf_counter() - t


class BudgetedScorer:
    """Budget-enforcing, call-counting, caching view of a scorer for a batch of queries.

    Queries are addressed by their position ``i`` in ``queries``. Each query may spend at most
    ``budget`` CE calls; an item already scored for query ``i`` is never sent to the CE again (its
    cached score is returned). All new (query, item) pairs of one :meth:`score_batch` call go to
    the wrapped scorer in a single ``score_batch`` call.
    """

    def __init__(self, scorer, queries: Sequence, budget: int) -> None:
        for attr in ("n_items", "score_batch"):
            if not hasattr(scorer, attr):
                raise TypeError(f"scorer must provide {attr!r} (see crossknn.scorers.Scorer)")
        if int(budget) < 0:
            raise ValueError(f"budget must be >= 0; got {budget}")
        self.scorer = scorer
        self.queries = list(queries)
        self.budget = int(budget)
        self.n_items = int(scorer.n_items)
        self._cache: list[dict[int, float]] = [{} for _ in self.queries]
        self.batches = 0  # number of score_batch calls made to the wrapped scorer

    def __repr__(self) -> str:
        return (
            f"BudgetedScorer(n_queries={len(self.queries)}, budget={self.budget}, "
            f"calls_max={self.calls.max(initial=0)})"
        )

    @property
    def calls(self) -> np.ndarray:
        """CE calls spent so far, per query (int64, shape (n_queries,))."""
        return np.array([len(c) for c in self._cache], np.int64)

    def remaining(self, i: int) -> int:
        return self.budget - len(self._cache[i])

    def scored(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """(items int64, scores float32) scored so far for query ``i``, in scoring order."""
        c = self._cache[i]
        return np.fromiter(c.keys(), np.int64, len(c)), np.fromiter(c.values(), np.float32, len(c))

    def is_scored(self, i: int, item: int) -> bool:
        return int(item) in self._cache[i]

    def score(self, i: int, items) -> np.ndarray:
        return self.score_batch([i], [items])[0]

    def score_batch(self, slots: Sequence[int], items: Sequence) -> list[np.ndarray]:
        """Scores ``items[j]`` for query slot ``slots[j]``; one wrapped call for all new pairs."""
        if len(slots) != len(items):
            raise ValueError(f"score_batch: {len(slots)} query slots but {len(items)} item lists")
        items = [as_items(it, self.n_items) for it in items]
        new: dict[int, list[int]] = {}
        for i, it in zip(slots, items, strict=True):
            if not 0 <= i < len(self.queries):
                raise IndexError(f"query slot {i} is out of range for {len(self.queries)} queries")
            cache = self._cache[i]
            pending = new.setdefault(i, [])
            seen = set(pending)
            for item in it.tolist():
                if item not in cache and item not in seen:
                    seen.add(item)
                    pending.append(item)
        for i, pending in new.items():
            if len(self._cache[i]) + len(pending) > self.budget:
                raise BudgetExceededError(
                    f"query {i}: scoring {len(pending)} new items would use "
                    f"{len(self._cache[i]) + len(pending)} CE calls; the budget is {self.budget} "
                    f"({len(self._cache[i])} already spent)"
                )
        todo = [(i, np.array(p, np.int64)) for i, p in new.items() if p]
        if todo:
            out = self.scorer.score_batch([self.queries[i] for i, _ in todo], [p for _, p in todo])
            self.batches += 1
            if len(out) != len(todo):
                raise ValueError(f"scorer returned {len(out)} score arrays for {len(todo)} queries")
            for (i, p), s in zip(todo, out, strict=True):
                s = np.asarray(s, np.float32).ravel()
                if s.shape != p.shape:
                    raise ValueError(
                        f"scorer returned {s.shape[0]} scores for {p.shape[0]} items (query {i})"
                    )
                if not np.all(np.isfinite(s)):
                    bad = int(p[~np.isfinite(s)][0])
                    raise ValueError(f"scorer returned a NaN/inf score for query {i}, item {bad}")
                self._cache[i].update(zip(p.tolist(), s.tolist(), strict=True))
        return [
            np.array([self._cache[i][x] for x in it.tolist()], np.float32)
            for i, it in zip(slots, items, strict=True)
        ]
