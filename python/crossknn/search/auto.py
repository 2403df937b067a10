"""``auto``: crossknn's default method, hybrid-feature rounds from a small index of train CE rows.

Offline, the index reads at most ``C`` CE entries of the *train* queries, through
:class:`IndexCallBudget` (a counting scorer that refuses more, as :class:`BudgetedScorer` does
online): ``m = min(C // N, n_train)`` complete train rows, the medoids of ``m`` k-means clusters of
the train queries' DE vectors (:func:`choose_rows`: representative queries, chosen before any CE
call; ``row_choice="random"`` draws them uniformly instead). The item features are
``X = [DE item vectors | the m rows, z-scored per row | V A | 1]`` (N x (d + m + r + 1)), where
``A`` (d x r, :func:`query_directions`, r = :data:`QUERY_DIRS`, with m >= 2 rows) holds the top
eigendirections of all train queries' DE vectors: the query-subspace block, no CE call.

Online, each query's embedding is a ridge least squares of its scored CE scores pulled toward its
DE query vector with a free per-query slope (no global CE -> DE score map is needed)::

    u = c * p0 + w,   (w, c) = argmin ||[X_A, X_A p0] (w, c) - a||^2 + sum_j rho_j w_j^2 + eps c^2

with ``p0 = [DE query vector, row prior, 0, 0]`` and ``rho = rho_D`` on the DE block, ``rho_R`` on
the CE-row block, :data:`RHO_Q` on the query-subspace block (zero prior: with the DE block, a
prior covariance ``diag(1 / rho_D) + A Aᵀ`` of the DE-block correction); the C++ loop solves it
(``Solve::PriorRidge`` in ``crossknn/search.h``). The row prior (:meth:`AUTO.priors`) guesses the
query's CE-row block from its DE neighbours among the row queries:
``alpha * sd(V q) * softmax(tau * cos(q, q_j))`` over the m row queries ``q_j`` (their DE vectors
are kept in the index), so a query near a row query starts from that query's CE row;
``alpha = 0`` is the plain DE prior. The first round is the DE's top items (``first_share`` of B,
or B / rounds), then TopK rounds over ``X u``; the final top-k is ranked by exact CE scores among
every scored item.

With ``2 <= m <`` :data:`CV_MIN_ROWS` rows the choices are fixed (:data:`FEW_ROWS`, measured on
pseudo splits of train rows: the cross-validation over so few rows is noisy); from
:data:`CV_MIN_ROWS` rows on ``rho_D``, ``rho_R`` and the number of rounds are chosen by K-fold
cross-validation over the m complete rows (rows of a fold are searched with features built from
the other rows only; their exact top-k is known because the rows are complete), with the row
prior's ``alpha`` fixed at :data:`PRIOR_ALPHA` (chosen on pseudo splits of train rows: the
cross-validation holds out medoid rows, which lie farther from the other row queries than a
typical query does, so it undervalues the row prior). With fewer than two rows the defaults
:data:`DEFAULTS` apply (a DE first round of 0.3 B). Test rows are never read.

The learned prior (:func:`partial_plan`, :func:`learned_prior`): with ``2 <= m <``
:data:`CV_MIN_ROWS`, :data:`PARTIAL_SHARE` of C is kept from the complete rows and spent on
partial rows of other train queries (:data:`PARTIAL_ITEMS` entries each: the items ``auto``
scores for that query with the row prior). Every fitted query (row and partial-row queries) gives
its correction ``delta_j`` to the plain DE prior from the same ridge fit as the online solve, and
a query's prior becomes its DE vector plus a kernel ridge regression of the corrections on the
fitted queries' DE vectors (:data:`PRIOR_RIDGE`, :data:`PRIOR_KERNEL_TAU`; indexes built before
it: the softmax-weighted corrections of its DE neighbours), in every block
(:meth:`AutoIndex.prior_vector`); no feature column is added.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
from threadpoolctl import threadpool_limits
from tqdm.auto import tqdm

from crossknn import _core
from crossknn.core import ItemFeatures
from crossknn.retrievers import make_retriever
from crossknn.scorers import BudgetExceededError, MatrixScorer, as_items
from crossknn.search import stopping
from crossknn.search.methods import RoundMethod, _round_plan
from crossknn.search.round_plan import ROUNDS_GRID, RoundChoice, RoundCost, choose_rounds
from crossknn.search.rounds import Step, split_sizes
from crossknn.topk import topk_recall

__all__ = [
    "AUTO",
    "CV_MIN_ROWS",
    "DEFAULTS",
    "FEW_ROWS",
    "PARTIAL_ITEMS",
    "PARTIAL_MIN_ROWS",
    "PARTIAL_SHARE",
    "PRIOR_ALPHA",
    "PRIOR_KERNEL_TAU",
    "PRIOR_RIDGE",
    "PRIOR_TAU",
    "QUERY_DIRS",
    "ROW_CHOICES",
    "AutoIndex",
    "IndexCallBudget",
    "build_auto_index",
    "choose_rows",
    "fit_prior_ridge",
    "partial_plan",
    "query_directions",
    "rounds_curve",
    "zrows",
]

# (rho_D, rho_R, rounds, first share) when fewer than two complete rows can be read (no
# cross-validation); chosen on a pseudo split of cisi-minilm's train rows (docs/design/notes.md)
DEFAULTS = (0.3, 0.3, 10, 0.3)
# the penalty grids; a wider one (1 .. 0.01 x 3 .. 0.03) was better on two of three pseudo splits
# of cisi's train rows at m = 6, but with m = 3 rows it chose extreme penalties
# (docs/design/notes.md)
GRID_D = (0.3, 0.1, 0.03)
GRID_R = (0.3, 0.1, 1.0)
# 20 rounds: chosen by the cross-validation on cisi's train rows for 4 of 6 (C, seed) builds
# (C = 4,526 / 9,052, seeds 0-2); +0.004 mean recall over 10 on pseudo splits
# (docs/design/notes.md).
# 30 rounds: above 20 in 6 of 6 (split, C) pairs of nfcorpus-minilm-gpu's train rows (three
# pseudo splits, 300 pseudo-test rows each, C = 1% and 10% of dense; docs/design/notes.md)
GRID_ROUNDS = (10, 20, 5, 30)
# share of B for the DE first round (None: B / rounds); with m >= 2 rows (0.3, 0.2, None) was a
# wash on three pseudo splits of cisi's train rows, so cross-validation keeps B / rounds
GRID_FIRST = (None,)
GRID_DECAY = (0.0,)
# the row prior's weight (0: none) and softmax sharpness of the index build: on pseudo splits of
# nfcorpus-minilm-gpu's train rows (300 pseudo-test rows, the cross-validated other choices) alpha
# = 3 was at or above alpha = 0 at every m tried (1, 13, 32, 137 rows: +0.003 to +0.018 mean
# recall over the six cells) and above alpha = 1 in 5 of 8 (docs/design/notes.md). Fixed, not
# cross-validated: held-out medoid rows lie farther from the other row queries than a typical
# query does, so the cross-validation undervalues the row prior (it chose 0 on two of three
# splits at 1%, where 3 was better on all three).
PRIOR_ALPHA = 3.0
PRIOR_TAU = 10.0
RHO_FREE = 1e-6  # penalty of the intercept column and of the free slope c
# The query-subspace block: the top QUERY_DIRS eigendirections of the train queries' DE vectors
# (second moment, uncentred), scaled so that their prior variances sum to QUERY_DIR_VAR times
# their share of the trace, as extra item features V A with penalty RHO_Q and a zero prior: the
# online correction of the DE block is cheaper along directions that queries occupy (prior
# covariance diag(1 / rho_D) + A Aᵀ). Uses no CE call. On pseudo splits of nfcorpus-minilm-gpu's
# train rows (docs/design/notes.md): +0.007 mean recall at 1% of dense (m = 13), +0.001 at 10%.
QUERY_DIRS = 32
QUERY_DIR_VAR = 600.0
RHO_Q = 1.0
# (rho_D, rho_R, rounds, first share) with 2 <= m < CV_MIN_ROWS rows: fixed, not cross-validated.
# With few rows the cross-validation (each fold's rows held out from an index of the others) is
# noisy: on pseudo splits of nfcorpus-minilm-gpu's train rows these fixed choices were at or above
# the cross-validated ones at m = 13 (three splits) and m = 32 (two), docs/design/notes.md
FEW_ROWS = (0.1, 1.0, 30, None)
CV_MIN_ROWS = 64
# The learned prior (with 2 <= m < CV_MIN_ROWS rows): PARTIAL_SHARE of C is kept from the complete
# rows for partial rows, PARTIAL_ITEMS entries each of other train queries, the items ``auto``
# itself scores for them at budget PARTIAL_ITEMS; at least PARTIAL_MIN_ROWS of them, else none.
# Measured on three pseudo splits of nfcorpus-minilm-gpu's train rows at 1% of dense (C = 50,026:
# 13 complete rows + 27 partial rows of 100 entries vs 13 complete rows): mean of the six cells
# 0.8141 -> 0.8280, above on 3 of 3 splits; 12 rows + 64 partial: 0.8242, 10 + 136: 0.8196; 50 or
# 25 entries a partial row: 0.8258, 0.8243 (docs/design/notes.md)
PARTIAL_SHARE = 0.04
PARTIAL_ITEMS = 100
PARTIAL_MIN_ROWS = 8
# How a query borrows the fitted queries' corrections (AutoIndex.prior_vector): a kernel ridge
# regression (the posterior mean of a Gaussian process) of the corrections on the fitted queries'
# DE vectors, kernel exp(PRIOR_KERNEL_TAU * (cos - 1)), ridge PRIOR_RIDGE, around their mean. The
# softmax(PRIOR_TAU * cos) average it replaced (prior_ridge = 0, indexes built before it) was below
# it on three pseudo splits of nfcorpus-minilm-gpu's train rows at 1% of dense (mean of the six
# cells 0.8241 / 0.8336 / 0.8265 -> 0.8258 / 0.8360 / 0.8271) and at 32 rows' calls (0.8500 /
# 0.8488 / 0.8422 -> 0.8535 / 0.8509 / 0.8440); docs/design/notes.md
PRIOR_RIDGE = 0.1
PRIOR_KERNEL_TAU = 2.0
CV_BUDGETS = (50, 100, 200)
CV_KS = (10, 50)
# how the m complete rows are picked among the train queries (before any CE call)
ROW_CHOICES = ("medoids", "random")


class IndexCallBudget:
    """Counting scorer over the train queries for the offline phase: at most ``calls`` distinct
    (query, item) entries, only of ``queries``; an entry read twice is served from the cache."""

    def __init__(self, scorer, queries: Sequence, calls: int) -> None:
        if int(calls) < 0:
            raise ValueError(f"index calls must be >= 0; got {calls}")
        self.scorer, self.limit = scorer, int(calls)
        self.n_items = int(scorer.n_items)
        self.allowed = {_key(q) for q in queries}
        self._seen: dict = {}

    @property
    def calls(self) -> int:
        return len(self._seen)

    def score(self, query, items) -> np.ndarray:
        return self.score_batch([query], [items])[0]

    def score_batch(self, queries: list, items: list) -> list[np.ndarray]:
        if len(queries) != len(items):
            raise ValueError(f"score_batch: {len(queries)} queries but {len(items)} item lists")
        items = [as_items(it, self.n_items) for it in items]
        new: dict = {}
        for q, it in zip(queries, items, strict=True):
            if _key(q) not in self.allowed:
                raise PermissionError(f"query {q!r} is not a train query of this index")
            pend = new.setdefault(_key(q), (q, {}))[1]
            for i in it.tolist():
                if (_key(q), i) not in self._seen:
                    pend[i] = None
        n_new = sum(len(p) for _, p in new.values())
        if self.calls + n_new > self.limit:
            raise BudgetExceededError(
                f"the index may read {self.limit} train CE entries; {self.calls} read, "
                f"{n_new} more asked"
            )
        todo = [(q, np.fromiter(p, np.int64, len(p))) for q, p in new.values() if p]
        if todo:
            out = self.scorer.score_batch([q for q, _ in todo], [p for _, p in todo])
            for (q, p), s in zip(todo, out, strict=True):
                s = np.asarray(s, np.float32).ravel()
                if s.shape != p.shape or not np.all(np.isfinite(s)):
                    raise ValueError(f"the scorer returned bad scores for query {q!r}")
                for i, v in zip(p.tolist(), s.tolist(), strict=True):
                    self._seen[(_key(q), i)] = v
        return [
            np.array([self._seen[(_key(q), i)] for i in it.tolist()], np.float32)
            for q, it in zip(queries, items, strict=True)
        ]


def _key(q):
    return int(q) if isinstance(q, (int, np.integer)) else q


def zrows(R) -> np.ndarray:
    """Each row centred and scaled to unit standard deviation (constant rows: centred only)."""
    R = np.asarray(R, np.float64)
    sd = R.std(axis=1, keepdims=True)
    return (R - R.mean(axis=1, keepdims=True)) / np.where(sd > 0, sd, 1.0)


@dataclass
class AutoIndex:
    """What ``auto`` needs: DE item vectors (N x d), ``rows`` (m x N) complete train CE rows
    (m may be 0), the chosen penalties and rounds, and the CE entries read to build it."""

    item_vectors: np.ndarray
    rows: np.ndarray
    rho_d: float = DEFAULTS[0]
    rho_r: float = DEFAULTS[1]
    rounds: int = DEFAULTS[2]
    first_share: float | None = DEFAULTS[3]  # of B for the DE first round; None: B / rounds
    decay: float = 0.0  # penalties scaled by (|A| / 10) ** -decay: the prior fades over rounds
    index_calls: int = 0
    # DE vectors of the m row queries (m x d; None: unknown, no row prior) and the row prior
    row_vectors: np.ndarray | None = None
    prior_alpha: float = 0.0
    prior_tau: float = PRIOR_TAU
    row_ids: list = field(default_factory=list)
    cv: dict | None = None
    # d x r directions of the query-subspace block (None or r = 0: none; see QUERY_DIRS)
    query_dirs: np.ndarray | None = None
    # the covariance (d x d, float64) of the item vectors (item_covariance), when already known:
    # stored by a corpus build, shared by the folds of the cross-validation; None: computed on
    # first use (O(N d^2))
    item_cov: np.ndarray | None = field(default=None, repr=False, compare=False)
    # the learned prior (:meth:`prior_vector`; None: the row prior): the DE vectors (P x d) of
    # the queries whose CE entries the build fitted (row queries and partial-row queries) and
    # their fitted corrections to the plain DE prior per unit DE-score spread (P x (d + m + r + 1))
    prior_vectors: np.ndarray | None = None
    prior_deltas: np.ndarray | None = None
    partial_rows: int = 0  # partial rows read for the learned prior (their entries in index_calls)
    # how the learned prior borrows the corrections (prior_vector): 0 (indexes built before it) the
    # softmax(prior_tau * cos) average, > 0 a kernel ridge regression with this ridge and kernel
    # exp(prior_kernel_tau * (cos - 1))
    prior_ridge: float = 0.0
    prior_kernel_tau: float = PRIOR_KERNEL_TAU
    # {rounds: cross-validated recall} over the complete rows (rounds_curve; None: not known,
    # indexes built before it or with fewer than 4 rows): what choose_rounds trades for time
    rounds_curve: dict | None = None
    # the early stop's table (crossknn.search.stopping.stop_curve over the complete rows; None:
    # not calibrated, indexes built before it or with fewer than 4 rows)
    stop_curve: dict | None = None
    # what row_prior reads for every query, computed once (see prior_tables); the arrays above are
    # not changed after construction
    _tables: tuple | None = field(default=None, init=False, repr=False, compare=False)
    # C's Cholesky factor packed for spread() (packed_cholesky), False where C has none
    _chol: np.ndarray | bool | None = field(default=None, init=False, repr=False, compare=False)
    # the prior's C++ object (prior_core): the one copy of prior_vector's arithmetic, shared with
    # the C++ crossknn::Searcher (crossknn/auto_index.h)
    _core_prior: object = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        V = np.asarray(self.item_vectors, np.float32)
        if V.ndim != 2 or 0 in V.shape:
            raise ValueError(f"item vectors must be a non-empty (N x d) matrix; got {V.shape}")
        R = np.asarray(self.rows, np.float32).reshape(-1, V.shape[0])
        if not (np.all(np.isfinite(V)) and np.all(np.isfinite(R))):
            raise ValueError("the auto index holds NaN or inf values")
        self.item_vectors, self.rows = V, R
        if self.row_vectors is not None:
            W = np.asarray(self.row_vectors, np.float32).reshape(-1, V.shape[1])
            if W.shape[0] != R.shape[0] or not np.all(np.isfinite(W)):
                raise ValueError(
                    f"row vectors must be {R.shape[0]} finite DE vectors of dim {V.shape[1]} "
                    f"(one per row); got shape {W.shape}"
                )
            self.row_vectors = W
        if self.query_dirs is not None:
            A = np.asarray(self.query_dirs, np.float32)
            if A.ndim != 2 or A.shape[0] != V.shape[1] or not np.all(np.isfinite(A)):
                raise ValueError(
                    f"query directions must be a finite ({V.shape[1]} x r) matrix; got shape "
                    f"{A.shape}"
                )
            self.query_dirs = A
        if self.item_cov is not None:
            C = np.asarray(self.item_cov, np.float64)
            d = V.shape[1]
            if C.shape != (d, d) or not np.all(np.isfinite(C)):
                raise ValueError(
                    f"the item covariance must be a finite {d} x {d} matrix; got shape {C.shape}"
                )
            self.item_cov = C
        if (self.prior_vectors is None) != (self.prior_deltas is None):
            raise ValueError("the learned prior needs both prior_vectors and prior_deltas")
        if self.prior_deltas is not None:
            P = np.asarray(self.prior_vectors, np.float32)
            D = np.asarray(self.prior_deltas, np.float32)
            width = V.shape[1] + R.shape[0] + self.n_dirs + 1
            if (
                P.ndim != 2
                or P.shape[1:] != (V.shape[1],)
                or D.shape != (P.shape[0], width)
                or P.shape[0] == 0
                or not (np.all(np.isfinite(P)) and np.all(np.isfinite(D)))
            ):
                raise ValueError(
                    f"the learned prior needs finite P x {V.shape[1]} vectors and P x {width} "
                    f"deltas (P >= 1); got shapes {P.shape} and {D.shape}"
                )
            self.prior_vectors, self.prior_deltas = P, D
        if self.prior_alpha < 0 or self.prior_tau <= 0:
            raise ValueError(
                f"need prior_alpha >= 0 and prior_tau > 0; got {self.prior_alpha}, {self.prior_tau}"
            )
        if not (self.prior_ridge >= 0 and self.prior_kernel_tau > 0):
            raise ValueError(
                f"need prior_ridge >= 0 and prior_kernel_tau > 0; got {self.prior_ridge}, "
                f"{self.prior_kernel_tau}"
            )
        if self.prior_alpha > 0 and self.row_vectors is None and R.shape[0]:
            raise ValueError("a row prior (prior_alpha > 0) needs the row queries' DE vectors")
        if self.rounds_curve is not None:
            self.rounds_curve = {int(r): float(v) for r, v in dict(self.rounds_curve).items()}
        if self.rho_d <= 0 or self.rho_r <= 0 or int(self.rounds) < 1:
            raise ValueError(
                f"need rho_d, rho_r > 0 and rounds >= 1; got {self.rho_d}, {self.rho_r}, "
                f"{self.rounds}"
            )

    @property
    def n_items(self) -> int:
        return self.item_vectors.shape[0]

    @property
    def dim(self) -> int:
        return self.item_vectors.shape[1]

    @property
    def n_rows(self) -> int:
        return self.rows.shape[0]

    @property
    def n_dirs(self) -> int:
        return 0 if self.query_dirs is None else self.query_dirs.shape[1]

    def features(self) -> np.ndarray:
        """``X = [V | zrows(R)ᵀ | V A | 1]`` (N x (d + m + r + 1)), float32, computed in double
        by the core (``_core.auto_features``, crossknn/auto_index.h: the same bits as the C++
        ``crossknn::Searcher``)."""
        A = self.query_dirs if self.n_dirs else np.zeros((self.dim, 0), np.float32)
        return _core.auto_features(self.item_vectors, self.rows, A)

    def penalties(self) -> np.ndarray:
        return np.r_[
            np.full(self.dim, self.rho_d),
            np.full(self.n_rows, self.rho_r),
            np.full(self.n_dirs, RHO_Q),
            RHO_FREE,
        ]

    def meta(self) -> dict:
        return {
            "rows": self.n_rows,
            "rho_d": self.rho_d,
            "rho_r": self.rho_r,
            "rounds": int(self.rounds),
            "first_share": self.first_share,
            "decay": float(self.decay),
            "prior_alpha": float(self.prior_alpha),
            "prior_tau": float(self.prior_tau),
            "index_calls": int(self.index_calls),
            "query_dirs": self.n_dirs,
            "learned_prior": 0 if self.prior_deltas is None else int(self.prior_deltas.shape[0]),
            "partial_rows": int(self.partial_rows),
            "prior_ridge": float(self.prior_ridge),
            "prior_kernel_tau": float(self.prior_kernel_tau),
            "rounds_curve": None
            if self.rounds_curve is None
            else {str(r): v for r, v in sorted(self.rounds_curve.items())},
            "stop_curve": self.stop_curve,
        }

    def prior_tables(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(W, |W_j|, C)``, computed once per index: the row queries' DE vectors (float32 as
        stored, C-contiguous: :meth:`cosines` reads them in double; the fitted queries' when the
        index has a learned prior), their norms (float64, at least 1e-12) and the covariance
        ``C`` (d x d, float64) of the item vectors, so that ``sd(V v) = sqrt(v C v)`` costs d^2
        per query instead of reading V."""
        if self._tables is None:
            learned = self.prior_deltas is not None
            W = self.prior_vectors if learned else self.row_vectors
            W = np.zeros((0, self.dim), np.float32) if W is None else W
            W = np.ascontiguousarray(W, np.float32)
            wn = np.linalg.norm(W.astype(np.float64), axis=1)
            self._tables = (W, np.maximum(wn, 1e-12))
        if self.item_cov is None:
            self.item_cov = item_covariance(self.item_vectors)
        if self._chol is None:
            self._chol = packed_cholesky(self.item_cov)
        return (*self._tables, self.item_cov)

    def cosines(self, v: np.ndarray) -> np.ndarray:
        """``cos(v, W_j)`` for the prior's queries ``W`` (:meth:`prior_tables`), in double from
        their float32 values (``_core.rows_dot``: one thread, half the bytes of a float64 copy)."""
        W, wn, _ = self.prior_tables()
        return _core.rows_dot(W, v) / (wn * max(float(np.linalg.norm(v)), 1e-12))

    def spread(self, v: np.ndarray) -> float:
        """``sd(V v) = sqrt(v C v)`` for a DE query vector ``v`` (float64, shape (d,)): through
        ``C``'s Cholesky factor packed (``||Lᵀ v||``, half of ``C``'s bytes, read once a query,
        on one thread: ``_core.packed_lower_t_norm2``) where ``C`` has one, else ``C`` itself."""
        C = self.prior_tables()[2]
        if self._chol is False:
            return float(np.sqrt(max(float(v @ (C @ v)), 0.0)))
        return float(np.sqrt(_core.packed_lower_t_norm2(self._chol, v)))

    def prior_core(self):
        """The prior's C++ object (``_core.AutoPrior``, crossknn/auto_index.h), made once:
        :meth:`prior_vector` runs its arithmetic, the same instructions as the C++
        ``crossknn::Searcher`` over this index's folder."""
        if self._core_prior is None:
            learned = self.prior_deltas is not None
            W = cov = chol = None
            if learned or (self.prior_alpha > 0 and self.n_rows):
                W, _, cov = self.prior_tables()
                chol = self._chol if isinstance(self._chol, np.ndarray) else None
            self._core_prior = _core.AutoPrior(
                self.dim,
                self.n_rows,
                self.n_dirs,
                W=W,
                deltas=self.prior_deltas if learned else None,
                alpha=float(self.prior_alpha),
                tau=float(self.prior_tau),
                ridge=float(self.prior_ridge),
                kernel_tau=float(self.prior_kernel_tau),
                cov=cov,
                chol=chol,
            )
        return self._core_prior

    def __getstate__(self) -> dict:
        """Pickled without the prior's C++ object (made again at first use)."""
        state = self.__dict__.copy()
        state["_core_prior"] = None
        return state

    def row_prior(self, v: np.ndarray) -> np.ndarray:
        """The prior's CE-row block for DE query vector ``v``:
        ``alpha * sd(V v) * softmax(tau * cos(v, row query j))`` (zeros when alpha is 0); the
        spread as ``sqrt(v C v)`` (:meth:`prior_tables`), equal to ``np.std(V v)`` up to
        float64 rounding."""
        if self.prior_alpha == 0 or self.n_rows == 0 or self.prior_deltas is not None:
            return np.zeros(self.n_rows)
        p = self.prior_core().prior(np.asarray(v, np.float64))
        return p[self.dim : self.dim + self.n_rows]

    def prior_vector(self, v: np.ndarray) -> np.ndarray:
        """The prior ``p0`` (d + m + r + 1) of DE query vector ``v`` (float64, shape (d,)).

        Without a learned prior: ``[v, row_prior(v), 0, 0]``. With one (``prior_deltas``):
        ``[v, 0, 0, 0] + sd(V v) * f(v)``, where each ``delta_j`` is how the fit of fitted query
        j's CE entries departs from its plain DE prior, per unit spread of its DE scores, and
        ``f`` regresses them on the fitted queries' DE vectors ``v_j``, so a query borrows the
        corrections of the fitted queries nearest it in DE space (all blocks: DE, CE rows, query
        subspace, intercept). With ``prior_ridge`` > 0 (builds since :data:`PRIOR_RIDGE`) a
        kernel ridge regression: ``f(v) = mean_j delta_j + k(v)ᵀ (K + prior_ridge I)^-1 (delta -
        mean)``, ``k(x, y) = exp(prior_kernel_tau * (cos(x, y) - 1))``; with 0 (indexes built
        before) ``f(v) = sum_j softmax(prior_tau * cos(v, v_j)) delta_j``. About P (d + m + r)
        operations a query, in the core (:meth:`prior_core`)."""
        return self.prior_core().prior(np.asarray(v, np.float64))


