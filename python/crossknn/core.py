"""The C++ core from Python: item features V (N x d), per-query least squares, top-k, sampling.

CONTRACT (stable API shared by all search methods; implemented by the C++ core ``crossknn._core``):

- ``ItemFeatures(V, *, storage="float32"|"float16"|"int8", threads=0)``
  V is N x d (any real array; converted to float32, then to the storage type; float16 rounds to
  nearest even; int8 uses per-row scales max|v|/127). V must be finite. The approximate scores
  only select candidates; exact CE scores decide the final ranking. float32/float16 scores are
  float32 dot products (AVX2 when the CPU has it); int8 scores are exact integer dot products
  against u rounded to int16 (scale max|u|/32767), off from rows(i) @ u by at most
  sum_j |V_ij| * max|u| / 65534, far below the int8 rounding of V itself.
  Every value of V must fit the storage type: |v| <= 3.4028235e38 for float32 and int8, and
  |v| < 65520 for float16 (what rounds to at most 65504); otherwise ValueError naming the row.
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
    u may be any finite float64: the wrapper scales each query by a power of two so that no
    float32 score can overflow (|V u| <= max|V| sum|u| <= 2^100) and a tiny u does not sink into
    float32 denormals; the order does not depend on a positive scale. The scores returned are
    scaled back: V u rounded to float32, +-inf where |V u| itself is beyond float32.
  * ``sample_softmax(u, k, *, exclude=None, temperature=1.0, seed=0)``: k distinct items drawn
    without replacement with probability ~ softmax(V u / T) over unmasked items (Gumbel-top-k:
    key_i = (V u)_i / T + G_i, with G_i a standard Gumbel from a counter-based hash of
    (seed, query row q, item i); q = 0 for a single u, the row number in the batch form).
    Same shapes as ``top_k``; returns (perturbed keys float32, indices), sorted by key.
    The core is given u' = u 2^b / 2^c_q and T' = T 2^b in [0.5, 1): the same keys, computed on
    logits V u / T directly, so a tiny T cannot overflow them. Only where |V u| / T could exceed
    2^100 (or |u| / T 2^120) is that query's temperature raised by the power of two 2^c_q that
    keeps the keys finite: then keys are (V u) / (T 2^c_q) + G, and any two items whose scores
    differ by more than 2^-94 max|V| sum|u| are still ordered by score (T -> 0 is top-k).
  * ``sample_random(k, *, exclude=None, seed=0)``: k distinct items uniformly from the unmasked
    ones -> int64 (k,). With ``exclude`` a sequence of Q arrays (or a (Q, m) array) -> (Q, k);
    the batch form can also be asked for with ``n_queries=Q`` and no exclusion.
  ``exclude``: for a single query, a 1-D array (or list) of item ids; for the batch form a
  sequence of Q such arrays, or a (Q, m) int array. Entries equal to -1 are padding and ignored
  everywhere; duplicates are fine; other ids outside [0, N) raise IndexError.
  ``allow`` (all three): the items each query may be given (:func:`pack_allow`): a boolean
  array (N,) for every query or (Q, N), a list of Q such arrays (None: every item), or the
  packed uint64 words. A disallowed item is never returned; k larger than the items a query's
  mask allows (less its exclusions) raises ValueError.
  Scalar parameters are checked in Python, each error naming the parameter and its range:
  k in [0, N], n_queries in [0, 2^31), seed an int in [-2^63, 2^64) (negative: modulo 2^64),
  threads in [0, 1024], temperature finite > 0; a bool, a string or a float where an int is
  expected raises TypeError.
- ``RoundState(features, *, ridge=0.0, prior=None, mix=0.0)``: one query's state.
  * ``append(items, targets)``: items int (m,), targets real (m,), finite; items already in
    the state (or repeated in the call) raise ValueError; ids outside [0, N) raise IndexError.
  ``ridge`` finite >= 0, ``mix`` in [0, 1], ``refine`` an int in [0, 100], ``jitter_rel`` in
  (0, 1).
  * ``solve() -> float64 (d,)``: finite, or ValueError where the solution overflows float64
    (targets far too large for the scale of the rows). With ``ridge == 0`` the min-norm
    least-squares u of V[A] u = a (the pinv solution); with ``ridge > 0`` the ridge solution
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

__all__ = [
    "ItemFeatures",
    "RoundState",
    "allowed_count",
    "kernel_name",
    "mask_words",
    "pack_allow",
    "unpack_allow",
]

import numbers
import os
from collections.abc import Sequence

import numpy as np

from crossknn import _core

_STORAGES = ("float32", "float16", "int8")


def kernel_name() -> str:
    """Score kernel set in use: 'avx2' or 'generic'."""
    return _core.kernel_name()


_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1
_F32_MAX = float(np.finfo(np.float32).max)
_F16_LIMIT = 65520.0  # float32 values at or above this round to inf in float16
_MAX_QUERIES = 2**31 - 1
_MAX_RESULT_IDS = 2**28  # ids one sampling call may return (2 GiB of int64)
# scaling of the queries (powers of two): scores and keys stay below 2^_SCORE_EXP, queries below
# 2^_U_EXP in float32; a top-k query whose bound is outside [2^_LOW_EXP, 2^_SCORE_EXP] is moved
# to about 2^_TARGET_EXP
_SCORE_EXP, _U_EXP, _LOW_EXP, _TARGET_EXP = 100, 120, -60, 64


def _unwrap0d(x):
    """A 0-d numpy array as its scalar (so np.array(3) passes where 3 does)."""
    if isinstance(x, np.ndarray) and x.ndim == 0:
        return x[()]
    return x


def _short(x) -> str:
    r = repr(x)
    return r if len(r) <= 40 else r[:37] + "..."


def _check_int(x, name: str, lo: int, hi: int, note: str = "") -> int:
    """An int in [lo, hi], or TypeError/ValueError naming `name` and the range."""
    x = _unwrap0d(x)
    if isinstance(x, bool | np.bool_) or not isinstance(x, numbers.Integral | np.integer):
        raise TypeError(f"{name} must be an int in [{lo}, {hi}]{note}; got {type(x).__name__}")
    v = int(x)
    if not lo <= v <= hi:
        raise ValueError(f"{name} must be in [{lo}, {hi}]{note}; got {_short(v)}")
    return v


def check_float(x, name: str, lo: float, hi: float, *, lo_open=False, hi_open=False) -> float:
    """A finite float in the given interval, or TypeError/ValueError naming `name` and the range."""
    hi_open = hi_open or hi == np.inf
    rng = f"{'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"
    x = _unwrap0d(x)
    if isinstance(x, bool | np.bool_) or not isinstance(x, numbers.Real | np.integer | np.floating):
        raise TypeError(f"{name} must be a real number in {rng}; got {type(x).__name__}")
    try:
        v = float(x)
    except OverflowError:  # an int beyond float64
        raise ValueError(f"{name} must be a finite number in {rng}; got {_short(x)}") from None
    ok = np.isfinite(v) and (v > lo if lo_open else v >= lo) and (v < hi if hi_open else v <= hi)
    if not ok:
        raise ValueError(f"{name} must be a finite number in {rng}; got {v}")
    return v


def _asarray(x, name: str) -> np.ndarray:
    try:
        return np.asarray(x)
    except (ValueError, TypeError) as e:  # ragged nested lists and the like
        raise TypeError(f"{name} must be an array; {e}") from None


def _item_ids(x, name: str, n: int, *, padding: bool = False) -> np.ndarray:
    """Flat int64 item ids, each in [0, n) (or -1 with `padding`); else TypeError/IndexError."""
    a = _asarray(x, name)
    allowed = f"[0, {n})" + (" or -1 (padding)" if padding else "")
    if a.size == 0:
        return np.empty(0, np.int64)
    if a.dtype == object:  # Python ints beyond int64, or mixed objects
        vals = a.ravel().tolist()
        for v in vals:
            if isinstance(v, bool | np.bool_) or not isinstance(v, numbers.Integral | np.integer):
                raise TypeError(f"{name} must be integer item ids; got {type(v).__name__}")
        for v in vals:
            if not (0 <= v < n or (padding and v == -1)):
                raise IndexError(f"{name}: item id {int(v)} is outside {allowed}")
        return np.array(vals, np.int64)
    if a.dtype.kind not in "iu":
        raise TypeError(f"{name} must be integer item ids; got dtype {a.dtype}")
    flat = a.ravel()
    bad = flat >= n if a.dtype.kind == "u" else (flat < 0) | (flat >= n)
    if padding and a.dtype.kind == "i":
        bad &= flat != -1
    if bad.any():
        raise IndexError(f"{name}: item id {int(flat[np.argmax(bad)])} is outside {allowed}")
    return np.ascontiguousarray(flat, dtype=np.int64)


def _real_array(x, name: str, dtype) -> np.ndarray:
    a = _asarray(x, name)
    if a.dtype.kind not in "fiu" or a.dtype == np.bool_:
        raise TypeError(f"{name} must be a real numeric array; got dtype {a.dtype}")
    with np.errstate(over="ignore", invalid="ignore"):  # overflow to inf is reported by callers
        return np.ascontiguousarray(a, dtype=dtype)


def _ndim(x) -> int:
    try:
        return np.ndim(x)
    except (ValueError, TypeError):  # ragged: at least a sequence
        return 1


def _is_batch_exclude(exclude) -> bool:
    if exclude is None:
        return False
    if isinstance(exclude, np.ndarray):
        return exclude.ndim == 2
    if isinstance(exclude, Sequence) and not isinstance(exclude, (str, bytes)):
        return len(exclude) > 0 and _ndim(exclude[0]) >= 1
    return False


def exclude_csr(exclude, n_queries: int, n_items: int):
    """(ids, offsets) for the core, or (None, None) for no exclusion."""
    if exclude is None:
        return None, None
    if n_queries == 1 and not _is_batch_exclude(exclude):
        ids = _item_ids(exclude, "exclude", n_items, padding=True)
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
        if _ndim(r) != 1:
            raise TypeError(
                f"exclude[{q}] must be a 1-D array of item ids (the batch form takes one array "
                f"per query); got {type(r).__name__} with {_ndim(r)} dimensions"
            )
    parts = [_item_ids(r, f"exclude[{q}]", n_items, padding=True) for q, r in enumerate(rows)]
    offsets = np.zeros(n_queries + 1, np.int64)
    np.cumsum([p.size for p in parts], out=offsets[1:])
    ids = np.concatenate(parts) if parts else np.empty(0, np.int64)
    return np.ascontiguousarray(ids, np.int64), offsets


def mask_words(n_items: int) -> int:
    """uint64 words of an allow mask over ``n_items`` items (one bit per item)."""
    return (int(n_items) + 63) // 64


def _pack_rows(rows: np.ndarray) -> np.ndarray:
    """Boolean rows (..., N) -> uint64 words (..., mask_words(N)): item i in bit i % 64 of word
    i // 64 (crossknn/features.h)."""
    n = rows.shape[-1]
    packed = np.packbits(rows, axis=-1, bitorder="little")
    pad = mask_words(n) * 8 - packed.shape[-1]
    if pad:
        packed = np.concatenate([packed, np.zeros(packed.shape[:-1] + (pad,), np.uint8)], axis=-1)
    return np.ascontiguousarray(packed.view("<u8"), dtype=np.uint64)


