"""Type stub of the C++ extension crossknn._core (use crossknn.core, which wraps it)."""

from collections.abc import Callable, Sequence
from typing import Any, TypedDict

import numpy as np
import numpy.typing as npt

def version() -> str: ...
def kernel_name() -> str: ...
def query_seed(seed: int, query_id: int) -> int: ...
def rows_dot(A: npt.ArrayLike, v: npt.ArrayLike) -> npt.NDArray[np.float64]: ...
def packed_lower_t_norm2(ap: npt.ArrayLike, v: npt.ArrayLike) -> float: ...

class RunSearchResult(TypedDict):
    scores: npt.NDArray[np.float32]  # (Q, k), padded with -inf
    indices: npt.NDArray[np.int64]  # (Q, k), padded with -1
    ce_calls: npt.NDArray[np.int64]  # (Q,)
    scored_items: list[npt.NDArray[np.int64]]  # per query, in scoring order
    scored_scores: list[npt.NDArray[np.float32]]
    stopped: npt.NDArray[np.int8]  # (Q,): 0 budget, 1 found (early stop), 2 allowed
    stop_chance: list[npt.NDArray[np.float64]]  # per query, one per step (NaN: none)

def run_search(
    features: Features,
    scorer: Callable[[npt.NDArray[np.int64], list[npt.NDArray[np.int64]]], Sequence[npt.ArrayLike]],
    plan: Sequence[tuple[str, int]],
    query_ids: Sequence[int],
    *,
    budget: int,
    k: int,
    strategy: str = "topk",
    temperature: float = 1.0,
    ridge: float = 0.0,
    refine: int = 3,
    jitter_rel: float = 1e-10,
    mix: float = 0.0,
    seed: int = 0,
    first_items: npt.NDArray[np.int64] | None = None,
    priors: npt.NDArray[np.float64] | None = None,
    score_alpha: float = 1.0,
    score_beta: float = 0.0,
    solve: str = "lstsq",  # "lstsq" | "targets" | "prior_ridge"
    inv_penalties: npt.NDArray[np.float64] | None = None,  # prior_ridge: d + 1 values 1/rho
    penalty_decay: float = 0.0,
    final_retrieved: bool = False,
    selector: Any = None,  # an object with ItemFeatures' top_k / sample_softmax
    first_features: Features | None = None,  # a dense first stage run by the loop
    first_queries: npt.NDArray[np.float32] | None = None,  # (Q, d) of first_features
    first_vmax: float = 0.0,  # an upper bound of max|first_features| (ItemFeatures._vmax)
    allow: npt.NDArray[np.uint64] | None = None,  # packed allow masks
    stop_threshold: float = 0.0,  # > 0: stop a query when its chance of a change is below it
    stop_trace: bool = False,  # record every step's chance (stop_chance)
) -> RunSearchResult: ...

class Features:
    """Item features V (N x d) in one storage type ("float32" | "float16" | "int8")."""

    def __init__(
        self, V: npt.NDArray[np.float32], *, storage: str = "float32", threads: int = 0
    ) -> None: ...
    @staticmethod
    def view(
        V: npt.NDArray[np.float32] | npt.NDArray[np.float16] | npt.NDArray[np.int8],
        *,
        scales: npt.NDArray[np.float32] | None = None,
        threads: int = 0,
        check_finite: bool = True,
    ) -> Features: ...
    @staticmethod
    def open_npy(
        path: str, *, threads: int = 0, scales_path: str = "", check_finite: bool = True
    ) -> Features: ...
    @property
    def is_view(self) -> bool: ...
    @property
    def n_items(self) -> int: ...
    @property
    def dim(self) -> int: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def storage(self) -> str: ...
    threads: int
    def rows(self, items: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]: ...
    def top_k(
        self,
        u: npt.NDArray[np.float32],
        k: int,
        exclude_ids: npt.NDArray[np.int64] | None = None,
        exclude_offsets: npt.NDArray[np.int64] | None = None,
    ) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]: ...
    def sample_softmax(
        self,
        u: npt.NDArray[np.float32],
        k: int,
        exclude_ids: npt.NDArray[np.int64] | None = None,
        exclude_offsets: npt.NDArray[np.int64] | None = None,
        temperature: float = 1.0,
        seed: int = 0,
    ) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]: ...
    def sample_random(
        self,
        n_queries: int,
        k: int,
        exclude_ids: npt.NDArray[np.int64] | None = None,
        exclude_offsets: npt.NDArray[np.int64] | None = None,
        seed: int = 0,
    ) -> npt.NDArray[np.int64]: ...