def packed_cholesky(C) -> np.ndarray | bool:
    """``C = L Lᵀ``'s factor ``L`` packed by columns (column j: ``L[j:, j]``; the d (d + 1) / 2
    entries ``_core.packed_lower_t_norm2`` reads); False where ``C`` is not positive definite
    (fewer items than dimensions, repeated columns)."""
    ap = _core.packed_cholesky(np.ascontiguousarray(C, np.float64))  # crossknn/auto_index.h
    return False if ap is None else ap


def item_covariance(V) -> np.ndarray:
    """The population covariance (d x d, float64) of the rows of ``V`` (N x d): ``var(V v) =
    v C v``, computed by the core (the same sums as the C++ reader of an index lacking it)."""
    return _core.item_covariance(np.ascontiguousarray(V, np.float32))  # crossknn/auto_index.h


class AUTO(RoundMethod):
    """Hybrid-feature rounds over an :class:`AutoIndex` (see the module docstring).

    ``prior``: DE query vectors, a callable ``query -> (d,)`` or an array indexed by query row;
    ``first``: the first-stage retriever (the DE) or ``"random"``.
    """

    name = "auto"
    solve = "prior_ridge"  # the core's ridge pulled to the DE prior (crossknn/search.h)

    def __init__(
        self,
        index: AutoIndex,
        *,
        prior,
        first="random",
        rounds: int | None = None,
        cost: RoundCost | None = None,
        target_ms: float | None = None,
    ):
        super().__init__(first=first, n_items=index.n_items)
        if prior is None:
            raise ValueError("auto needs the DE query vectors as its prior")
        self.index = index
        self.features = ItemFeatures(index.features())
        self._inv_rho = np.ascontiguousarray(np.r_[1.0 / index.penalties(), 1.0 / RHO_FREE])
        self.prior = prior
        self._choices: dict[int, RoundChoice] = {}
        self.set_rounds(rounds)
        self.set_cost(cost, target_ms)
        learned = index.prior_deltas is not None
        if learned or (index.prior_alpha > 0 and index.n_rows):  # tables now, not in a query
            index.prior_tables()

    def set_cost(self, cost: RoundCost | None, target_ms: float | None) -> None:
        """The round cost and latency target the rounds are chosen under
        (:func:`crossknn.search.round_plan.choose_rounds`; None: the index's rounds)."""
        if target_ms is not None and not float(target_ms) > 0:
            raise ValueError(f"the latency target must be > 0 ms; got {target_ms}")
        self.cost = cost
        self.target_ms = None if target_ms is None else float(target_ms)
        self._choices = {}

    def set_rounds(self, rounds: int | None) -> None:
        """Rounds asked for (None: chosen, :meth:`choice`)."""
        if rounds is not None and int(rounds) < 1:
            raise ValueError(f"rounds must be >= 1; got {rounds}")
        self.asked_rounds = None if rounds is None else int(rounds)
        self.rounds = int(self.index.rounds if rounds is None else rounds)
        self._choices = {}

    def stop_threshold(self, target_recall: float, budget: int) -> float:
        """The early stop's threshold for ``target_recall`` at ``budget`` from the index's
        calibration (:func:`crossknn.search.stopping.stop_threshold`)."""
        return stopping.stop_threshold(self.index.stop_curve, target_recall, budget)

    def choice(self, budget: int) -> RoundChoice:
        """The rounds a search of ``budget`` CE calls runs, and why (computed once a budget)."""
        b = int(budget)
        if b not in self._choices:
            self._choices[b] = choose_rounds(
                self.index.rounds_curve,
                self.index.rounds,
                budget=b,
                cost=self.cost,
                target_ms=self.target_ms,
                rounds=self.asked_rounds,
            )
        return self._choices[b]

    def plan(self, budget):
        share, rounds = self.index.first_share, min(self.choice(budget).rounds, budget)
        n1 = 0 if share is None else max(1, int(round(share * budget)))
        if share is None or rounds < 2 or budget - n1 < rounds - 1:
            return _round_plan(budget, rounds, 0)
        return [Step("first", n1)] + [
            Step("round", n) for n in split_sizes(budget - n1, rounds - 1)
        ]

    def priors(self, queries):
        out = []
        for q in queries:
            v = self.prior(q) if callable(self.prior) else np.asarray(self.prior)[int(q)]
            v = np.asarray(v, np.float64).ravel()
            if v.shape != (self.index.dim,):
                raise ValueError(
                    f"DE query vector must have shape ({self.index.dim},); got {v.shape}"
                )
            out.append(self.index.prior_vector(v))
        return out

    def prepare(self, budget: int) -> list[str]:
        """The PriorRidge solve's kernel cache for this index's penalties (``RoundMethod.prepare``;
        built only here: ``ItemFeatures.prepare_gram``)."""
        return ["gram"] if self.features.prepare_gram(self._inv_rho) else []

    def prior_ridge_penalties(self) -> tuple[np.ndarray, float]:
        """``(1 / rho, decay)`` of the core's PriorRidge solve: d + m + 1 feature penalties and the
        free slope's, last (``crossknn/search.h``)."""
        return self._inv_rho, float(self.index.decay)


