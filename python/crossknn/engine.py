"""The round engine: item features V (N x d), per-query least squares, top-k and sampling.

CONTRACT (stable API shared by all search methods; implemented by the C++ core ``crossknn._core``):

- ``ItemFeatures(V, *, storage="float32"|"float16"|"int8", threads=0)``
  V is N x d (any real array; converted to float32, then to the storage type; float16 rounds to
  nearest even; int8 uses per-row scales max|v|/127). V must be finite. The approximate scores
  only select candidates; exact CE scores decide the final ranking. float32/float16 scores are
  float32 dot products (AVX2 when the CPU has it); int8 scores are exact integer dot products
  against u rounded to int16 (scale max|u|/32767), off from rows(i) @ u by at most
  sum_j |V_ij| * max|u| / 65534, far below the int8 rounding of V itself.
  No copy when V is already C-contiguous in the storage dtype (float32, float16, or int8 with
  ``scales=`` row scales): the features are then a view that keeps V alive (like np.asarray),
  so V must not be changed while they are used; ``ItemFeatures.from_npy(path)`` memory-maps an
  index's ``.npy`` item matrix the same way (``path.scales.npy`` next to an int8 matrix).
  Attributes ``n_items``, ``dim``, ``storage``, ``threads`` (settable), ``nbytes``, ``is_view``.
  ``threads=0`` means all cores. Results never depend on the thread count.
  * ``rows(items) -> float64[m, d]``: dequantized rows V[items].
  * ``scores(u, items) -> float64``: the approximate scores V[items] u (``u`` (d,) -> (m,)).
  * ``top_k(u, k, *, exclude=None) -> (scores float32, indices int64)``:
    u of shape (d,) -> results of shape (k,); u of shape (Q, d) -> (Q, k) (the batch form reads
    V once per block for all Q queries). Sorted by score descending, ties to the lower index.
    k larger than the number of unmasked items raises ValueError. Never sorts all N.
  * ``sample_softmax(u, k, *, exclude=None, temperature=1.0, seed=0)``: k distinct items drawn
    without replacement with probability ~ softmax(V u / T) over unmasked items (Gumbel-top-k:
    key_i = (V u)_i / T + G_i, with G_i a standard Gumbel from a counter-based hash of
    (seed, query row q, item i); q = 0 for a single u, the row number in the batch form).
    Same shapes as ``top_k``; returns (perturbed keys float32, indices), sorted by key.
  * ``sample_random(k, *, exclude=None, seed=0)``: k distinct items uniformly from the unmasked
    ones -> int64 (k,). With ``exclude`` a sequence of Q arrays (or a (Q, m) array) -> (Q, k);
    the batch form can also be asked for with ``n_queries=Q`` and no exclusion.
  ``exclude``: for a single query, a 1-D array (or list) of item ids; for the batch form a
  sequence of Q such arrays, or a (Q, m) int array. Entries equal to -1 are padding and ignored
  everywhere; duplicates are fine; other ids outside [0, N) raise IndexError.
- ``RoundState(features, *, ridge=0.0, prior=None, mix=0.0)``: one query's state.
  * ``append(items, targets)``: items int (m,), targets real (m,), finite; items already in
    the state (or repeated in the call) raise ValueError; ids outside [0, N) raise IndexError.
  * ``solve() -> float64 (d,)``: with ``ridge == 0`` the min-norm least-squares u of
    V[A] u = a (the pinv solution); with ``ridge > 0`` the ridge solution
    (X^T X + ridge I)^-1 X^T a = X^T (X X^T + ridge I)^-1 a, X = V[A]; then
    u = (1 - mix) * u + mix * prior when a prior is given. Empty state: u = 0 (then mixed).
  * ``items`` (int64 copy of A in append order), ``targets`` (float64 copy of a), ``size``.

How ``solve`` works (C++, accumulated in double): while |A| < d a Cholesky factor of
X X^T + delta I, once |A| >= d one of X^T X + delta I, both extended as rows arrive (row-wise
block extension, resp. rank-1 updates); no pinv/SVD per round. With ridge > 0, delta = ridge and
the answer is exact. With ridge = 0, delta = 1e-10 * max_i ||x_i||^2 (``jitter_rel``) and 3
(``refine``) steps of iterated Tikhonov refinement follow, so each singular direction sigma is
solved to a relative error (delta / (sigma^2 + delta))^4: the pinv solution to machine precision
for sigma^2 >> delta, while directions with sigma^2 << delta (duplicate or zero rows, numerical
rank deficiency) are dropped as pinv with a cut-off drops them. Never NaN.
"""

