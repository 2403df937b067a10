"""The one list of search methods: name, the index it needs, its online constructor, defaults.

Everything that names methods reads this registry: the CLI choices of ``search`` / ``eval`` /
``serve``, :class:`crossknn.Searcher`, :func:`crossknn.eval.evaluate`, the request schema of
``crossknn serve`` and its ``/info``. Adding a method is one file (its
:class:`crossknn.search.methods.RoundMethod` subclass) and one :class:`MethodSpec` entry in
:data:`REGISTRY` below (see docs/architecture.md).

The index a method needs (``MethodSpec.index``) is one of :data:`INDEXES`:

- ``none``: only what every corpus index / score matrix has (the DE item vectors and the first
  stage);
- ``vectors``: item vectors with the DE query vector as prior and a CE -> DE score map (AXN);
- ``cur``: the dense CUR rows ``R`` (CE scores of train queries x all items);
- ``auto``: the auto index (at most C train CE entries, ``crossknn.search.auto``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from crossknn.core import ItemFeatures
from crossknn.retrievers import DenseRetriever
from crossknn.score_map import ScoreMap
from crossknn.search.auto import AUTO
from crossknn.search.gar import DEFAULT_BATCH, GAR
from crossknn.search.graph import graph_for
from crossknn.search.methods import (
    ADACUR,
    ANNCUR,
    AXN,
    DEFAULT_MIX,
    DEFAULT_RIDGE,
    RNR,
    CurIndex,
    RoundMethod,
)

__all__ = [
    "INDEXES",
    "INDEX_NAMES",
    "REGISTRY",
    "MethodSpec",
    "Resources",
    "available",
    "check_available",
    "get",
    "names",
]

#: index kind -> how ``crossknn build`` (corpus indexes) and ``crossknn eval`` (score matrices)
#: make it
INDEXES: dict[str, str] = {
    "none": "every index has it (DE item vectors)",
    "vectors": "every index has it (DE item vectors; the score map is fitted at build/eval)",
    "cur": "build: crossknn build CORPUS INDEX_DIR --train-queries FILE --cur; "
    "eval: every train row of the matrix",
    "auto": "build: crossknn build CORPUS INDEX_DIR --index-calls C; "
    "eval: --index-calls C (default 10% of |train| x N)",
}


#: index kind -> what it is, in refusals
INDEX_NAMES: dict[str, str] = {
    "none": "nothing beyond the DE item vectors",
    "vectors": "item vectors",
    "cur": "a CUR index (CE scores of train queries x all items)",
    "auto": "an auto index (complete train CE rows read within C calls)",
}


@dataclass
class Resources:
    """What a method's constructor may use (the caller fills what it has; see ``MethodSpec``).

    ``first``: ``"random"`` or a first-stage retriever; ``cur``: the :class:`CurIndex`;
    ``item_vectors``: item features of the rounds (an ``ItemFeatures`` or an N x d array);
    ``prior``: DE query vectors (callable or array by query row); ``score_map``: CE -> DE scale;
    ``auto_index``: the :class:`crossknn.search.auto.AutoIndex`; ``ridge``/``split``/
    ``temperature``: ``None`` keeps the entry's default."""

    first: Any = "random"
    rounds: int | None = None
    cur: CurIndex | None = None
    item_vectors: Any = None
    prior: Any = None
    mix: float = DEFAULT_MIX
    score_map: ScoreMap | None = None
    split: float | None = None
    temperature: float | None = None
    ridge: float | None = None
    final: str = "all"
    anchor_seed: int = 0
    n_items: int | None = None
    auto_index: Any = None
    graph: Any = None  # GAR's corpus graph (N x k); None: built from the DE item vectors

    def get(self, name: str, defaults: Mapping[str, Any]) -> Any:
        value = getattr(self, name)
        return defaults.get(name) if value is None else value


@dataclass(frozen=True)
class MethodSpec:
    """One method: ``make(resources, spec)`` returns its online object (its plan is the object's
    ``plan(budget)``); ``index``: a key of :data:`INDEXES`; ``rounds``: whether ``--rounds``
    applies; ``dev_param``: the free parameter ``eval`` chooses on dev rows (or None);
    ``first``: a fixed first stage (``"de"``) or None (the caller's ``--first``)."""

    name: str
    summary: str
    index: str
    make: Callable[[Resources, MethodSpec], RoundMethod]
    rounds: bool = False
    dev_param: str | None = None
    first: str | None = None
    defaults: Mapping[str, Any] = field(default_factory=dict)

    def build(self, resources: Resources) -> RoundMethod:
        return self.make(resources, self)


def _need(value, what: str, spec: MethodSpec):
    if value is None:
        raise ValueError(f"method {spec.name!r} needs {what}; {INDEXES[spec.index]}")
    return value


def _rnr(r: Resources, spec: MethodSpec) -> RoundMethod:
    return RNR(r.first, n_items=r.n_items)


def _anncur(r: Resources, spec: MethodSpec) -> RoundMethod:
    d = spec.defaults
    return ANNCUR(
        _need(r.cur, "a CUR index (CE scores of train queries x all items)", spec),
        split=r.get("split", d),
        first=r.first,
        anchor_seed=r.anchor_seed,
        ridge=r.get("ridge", d),
        final=r.final,
    )


def _adacur(r: Resources, spec: MethodSpec) -> RoundMethod:
    d = spec.defaults
    return ADACUR(
        _need(r.cur, "a CUR index (CE scores of train queries x all items)", spec),
        rounds=r.get("rounds", d),
        first=r.first,
        strategy=d["strategy"],
        split=r.get("split", d) if d.get("split") is not None else None,
        temperature=r.get("temperature", d),
        ridge=r.get("ridge", d),
        final=r.final,
    )


