"""Search methods: small objects that say which items to score; the loop is the C++ core's
(``crossknn.search.engine.search_rounds``).

- :class:`RNR` — retrieve-and-rerank: score the first stage's top-B items.
- :class:`ANNCUR` — CUR index with ``k_i`` anchor items, then the top ``B - k_i`` approximate items.
- :class:`ADACUR` — adaptive anchors over rounds (TopK / SoftMax / Random), Split or No-Split.
- :class:`AXN` — rounds over item embeddings ``V`` with the least-squares query embedding, optional
  mix with a dual-encoder query vector.

Every method is used the same way::

    result = method.search(scorer, queries, budget=100, k=10, seed=0)
    scores, indices = result            # (Q, k) each; result.ce_calls <= budget

Two improvements over the papers are on by default: items already scored (anchors, earlier
rounds) take part in the final ranking (``final="all"``; ``final="retrieved"`` reproduces the
papers' split variants, which rerank only the retrieved items), and split fractions are meant to
be chosen on held-out train queries (:func:`crossknn.search.tuning.choose_on_dev`).
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from crossknn.core import ItemFeatures
from crossknn.retrievers import DenseRetriever
from crossknn.score_map import ScoreMap
from crossknn.search.engine import search_rounds
from crossknn.search.rounds import SearchResult, Step, split_sizes

__all__ = ["ADACUR", "ANNCUR", "AXN", "DEFAULT_MIX", "RNR", "CurIndex", "RoundMethod"]

DEFAULT_RCOND = 1e-6
# Ridge of the least squares of CUR methods (ANNCUR's E, ADACUR's query weights). CE scores of one
# model are strongly correlated across queries (R has one dominant singular value), so R[:, A] is
# badly conditioned once |A| nears k_q; a small ridge keeps the solution stable. 0 = the papers'
# plain pseudo-inverse.
DEFAULT_RIDGE = 1e-2  # chosen on dev rows of the cisi-minilm train split (docs/methods.md)
# AXN's lambda (mix of the least-squares query embedding with the DE query vector): 0.5 was chosen
# on the train rows of cisi-minilm (docs/methods.md); it is a property of the CE/DE pair.
DEFAULT_MIX = 0.5


@dataclass
class CurIndex:
    """Dense CUR index: ``R`` (k_q x N), CE scores of anchor (train) queries against all items.

    ``item_features()`` is the ADACUR feature matrix ``Rᵀ`` (N x k_q). ``anncur_embedding(anchors)``
    is ANNCUR's ``E = pinv(R[:, anchors]) R``, computed offline in float64 as the ridge solution
    ``(CᵀC + ridge I)⁻¹ Cᵀ R`` (``C = R[:, anchors]``, default ``ridge`` = ``DEFAULT_RIDGE``), or
    with ``ridge=0`` as ``np.linalg.pinv(C, rcond) R`` (singular values below ``rcond * s_max``
    dropped).
    """

    R: np.ndarray
    rows: np.ndarray | None = None  # the score-matrix rows R came from (for bookkeeping)
    storage: str = "float32"
    _features: ItemFeatures | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        R = np.asarray(self.R)
        if R.ndim != 2 or 0 in R.shape:
            raise ValueError(
                "a CUR index needs a non-empty (anchor queries x items) matrix; "
                f"got shape {R.shape}"
            )
        if not np.all(np.isfinite(R)):
            raise ValueError("the CUR index matrix contains NaN or inf scores")
        self.R = np.ascontiguousarray(R, np.float32)

    @classmethod
    def from_matrix(cls, scores, rows, *, test_rows=None, storage: str = "float32") -> CurIndex:
        """Index from the given rows of a score matrix; refuses rows that are test rows."""
        scores = np.asarray(scores)
        rows = np.asarray(rows, np.int64).ravel()
        if rows.size == 0:
            raise ValueError("a CUR index needs at least one anchor (train) query row")
        if rows.min() < 0 or rows.max() >= scores.shape[0]:
            raise ValueError(f"anchor query rows out of range for {scores.shape[0]} rows")
        if test_rows is not None:
            bad = np.intersect1d(rows, np.asarray(test_rows, np.int64))
            if bad.size:
                raise ValueError(
                    f"anchor queries must come from train rows; rows {bad[:5].tolist()} "
                    "are test rows"
                )
        return cls(scores[rows], rows=rows, storage=storage)

    @property
    def n_items(self) -> int:
        return self.R.shape[1]

    @property
    def n_anchor_queries(self) -> int:
        return self.R.shape[0]

    @property
    def score_scale(self) -> float:
        """Typical spread of one query's CE scores (mean over anchor queries of the row std)."""
        s = float(self.R.std(axis=1).mean())
        return s if s > 0 else 1.0

    def item_features(self) -> ItemFeatures:
        if self._features is None:
            self._features = ItemFeatures(self.R.T, storage=self.storage)
        return self._features

    def anncur_embedding(
        self, anchors, *, ridge: float = DEFAULT_RIDGE, rcond: float = DEFAULT_RCOND
    ) -> np.ndarray:
        """``E`` (k_i x N) in float64: ``(CᵀC + ridge I)⁻¹ Cᵀ R`` with ``C = R[:, anchors]``
        when ``ridge > 0`` (computed through the smaller of the two Gram matrices), else
        ``pinv(C, rcond) R``."""
        anchors = np.asarray(anchors, np.int64).ravel()
        if anchors.size == 0:
            raise ValueError("ANNCUR needs at least one anchor item")
        C = self.R[:, anchors].astype(np.float64)  # (k_q, k_i)
        k_q, k_i = C.shape
        if ridge > 0:  # W = (CᵀC + ridge I)⁻¹ Cᵀ = Cᵀ (CCᵀ + ridge I)⁻¹, the smaller solve
            if k_i <= k_q:
                W = np.linalg.solve(C.T @ C + ridge * np.eye(k_i), C.T)
            else:
                W = C.T @ np.linalg.inv(C @ C.T + ridge * np.eye(k_q))
        else:
            W = np.linalg.pinv(C, rcond=rcond)
        E = np.empty((k_i, self.n_items), np.float64)
        block = 1 << 16  # columns at a time: R is never copied whole to float64
        for lo in range(0, self.n_items, block):
            E[:, lo : lo + block] = W @ self.R[:, lo : lo + block].astype(np.float64)
        return E


