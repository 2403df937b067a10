"""One call that turns a method name and the resources at hand into a method object.

A thin front of :mod:`crossknn.search.registry` (the one list of methods), as
:func:`crossknn.retrievers.make_retriever` is for first stages::

    method = make_method("adacur", cur=CurIndex(R), first=retriever, rounds=5)
"""

from __future__ import annotations

from typing import Any

from crossknn.score_map import ScoreMap
from crossknn.search.methods import DEFAULT_MIX, CurIndex, RoundMethod
from crossknn.search.registry import Resources, get, names

__all__ = ["METHODS", "make_method"]

#: the method names, in the registry's order (read from crossknn.search.registry)
METHODS: tuple[str, ...] = names()


def make_method(
    name: str,
    *,
    first: Any = "random",
    rounds: int | None = None,
    cur: CurIndex | None = None,
    item_vectors: Any = None,
    prior: Any = None,
    mix: float = DEFAULT_MIX,
    score_map: ScoreMap | None = None,
    split: float | None = None,
    temperature: float | None = None,
    ridge: float | None = None,
    final: str = "all",
    anchor_seed: int = 0,
    n_items: int | None = None,
    auto_index: Any = None,
) -> RoundMethod:
    """The method ``name`` (a key of :data:`crossknn.search.registry.REGISTRY`) over the given
    resources (:class:`crossknn.search.registry.Resources`; ``None`` keeps the entry's default).

    ``cur``: the dense CUR index (ANNCUR/ADACUR); ``item_vectors``: AXN's item features (N x d);
    ``prior``: DE query vectors (callable or array by query row), AXN's mixed in with weight
    ``mix`` (ignored without a prior); ``split``: ANNCUR's and ``adacur-split``'s anchor share
    of the budget; ``auto_index``: the :class:`crossknn.search.auto.AutoIndex` of ``auto``.
    """
    spec = get(name)
    return spec.build(
        Resources(
            first=first,
            rounds=rounds,
            cur=cur,
            item_vectors=item_vectors,
            prior=prior,
            mix=mix,
            score_map=score_map,
            split=split,
            temperature=temperature,
            ridge=ridge,
            final=final,
            anchor_seed=anchor_seed,
            n_items=n_items,
            auto_index=auto_index,
        )
    )
