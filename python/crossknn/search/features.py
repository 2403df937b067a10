"""The item features a :class:`crossknn.searcher.Searcher` gives its rounds: the index's vectors
exact, behind the index folder's round index (:mod:`crossknn.search.round_index`), or sharded over
Ray actors (:mod:`crossknn.search.shards`)."""

from __future__ import annotations

import numpy as np

from crossknn.core import ItemFeatures
from crossknn.search.round_index import WIDTH_NAME, _check_kind, open_round_features
from crossknn.search.shards import ShardedFeatures

__all__ = ["search_features"]


def search_features(
    index, V: np.ndarray, *, round_index: str = "auto", shards: int = 0, ray_address=None
) -> ItemFeatures:
    """The features a :class:`crossknn.searcher.Searcher` gives its rounds: ``V`` exact, behind
    the index folder's round index, or (``shards`` > 0) sharded over Ray actors at
    ``ray_address`` (each actor building the stored kind of round index over its shard)."""
    features = ItemFeatures(V)
    where = f"index {index.path}"
    if not shards:
        if ray_address:
            raise ValueError("--ray-address needs --shards S (the number of item shards)")
        return open_round_features(index.arrays, index.params, features, round_index, where=where)
    # ray: optional (ray extra), slow to import
    import ray

    meta = index.params.get("round_index") or {"kind": "exact"}
    kind = meta.get("kind", "exact") if round_index == "auto" else round_index
    _check_kind(kind)
    spec = None if kind == "exact" else (kind, meta.get(WIDTH_NAME[kind]))
    if not ray.is_initialized():
        ray.init(address=ray_address or "local", include_dashboard=False, log_to_driver=False)
    return ShardedFeatures.start(features, shards, round_index=spec)