def _first_spec(first):
    if isinstance(first, str):
        if first != "random":
            raise ValueError(
                f"first must be 'random' or a retriever object (see crossknn.retrievers); got "
                f"{first!r} — build named retrievers with crossknn.retrievers.make_retriever"
            )
        return first
    if not hasattr(first, "retrieve"):
        raise TypeError(f"first must be 'random' or a retriever; got {type(first).__name__}")
    return first


class RoundMethod:
    """Base of all methods. Subclasses set the plan and the features; the loop is shared."""

    name = "method"
    strategy = "topk"  # how 'round' steps choose items: topk | softmax | random
    ridge = 0.0
    mix = 0.0
    temperature = 1.0
    final = "all"  # 'all': rank every scored item; 'retrieved': only the retrieve step (papers)
    # how the loop solves a query's embedding u (crossknn/search.h Solve): 'lstsq' (the least
    # squares, mixed with the prior by `mix`), 'targets' (u = the scores, ANNCUR's fixed anchors)
    # or 'prior_ridge' (auto's ridge pulled to the DE prior; prior_ridge_penalties())
    solve = "lstsq"

    def __init__(self, *, first="random", n_items: int | None = None) -> None:
        self.first = _first_spec(first)
        self.n_items = n_items
        self.features: ItemFeatures | None = None
        self._random_features: ItemFeatures | None = None

    def __repr__(self) -> str:
        first = self.first if isinstance(self.first, str) else type(self.first).__name__
        return f"{type(self).__name__}(first={first!r}, n_items={self.n_items})"

    # ---- hooks -------------------------------------------------------------------------------
    def plan(self, budget: int) -> list[Step]:
        """The steps for one query at this budget (no side effects: methods are shared)."""
        raise NotImplementedError

    def features_for(self, budget: int) -> ItemFeatures | None:
        """The item features the rounds use at this budget (default: the method's own)."""
        return self.features

    def prepare(self, budget: int) -> list[str]:
        """Build now what the core keeps in memory for this method's rounds, instead of on the
        second search (a server's load): the item Gram cache of least-squares rounds
        (crossknn/features.h, ``ItemFeatures.prepare_gram``). Returns the names of what is
        ready; results never depend on it."""
        feats = self.features_for(budget)
        if self.solve != "lstsq" or feats is None:
            return []
        return ["gram"] if feats.prepare_gram() else []

    def priors(self, queries: Sequence) -> list[np.ndarray | None]:
        return [None] * len(queries)

    def score_normalization(self) -> tuple[float, float]:
        """``(alpha, beta)``: the solves fit ``(score - beta) / alpha`` (AXN's score map)."""
        return 1.0, 0.0

    def transform_targets(self, scores: np.ndarray) -> np.ndarray:
        alpha, beta = self.score_normalization()
        if (alpha, beta) == (1.0, 0.0):
            return scores
        return (np.asarray(scores, np.float64) - beta) / alpha

    def random_features(self) -> ItemFeatures:
        """Features to draw uniform random items from: the method's own, or N x 1 zeros."""
        if self.features is not None:
            return self.features
        if self._random_features is None:
            self._random_features = ItemFeatures(np.zeros((self.n_items, 1), np.float32))
        return self._random_features

    def first_items(
        self, queries: Sequence, n: int, seeds: Sequence[int], *, allow=None
    ) -> list[np.ndarray]:
        """The first step's ``n`` items of each query; ``allow`` (None, or one boolean array
        (N,) or None per query): chosen among the items each query's mask allows."""
        masks = [None] * len(queries) if allow is None else list(allow)
        if isinstance(self.first, str):  # uniform random
            feats = self.random_features()
            return [
                feats.sample_random(n, seed=s, allow=a) for s, a in zip(seeds, masks, strict=True)
            ]
        kw = {} if allow is None else {"allow": masks}
        if allow is not None and "allow" not in inspect.signature(self.first.retrieve).parameters:
            raise TypeError(
                f"the first-stage retriever {type(self.first).__name__} cannot search within a "
                "subset: its retrieve(queries, k) takes no allow= masks (crossknn.retrievers."
                "Retriever); give it one to use filters or removed items with it"
            )
        top = np.asarray(self.first.retrieve(list(queries), n, **kw), np.int64)
        if top.shape != (len(queries), n):
            raise ValueError(
                f"the first-stage retriever returned {top.shape}; expected ({len(queries)}, {n})"
            )
        return list(top)

    def core_first_stage(self, queries: Sequence) -> dict | None:
        """The ``_core.run_search`` arguments of a dense first stage when the first step is a
        DE's top items (a :class:`crossknn.retrievers.DenseRetriever` as ``first``,
        :meth:`first_items` not overridden): the C++ loop then takes them itself, the same
        items as :meth:`first_items`. ``None`` otherwise (the items come from
        :meth:`first_items`)."""
        if type(self).first_items is not RoundMethod.first_items:
            return None
        return self._dense_first(queries)

    def _dense_first(self, queries: Sequence) -> dict | None:
        first = self.first
        if not isinstance(first, DenseRetriever) or type(first).retrieve is not (
            DenseRetriever.retrieve
        ):
            return None
        return first.loop_first_stage(queries)

    def core_draws_first(self) -> bool:
        """Whether the C++ loop draws the first items itself: uniform random (``first`` is a
        string) and :meth:`first_items` not overridden."""
        return isinstance(self.first, str) and type(self).first_items is RoundMethod.first_items

    # ---- public ------------------------------------------------------------------------------
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
        """Top-k items per query by exact CE score, spending at most ``budget`` CE calls each.
        ``allow``: the items each query may be given (a boolean array (N,) for every query, or
        one per query, None for every item; :func:`crossknn.search.engine.search_rounds`)."""
        return search_rounds(
            self, scorer, queries, budget=budget, k=k, seed=seed, query_ids=query_ids, allow=allow
        )