from __future__ import annotations

__all__ = ["ItemFeatures", "RoundState", "kernel_name"]

import numbers
from collections.abc import Sequence

import numpy as np

from crossknn import _core

_STORAGES = ("float32", "float16", "int8")


def kernel_name() -> str:
    """Score kernel set in use: 'avx2' or 'generic'."""
    return _core.kernel_name()


def _int_array(x, name: str) -> np.ndarray:
    """1-D int64 copy-if-needed of item ids; floats, bools and other types raise TypeError."""
    a = np.asarray(x)
    if a.size == 0:
        return np.empty(0, np.int64)
    if a.dtype.kind not in "iu":
        raise TypeError(f"{name} must be integer item ids; got dtype {a.dtype}")
    if a.dtype.kind == "u" and a.size and a.max() > np.iinfo(np.int64).max:
        raise ValueError(f"{name}: item id too large for int64")
    return np.ascontiguousarray(a.ravel(), dtype=np.int64)


def _real_array(x, name: str, dtype) -> np.ndarray:
    a = np.asarray(x)
    if a.dtype.kind not in "fiu" or a.dtype == np.bool_:
        raise TypeError(f"{name} must be a real numeric array; got dtype {a.dtype}")
    with np.errstate(over="ignore", invalid="ignore"):  # overflow to inf is reported by callers
        return np.ascontiguousarray(a, dtype=dtype)


def _is_batch_exclude(exclude) -> bool:
    if exclude is None:
        return False
    if isinstance(exclude, np.ndarray):
        return exclude.ndim == 2
    if isinstance(exclude, Sequence) and not isinstance(exclude, (str, bytes)):
        return len(exclude) > 0 and np.ndim(exclude[0]) >= 1
    return False


def _exclude_csr(exclude, n_queries: int):
    """(ids, offsets) for the core, or (None, None) for no exclusion."""
    if exclude is None:
        return None, None
    if n_queries == 1 and not _is_batch_exclude(exclude):
        ids = _int_array(exclude, "exclude")
        return ids, np.array([0, ids.size], np.int64)
    if isinstance(exclude, np.ndarray) and exclude.ndim == 2:
        rows = list(exclude)
    elif isinstance(exclude, Sequence) and not isinstance(exclude, (str, bytes)):
        rows = list(exclude)
    else:
        raise TypeError(
            f"exclude must be a sequence of {n_queries} id arrays (one per query) or a "
            f"(Q, m) int array; got {type(exclude).__name__}"
        )
    if len(rows) != n_queries:
        raise ValueError(f"exclude: expected {n_queries} arrays (one per query), got {len(rows)}")
    for q, r in enumerate(rows):
        if np.ndim(r) != 1:
            raise TypeError(
                f"exclude[{q}] must be a 1-D array of item ids (the batch form takes one array "
                f"per query); got {type(r).__name__} with {np.ndim(r)} dimensions"
            )
    parts = [_int_array(r, f"exclude[{q}]") for q, r in enumerate(rows)]
    offsets = np.zeros(n_queries + 1, np.int64)
    np.cumsum([p.size for p in parts], out=offsets[1:])
    ids = np.concatenate(parts) if parts else np.empty(0, np.int64)
    return np.ascontiguousarray(ids, np.int64), offsets