def pack_allow(allow, n_queries: int, n_items: int) -> np.ndarray | None:
    """The core's allow masks from ``allow``: None (every item); a boolean array (N,) for every
    query or (Q, N); a sequence of Q entries, each a boolean array (N,) or None (every item);
    or already packed uint64 words ((W,) or (Q, W), W = :func:`mask_words`). Returns None, (W,)
    or (Q, W) uint64."""
    if allow is None:
        return None
    words = mask_words(n_items)
    if isinstance(allow, np.ndarray) and allow.dtype == np.uint64:
        if allow.shape not in ((words,), (n_queries, words)):
            raise ValueError(
                f"packed allow masks over {n_items} items must have shape ({words},) or "
                f"({n_queries}, {words}); got {allow.shape}"
            )
        return np.ascontiguousarray(allow)
    if isinstance(allow, np.ndarray) or (
        isinstance(allow, Sequence)
        and allow
        and not isinstance(allow[0], (np.ndarray, list, type(None)))
    ):
        a = np.asarray(allow)
        if a.dtype != np.bool_:
            raise TypeError(f"allow must be a boolean array (one flag per item); got {a.dtype}")
        if a.shape not in ((n_items,), (n_queries, n_items)):
            raise ValueError(
                f"allow must have shape ({n_items},) or ({n_queries}, {n_items}); got {a.shape}"
            )
        return _pack_rows(a)
    if not isinstance(allow, Sequence) or isinstance(allow, (str, bytes)):
        raise TypeError(
            f"allow must be a boolean array, a list of {n_queries} boolean arrays (or None), or "
            f"packed uint64 words; got {type(allow).__name__}"
        )
    if len(allow) != n_queries:
        raise ValueError(f"allow: {len(allow)} masks for {n_queries} queries")
    rows = np.ones((n_queries, n_items), bool)
    for q, a in enumerate(allow):
        if a is None:
            continue
        a = np.asarray(a)
        if a.dtype != np.bool_ or a.shape != (n_items,):
            raise ValueError(
                f"allow[{q}] must be a boolean array of shape ({n_items},); got {a.dtype} {a.shape}"
            )
        rows[q] = a
    return _pack_rows(rows)