def _n_anchors(split: float, budget: int) -> int:
    if not 0.0 < split <= 1.0:
        raise ValueError(
            f"split (fraction of the budget for anchor items) must be in (0, 1]; got {split}"
        )
    return int(min(budget, max(1, round(split * budget))))


class RNR(RoundMethod):
    """Retrieve-and-rerank: the first stage's top-B items, reranked by the CE."""

    name = "rnr"

    def __init__(self, first, *, n_items: int | None = None) -> None:
        if n_items is None:
            n_items = getattr(first, "n_items", None)
        if n_items is None or n_items <= 0:
            raise ValueError(f"RNR needs a non-empty item set; got n_items={n_items}")
        super().__init__(first=first, n_items=n_items)

    def plan(self, budget):
        return [Step("first", budget)]


class ANNCUR(RoundMethod):
    """ANNCUR: ``k_i = split * B`` anchor items scored, then the top ``B - k_i`` approximate items.

    With ``first="random"`` the anchors are fixed for the index (uniform random, ``anchor_seed``)
    and the approximation uses the precomputed item embedding ``E = pinv(R[:, anchors]) R``
    (features ``Eᵀ``; the least squares on the anchors then returns exactly the anchors' CE
    scores, so ``approx = e_q E``). With a retriever as ``first`` the anchors are that query's top
    retrieved items, and ``E`` is per query, which is the least squares over ``Rᵀ``.
    """

    name = "anncur"

    def __init__(
        self,
        index: CurIndex,
        *,
        split: float = 0.5,
        first="random",
        anchor_seed: int = 0,
        ridge: float = DEFAULT_RIDGE,
        rcond: float = DEFAULT_RCOND,
        final: str = "all",
    ) -> None:
        super().__init__(first=first, n_items=index.n_items)
        self.index, self.split, self.anchor_seed, self.rcond = index, split, anchor_seed, rcond
        if ridge < 0:
            raise ValueError(f"ridge must be >= 0; got {ridge}")
        self.ridge = float(ridge)
        self.final = _check_final(final)
        self._anncur_cache: dict[int, tuple[np.ndarray, ItemFeatures]] = {}
        self._under_masks = False  # for_masks()
        _n_anchors(split, 1)

    def anchors(self, n: int) -> tuple[np.ndarray, ItemFeatures]:
        """The fixed anchor items for ``n`` anchors and the features ``Eᵀ``."""
        if n not in self._anncur_cache:
            anchors = np.sort(self.index.item_features().sample_random(n, seed=self.anchor_seed))
            E = self.index.anncur_embedding(anchors, ridge=self.ridge, rcond=self.rcond)
            self._anncur_cache[n] = (anchors, ItemFeatures(E.T, storage=self.index.storage))
        return self._anncur_cache[n]

    def plan(self, budget):
        k_i = _n_anchors(self.split, budget)
        steps = [Step("first", k_i)]
        if budget > k_i:
            steps.append(Step("retrieve", budget - k_i))
        return steps

    def first_items(self, queries, n, seeds, *, allow=None):
        if isinstance(self.first, str):  # the first step scores exactly the k_i fixed anchors
            anchors = self.anchors(n)[0]
            if allow is None:
                return [anchors] * len(queries)
            # under masks: the allowed anchors, topped up with random allowed items
            out = []
            for s, a in zip(seeds, allow, strict=True):
                keep = anchors if a is None else anchors[a[anchors]]
                if keep.size < n:
                    fill = self.index.item_features().sample_random(
                        n - keep.size, seed=s, exclude=keep, allow=a
                    )
                    keep = np.concatenate([keep, fill])
                out.append(keep)
            return out
        return super().first_items(queries, n, seeds, allow=allow)

    def core_first_stage(self, queries):  # a retriever as first: RoundMethod.first_items
        return None if isinstance(self.first, str) else self._dense_first(queries)

    def for_masks(self) -> ANNCUR:
        """The method for a batch with allow masks: with fixed anchors, a query whose mask
        excludes some anchors cannot use the precomputed ``E``; every query then solves by least
        squares over ``Rᵀ`` on its allowed anchors (topped up with random allowed items), which
        is ANNCUR's per-query ``E`` (as with a retriever as ``first``)."""
        if not isinstance(self.first, str) or self._under_masks:
            return self
        twin = copy.copy(self)
        twin._under_masks = True
        return twin

    def features_for(self, budget):
        if isinstance(self.first, str) and not self._under_masks:
            return self.anchors(_n_anchors(self.split, budget))[1]  # Eᵀ for k_i fixed anchors
        return self.index.item_features()

    @property
    def solve(self) -> str:  # fixed anchors: u = e_q (the anchors' CE scores), features Eᵀ
        return "targets" if isinstance(self.first, str) and not self._under_masks else "lstsq"