def build_auto_index(
    scorer,
    train_queries: Sequence,
    item_vectors,
    train_query_vectors,
    *,
    index_calls: int,
    seed: int = 0,
    budgets: Sequence[int] | None = None,
    ks: Sequence[int] | None = None,
    n_folds: int = 6,
    max_dev: int = 30,
    row_choice: str = "medoids",
    prior_alpha: float = PRIOR_ALPHA,
    query_dirs: int = QUERY_DIRS,
    partial_items: int | None = None,
    progress: bool = False,
    curve_rounds: Sequence[int] | None = ROUNDS_GRID,
    stop_rows: Callable[[int, float], bool] | None = None,
    stop_targets: Sequence[float] | None = None,
) -> AutoIndex:
    """Reads at most ``index_calls`` CE entries of the train queries and returns the index.

    ``scorer``: any scorer over the train queries (it is wrapped in :class:`IndexCallBudget`, or
    used as is when it already is one); ``train_query_vectors[j]``: the DE vector of
    ``train_queries[j]`` (used for the cross-validated choices only); ``budgets`` / ``ks``: the
    cross-validation objective, mean Top-k-Recall@B (default :data:`CV_BUDGETS` x :data:`CV_KS`);
    ``row_choice``: ``"medoids"`` (default) or ``"random"``, see :func:`choose_rows`;
    ``prior_alpha``: the row prior's weight (0: the plain DE prior), see :meth:`AUTO.priors`;
    ``query_dirs``: directions of the query-subspace block from all ``train_query_vectors`` (0:
    none), see :func:`query_directions`; ``partial_items``: entries a partial row of the
    learned prior (None: :data:`PARTIAL_ITEMS`; 0: none), see :func:`partial_plan` and
    :func:`learned_prior`; ``curve_rounds``: the round counts of the index's rounds curve
    (:func:`rounds_curve`, with 4 rows or more; None or empty: no curve); ``stop_rows(j,
    seconds)``: asked before the j-th complete row (``seconds`` spent on the rows so far), True
    stops reading rows there (a time cap): the index is made of the j rows read, with the
    choices of j rows and no partial rows (None: every planned row is read); ``stop_targets``:
    the targets of the early stop's calibration (:func:`crossknn.search.stopping.stop_curve`, with
    4 rows or more; None: :data:`crossknn.search.stopping.TARGETS`, empty: none).
    """
    budgets = CV_BUDGETS if budgets is None else budgets
    partial_items = PARTIAL_ITEMS if partial_items is None else int(partial_items)
    ks = CV_KS if ks is None else ks
    V = np.asarray(item_vectors, np.float32)
    Q = np.asarray(train_query_vectors, np.float32)
    train = list(train_queries)
    if Q.shape != (len(train), V.shape[1]):
        raise ValueError(
            f"train query vectors must have shape ({len(train)}, {V.shape[1]}); got {Q.shape}"
        )
    reader = scorer if isinstance(scorer, IndexCallBudget) else None
    reader = reader or IndexCallBudget(scorer, train, index_calls)
    N = V.shape[0]
    if reader.n_items != N:
        raise ValueError(f"the scorer has {reader.n_items} items, the item vectors {N}")
    m, n_part = partial_plan(int(index_calls), N, len(train), partial_items)
    A = query_directions(Q, query_dirs) if m >= 2 and query_dirs else None
    pos = choose_rows(Q, m, how=row_choice, seed=seed)
    all_items = np.arange(N, dtype=np.int64)
    R = np.empty((m, N), np.float32)

    # one bar over the CE pairs of the rows: pairs/s and the time left
    t0 = time.perf_counter()
    with tqdm(
        total=m * N,
        desc=f"auto index ({m} CE rows)",
        unit="pair",
        unit_scale=True,
        disable=not progress or m == 0,
        leave=False,
    ) as bar:
        for j, p in enumerate(pos):
            if stop_rows is not None and stop_rows(j, time.perf_counter() - t0):
                m, n_part, pos, R = j, 0, pos[:j], R[:j]  # cut: the rows read so far
                A = A if m >= 2 else None
                break
            R[j] = reader.score(train[p], all_items)
            bar.update(N)
    rho_d, rho_r, rounds, first = DEFAULTS
    decay = 0.0
    table = None
    if 2 <= m < CV_MIN_ROWS:
        rho_d, rho_r, rounds, first = FEW_ROWS
    elif m >= CV_MIN_ROWS:
        (rho_d, rho_r, rounds, first, decay), table = _cross_validate(
            R,
            Q[pos],
            V,
            budgets=budgets,
            ks=ks,
            n_folds=n_folds,
            max_dev=max_dev,
            seed=seed,
            alpha=prior_alpha,
            query_dirs=A,
        )
    curve = None
    if m >= 4 and curve_rounds:
        curve = rounds_curve(
            R,
            Q[pos],
            V,
            rho_d=rho_d,
            rho_r=rho_r,
            first_share=first,
            decay=decay,
            alpha=prior_alpha,
            query_dirs=A,
            budgets=budgets,
            ks=ks,
            grid=sorted({*curve_rounds, int(rounds)}),
            n_folds=n_folds,
            max_dev=max_dev,
            seed=seed,
        )
    idx = AutoIndex(
        V,
        R,
        rho_d=rho_d,
        rho_r=rho_r,
        rounds=rounds,
        first_share=first,
        decay=decay,
        index_calls=reader.calls,
        row_vectors=Q[pos],
        prior_alpha=prior_alpha,
        row_ids=[train[p] for p in pos],
        cv=table,
        query_dirs=A,
        rounds_curve=curve,
        stop_curve=_stop_curve(
            R, Q[pos], V, (rho_d, rho_r, rounds, first, decay), prior_alpha, A, stop_targets, seed
        ),
    )
    if n_part == 0:
        return idx
    fit = learned_prior(reader, train, Q, idx, pos, n_part, items=partial_items, seed=seed)
    return replace(
        idx,
        prior_vectors=None if fit is None else fit[0],
        prior_deltas=None if fit is None else fit[1],
        partial_rows=n_part,
        index_calls=reader.calls,
        prior_ridge=PRIOR_RIDGE,
        prior_kernel_tau=PRIOR_KERNEL_TAU,
    )


