"""Independent numpy reference of the crossknn.core contract (slow, simple, obviously right).

Used by tests/test_core.py. Sampling uses numpy's RNG, so only its distribution (not its
draws) is comparable with the C++ engine. ``rows`` reproduces the engine's storage rounding
(float16 round-to-nearest-even, int8 per-row scale max|v|/127 with round-half-even).
"""

from __future__ import annotations

__all__ = ["ItemFeatures", "RoundState"]

from collections.abc import Sequence

import numpy as np

_STORAGES = ("float32", "float16", "int8")


def _as_exclude(exclude, n_queries: int | None) -> list[np.ndarray]:
    if n_queries is None:
        ex = np.empty(0, np.int64) if exclude is None else np.asarray(exclude, np.int64).ravel()
        return [ex]
    if exclude is None:
        return [np.empty(0, np.int64)] * n_queries
    if len(exclude) != n_queries:
        raise ValueError(
            f"exclude: expected {n_queries} arrays (one per query), got {len(exclude)}"
        )
    return [np.asarray(e, np.int64).ravel() for e in exclude]


class ItemFeatures:
    def __init__(self, V, *, storage: str = "float32", threads: int = 0) -> None:
        V = np.asarray(V)
        if V.ndim != 2 or V.shape[0] == 0 or V.shape[1] == 0:
            raise ValueError(f"V must be a non-empty 2-D array (N x d); got shape {V.shape}")
        if storage not in _STORAGES:
            raise ValueError(f"storage must be one of {_STORAGES}; got {storage!r}")
        self.storage = storage
        self.threads = threads
        V = V.astype(np.float32)
        if storage == "int8":
            scale = np.abs(V).max(axis=1) / 127.0
            scale[scale == 0] = 1.0
            self._q = np.round(V / scale[:, None]).astype(np.int8)
            self._scale = scale.astype(np.float32)
            self._V = self._q.astype(np.float32) * self._scale[:, None]
        else:
            self._V = V.astype(storage).astype(np.float32)
        self.n_items, self.dim = V.shape

    def __repr__(self) -> str:
        return f"ItemFeatures(n_items={self.n_items}, dim={self.dim}, storage={self.storage!r})"

    def rows(self, items) -> np.ndarray:
        return self._V[np.asarray(items, np.int64)].astype(np.float64)

    def _select(self, u, k, exclude, keyfn):
        u = np.asarray(u, np.float32)
        single = u.ndim == 1
        U = u[None, :] if single else u
        if U.ndim != 2 or U.shape[1] != self.dim:
            raise ValueError(f"u must have shape (d,) or (Q, d) with d={self.dim}; got {u.shape}")
        exs = _as_exclude(exclude, None if single else U.shape[0])
        S, idx = [], []
        for q, (row, ex) in enumerate(zip(U, exs, strict=True)):
            s = keyfn(q, (self._V @ row).astype(np.float32))
            avail = self.n_items - len(np.unique(ex))
            if k > avail:
                raise ValueError(f"k={k} exceeds the {avail} items not excluded")
            s = s.copy()
            s[ex] = -np.inf
            order = np.lexsort((np.arange(self.n_items), -s))[:k]
            S.append(s[order])
            idx.append(order.astype(np.int64))
        S, idx = np.array(S, np.float32), np.array(idx, np.int64)
        return (S[0], idx[0]) if single else (S, idx)

    def top_k(self, u, k: int, *, exclude=None):
        return self._select(u, k, exclude, lambda q, s: s)

    def sample_softmax(self, u, k: int, *, exclude=None, temperature: float = 1.0, seed: int = 0):
        def key(q, s):
            g = np.random.default_rng([seed, q]).gumbel(size=s.shape)
            return (s / temperature + g).astype(np.float32)

        return self._select(u, k, exclude, key)

    def sample_random(self, k: int, *, exclude=None, seed: int = 0):
        single = (
            exclude is None
            or (isinstance(exclude, np.ndarray) and exclude.ndim == 1)
            or not isinstance(exclude, Sequence)
            or (len(exclude) > 0 and np.isscalar(exclude[0]))
        )
        exs = _as_exclude(exclude, None if single else len(exclude))
        out = []
        for q, ex in enumerate(exs):
            avail = np.setdiff1d(np.arange(self.n_items), ex)
            if k > len(avail):
                raise ValueError(f"k={k} exceeds the {len(avail)} items not excluded")
            out.append(np.random.default_rng([seed, q]).choice(avail, size=k, replace=False))
        out = np.array(out, np.int64)
        return out[0] if single else out


class RoundState:
    def __init__(self, features: ItemFeatures, *, ridge: float = 0.0, prior=None, mix: float = 0.0):
        self.features = features
        self.ridge = float(ridge)
        self.prior = None if prior is None else np.asarray(prior, np.float64)
        self.mix = float(mix)
        self._items: list[int] = []
        self._targets: list[float] = []

    @property
    def items(self) -> np.ndarray:
        return np.array(self._items, np.int64)

    @property
    def targets(self) -> np.ndarray:
        return np.array(self._targets, np.float64)

    @property
    def size(self) -> int:
        return len(self._items)

    def append(self, items, targets) -> None:
        items = np.asarray(items, np.int64).ravel()
        targets = np.asarray(targets, np.float64).ravel()
        if items.shape != targets.shape:
            raise ValueError(f"items {items.shape} and targets {targets.shape} differ in length")
        if not np.all(np.isfinite(targets)):
            raise ValueError("targets contain NaN or inf")
        if len(set(items.tolist()) | set(self._items)) != len(self._items) + len(items):
            raise ValueError("an item was appended twice")
        self._items += items.tolist()
        self._targets += targets.tolist()

    def solve(self) -> np.ndarray:
        X = self.features.rows(self.items)
        a = self.targets
        if self.ridge > 0:
            d = X.shape[1]
            u = np.linalg.solve(X.T @ X + self.ridge * np.eye(d), X.T @ a)
        else:
            u = np.linalg.pinv(X) @ a
        if self.prior is not None:
            u = (1 - self.mix) * u + self.mix * self.prior
        return u