def _check_final(final: str) -> str:
    if final not in ("all", "retrieved"):
        raise ValueError(f"final must be 'all' or 'retrieved'; got {final!r}")
    return final


def _check_strategy(strategy: str) -> str:
    if strategy not in ("topk", "softmax", "random"):
        raise ValueError(f"strategy must be 'topk', 'softmax' or 'random'; got {strategy!r}")
    return strategy


def _round_plan(n_rounds_budget: int, rounds: int, retrieve: int) -> list[Step]:
    sizes = split_sizes(n_rounds_budget, min(rounds, n_rounds_budget))
    steps = [Step("first", sizes[0])] + [Step("round", s) for s in sizes[1:]]
    if retrieve > 0:
        steps.append(Step("retrieve", retrieve))
    return steps


class ADACUR(RoundMethod):
    """ADACUR over a dense CUR index (item features ``Rᵀ``, min-norm least squares).

    ``split=None`` is No-Split (all B calls in ``rounds`` rounds, top-k of the scored items);
    ``split=f`` spends ``k_i = f * B`` calls in the rounds, then retrieves ``B - k_i`` top
    approximate items. ``strategy``: topk | softmax | random for rounds 2.. (round 1 is
    ``first``). SoftMax samples with probabilities ~ exp(approx / T), ``T = temperature *
    index.score_scale`` (temperature in units of a query's CE score spread).
    """

    name = "adacur"

    def __init__(
        self,
        index: CurIndex,
        *,
        rounds: int = 5,
        split: float | None = None,
        strategy: str = "topk",
        first="random",
        temperature: float = 1.0,
        ridge: float = DEFAULT_RIDGE,
        final: str = "all",
    ) -> None:
        super().__init__(first=first, n_items=index.n_items)
        if int(rounds) < 1:
            raise ValueError(f"rounds must be >= 1; got {rounds}")
        if split is not None:
            _n_anchors(split, 1)
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0; got {temperature}")
        self.index, self.rounds, self.split = index, int(rounds), split
        self.strategy = _check_strategy(strategy)
        self.temperature = float(temperature) * index.score_scale
        if ridge < 0:
            raise ValueError(f"ridge must be >= 0; got {ridge}")
        self.ridge = float(ridge)
        self.final = _check_final(final)
        self.features = index.item_features()

    def plan(self, budget):
        if self.rounds > budget:
            raise ValueError(f"rounds={self.rounds} exceeds the budget B={budget}")
        if self.split is None:
            return _round_plan(budget, self.rounds, 0)
        k_i = _n_anchors(self.split, budget)
        return _round_plan(k_i, self.rounds, budget - k_i)