def _stop_curve(R, Qr, V, choice, alpha, query_dirs, targets, seed) -> dict | None:
    """The early stop's table over the m complete rows (m >= 4; cross-validated folds as
    :func:`rounds_curve`, the row prior kept, the learned prior not); None with fewer rows."""
    targets = stopping.TARGETS if targets is None else tuple(targets)
    m = R.shape[0]
    if m < 4 or not targets:
        return None
    de = make_retriever("de", item_vectors=V, query_vectors=Qr)
    cov = item_covariance(V) if alpha > 0 else None
    chol = None if cov is None else packed_cholesky(cov)

    def method_for(fold):
        keep = np.setdiff1d(np.arange(m), fold)
        return _fold_method(V, R, Qr, keep, choice, alpha, query_dirs, cov, chol, de)

    folds = _cv_folds(m, n_folds=6, max_dev=stopping.MAX_ROWS, seed=seed)
    return stopping.stop_curve(method_for, R, folds, seed=seed, targets=targets)


def partial_plan(index_calls: int, n_items: int, n_train: int, items: int = PARTIAL_ITEMS):
    """``(m, P)``: the complete rows and the partial rows (``items`` entries each) that ``C``
    index calls buy. Without partial rows ``m = min(C // N, n_train)``; with ``2 <= m <``
    :data:`CV_MIN_ROWS` and ``items > 0``, :data:`PARTIAL_SHARE` of C is kept from the complete
    rows (m at least 2) and spent on partial rows of other train queries, when that buys at least
    :data:`PARTIAL_MIN_ROWS` of them and ``items <= N / 2`` (else ``P = 0`` and m as without)."""
    C, N, n = int(index_calls), int(n_items), int(n_train)
    if C < 0 or N < 1 or n < 0 or int(items) < 0:
        raise ValueError(
            f"need index_calls >= 0, n_items >= 1, n_train >= 0, items >= 0; got {C}, {N}, {n}, "
            f"{items}"
        )
    m, L = min(C // N, n), int(items)
    if not (L and 2 <= m < CV_MIN_ROWS) or 2 * L > N:  # a partial row is at most half a row
        return m, 0
    keep = max(2, min(int((1.0 - PARTIAL_SHARE) * C) // N, n))
    n_part = min((C - keep * N) // L, n - keep)
    return (keep, n_part) if n_part >= PARTIAL_MIN_ROWS else (m, 0)


class _Recorder:
    """A scorer over train query positions that reads through ``reader`` and keeps, per
    position, the items asked and their scores (the entries one search read)."""

    def __init__(self, reader: IndexCallBudget, train: list) -> None:
        self.reader, self.train, self.n_items = reader, train, reader.n_items
        self.seen: dict[int, tuple[list, list]] = {}

    def score_batch(self, queries: list, items: list) -> list[np.ndarray]:
        out = self.reader.score_batch([self.train[int(q)] for q in queries], items)
        for q, it, sc in zip(queries, items, out, strict=True):
            rec = self.seen.setdefault(int(q), ([], []))
            rec[0].append(np.asarray(it, np.int64).ravel())
            rec[1].append(np.asarray(sc, np.float64).ravel())
        return out


def fit_prior_ridge(X, a, p0, penalties, eps: float = RHO_FREE) -> tuple[np.ndarray, float]:
    """``(w, c)`` of the ridge pulled to ``p0`` with a free slope (the online solve, in numpy):
    ``argmin ||X w + c X p0 - a||^2 + sum penalties_j w_j^2 + eps c^2`` over the L rows of X
    (L x F) and their scores ``a``; solved in its L x L dual form (L is a partial row's size)."""
    X = np.asarray(X, np.float64)
    a = np.asarray(a, np.float64).ravel()
    Z = np.hstack([X, (X @ np.asarray(p0, np.float64))[:, None]])
    ZD = Z / np.r_[np.asarray(penalties, np.float64), eps]
    theta = ZD.T @ np.linalg.solve(ZD @ Z.T + np.eye(a.size), a)
    return theta[:-1], float(theta[-1])


def prior_correction(index: AutoIndex, X, penalties, v, p0, items, scores) -> np.ndarray | None:
    """One fitted query's correction ``delta = (p0 + w / c - [v, 0, 0, 0]) / sd(V v)`` from its
    CE ``scores`` of ``items`` (:func:`fit_prior_ridge` over the features ``X``); None when the
    fitted slope c or the spread of its DE scores is not positive."""
    w, c = fit_prior_ridge(X[items], scores, p0, penalties)
    spread = index.spread(v)
    if not (c > 0 and spread > 0):
        return None
    t = p0 + w / c
    t[: index.dim] -= v
    return t / spread


def learned_prior(
    reader, train, Q, index: AutoIndex, pos, n_part: int, *, items: int, seed: int = 0
) -> tuple[np.ndarray, np.ndarray] | None:
    """``(prior_vectors, prior_deltas)`` of the learned prior (:meth:`AutoIndex.prior_vector`).

    ``n_part`` train queries other than the row queries ``pos`` (uniform, seeded) are searched by
    ``auto`` over ``index`` (its row prior) with budget ``items`` through ``reader``: their
    partial rows, ``items`` CE entries each, where ``auto`` looks; the row queries are searched
    the same way from their complete rows (no new entry). Each query's entries are fitted by
    :func:`fit_prior_ridge` with its prior ``p0``: ``t = p0 + w / c`` is the query's estimated
    embedding in the prior's scale, and ``delta = (t - [v, 0, 0, 0]) / sd(V v)``. Queries whose
    fitted slope c is not positive (CE against the DE) are left out; None when that leaves none.
    """
    train = list(train)
    pos = np.asarray(pos, np.int64)
    rest = np.setdiff1d(np.arange(len(train)), pos)
    rng = np.random.default_rng([int(seed), 77])
    part = np.sort(rng.choice(rest, int(n_part), replace=False))
    fitted = np.concatenate((pos, part)).astype(np.int64)
    rec = _Recorder(reader, train)
    de = make_retriever("de", item_vectors=index.item_vectors, query_vectors=Q)
    meth = AUTO(index, prior=Q, first=de)
    b = min(int(items), index.n_items)
    meth.search(rec, fitted.tolist(), budget=b, k=min(10, b), seed=seed)
    X = index.features().astype(np.float64)
    pen = index.penalties()
    vecs, deltas = [], []
    for q, p0 in zip(fitted.tolist(), meth.priors(fitted.tolist()), strict=True):
        its, sc = rec.seen[q]
        its, first = np.unique(np.concatenate(its), return_index=True)
        v = np.asarray(Q[q], np.float64)
        delta = prior_correction(index, X, pen, v, p0, its, np.concatenate(sc)[first])
        if delta is not None:
            vecs.append(v)
            deltas.append(delta)
    if not vecs:  # the CE runs against the DE for every fitted query: keep the row prior
        return None
    return np.array(vecs, np.float32), np.array(deltas, np.float32)


def choose_rows(query_vectors, m: int, *, how: str = "medoids", seed: int = 0) -> np.ndarray:
    """Positions (sorted, distinct) of the ``m`` train queries whose complete CE rows to read.

    ``"medoids"``: k-means (k = m, seeded) over the train queries' DE vectors, and in each cluster
    the query nearest its centre: the rows then cover the kinds of queries the train set has
    (uses no CE call, so it costs nothing of C). ``"random"``: ``m`` uniformly drawn queries.
    """
    if how not in ROW_CHOICES:
        raise ValueError(f"row choice must be one of {ROW_CHOICES}; got {how!r}")
    Q = np.asarray(query_vectors, np.float64)
    n = Q.shape[0]
    if not 0 <= int(m) <= n:
        raise ValueError(f"cannot choose {m} rows among {n} train queries")
    m = int(m)
    if m == 0:
        return np.empty(0, np.int64)
    if m == n:
        return np.arange(n, dtype=np.int64)
    if how == "random":
        rng = np.random.default_rng([int(seed), 1717])
        return np.sort(rng.choice(n, m, replace=False)).astype(np.int64)
    # scikit-learn: about 0.7 s to import, only this function needs it
    from sklearn.cluster import KMeans

    with threadpool_limits(1):  # tiny problem: threads only contend on a shared machine
        km = KMeans(m, n_init=10, random_state=int(seed) % 2**32).fit(Q)
    d = ((Q[:, None, :] - km.cluster_centers_[None]) ** 2).sum(-1)  # n x m
    pos: list[int] = []
    for c in range(m):  # the member nearest each centre; a query is used once
        members = np.flatnonzero(km.labels_ == c)
        cand = members if members.size else np.arange(n)
        for j in cand[np.argsort(d[cand, c], kind="stable")]:
            if int(j) not in pos:
                pos.append(int(j))
                break
    for j in np.argsort(d.min(1), kind="stable"):  # k-means left a cluster short: fill up
        if len(pos) == m:
            break
        if int(j) not in pos:
            pos.append(int(j))
    return np.sort(np.array(pos, np.int64))


def query_directions(query_vectors, r: int = QUERY_DIRS, *, var: float = QUERY_DIR_VAR):
    """The d x r' directions of the query-subspace block (r' = min(r, d, queries)): the top
    eigenvectors of the queries' uncentred DE second moment ``C = QᵀQ / n``, column j scaled to
    ``sqrt(var * eigenvalue_j / trace C)`` (its prior standard deviation). Uses no CE call."""
    Q = np.asarray(query_vectors, np.float64)
    if Q.ndim != 2 or not np.all(np.isfinite(Q)):
        raise ValueError(f"query vectors must be a finite (n x d) matrix; got shape {Q.shape}")
    if int(r) < 0 or var <= 0:
        raise ValueError(f"need r >= 0 and var > 0; got r={r}, var={var}")
    n, d = Q.shape
    r = min(int(r), d, n)
    C = Q.T @ Q / max(n, 1)
    tr = float(np.trace(C))
    if r == 0 or tr <= 0:
        return np.zeros((d, 0), np.float32)
    ev, vec = np.linalg.eigh(C)
    ev, vec = ev[::-1][:r], vec[:, ::-1][:, :r]
    vec = vec * np.where(vec[np.abs(vec).argmax(0), np.arange(r)] < 0, -1.0, 1.0)  # fixed signs
    return (vec * np.sqrt(var * np.maximum(ev, 0.0) / tr)).astype(np.float32)


def _cv_folds(m: int, *, n_folds: int, max_dev: int, seed: int) -> list[np.ndarray]:
    """The folds of the cross-validation over m complete rows (seeded; at most ``max_dev`` rows
    searched)."""
    rng = np.random.default_rng([int(seed), 17])
    order = rng.permutation(m)[:max_dev]
    return np.array_split(order, min(n_folds, len(order)))


def _fold_method(V, R, Qr, keep, choice, alpha, query_dirs, cov, chol, de):
    """AUTO over an index of the rows ``keep`` of ``R`` (``choice = (rho_d, rho_r, rounds, first
    share, decay)``), the DE first stage ``de`` and the prior over all rows ``Qr``; ``chol``: the
    packed Cholesky factor of ``cov`` (None: none), computed once by the caller."""
    rho_d, rho_r, rounds, first, decay = choice
    idx = AutoIndex(
        V,
        R[keep],
        rho_d=rho_d,
        rho_r=rho_r,
        rounds=rounds,
        first_share=first,
        decay=decay,
        row_vectors=Qr[keep],
        prior_alpha=alpha,
        query_dirs=query_dirs,
        item_cov=cov,
    )
    if chol is not None:
        idx._chol = chol
    return AUTO(idx, prior=Qr, first=de)


def _dev_recall(
    R, Qr, V, folds, choice, *, budgets, ks, seed, alpha, query_dirs, cov, rounds=(None,)
) -> list[float]:
    """Mean Top-k-Recall over ``budgets`` x ``ks`` of the rows of each fold, searched with an
    index of the other rows and ``choice = (rho_d, rho_r, rounds, first share, decay)``; one
    value per entry of ``rounds`` (None: the choice's rounds), each fold's index built once.
    ``cov``: the item covariance (the row prior's spread), its Cholesky factor packed once."""
    m = R.shape[0]
    scorer = MatrixScorer(R)
    de = make_retriever("de", item_vectors=V, query_vectors=Qr)
    chol = None if cov is None else packed_cholesky(cov)
    num = np.zeros(len(rounds))
    for f in folds:
        keep = np.setdiff1d(np.arange(m), f)
        meth = _fold_method(V, R, Qr, keep, choice, alpha, query_dirs, cov, chol, de)
        for j, r in enumerate(rounds):
            meth.set_rounds(r)
            recs = []
            for B in budgets:
                res = meth.search(scorer, f.tolist(), budget=B, k=max(ks), seed=seed)
                recs += [float(topk_recall(R, f, res.indices, k).mean()) for k in ks]
            num[j] += len(f) * float(np.mean(recs))
    return (num / sum(len(f) for f in folds)).tolist()


def _cv_grid(budgets, ks, N):
    budgets = [b for b in budgets if b <= N] or [N]
    ks = [k for k in ks if k <= min(budgets)] or [1]
    return budgets, ks


def rounds_curve(
    R,
    Qr,
    V,
    *,
    rho_d: float,
    rho_r: float,
    first_share: float | None,
    decay: float = 0.0,
    alpha: float = 0.0,
    query_dirs=None,
    budgets: Sequence[int] = CV_BUDGETS,
    ks: Sequence[int] = CV_KS,
    grid: Sequence[int] = ROUNDS_GRID,
    n_folds: int = 6,
    max_dev: int = 30,
    seed: int = 0,
) -> dict[int, float]:
    """``{rounds: cross-validated recall}`` over the m complete rows ``R`` (m >= 4; their DE
    vectors ``Qr``), the other choices fixed: the trade :func:`crossknn.search.round_plan.
    choose_rounds` makes against a round's cost. Rows of a fold are searched with an index of the
    other rows (their exact top-k is known: the rows are complete); the row prior is kept, the
    learned prior is not (it is fitted from these rows). Uses no CE call."""
    R = np.asarray(R, np.float32)
    Qr = np.asarray(Qr, np.float32)
    V = np.asarray(V, np.float32)
    m, N = R.shape
    if m < 4:
        raise ValueError(f"a rounds curve needs at least 4 complete rows; got {m}")
    budgets, ks = _cv_grid(budgets, ks, N)
    folds = _cv_folds(m, n_folds=n_folds, max_dev=max_dev, seed=seed)
    cov = item_covariance(V) if alpha > 0 else None
    rounds = [int(r) for r in sorted(set(grid)) if int(r) <= min(budgets)]
    dev = _dev_recall(
        R,
        Qr,
        V,
        folds,
        (rho_d, rho_r, max(rounds), first_share, decay),
        budgets=budgets,
        ks=ks,
        seed=seed,
        alpha=alpha,
        query_dirs=query_dirs,
        cov=cov,
        rounds=rounds,
    )
    return {r: round(v, 6) for r, v in zip(rounds, dev, strict=True)}


def _cross_validate(R, Qr, V, *, budgets, ks, n_folds, max_dev, seed, alpha=0.0, query_dirs=None):
    """((rho_D, rho_R, rounds, first share, decay), {key: mean dev recall}) by K-fold CV over the
    complete rows with the row prior's weight ``alpha`` (queries are addressed by their position
    among the rows; ties -> the earlier grid entry)."""
    m, N = R.shape
    budgets, ks = _cv_grid(budgets, ks, N)
    folds = _cv_folds(m, n_folds=n_folds, max_dev=max_dev, seed=seed)
    cov = item_covariance(V) if alpha > 0 else None  # the row prior's spread, once for all folds
    table: dict[str, float] = {}
    grid = [
        (d, r, n, s1, g)
        for g in GRID_DECAY
        for s1 in GRID_FIRST
        for n in GRID_ROUNDS
        for d in GRID_D
        for r in GRID_R
    ]
    for choice in grid:
        (table[",".join(str(x) for x in choice)],) = _dev_recall(
            R,
            Qr,
            V,
            folds,
            choice,
            budgets=budgets,
            ks=ks,
            seed=seed,
            alpha=alpha,
            query_dirs=query_dirs,
            cov=cov,
        )
    best = max(table, key=lambda key: round(table[key], 9))  # max keeps the first of equals
    d, r, n, f, g = best.split(",")
    return (float(d), float(r), int(n), None if f == "None" else float(f), float(g)), table
