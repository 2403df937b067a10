"""Plans of the round loop: steps, split sizes, query seeds and the result type.

A method (``crossknn.search.methods``) describes *what* to score: a plan of steps, each a number of
new items per query, of one of three kinds:

- ``first``: items that need no CE feedback (fixed anchors, a first-stage retriever's top items,
  or uniform random items);
- ``round``: items chosen from the approximate scores ``V u`` of the items not scored yet, where
  ``u`` solves the least squares on the items scored so far (TopK, SoftMax or Random);
- ``retrieve``: the top approximate items not scored yet (the last step of split methods).

:func:`crossknn.search.engine.search_rounds` executes the plan for a batch of queries on the C++
loop (``crossknn/search.h``): every step sends the CE calls of all queries to the scorer in one
``score_batch``; the solves, the top-k / sampling and the final ranking by exact CE scores are the
core's. Randomness is keyed by ``(seed, query id)`` so a query gets the same result alone or
inside any batch.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

__all__ = ["STOP_REASONS", "SearchResult", "Step", "check_plan", "query_seed", "split_sizes"]

STEP_KINDS = ("first", "round", "retrieve")
#: why a query's search ended (``SearchResult.stopped``, ``Hits.stopped``): it ran its whole plan
#: (``budget``), the early stop found its top-k (``found``; ``crossknn.search.stopping``), or its
#: allow mask allowed at most B items, all scored in one step (``allowed``)
STOP_REASONS = ("budget", "found", "allowed")


@dataclass(frozen=True)
class Step:
    kind: str  # one of STEP_KINDS
    n: int  # new items per query in this step


@dataclass
class SearchResult:
    """Final top-k per query, FAISS-style, plus the CE calls spent.

    ``scores`` float32 (Q, k) exact CE scores, ``indices`` int64 (Q, k), padded with -inf / -1 when
    fewer than k items were scored; ``ce_calls`` int64 (Q,); ``scored_items`` / ``scored_scores``:
    every item scored for each query (in scoring order) and its CE score; ``stopped`` int8 (Q,)
    codes of :data:`STOP_REASONS` (:meth:`stop_reason`); ``stop_chance``: with a stop threshold
    or trace, each query's estimated chance per step that the step changes its top-k (NaN where
    none was made).
    """

    scores: np.ndarray
    indices: np.ndarray
    ce_calls: np.ndarray
    scored_items: list[np.ndarray] = field(default_factory=list)
    scored_scores: list[np.ndarray] = field(default_factory=list)
    stopped: np.ndarray | None = None
    stop_chance: list[np.ndarray] = field(default_factory=list)

    def stop_reason(self, i: int) -> str:
        """Why query ``i``'s search ended: one of :data:`STOP_REASONS`."""
        return "budget" if self.stopped is None else STOP_REASONS[int(self.stopped[i])]

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


def check_plan(plan: Sequence[Step], budget: int, n_items: int) -> None:
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