def _check_k(k) -> int:
    if isinstance(k, bool) or not isinstance(k, numbers.Integral | np.integer):
        raise TypeError(f"k must be an int; got {type(k).__name__}")
    if k < 0:
        raise ValueError(f"k must be >= 0; got {k}")
    return int(k)


def _check_seed(seed) -> int:
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral | np.integer):
        raise TypeError(f"seed must be an int; got {type(seed).__name__}")
    return int(seed) & 0xFFFFFFFFFFFFFFFF


class ItemFeatures:
    """Item features V (N x d) shared by all queries; see the module docstring."""

    def __init__(self, V, *, storage: str = "float32", threads: int = 0, scales=None) -> None:
        if storage not in _STORAGES:
            raise ValueError(f"storage must be one of {_STORAGES}; got {storage!r}")
        if isinstance(threads, bool) or not isinstance(threads, numbers.Integral | np.integer):
            raise TypeError(f"threads must be an int (0 = all cores); got {type(threads).__name__}")
        if not 0 <= threads <= 1024:
            raise ValueError(f"threads must be in [0, 1024] (0 = all cores); got {threads}")
        V = np.asarray(V)
        if V.ndim != 2 or V.shape[0] == 0 or V.shape[1] == 0:
            raise ValueError(f"V must be a non-empty 2-D array (N x d); got shape {V.shape}")
        if V.flags.c_contiguous and V.dtype == np.dtype(storage) and V.dtype.isnative:
            # already in the storage type: a zero-copy view (int8 needs its row scales)
            if storage == "int8" and scales is None:
                raise ValueError("an int8 V in int8 storage needs scales= (float32 (N,))")
            sc = None if scales is None else np.ascontiguousarray(scales, np.float32)
            self._f = _core.Features.view(V, scales=sc, threads=int(threads))
        else:
            if scales is not None:
                raise ValueError("scales= is only for an int8 V stored as int8")
            V = _real_array(V, "V", np.float32)  # NaN/inf (also float32 overflow): core says where
            self._f = _core.Features(V, storage=storage, threads=int(threads))
        self.storage = storage
        self.n_items, self.dim = int(V.shape[0]), int(V.shape[1])

    @classmethod
    def from_npy(cls, path, *, threads: int = 0) -> ItemFeatures:
        """Memory-maps an ``.npy`` item matrix (float32, float16, or int8 with ``X.scales.npy``
        next to ``X.npy``) without copying: the C++ core reads the same file a service opens."""
        import os

        path = os.fspath(path)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"no item matrix at {path}")
        scales = path[: -len(".npy")] + ".scales.npy" if path.endswith(".npy") else ""
        scales = scales if scales and os.path.isfile(scales) else ""
        self = cls.__new__(cls)
        self._f = _core.Features.open_npy(path, threads=int(threads), scales_path=scales)
        self.storage = self._f.storage
        self.n_items, self.dim = int(self._f.n_items), int(self._f.dim)
        return self

    @property
    def is_view(self) -> bool:
        """True when V is not copied (a view of the input array or a memory-mapped file)."""
        return self._f.is_view

    @property
    def threads(self) -> int:
        return self._f.threads

    @threads.setter
    def threads(self, value: int) -> None:
        self._f.threads = int(value)

    @property
    def nbytes(self) -> int:
        """Bytes of the stored matrix (what one top-k pass reads)."""
        return self._f.nbytes

    def __repr__(self) -> str:
        return f"ItemFeatures(n_items={self.n_items}, dim={self.dim}, storage={self.storage!r})"

    def rows(self, items) -> np.ndarray:
        return self._f.rows(_int_array(items, "items"))

    def scores(self, u, items) -> np.ndarray:
        """Approximate scores V[items] @ u in float64 (u of shape (d,))."""
        u = _real_array(u, "u", np.float64)
        if u.shape != (self.dim,):
            raise ValueError(f"u must have shape ({self.dim},); got {u.shape}")
        return self.rows(items) @ u

    def _queries(self, u) -> tuple[np.ndarray, bool]:
        u = np.asarray(u)
        single = u.ndim == 1
        U = u[None, :] if single else u
        if U.ndim != 2 or U.shape[1] != self.dim:
            raise ValueError(f"u must have shape (d,) or (Q, d) with d={self.dim}; got {u.shape}")
        U = _real_array(U, "u", np.float32)
        if not np.isfinite(U).all():
            raise ValueError("u contains NaN or inf")
        return U, single

    def top_k(self, u, k: int, *, exclude=None):
        k = _check_k(k)
        U, single = self._queries(u)
        ids, off = _exclude_csr(exclude, 1 if single else U.shape[0])
        s, i = self._f.top_k(U, k, ids, off)
        return (s[0], i[0]) if single else (s, i)

    def sample_softmax(self, u, k: int, *, exclude=None, temperature: float = 1.0, seed: int = 0):
        k = _check_k(k)
        temperature = float(temperature)
        if not (np.isfinite(temperature) and temperature > 0):
            raise ValueError(f"temperature must be a finite number > 0; got {temperature}")
        U, single = self._queries(u)
        ids, off = _exclude_csr(exclude, 1 if single else U.shape[0])
        s, i = self._f.sample_softmax(U, k, ids, off, temperature, _check_seed(seed))
        return (s[0], i[0]) if single else (s, i)

    def sample_random(self, k: int, *, exclude=None, seed: int = 0, n_queries: int | None = None):
        k = _check_k(k)
        if n_queries is None:
            single = not _is_batch_exclude(exclude)
            Q = 1 if single else len(exclude)
        else:
            single, Q = False, int(n_queries)
            if Q < 0:
                raise ValueError(f"n_queries must be >= 0; got {Q}")
        ids, off = _exclude_csr(exclude, Q) if not single else _exclude_csr(exclude, 1)
        out = self._f.sample_random(Q, k, ids, off, _check_seed(seed))
        return out[0] if single else out


