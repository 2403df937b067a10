"""Item features sharded over Ray actors: each actor scans its own contiguous block of items.

:class:`ShardedFeatures` is an :class:`crossknn.core.ItemFeatures` whose ``top_k`` sends the round
queries ``u`` (and each shard's part of the exclusion lists) to every :class:`ShardActor`, and
merges the shards' top-k: score descending, ties to the lower global id, exactly the order of the
single-process kernel, so the search results are identical. The caller keeps the features only for
what the least squares needs (the rows of scored items): open them memory-mapped
(``ItemFeatures.from_npy``) and only those rows are read. The CE calls stay with the caller.

Each actor holds its shard as exact features or behind a FAISS round index
(:mod:`crossknn.search.round_index`). SoftMax and random sampling hash the item id inside the C++
kernel, which a shard only knows locally: they run on the caller's (memory-mapped) features.
"""

from __future__ import annotations

import numpy as np

from crossknn.core import ItemFeatures, check_k, exclude_csr
from crossknn.retrievers import query_masks
from crossknn.search.round_index import IndexedFeatures, build_round_index

__all__ = ["ShardActor", "ShardedFeatures", "shard_bounds"]


def shard_bounds(n_items: int, shards: int) -> list[tuple[int, int]]:
    """``shards`` contiguous item ranges covering ``[0, n_items)``, as even as possible."""
    if not 1 <= int(shards) <= int(n_items):
        raise ValueError(f"shards must be in [1, {n_items}] (the number of items); got {shards}")
    base, extra = divmod(int(n_items), int(shards))
    out, lo = [], 0
    for s in range(int(shards)):
        hi = lo + base + (1 if s < extra else 0)
        out.append((lo, hi))
        lo = hi
    return out


class ShardActor:
    """One shard: items ``[lo, hi)`` of V as exact features, or behind a FAISS round index.

    ``source``: the shard's rows (an array) or the path of the whole ``.npy`` item matrix (the
    actor memory-maps it and copies its rows only). ``round_index``: ``None`` (exact), or
    ``("ivf"|"hnsw", width)`` to build one over the shard."""

    def __init__(self, source, lo: int, hi: int, *, storage="float32", round_index=None):
        if isinstance(source, np.ndarray):
            rows = source
        else:
            rows = np.load(source, mmap_mode="r", allow_pickle=False)[lo:hi]
        if rows.shape[0] != hi - lo:
            raise ValueError(f"shard [{lo}, {hi}) got {rows.shape[0]} rows")
        self.lo, self.hi = int(lo), int(hi)
        self.features = ItemFeatures(np.asarray(rows, np.float32), storage=storage)
        if round_index is not None:
            kind, width = round_index
            index = build_round_index(self.features, kind, progress=False)
            self.features = IndexedFeatures(self.features, index, width=width)

    def n_items(self) -> int:
        return self.hi - self.lo

    def top_k(self, U: np.ndarray, k: int, excludes: list[np.ndarray], allows=None):
        """Per query, the shard's top min(k, available) items: (scores, global ids) lists.
        ``allows``: None, or per query the shard's slice of its allow mask (None: every item)."""
        S, ids_k = [], []
        n = self.hi - self.lo
        allows = [None] * len(excludes) if allows is None else allows
        ks = []
        for e, a in zip(excludes, allows, strict=True):
            e = np.unique(e)
            avail = n - e.size if a is None else int(a.sum()) - int(a[e].sum())
            ks.append(min(k, avail))
        if len(set(ks)) == 1 and all(a is None for a in allows):  # one batch call
            if ks[0] > 0:
                s, i = self.features.top_k(U, ks[0], exclude=excludes)
                return list(s), [ii + self.lo for ii in i]
            return [np.empty(0, np.float32)] * len(ks), [np.empty(0, np.int64)] * len(ks)
        for q, kq in enumerate(ks):
            if kq <= 0:
                S.append(np.empty(0, np.float32))
                ids_k.append(np.empty(0, np.int64))
                continue
            s, i = self.features.top_k(U[q], kq, exclude=excludes[q], allow=allows[q])
            S.append(s)
            ids_k.append(i + self.lo)
        return S, ids_k