def _axn(r: Resources, spec: MethodSpec) -> RoundMethod:
    V = _need(r.item_vectors, "item vectors (e.g. the DE item vectors)", spec)
    prior = r.prior
    if prior is not None and isinstance(prior, np.ndarray) and prior.ndim != 2:
        raise ValueError(f"AXN prior query embeddings must be 2-D; got shape {prior.shape}")
    use_prior = prior is not None and r.mix > 0
    return AXN(
        V,
        rounds=r.get("rounds", spec.defaults),
        first=r.first,
        prior=prior if use_prior else None,
        mix=r.mix if use_prior else 0.0,
        score_map=r.score_map,
        ridge=r.get("ridge", spec.defaults),
    )


def _auto(r: Resources, spec: MethodSpec) -> RoundMethod:
    index = _need(r.auto_index, "an auto index (crossknn.search.auto)", spec)
    # rounds None: chosen by the method (the index's, or under a latency target: round_plan)
    return AUTO(index, prior=r.prior, first=r.first, rounds=r.rounds)


def _de_item_vectors(r: Resources, spec: MethodSpec) -> np.ndarray:
    """The DE item vectors at hand: the DE first stage's, else ``item_vectors``."""
    first = r.first.features if isinstance(r.first, DenseRetriever) else None
    for feats in (first, r.item_vectors):
        if isinstance(feats, np.ndarray) and feats.ndim == 2:
            return feats
        if type(feats) is ItemFeatures:
            return feats._f.rows(np.arange(feats.n_items, dtype=np.int64)).astype(np.float32)
    raise ValueError(
        f"method {spec.name!r} needs its corpus graph or the DE item vectors to build it from "
        "(a DE first stage, --first de); crossknn build writes the graph into a corpus index"
    )


def _gar(r: Resources, spec: MethodSpec) -> RoundMethod:
    # the corpus graph: the index's, else built from the DE item vectors on first use (in memory)
    d = spec.defaults
    graph = r.graph if r.graph is not None else graph_for(_de_item_vectors(r, spec), d["k"])
    return GAR(graph, first=r.first, batch_size=d["batch_size"], n_items=r.n_items)


_CUR = {"ridge": DEFAULT_RIDGE, "rounds": 5, "temperature": 1.0, "split": None}

#: every method, by name (the order is the one help texts and ``/info`` show)
REGISTRY: dict[str, MethodSpec] = {
    s.name: s
    for s in (
        MethodSpec(
            "auto",
            "hybrid-feature rounds over [DE items | train CE rows | 1], ridge pulled to the DE "
            "query vector; rounds and penalties chosen on train rows (the default)",
            "auto",
            _auto,
            rounds=True,
            first="de",
            defaults={"rounds": None},
        ),
        MethodSpec(
            "axn",
            "rounds over the DE item vectors, least squares mixed with the DE query vector",
            "vectors",
            _axn,
            rounds=True,
            defaults={"rounds": 5, "ridge": 0.0},
        ),
        MethodSpec("rnr", "rerank the first stage's top-B items", "none", _rnr),
        MethodSpec(
            "gar",
            "GAR: batches of b alternating the first stage's ranking and the corpus-graph "
            "neighbours (DE k-NN) of the best items scored",
            "none",
            _gar,
            defaults={"batch_size": DEFAULT_BATCH, "k": 16},
        ),
        MethodSpec(
            "adacur",
            "ADACUR: adaptive anchors over rounds (TopK), all B calls in the rounds",
            "cur",
            _adacur,
            rounds=True,
            defaults={**_CUR, "strategy": "topk"},
        ),
        MethodSpec(
            "adacur-split",
            "ADACUR with a split: rounds on split x B calls, then the top approximate items",
            "cur",
            _adacur,
            rounds=True,
            dev_param="split",
            defaults={**_CUR, "strategy": "topk", "split": 0.5},
        ),
        MethodSpec(
            "adacur-softmax",
            "ADACUR, rounds sampled from softmax(approx / T)",
            "cur",
            _adacur,
            rounds=True,
            dev_param="temperature",
            defaults={**_CUR, "strategy": "softmax"},
        ),
        MethodSpec(
            "adacur-random",
            "ADACUR, uniform random rounds",
            "cur",
            _adacur,
            rounds=True,
            defaults={**_CUR, "strategy": "random"},
        ),
        MethodSpec(
            "anncur",
            "ANNCUR: split x B fixed anchors, then the top approximate items",
            "cur",
            _anncur,
            dev_param="split",
            defaults={"split": 0.5, "ridge": DEFAULT_RIDGE},
        ),
    )
}


def names() -> tuple[str, ...]:
    return tuple(REGISTRY)


def get(name: str) -> MethodSpec:
    """The entry of ``name``; unknown names are refused naming every known one."""
    spec = REGISTRY.get(name)
    if spec is None:
        raise ValueError(f"unknown method {name!r}; expected one of {list(REGISTRY)}")
    return spec


def available(indexes: Iterable[str]) -> list[str]:
    """The methods an index holding ``indexes`` (kinds; ``none`` and ``vectors`` are implied)
    can run."""
    have = {"none", "vectors", *indexes}
    return [n for n, s in REGISTRY.items() if s.index in have]


def check_available(name: str, indexes: Iterable[str], *, where: str = "this index") -> MethodSpec:
    """The entry of ``name`` when ``where`` holds what it needs; else a one-line refusal with
    how to make that index."""
    spec = get(name)
    if spec.index not in {"none", "vectors", *indexes}:
        raise ValueError(
            f"method {name!r} needs {INDEX_NAMES[spec.index]}, which {where} does not hold; "
            f"{INDEXES[spec.index]}"
        )
    return spec
