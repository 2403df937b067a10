"""The pairs of one training step: which queries, and for each a group of items.

A group is one positive (drawn from the query's positives), hard negatives (drawn from its mined
list) and random negatives (corpus items that are not positives), ``group_size`` items in all;
when the mined list is short, random items fill the group. Everything is a function of
``(seed, step)`` (the data order of an epoch of ``(seed, epoch)``), so a resumed run draws what
the uninterrupted run would have drawn.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["StepPlan"]


class StepPlan:
    def __init__(self, n_queries: int, per_step: int, seed: int) -> None:
        self.n = n_queries
        self.per_step = per_step
        self.seed = seed
        self.steps_per_epoch = math.ceil(n_queries / per_step)
        self._order: tuple[int, np.ndarray] | None = None

    def queries(self, step: int) -> np.ndarray:
        """The (train) query rows of ``step``, in data order."""
        epoch, pos = divmod(step, self.steps_per_epoch)
        if self._order is None or self._order[0] != epoch:
            self._order = (epoch, np.random.default_rng([self.seed, epoch, 2]).permutation(self.n))
        return self._order[1][pos * self.per_step : (pos + 1) * self.per_step]

    def groups(self, step, rows, positives, hard, pool, group_size, n_random) -> np.ndarray:
        """Item indices (len(rows) x group_size), the positive first."""
        rng = np.random.default_rng([self.seed, step, 1])
        out = np.empty((len(rows), group_size), dtype=np.int64)
        for r, q in enumerate(rows):
            pos = positives[q]
            out[r, 0] = pos[rng.integers(len(pos))]
            mined = hard[q]
            k = min(group_size - 1 - n_random, len(mined))
            chosen = list(rng.choice(mined, size=k, replace=False)) if k else []
            taken = set(chosen) | {int(p) for p in pos}
            while len(chosen) < group_size - 1:
                item = int(pool[rng.integers(len(pool))])
                if item not in taken:
                    chosen.append(item)
                    taken.add(item)
            out[r, 1:] = chosen
        return out