class ShardedFeatures(ItemFeatures):
    """``features`` (the caller's, for rows and least squares) with ``top_k`` over Ray actors.

    ``actors``: handles of :class:`ShardActor` (a Ray remote class) in item order, covering
    ``[0, N)`` contiguously as :func:`shard_bounds` does.
    """

    def __init__(self, features: ItemFeatures, actors, bounds: list[tuple[int, int]]) -> None:
        if not isinstance(features, ItemFeatures):
            raise TypeError(f"features must be an ItemFeatures; got {type(features).__name__}")
        if len(actors) != len(bounds) or not actors:
            raise ValueError(f"{len(actors)} actors for {len(bounds)} shards")
        if (
            bounds[0][0] != 0
            or bounds[-1][1] != features.n_items
            or any(a[1] != b[0] for a, b in zip(bounds, bounds[1:], strict=False))
        ):
            raise ValueError(f"shards {bounds} do not cover [0, {features.n_items}) in order")
        self.base, self.actors, self.bounds = features, list(actors), list(bounds)
        self._f, self._vmax = features._f, features._vmax
        self.storage, self.n_items, self.dim = features.storage, features.n_items, features.dim

    @classmethod
    def start(
        cls,
        features: ItemFeatures,
        shards: int,
        *,
        source=None,
        round_index=None,
        num_cpus: float = 0.5,
    ) -> ShardedFeatures:
        """Start ``shards`` actors on the connected Ray cluster (``ray.init`` first). ``source``:
        the path of the ``.npy`` item matrix each actor reads its rows from (default: the rows
        are sent from here)."""
        # ray: optional (ray extra), slow to import
        import ray

        bounds = shard_bounds(features.n_items, shards)
        remote = ray.remote(num_cpus=num_cpus)(ShardActor)
        actors = []
        for lo, hi in bounds:
            src = source if source is not None else features.rows(np.arange(lo, hi))
            actors.append(
                remote.remote(src, lo, hi, storage=features.storage, round_index=round_index)
            )
        ray.get([a.n_items.remote() for a in actors])  # fail here if an actor cannot start
        return cls(features, actors, bounds)

    def stop(self) -> None:
        # ray: optional (ray extra), slow to import
        import ray

        for a in self.actors:
            ray.kill(a)
        self.actors = []

    def top_k(self, u, k: int, *, exclude=None, allow=None):
        # ray: optional (ray extra), slow to import
        import ray

        k = check_k(k, self.n_items)
        U, single = self._queries(u)
        Q = U.shape[0]
        ids, off = exclude_csr(exclude, 1 if single else Q, self.n_items)
        per_query = [
            np.empty(0, np.int64) if ids is None else ids[off[q] : off[q + 1]] for q in range(Q)
        ]
        per_query = [e[e >= 0] for e in per_query]
        masks = None
        if allow is not None:
            masks = query_masks([allow] if single else allow, Q, self.n_items)
        futures = []
        for a, (lo, hi) in zip(self.actors, self.bounds, strict=True):
            local = [e[(e >= lo) & (e < hi)] - lo for e in per_query]
            parts = None if masks is None else [None if m is None else m[lo:hi] for m in masks]
            futures.append(a.top_k.remote(U, k, local, parts))
        parts = ray.get(futures)
        S = np.empty((Q, k), np.float32)
        ids_k = np.empty((Q, k), np.int64)
        for q in range(Q):
            s = np.concatenate([p[0][q] for p in parts])
            i = np.concatenate([p[1][q] for p in parts])
            order = np.lexsort((i, -s.astype(np.float64)))[:k]
            if order.size < k:
                raise ValueError(f"the shards returned {order.size} unscored items; need {k}")
            S[q], ids_k[q] = s[order], i[order]
        return (S[0], ids_k[0]) if single else (S, ids_k)