def unpack_allow(words: np.ndarray, n_items: int) -> np.ndarray:
    """Packed allow words ((W,) or (Q, W) uint64) -> boolean (N,) or (Q, N)."""
    w = np.ascontiguousarray(words)
    if w.dtype != np.uint64 or w.shape[-1] != mask_words(n_items):
        raise ValueError(
            f"packed allow masks over {n_items} items are uint64 with {mask_words(n_items)} "
            f"words; got {w.dtype} {w.shape}"
        )
    bits = np.unpackbits(w.astype("<u8").view(np.uint8), axis=-1, bitorder="little")
    return bits[..., :n_items].astype(bool)


def allowed_count(words: np.ndarray | None, n_items: int) -> np.ndarray | int:
    """Items each packed mask allows (``n_items`` for None): an int for (W,), (Q,) for (Q, W)."""
    if words is None:
        return int(n_items)
    w = np.ascontiguousarray(words, np.uint64)
    if n_items % 64:  # bits past N count for nothing
        w = w.copy()
        w[..., -1] &= np.uint64((1 << (n_items % 64)) - 1)
    if hasattr(np, "bitwise_count"):  # numpy >= 2
        c = np.bitwise_count(w).sum(axis=-1, dtype=np.int64)
    else:
        c = np.unpackbits(w.astype("<u8").view(np.uint8), axis=-1).sum(axis=-1, dtype=np.int64)
    return int(c) if np.ndim(c) == 0 else c


