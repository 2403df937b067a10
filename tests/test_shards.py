"""Item features sharded over local Ray actors give the single-process results exactly."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from crossknn.core import ItemFeatures
from crossknn.scorers import MatrixScorer
from crossknn.search import AXN
from crossknn.search.shards import ShardedFeatures, shard_bounds


def test_shard_bounds():
    assert shard_bounds(10, 3) == [(0, 4), (4, 7), (7, 10)]
    assert shard_bounds(5, 1) == [(0, 5)]
    with pytest.raises(ValueError, match=r"shards must be in \[1, 5\]"):
        shard_bounds(5, 6)


@pytest.fixture(scope="module")
def ray_local():
    ray = pytest.importorskip("ray")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", FutureWarning)
        warnings.simplefilter("ignore", ResourceWarning)
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        yield ray
        ray.shutdown()


@pytest.mark.slow
@pytest.mark.xdist_group("ray")  # one local Ray cluster at a time (tests/conftest.py)
@pytest.mark.parametrize("shards", [2, 4])
def test_sharded_search_equals_single_process(ray_local, shards):
    rng = np.random.default_rng(0)
    n, d, nq = 403, 12, 6
    V = rng.standard_normal((n, d)).astype(np.float32)
    V[7] = V[300]  # an exact tie across shards: the lower global id must win
    S = (rng.standard_normal((nq, d)) @ V.T + 0.3 * rng.standard_normal((nq, n))).astype(np.float32)
    f = ItemFeatures(V)
    sharded = ShardedFeatures.start(f, shards)
    try:
        U = rng.standard_normal((nq, d))
        U[0] = V[7]
        excl = [rng.choice(n, size=rng.integers(0, 90), replace=False) for _ in range(nq)]
        excl[1] = np.arange(0, 100)  # a whole shard (or most of one) scored already
        s1, i1 = f.top_k(U, 40, exclude=excl)
        s2, i2 = sharded.top_k(U, 40, exclude=excl)
        np.testing.assert_array_equal(i2, i1)
        np.testing.assert_array_equal(s2, s1)
        assert i2[0][0] == 7 and i2[0][1] == 300  # the tie, lower id first
        scorer = MatrixScorer(S)
        one = AXN(f, rounds=4).search(scorer, list(range(nq)), budget=40, k=10, seed=3)
        many = AXN(sharded, rounds=4).search(scorer, list(range(nq)), budget=40, k=10, seed=3)
        np.testing.assert_array_equal(many.indices, one.indices)
        np.testing.assert_array_equal(many.scores, one.scores)
        for a, b in zip(many.scored_items, one.scored_items, strict=True):
            np.testing.assert_array_equal(a, b)
        # allow masks: each shard searches its slice of them, the merge equals one process
        allow = [rng.random(n) < 0.4 for _ in range(nq)]
        allow[2][:] = False
        allow[2][350:] = True  # one query's allowed items all in the last shard
        s1, i1 = f.top_k(U, 20, exclude=excl, allow=allow)
        s2, i2 = sharded.top_k(U, 20, exclude=excl, allow=allow)
        np.testing.assert_array_equal(i2, i1)
        np.testing.assert_array_equal(s2, s1)
        one = AXN(f, rounds=4).search(scorer, list(range(nq)), budget=40, k=10, allow=allow)
        many = AXN(sharded, rounds=4).search(scorer, list(range(nq)), budget=40, k=10, allow=allow)
        np.testing.assert_array_equal(many.indices, one.indices)
        assert all(a[r].all() for a, r in zip(allow, many.indices, strict=True))
    finally:
        sharded.stop()


@pytest.mark.slow
@pytest.mark.xdist_group("ray")  # one local Ray cluster at a time (tests/conftest.py)
def test_searcher_features_with_shards(ray_local):
    """What `crossknn search --shards S` gives the rounds: exact shards of the folder's items."""
    from types import SimpleNamespace

    from crossknn.search.features import search_features

    V = np.random.default_rng(1).standard_normal((120, 6)).astype(np.float32)
    index = SimpleNamespace(path="idx", arrays={"de_items": V}, params={})
    feats = search_features(index, V, shards=3)
    try:
        assert isinstance(feats, ShardedFeatures) and len(feats.actors) == 3
        u = np.random.default_rng(2).standard_normal(6)
        np.testing.assert_array_equal(
            feats.top_k(u, 15, exclude=[1, 2, 3])[1],
            ItemFeatures(V).top_k(u, 15, exclude=[1, 2, 3])[1],
        )
    finally:
        feats.stop()
    with pytest.raises(ValueError, match="--ray-address needs --shards"):
        search_features(index, V, ray_address="auto")