class AXN(RoundMethod):
    """AXN: rounds over item embeddings ``V`` (N x d), query embedding by least squares.

    ``prior``: the parametric query embedding (e.g. the DE query vector): a callable
    ``query -> (d,) vector`` or an array indexed by query row; mixed in as
    ``u = (1 - mix) u_lstsq + mix u_prior``. ``score_map`` (a :class:`crossknn.score_map.ScoreMap`,
    ``ce ≈ scale * approx + offset``) maps CE scores to the scale of ``V``'s inner products before
    the least squares, AXN's CE score normalization; fit it on train rows.
    """

    name = "axn"

    def __init__(
        self,
        V,
        *,
        rounds: int = 5,
        first="random",
        prior=None,
        mix: float = 0.0,
        ridge: float = 0.0,
        score_map: ScoreMap | None = None,
        storage: str = "float32",
    ) -> None:
        features = V if isinstance(V, ItemFeatures) else ItemFeatures(V, storage=storage)
        super().__init__(first=first, n_items=features.n_items)
        self.features = features
        if int(rounds) < 1:
            raise ValueError(f"rounds must be >= 1; got {rounds}")
        if not 0.0 <= mix <= 1.0:
            raise ValueError(f"mix (lambda) must be in [0, 1]; got {mix}")
        if mix > 0 and prior is None:
            raise ValueError("mix > 0 needs a prior (the DE query embedding)")
        self.rounds, self.mix, self.ridge = int(rounds), float(mix), float(ridge)
        self.prior = prior
        if score_map is not None and not isinstance(score_map, ScoreMap):
            raise TypeError(f"score_map must be a ScoreMap or None; got {type(score_map).__name__}")
        self.score_map = score_map

    def plan(self, budget):
        if self.rounds > budget:
            raise ValueError(f"rounds={self.rounds} exceeds the budget B={budget}")
        return _round_plan(budget, self.rounds, 0)

    def priors(self, queries):
        if self.prior is None or self.mix == 0:
            return [None] * len(queries)
        out = []
        for q in queries:
            v = self.prior(q) if callable(self.prior) else np.asarray(self.prior)[int(q)]
            v = np.asarray(v, np.float64).ravel()
            if v.shape != (self.features.dim,):
                raise ValueError(
                    f"prior query vector must have shape ({self.features.dim},); got {v.shape}"
                )
            out.append(v)
        return out

    def score_normalization(self):
        if self.score_map is None:
            return 1.0, 0.0
        return float(self.score_map.scale), float(self.score_map.offset)