class LeastSquares:
    """Incremental least squares of one query over rows of a Features object."""

    def __init__(
        self, features: Features, *, ridge: float = 0.0, refine: int = 3, jitter_rel: float = 1e-10
    ) -> None: ...
    def append(self, items: npt.NDArray[np.int64], targets: npt.NDArray[np.float64]) -> None: ...
    def solve(self) -> npt.NDArray[np.float64]: ...
    def set_prior(self, prior: npt.NDArray[np.float64] | None, mix: float) -> None: ...
    @property
    def items(self) -> npt.NDArray[np.int64]: ...
    @property
    def targets(self) -> npt.NDArray[np.float64]: ...
    @property
    def size(self) -> int: ...
    @property
    def dim(self) -> int: ...
    @property
    def ridge(self) -> float: ...
    @property
    def primal(self) -> bool: ...
    @property
    def delta(self) -> float: ...

# crossknn/auto_index.h: auto's features and prior (crossknn.search.auto calls them)
def auto_features(
    V: npt.ArrayLike, R: npt.ArrayLike, A: npt.ArrayLike
) -> npt.NDArray[np.float32]: ...
def item_covariance(V: npt.ArrayLike) -> npt.NDArray[np.float64]: ...
def packed_cholesky(C: npt.ArrayLike) -> npt.NDArray[np.float64] | None: ...

class AutoPrior:
    """auto's prior of a query: [v, row prior, 0, 0] or the learned prior (kernel ridge)."""

    def __init__(
        self,
        d: int,
        m: int,
        r: int,
        *,
        W: npt.ArrayLike | None = None,
        deltas: npt.ArrayLike | None = None,
        alpha: float = 0.0,
        tau: float = 10.0,
        ridge: float = 0.0,
        kernel_tau: float = 2.0,
        cov: npt.ArrayLike | None = None,
        V: npt.ArrayLike | None = None,
        chol: npt.ArrayLike | None = None,
    ) -> None: ...
    @property
    def width(self) -> int: ...
    @property
    def uses_tables(self) -> bool: ...
    def prior(self, v: npt.ArrayLike) -> npt.NDArray[np.float64]: ...
    def spread(self, v: npt.ArrayLike) -> float: ...
    @property
    def covariance(self) -> npt.NDArray[np.float64]: ...
    @property
    def cholesky(self) -> npt.NDArray[np.float64] | None: ...

class IndexSearchResult(TypedDict):
    indices: npt.NDArray[np.int64]
    scores: npt.NDArray[np.float32]
    ce_calls: int
    allowed: int  # -1: every item
    seconds: float
    stopped: str

# crossknn/index.h + crossknn/searcher.h: the C++ search of an index folder
class IndexSearcher:
    def __init__(
        self,
        path: str,
        *,
        round_index: str = "auto",
        mix: float = 0.5,
        threads: int = 0,
        verify: bool = True,
    ) -> None: ...
    @property
    def n_items(self) -> int: ...
    @property
    def version(self) -> int: ...
    @property
    def n_removed(self) -> int: ...
    @property
    def ids(self) -> list[str]: ...
    @property
    def methods(self) -> list[str]: ...
    @property
    def default_method(self) -> str: ...
    def plan(self, method: str = "", budget: int = 100, rounds: int = 0) -> list[int]: ...
    def search(
        self,
        query_vector: npt.ArrayLike,
        scores: npt.ArrayLike | Callable[[npt.NDArray[np.int64]], npt.ArrayLike],
        *,
        k: int = 10,
        budget: int = 100,
        method: str = "",
        rounds: int = 0,
        seed: int = 0,
        query_id: int = 0,
        allow: npt.NDArray[np.bool_] | None = None,
        target_recall: float = 0.0,
    ) -> IndexSearchResult: ...