class RoundState:
    """One query's scored set A, its exact scores a and the incremental least-squares solver."""

    def __init__(
        self,
        features: ItemFeatures,
        *,
        ridge: float = 0.0,
        prior=None,
        mix: float = 0.0,
        refine: int = 3,
        jitter_rel: float = 1e-10,
    ) -> None:
        if not isinstance(features, ItemFeatures):
            raise TypeError(f"features must be an ItemFeatures; got {type(features).__name__}")
        self.features = features
        self.ridge = float(ridge)
        self._s = _core.LeastSquares(
            features._f, ridge=self.ridge, refine=int(refine), jitter_rel=float(jitter_rel)
        )
        self.mix = float(mix)
        self.prior = None
        if prior is not None:
            p = _real_array(prior, "prior", np.float64)
            if p.shape != (features.dim,):
                raise ValueError(f"prior must have shape ({features.dim},); got {p.shape}")
            self._s.set_prior(p, self.mix)
            self.prior = p
        elif self.mix != 0.0:
            raise ValueError(f"mix={self.mix} needs a prior")

    def __repr__(self) -> str:
        return f"RoundState(size={self.size}, dim={self.features.dim}, ridge={self.ridge})"

    @property
    def items(self) -> np.ndarray:
        return self._s.items

    @property
    def targets(self) -> np.ndarray:
        return self._s.targets

    @property
    def size(self) -> int:
        return self._s.size

    def append(self, items, targets) -> None:
        items = _int_array(items, "items")
        targets = _real_array(targets, "targets", np.float64).ravel()
        if items.shape != targets.shape:
            raise ValueError(f"items {items.shape} and targets {targets.shape} differ in length")
        self._s.append(items, targets)

    def solve(self) -> np.ndarray:
        return self._s.solve()
