"""One place that turns a method name and the resources at hand into a method object.

Used by the corpus :class:`crossknn.Searcher` and by the eval harness, as
:func:`crossknn.retrievers.make_retriever` is for first stages::

    method = make_method("adacur", cur=CurIndex(R), first=retriever, rounds=5)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from crossknn.score_map import ScoreMap
from crossknn.search.methods import ADACUR, ANNCUR, AXN, DEFAULT_MIX, RNR, CurIndex, RoundMethod

__all__ = ["METHODS", "make_method"]

#: method name -> (uses rounds, free parameter chosen on dev rows or None)
METHODS: dict[str, tuple[bool, str | None]] = {
    "rnr": (False, None),
    "anncur": (False, "split"),
    "adacur": (True, None),
    "adacur-split": (True, "split"),
    "adacur-softmax": (True, "temperature"),
    "adacur-random": (True, None),
    "axn": (True, None),
    "auto": (False, None),  # its rounds come from the index (chosen on train rows)
}


def make_method(
    name: str,
    *,
    first: Any = "random",
    rounds: int = 5,
    cur: CurIndex | None = None,
    item_vectors: Any = None,
    prior: Any = None,
    mix: float = DEFAULT_MIX,
    score_map: ScoreMap | None = None,
    split: float | None = 0.5,
    temperature: float = 1.0,
    ridge: float | None = None,
    final: str = "all",
    anchor_seed: int = 0,
    n_items: int | None = None,
    auto_index: Any = None,
) -> RoundMethod:
    """The method ``name`` (one of :data:`METHODS`) over the given resources.

    ``cur``: the dense CUR index (ANNCUR/ADACUR); ``item_vectors``: AXN's item features (N x d);
    ``prior``: AXN's prior query embeddings (callable or array by query row), mixed in with
    weight ``mix`` (ignored without a prior); ``split``: ANNCUR's and ``adacur-split``'s anchor
    share of the budget; ``ridge``: ``None`` keeps each method's default; ``auto_index``: the
    :class:`crossknn.search.auto.AutoIndex` of method ``auto`` (its prior: the DE query vectors).
    """
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}; expected one of {sorted(METHODS)}")
    ridge_kw = {} if ridge is None else {"ridge": float(ridge)}
    if name == "rnr":
        return RNR(first, n_items=n_items)
    if name == "auto":
        from crossknn.search.auto import AUTO

        if auto_index is None:
            raise ValueError("method 'auto' needs an auto index (crossknn.search.auto)")
        return AUTO(auto_index, prior=prior, first=first)
    if name in ("anncur",) or name.startswith("adacur"):
        if cur is None:
            raise ValueError(
                f"method {name!r} needs a CUR index (CE scores of train queries x all items)"
            )
        if name == "anncur":
            return ANNCUR(
                cur, split=split, first=first, anchor_seed=anchor_seed, final=final, **ridge_kw
            )
        strategy = {"adacur-softmax": "softmax", "adacur-random": "random"}.get(name, "topk")
        return ADACUR(
            cur,
            rounds=rounds,
            first=first,
            strategy=strategy,
            split=split if name == "adacur-split" else None,
            temperature=temperature,
            final=final,
            **ridge_kw,
        )
    # axn
    if item_vectors is None:
        raise ValueError("method 'axn' needs item vectors (e.g. the DE item vectors)")
    if prior is not None and isinstance(prior, np.ndarray) and prior.ndim != 2:
        raise ValueError(f"AXN prior query embeddings must be 2-D; got shape {prior.shape}")
    use_prior = prior is not None and mix > 0
    return AXN(
        item_vectors,
        rounds=rounds,
        first=first,
        prior=prior if use_prior else None,
        mix=mix if use_prior else 0.0,
        score_map=score_map,
        **ridge_kw,
    )