def allowed_items(words: np.ndarray, items: np.ndarray) -> np.ndarray:
    """Whether each of ``items`` is allowed by one packed mask (boolean, like ``items``)."""
    items = np.asarray(items, np.int64)
    return ((np.asarray(words, np.uint64)[items >> 6] >> (items & 63).astype(np.uint64)) & 1) == 1


def check_k(k, n_items: int) -> int:
    k = _unwrap0d(k)
    if isinstance(k, bool | np.bool_) or not isinstance(k, numbers.Integral | np.integer):
        raise TypeError(f"k must be an int in [0, {n_items}]; got {type(k).__name__}")
    k = int(k)
    if k < 0:
        raise ValueError(f"k must be >= 0 (in [0, {n_items}]); got {k}")
    if k > n_items:  # before the core allocates Q x k outputs
        raise ValueError(f"k={_short(k)} exceeds the {n_items} items (k must be in [0, {n_items}])")
    return k


def check_seed(seed) -> int:
    return _check_int(seed, "seed", _I64_MIN, 2**64 - 1, " (negative: taken modulo 2^64)") & (
        2**64 - 1
    )


def _check_threads(threads) -> int:
    return _check_int(threads, "threads", 0, 1024, " (0 = all cores)")


def _view_scales(V: np.ndarray, storage: str, scales) -> np.ndarray | None:
    if storage != "int8":
        if scales is not None:
            raise ValueError("scales= is only for an int8 V stored as int8")
        return None
    if scales is None:
        raise ValueError("an int8 V in int8 storage needs scales= (float32 (N,))")
    sc = np.ascontiguousarray(scales, np.float32)
    if sc.shape != (V.shape[0],) or not np.all(np.isfinite(sc)) or (sc < 0).any():
        raise ValueError(
            f"scales must be {V.shape[0]} finite non-negative row scales; got shape {sc.shape}"
        )
    return sc


