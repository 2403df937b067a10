"""The item Gram cache of the least-squares rounds (cpp/src/gram.h): a search with it scores
the same items in the same order, with the same top-k, as the same search without it, on
matrices built to make ties and near-ties (repeated rows, low rank), for single queries and
batches, Split plans and ridge; the cache is really used (its top-k counter moves), built once
enough searches ran (PriorRidge's only on request), and refused where the matrix does not
qualify."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from crossknn import _core
from crossknn.core import ItemFeatures


def _matrix(n, d, rank, seed, repeats=0):
    rng = np.random.default_rng(seed)
    V = (rng.standard_normal((n, rank)) @ rng.standard_normal((rank, d))).astype(np.float32)
    V += 0.01 * rng.standard_normal((n, d)).astype(np.float32)
    for r in range(repeats):  # copies of rows, every other one nudged by one float32 step in
        V[n - 1 - r] = V[r]  # a coordinate: tied and nearly tied scores
        if r % 2:
            j = r % d
            V[n - 1 - r, j] = np.nextafter(V[r, j], np.float32(np.inf))
    S = (rng.standard_normal((40, rank)) @ rng.standard_normal((rank, d)) @ V.T).astype(np.float32)
    S += 0.1 * rng.standard_normal(S.shape).astype(np.float32)
    return V, S


def _search(feats, S, plan, qids, **kw):
    def score(qs, items):
        return [S[qids[q], np.asarray(it)] for q, it in zip(qs, items, strict=True)]

    budget = sum(n for _, n in plan)
    if kw.get("priors") is not None:  # one prior row per query of this call
        kw = dict(kw, priors=np.ascontiguousarray(kw["priors"][qids]))
    return _core.run_search(feats._f, score, plan, qids, budget=budget, k=10, **kw)


def _same(a, b):
    for key in ("indices", "scores", "ce_calls"):
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)
    assert len(a["scored_items"]) == len(b["scored_items"])
    for x, y in zip(a["scored_items"], b["scored_items"], strict=True):
        np.testing.assert_array_equal(x, y)


PLANS = {
    # d = 400: 8 |A| <= d through every round (the cache answers every top-k)
    "rounds": [("first", 10)] + [("round", 10)] * 4,
    # |A| passes d / 8 = 50 midway: later rounds fall back to the int8 / float32 passes
    "long": [("first", 20)] + [("round", 20)] * 5,
    "split": [("first", 8), ("round", 8), ("round", 8), ("retrieve", 16)],
}


@pytest.mark.parametrize(
    ("plan", "extra"),
    [(p, {}) for p in sorted(PLANS)]
    + [("rounds", {"ridge": 0.5}), ("split", {"final_retrieved": True})],
)
def test_same_results_with_and_without_the_cache(plan, extra):
    V, S = _matrix(700, 400, 24, seed=3, repeats=60)
    on, off = ItemFeatures(V), ItemFeatures(V)
    off.gram = False
    assert on.prepare_gram() and on.gram_ready
    before = on._f.gram_top_k_calls
    qids = list(range(40))
    for batch in (qids[:1], qids):  # one query, then all 40 in one call
        a = _search(on, S, PLANS[plan], batch, **extra)
        b = _search(off, S, PLANS[plan], batch, **extra)
        _same(a, b)
    assert on._f.gram_top_k_calls > before  # the cache answered top-k calls
    assert off._f.gram_top_k_calls == 0


def test_random_and_softmax_rounds_unchanged():
    V, S = _matrix(500, 256, 16, seed=5)
    on, off = ItemFeatures(V), ItemFeatures(V)
    off.gram = False
    on.prepare_gram()
    plan = [("first", 10)] + [("round", 10)] * 3
    for strategy in ("softmax", "random"):
        _same(
            _search(on, S, plan, list(range(10)), strategy=strategy, seed=7),
            _search(off, S, plan, list(range(10)), strategy=strategy, seed=7),
        )


def test_with_a_prior_mix_the_solver_still_matches():
    # mix > 0: u leaves the span of the scored rows, so the top-k takes the int8 pass, but the
    # solver's Gram entries still come from the cache
    V, S = _matrix(500, 256, 16, seed=9)
    on, off = ItemFeatures(V), ItemFeatures(V)
    off.gram = False
    on.prepare_gram()
    priors = np.random.default_rng(1).standard_normal((40, 256))
    plan = [("first", 10)] + [("round", 10)] * 3
    a = _search(on, S, plan, list(range(40)), mix=0.3, priors=priors)
    b = _search(off, S, plan, list(range(40)), mix=0.3, priors=priors)
    _same(a, b)


def test_built_once_enough_least_squares_searches_ran():
    V, S = _matrix(300, 200, 8, seed=11)
    f = ItemFeatures(V)
    plan = [("first", 5)] + [("round", 5)] * 2
    for q in range(63):  # max(64, N / 8) = 64 searches pay for the build
        _search(f, S, plan, [q % 40])
    assert not f.gram_ready
    _search(f, S, plan, [0])
    assert f.gram_ready


def test_prior_ridge_cache_same_results_and_only_on_request():
    V, S = _matrix(600, 300, 16, seed=17, repeats=40)
    rng = np.random.default_rng(2)
    inv = np.r_[rng.uniform(0.2, 5.0, 300), 2.0]
    priors = rng.standard_normal((40, 300))
    plan = [("first", 10)] + [("round", 10)] * 4
    kw = dict(solve="prior_ridge", inv_penalties=inv, priors=priors)
    on, off = ItemFeatures(V), ItemFeatures(V)
    off.gram = False
    before = [_search(on, S, plan, [q], **kw) for q in range(40)]
    for f in (on, off):  # many PriorRidge searches build nothing by themselves
        assert not f.gram_ready
    assert on.prepare_gram(inv) and not off.prepare_gram(inv)
    for q in range(40):
        _same(_search(on, S, plan, [q], **kw), before[q])
        _same(_search(off, S, plan, [q], **kw), before[q])
    _same(_search(on, S, plan, list(range(40)), **kw), _search(off, S, plan, list(range(40)), **kw))
    with pytest.raises(ValueError, match="inverse penalties"):
        on.prepare_gram(np.r_[inv[:-2], -1.0, 1.0])


@pytest.mark.parametrize(
    ("n", "d", "storage"),
    [(300, 64, "float32"), (300, 200, "int8"), (300, 200, "float16")],
)
def test_not_built_where_the_matrix_does_not_qualify(n, d, storage):
    V, _ = _matrix(n, d, 8, seed=13)
    f = ItemFeatures(V, storage=storage)
    assert f.prepare_gram() is False and not f.gram_ready


def test_memory_limit_from_the_environment():
    code = (
        "import numpy as np\n"
        "from crossknn.core import ItemFeatures\n"
        "f = ItemFeatures(np.ones((300, 200), np.float32))\n"
        "print(f.prepare_gram())\n"
    )
    for mb, want in (("0", "False"), ("1", "True")):  # 300^2 x 8 bytes = 0.69 MiB
        env = dict(os.environ, CROSSKNN_GRAM_MB=mb)
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        assert out.stdout.strip() == want
