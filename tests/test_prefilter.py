"""The exact top-k prefilter (``Features.top_k`` through an int8 or float16 copy,
cpp/src/features.cpp): the same items and the same float bits as the full float32 pass, on
matrices built to stress its error bounds (ties, duplicate and near-duplicate rows, columns of
very different scale, tiny and huge values, subnormal query entries, exclusions, batches), the
search results of a prefiltered matrix equal those without it, and the core's phase timers."""

from __future__ import annotations

import numpy as np
import pytest

from crossknn import _core


def _pair(V, threads=1):
    on = _core.Features(V, storage="float32", threads=threads)
    off = _core.Features(V, storage="float32", threads=threads)
    off.prefilter = False
    assert on.prefilter and not off.prefilter
    return on, off


def _exclude(rng, n, Q):
    ex = [rng.choice(n, int(rng.integers(0, n // 3 + 1)), replace=False) for _ in range(Q)]
    ids = np.concatenate(ex).astype(np.int64)
    off = np.r_[0, np.cumsum([len(e) for e in ex])].astype(np.int64)
    return ids, off


def _same(a, b):
    (sa, ia), (sb, ib) = a, b
    np.testing.assert_array_equal(ia, ib)
    np.testing.assert_array_equal(sa.view(np.int32), sb.view(np.int32))  # same float bits


KINDS = (
    "normal",
    "ties",
    "duplicates",
    "near_duplicates",
    "tiny",
    "column_scales",
    "huge",
    "subnormal_u",
)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("seed", range(6))
def test_prefilter_equals_full_pass(kind, seed):
    rng = np.random.default_rng([seed, KINDS.index(kind)])
    n, d = int(rng.integers(40, 2500)), int(rng.integers(1, 200))
    V = rng.standard_normal((n, d)).astype(np.float32)
    U = rng.standard_normal((3, d)).astype(np.float32)
    if kind == "ties":
        V = np.round(V)
        U = np.round(U)
    elif kind == "duplicates":
        V[: n // 2] = V[0]
    elif kind == "near_duplicates":  # score gaps far below int8's resolution: the float16 copy
        V = (1.0 + 1e-3 * V).astype(np.float32)
    elif kind == "tiny":
        V *= np.float32(1e-30)
    elif kind == "column_scales":  # auto's features: DE columns next to z-scores and a constant
        V[:, : d // 2] *= np.float32(1e-3)
        V[:, -1] = 1.0
    elif kind == "huge":
        V *= np.float32(1e17)
    elif kind == "subnormal_u":
        U[:, ::2] *= np.float32(1e-42)
    on, off = _pair(V, threads=int(rng.integers(1, 3)))
    ids, offs = _exclude(rng, n, 3)
    for k in (1, max(1, n // 40), n // 4):
        for _ in range(5):  # a copy is built on the second call; float16 after 3 int8 misses
            _same(on.top_k(U, k, ids, offs), off.top_k(U, k, ids, offs))
            _same(on.top_k(U[1:2], k, None, None), off.top_k(U[1:2], k, None, None))
    assert on.prefilter_ready


def test_zero_query_and_all_equal_scores():
    V = np.ones((300, 8), np.float32)
    on, off = _pair(V)
    U = np.zeros((1, 8), np.float32)
    for _ in range(3):
        _same(on.top_k(U, 7, None, None), off.top_k(U, 7, None, None))
        _same(on.top_k(U + 1, 7, None, None), off.top_k(U + 1, 7, None, None))


def test_large_k_and_other_storages_use_the_full_pass():
    rng = np.random.default_rng(5)
    V = rng.standard_normal((100, 16)).astype(np.float32)
    U = rng.standard_normal((1, 16)).astype(np.float32)
    on, off = _pair(V)
    for _ in range(2):
        _same(on.top_k(U, 60, None, None), off.top_k(U, 60, None, None))  # k > N / 4
    assert not on.prefilter_ready
    h = _core.Features(V, storage="float16")
    h.top_k(U, 3, None, None)
    h.top_k(U, 3, None, None)
    assert not h.prefilter_ready  # float16 storage: its own bytes already


def test_search_results_equal_with_and_without_prefilter():
    from crossknn import AXN, MatrixScorer

    rng = np.random.default_rng(7)
    N, D = 900, 24
    V = rng.standard_normal((N, D)).astype(np.float32)
    S = (rng.standard_normal((6, D)) @ V.T + 0.3 * rng.standard_normal((6, N))).astype(np.float32)
    scorer = MatrixScorer(S)
    res = {}
    for flag in (True, False):
        m = AXN(V, rounds=5)
        m.features._f.prefilter = flag
        res[flag] = m.search(scorer, list(range(6)), budget=60, k=10, seed=1)
        assert m.features._f.prefilter_ready == flag
    for a, b in zip(res[True].scored_items, res[False].scored_items, strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(res[True].indices, res[False].indices)
    np.testing.assert_array_equal(res[True].scores, res[False].scores)


def test_search_profile_splits_the_loop_by_phase():
    """CROSSKNN_PROFILE=1 (read at the first search) fills _core.search_profile(); without it the
    totals stay zero. Run in fresh interpreters: the switch is read once per process."""
    import os
    import subprocess
    import sys

    code = (
        "import numpy as np\n"
        "from crossknn import AXN, MatrixScorer, _core\n"
        "rng = np.random.default_rng(0)\n"
        "V = rng.standard_normal((500, 16)).astype(np.float32)\n"
        "S = (rng.standard_normal((3, 16)) @ V.T).astype(np.float32)\n"
        "AXN(V, rounds=4).search(MatrixScorer(S), [0, 1, 2], budget=40, k=5)\n"
        "p = _core.search_profile(True)\n"
        "print(p['searches'], p['solve'] > 0, p['select'] > 0, p['score'] > 0, p['append'] > 0)\n"
        "print(_core.search_profile()['searches'])\n"
    )
    env = dict(os.environ)
    out = {}
    for flag in ("1", "0"):
        env["CROSSKNN_PROFILE"] = flag
        run = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        out[flag] = run.stdout.split("\n")[:2]
    assert out["1"] == ["1 True True True True", "0"]  # one batch search; reset zeroes it
    assert out["0"] == ["0 False False False False", "0"]