def _view_vmax(V: np.ndarray, scales: np.ndarray | None) -> float:
    """An upper bound of max|V| (NaN/inf if V holds any) without copying V."""
    if scales is not None:
        return 127.0 * float(scales.max(initial=0.0))
    return float(max(V.max(), -V.min()))


def _bound_exponents(U: np.ndarray, vmax: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per query row of finite float64 U: (nonzero, e_u, lb) with max|u| < 2^e_u and
    max|V| sum|u| <= 2^lb; nonzero: u != 0 (else e_u = 0), lb = -inf where u = 0 or V = 0."""
    amax = np.abs(U).max(axis=1) if U.shape[1] else np.zeros(U.shape[0])
    nonzero = amax > 0
    e_u = np.where(nonzero, np.frexp(amax)[1], 0).astype(np.int64)
    lb = np.full(U.shape[0], -np.inf)
    if nonzero.any() and vmax > 0:
        un = np.ldexp(U[nonzero], -e_u[nonzero, None])  # |un| < 1: no overflow below
        lb[nonzero] = np.log2(vmax * np.abs(un).sum(axis=1)) + e_u[nonzero]
    return nonzero, e_u, lb


class ItemFeatures:
    """Item features V (N x d) shared by all queries; see the module docstring."""

    def __init__(self, V, *, storage: str = "float32", threads: int = 0, scales=None) -> None:
        if not isinstance(storage, str) or storage not in _STORAGES:
            raise ValueError(f"storage must be one of {_STORAGES}; got {storage!r}")
        threads = _check_threads(threads)
        V = _asarray(V, "V")
        if V.ndim != 2 or V.shape[0] == 0 or V.shape[1] == 0:
            raise ValueError(f"V must be a non-empty 2-D array (N x d); got shape {V.shape}")
        if V.flags.c_contiguous and V.dtype == np.dtype(storage) and V.dtype.isnative:
            # already in the storage type: a zero-copy view (int8 needs its row scales)
            sc = _view_scales(V, storage, scales)
            vmax = _view_vmax(V, sc)
            if not np.isfinite(vmax):
                self._reject_values(V, V, storage)
            self._f = _core.Features.view(V, scales=sc, threads=threads)
        else:
            if scales is not None:
                raise ValueError("scales= is only for an int8 V stored as int8 (a zero-copy view)")
            V32 = _real_array(V, "V", np.float32)
            vmax = float(max(V32.max(), -V32.min()))  # NaN if any NaN; no |V| copy of a large V
            limit = _F16_LIMIT if storage == "float16" else np.inf
            if not vmax < limit:
                self._reject_values(V, V32, storage)
            self._f = _core.Features(V32, storage=storage, threads=threads)
        self._vmax = vmax
        self.storage = storage
        self.n_items, self.dim = int(V.shape[0]), int(V.shape[1])

    @classmethod
    def from_npy(cls, path, *, threads: int = 0) -> ItemFeatures:
        """Memory-maps an ``.npy`` item matrix (float32, float16, or int8 with ``X.scales.npy``
        next to ``X.npy``) without copying: the C++ core reads the same file a service opens."""
        threads = _check_threads(threads)
        path = os.fspath(path)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"no item matrix at {path}")
        scales = path[: -len(".npy")] + ".scales.npy" if path.endswith(".npy") else ""
        scales = scales if scales and os.path.isfile(scales) else ""
        self = cls.__new__(cls)
        self._f = _core.Features.open_npy(path, threads=threads, scales_path=scales)
        self.storage = self._f.storage
        self.n_items, self.dim = int(self._f.n_items), int(self._f.dim)
        V = np.load(path, mmap_mode="r", allow_pickle=False)
        sc = np.load(scales, allow_pickle=False) if scales else None
        self._vmax = _view_vmax(V, sc)
        if not np.isfinite(self._vmax):
            raise ValueError(f"{path}: the item matrix contains NaN or inf")
        return self

    @property
    def is_view(self) -> bool:
        """True when V is not copied (a view of the input array or a memory-mapped file)."""
        return self._f.is_view

    @staticmethod
    def _reject_values(V: np.ndarray, V32: np.ndarray, storage: str) -> None:
        bad = ~np.isfinite(V32)
        if storage == "float16":
            with np.errstate(invalid="ignore"):
                bad |= np.abs(V32) >= _F16_LIMIT
        r, c = (int(x) for x in np.argwhere(bad)[0])
        v = float(V[r, c])
        if not np.isfinite(v):
            raise ValueError(f"V contains NaN or inf (row {r}, column {c}): V must be finite")
        if not np.isfinite(V32[r, c]):
            raise ValueError(
                f"V row {r}, column {c}: {v:g} is outside the float32 range "
                f"(|v| <= {_F32_MAX:.8g}); it would become inf, and V must not contain NaN or inf"
            )
        raise ValueError(
            f"V row {r}, column {c}: {v:g} is outside the float16 range of storage='float16' "
            f"(|v| < {_F16_LIMIT:g}, stored as at most 65504); use storage='float32' or 'int8'"
        )

    @property
    def threads(self) -> int:
        return self._f.threads

    @threads.setter
    def threads(self, value: int) -> None:
        self._f.threads = _check_threads(value)

    @property
    def nbytes(self) -> int:
        """Bytes of the stored matrix (what one top-k pass reads)."""
        return self._f.nbytes

    @property
    def gram(self) -> bool:
        """Whether least-squares rounds on these features may use the item Gram cache."""
        return bool(self._f.gram)

    @gram.setter
    def gram(self, on: bool) -> None:
        self._f.gram = bool(on)

    @property
    def gram_ready(self) -> bool:
        """Whether the item Gram cache has been built (by these features or a copy)."""
        return bool(self._f.gram_ready)

    def prepare_gram(self, inv_penalties=None) -> bool:
        """Build the item Gram cache of least-squares rounds now (N^2 x 8 bytes; float32
        matrices with dim >= 128 and N^2 x 8 bytes within CROSSKNN_GRAM_MB MiB, default 256);
        otherwise it is built once max(64, N / 8) such searches have run. ``inv_penalties``: the
        PriorRidge solve's cache (``auto``) for these inverse penalties instead, built only
        here. True when it is ready. Search results are the same with it or without."""
        if inv_penalties is None:
            return bool(self._f.prepare_gram())
        return bool(self._f.prepare_gram(np.asarray(inv_penalties, np.float64)))

    def __repr__(self) -> str:
        return f"ItemFeatures(n_items={self.n_items}, dim={self.dim}, storage={self.storage!r})"

    def rows(self, items) -> np.ndarray:
        return self._f.rows(_item_ids(items, "items", self.n_items))

    def scores(self, u, items) -> np.ndarray:
        """Approximate scores V[items] @ u in float64 (u of shape (d,))."""
        u = _real_array(u, "u", np.float64)
        if u.shape != (self.dim,):
            raise ValueError(f"u must have shape ({self.dim},); got {u.shape}")
        if not np.isfinite(u).all():
            raise ValueError("u contains NaN or inf")
        return self._scores_of_rows(self.rows(items), u)

    @staticmethod
    def _scores_of_rows(rows: np.ndarray, u: np.ndarray) -> np.ndarray:
        """``rows @ u`` in float64 for a finite float64 ``u``, scaled by a power of two so that
        no product overflows where the score itself does not."""
        e = int(np.frexp(np.abs(u).max())[1]) if u.size else 0
        with np.errstate(over="ignore"):  # +-inf only where V u itself is beyond float64
            return np.ldexp(rows @ np.ldexp(u, -e), e)

    def _queries(self, u) -> tuple[np.ndarray, bool]:
        """(Q, d) finite float64 queries and whether u was a single query."""
        u = _asarray(u, "u")
        single = u.ndim == 1
        U = u[None, :] if single else u
        if U.ndim != 2 or U.shape[1] != self.dim:
            raise ValueError(f"u must have shape (d,) or (Q, d) with d={self.dim}; got {u.shape}")
        U = _real_array(U, "u", np.float64)
        if not np.isfinite(U).all():
            raise ValueError("u contains NaN or inf (or values beyond float64)")
        return U, single

    def top_k(self, u, k: int, *, exclude=None, allow=None):
        k = check_k(k, self.n_items)
        U, single = self._queries(u)
        ids, off = exclude_csr(exclude, 1 if single else U.shape[0], self.n_items)
        masks = pack_allow(allow, U.shape[0], self.n_items)
        # scale each query by 2^a so that no float32 score overflows or sinks into denormals
        nonzero, e_u, lb = _bound_exponents(U, self._vmax)
        low = (lb < _LOW_EXP) & np.isfinite(lb)
        need = nonzero & ((lb > _SCORE_EXP) | low | (e_u > _U_EXP) | (e_u < -_U_EXP))
        with np.errstate(invalid="ignore"):
            want = np.minimum(_TARGET_EXP - np.ceil(lb), _U_EXP - e_u)  # lb = -inf: u's limit
        a = np.where(need, want, 0).astype(np.int64)
        s, i = self._f.top_k(np.ldexp(U, a[:, None]).astype(np.float32), k, ids, off, masks)
        if need.any():
            with np.errstate(over="ignore"):  # +-inf where V u is beyond float32
                s = np.ldexp(s.astype(np.float64), -a[:, None]).astype(np.float32)
        return (s[0], i[0]) if single else (s, i)

    def sample_softmax(
        self, u, k: int, *, exclude=None, temperature: float = 1.0, seed: int = 0, allow=None
    ):
        k = check_k(k, self.n_items)
        temperature = check_float(temperature, "temperature", 0.0, np.inf, lo_open=True)
        seed = check_seed(seed)
        U, single = self._queries(u)
        ids, off = exclude_csr(exclude, 1 if single else U.shape[0], self.n_items)
        masks = pack_allow(allow, U.shape[0], self.n_items)
        # keys = (V u) / T + G = (V u 2^b) / (T 2^b) + G with T 2^b in [0.5, 1): the core works
        # on the logits; a query whose logits could overflow gets its own 2^-c (T raised by 2^c)
        b = -int(np.frexp(temperature)[1])
        t_scaled = float(np.ldexp(temperature, b))
        nonzero, e_u, lb = _bound_exponents(U, self._vmax)
        cap = np.minimum(_SCORE_EXP - np.ceil(lb), _U_EXP - e_u)  # lb = -inf: u's limit
        a = np.where(nonzero, np.minimum(b, cap), 0).astype(np.int64)
        with np.errstate(under="ignore"):
            Us = np.ldexp(U, a[:, None]).astype(np.float32)
        s, i = self._f.sample_softmax(Us, k, ids, off, t_scaled, seed, masks)
        return (s[0], i[0]) if single else (s, i)

    def sample_random(
        self, k: int, *, exclude=None, seed: int = 0, n_queries: int | None = None, allow=None
    ):
        k = check_k(k, self.n_items)
        seed = check_seed(seed)
        if n_queries is None:
            single = not _is_batch_exclude(exclude)
            Q = 1 if single else len(exclude)
        else:
            single, Q = False, _check_int(n_queries, "n_queries", 0, _MAX_QUERIES)
        if Q * k > _MAX_RESULT_IDS:
            raise ValueError(
                f"n_queries x k = {Q} x {k} result ids exceed the limit of 2**28 "
                f"({_MAX_RESULT_IDS}) per call; split the queries into smaller calls"
            )
        ids, off = exclude_csr(exclude, 1 if single else Q, self.n_items)
        out = self._f.sample_random(Q, k, ids, off, seed, pack_allow(allow, Q, self.n_items))
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
        self.ridge = check_float(ridge, "ridge", 0.0, np.inf, hi_open=True)
        self.mix = check_float(mix, "mix", 0.0, 1.0)
        self._s = _core.LeastSquares(
            features._f,
            ridge=self.ridge,
            refine=_check_int(refine, "refine", 0, 100),
            jitter_rel=check_float(jitter_rel, "jitter_rel", 0.0, 1.0, lo_open=True, hi_open=True),
        )
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
        items = _item_ids(items, "items", self.features.n_items)
        targets = _real_array(targets, "targets", np.float64).ravel()
        if items.shape != targets.shape:
            raise ValueError(f"items {items.shape} and targets {targets.shape} differ in length")
        self._s.append(items, targets)

    def solve(self) -> np.ndarray:
        u = self._s.solve()
        if not np.isfinite(u).all():
            t = np.abs(self._s.targets).max(initial=0.0)
            raise ValueError(
                f"solve: the least-squares solution overflows float64 (targets up to {t:.3g} "
                "are too large for the scale of the rows); rescale the targets"
            )
        return u
