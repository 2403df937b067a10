"""The C++ round engine (crossknn.core) vs the independent numpy reference tests/ref_core.py."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from crossknn import _core
from crossknn.core import ItemFeatures, RoundState

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ref_core  # noqa: E402
from shared_fixtures import lazy_module  # noqa: E402

stats = lazy_module("scipy.stats")  # imported by the first test that uses it

STORAGES = ["float32", "float16", "int8"]
HSET = settings(
    max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)


def _rng(seed=0):
    return np.random.default_rng(seed)


def _pinv_solution(X, a):
    return np.linalg.pinv(X) @ a


# ----------------------------------------------------------------------------- storage / rows
@pytest.mark.parametrize("storage", STORAGES)
@pytest.mark.parametrize("shape", [(1, 1), (7, 3), (300, 17)])
def test_rows_match_reference(storage, shape):
    V = _rng(1).standard_normal(shape) * 3
    f = ItemFeatures(V, storage=storage)
    r = ref_core.ItemFeatures(V, storage=storage)
    items = np.arange(shape[0])[::-1].copy()
    np.testing.assert_array_equal(f.rows(items), r.rows(items))
    assert f.rows(items).dtype == np.float64
    assert (f.n_items, f.dim, f.storage) == (shape[0], shape[1], storage)


def test_float16_rounding_edge_values():
    vals = np.array([[0.0, -0.0, 1e-8, 6e-8, 3e-5, 65504.0, 65519.0, -2.5e-3, 1 + 2**-11]])
    f = ItemFeatures(vals, storage="float16")
    expect = vals.astype(np.float32).astype(np.float16).astype(np.float64)
    np.testing.assert_array_equal(f.rows([0]), expect)


def test_int8_quantization_error_bounded():
    V = _rng(2).standard_normal((50, 40))
    f = ItemFeatures(V, storage="int8")
    step = np.abs(V).max(axis=1, keepdims=True) / 127
    assert np.all(np.abs(f.rows(np.arange(50)) - V) <= step / 2 + 1e-6)
    assert f.nbytes == 50 * 40 + 50 * 4


# ------------------------------------------------------------------------------- least squares
def _random_problem(rng, m, d, cond=None):
    X = rng.standard_normal((m, d))
    if cond is not None:  # prescribed singular values from 1 to 1/cond
        U, _, Wt = np.linalg.svd(X, full_matrices=False)
        s = np.logspace(0, -np.log10(cond), min(m, d))
        X = (U * s) @ Wt
    return X.astype(np.float32), rng.standard_normal(m)


@HSET
@given(
    m=st.integers(1, 60),
    d=st.integers(1, 40),
    n_blocks=st.integers(1, 4),
    seed=st.integers(0, 2**31),
)
def test_solve_matches_pinv_well_conditioned(m, d, n_blocks, seed):
    rng = _rng(seed)
    X, a = _random_problem(rng, m, d, cond=30)
    f = ItemFeatures(X)
    state = RoundState(f)
    cuts = np.sort(rng.choice(np.arange(1, m), size=min(n_blocks - 1, m - 1), replace=False))
    for part in np.split(np.arange(m), cuts):
        state.append(part, a[part])
        u = state.solve()
        Xa = f.rows(state.items)
        ref = _pinv_solution(Xa, state.targets)
        assert np.linalg.norm(u - ref) <= 1e-5 * max(np.linalg.norm(ref), 1e-12)


@HSET
@given(
    m=st.integers(2, 60),
    d=st.integers(2, 30),
    kind=st.sampled_from(["duplicates", "zeros", "lowrank", "tiny", "cond1e4"]),
    seed=st.integers(0, 2**31),
)
def test_solve_ill_conditioned_is_finite_and_near_optimal(m, d, kind, seed):
    """Rank-deficient (exactly, in float32) or condition 1e4: residual as small as pinv's.

    Gram-matrix Cholesky resolves singular values down to about sqrt(jitter_rel) = 1e-5 of the
    largest (see the engine docstring); float32 rounding noise below that is not fitted.
    """
    rng = _rng(seed)
    X = rng.standard_normal((m, d))
    if kind == "duplicates":  # inconsistent targets on identical rows
        X[m // 2 :] = X[: m - m // 2]
    elif kind == "zeros":
        X[::2] = 0
    elif kind == "lowrank":  # exact in float32: small integers times 1/16 multiples
        X = rng.integers(-3, 4, (m, 2)) @ (np.round(rng.standard_normal((2, d)) * 16) / 16)
    elif kind == "tiny":
        X *= 1e-20
    else:
        X, _ = _random_problem(rng, m, d, cond=1e4)
    X = X.astype(np.float32)
    a = rng.standard_normal(m)
    f = ItemFeatures(X)
    state = RoundState(f)
    half = m // 2
    state.append(np.arange(half), a[:half])
    state.append(np.arange(half, m), a[half:])
    u = state.solve()
    assert np.all(np.isfinite(u))
    Xd = X.astype(np.float64)
    ref = _pinv_solution(Xd, a)
    r_ours = np.linalg.norm(Xd @ u - a)
    r_ref = np.linalg.norm(Xd @ ref - a)
    assert abs(r_ours - r_ref) <= 1e-3 * np.linalg.norm(a)
    # and it is the min-norm solution, not just any least-squares one
    assert np.linalg.norm(u - ref) <= 1e-3 * np.linalg.norm(ref) + 1e-12


def test_solve_near_collinear_rows_is_finite():
    """float32 rounding makes these rows independent at 1e-7: finite, no blow-up."""
    rng = _rng(17)
    X = np.outer(rng.standard_normal(20), rng.standard_normal(8)) + 1e-9
    X = X.astype(np.float32)
    a = rng.standard_normal(20)
    state = RoundState(ItemFeatures(X))
    state.append(np.arange(20), a)
    u = state.solve()
    assert np.all(np.isfinite(u))
    ref = np.linalg.lstsq(X.astype(np.float64), a, rcond=1e-5)[0]
    assert np.linalg.norm(X @ u - a) <= np.linalg.norm(X @ ref - a) + 1e-3 * np.linalg.norm(a)


@pytest.mark.parametrize("m,d", [(5, 20), (20, 20), (60, 20)])
def test_ridge_solution_exact(m, d):
    rng = _rng(3)
    X, a = _random_problem(rng, m, d)
    f = ItemFeatures(X)
    for ridge in (1e-3, 0.5, 10.0):
        state = RoundState(f, ridge=ridge)
        state.append(np.arange(m // 3), a[: m // 3])
        state.append(np.arange(m // 3, m), a[m // 3 :])
        Xd = X.astype(np.float64)
        ref = np.linalg.solve(Xd.T @ Xd + ridge * np.eye(d), Xd.T @ a)
        np.testing.assert_allclose(state.solve(), ref, rtol=1e-9, atol=1e-12)


def test_regime_switch_is_consistent():
    """Appending one row at a time across |A| = d gives the pinv solution at every size."""
    rng = _rng(4)
    d = 12
    X, a = _random_problem(rng, 30, d)
    f = ItemFeatures(X)
    state = RoundState(f)
    for i in range(30):
        state.append([i], [a[i]])
        ref = _pinv_solution(X[: i + 1].astype(np.float64), a[: i + 1])
        np.testing.assert_allclose(state.solve(), ref, rtol=1e-7, atol=1e-9)


def test_prior_mix_and_empty_state():
    rng = _rng(5)
    X, a = _random_problem(rng, 10, 6)
    prior = rng.standard_normal(6)
    f = ItemFeatures(X)
    state = RoundState(f, prior=prior, mix=0.25)
    np.testing.assert_allclose(state.solve(), 0.25 * prior)
    state.append(np.arange(10), a)
    ls = _pinv_solution(X.astype(np.float64), a)
    np.testing.assert_allclose(state.solve(), 0.75 * ls + 0.25 * prior, rtol=1e-8)
    assert RoundState(f).solve().tolist() == [0.0] * 6


@pytest.mark.parametrize("scale", [1e-15, 1.0, 1e12])
def test_delta_follows_the_scale_of_the_rows(scale):
    """Zero rows first (delta undefined), then rows of any scale: still the pinv solution."""
    rng = _rng(6)
    X = rng.standard_normal((12, 10)) * scale
    X[:3] = 0
    X = X.astype(np.float32)
    a = rng.standard_normal(12)
    state = RoundState(ItemFeatures(X))
    state.append(np.arange(3), a[:3])
    assert np.all(state.solve() == 0)
    state.append(np.arange(3, 7), a[3:7])
    state.append(np.arange(7, 12), a[7:])
    ref = _pinv_solution(X.astype(np.float64), a)
    assert np.linalg.norm(state.solve() - ref) <= 1e-5 * np.linalg.norm(ref)


def test_items_targets_size():
    f = ItemFeatures(_rng(7).standard_normal((20, 3)))
    state = RoundState(f)
    state.append(np.array([5, 2], np.int32), [1.5, -2])
    state.append([7], np.array([3], np.float32))
    assert state.items.tolist() == [5, 2, 7]
    assert state.items.dtype == np.int64
    assert state.targets.tolist() == [1.5, -2.0, 3.0]
    assert state.size == 3


# ------------------------------------------------------------------------------------ top-k
def _check_topk(V64, u, k, exclude, s, idx, tol):
    """idx are k distinct unmasked items holding the k best scores (up to tol), sorted."""
    full = V64 @ u.astype(np.float64)
    mask = np.zeros(len(full), bool)
    ex = np.asarray(exclude if exclude is not None else [], np.int64)
    mask[ex[ex >= 0]] = True
    assert len(set(idx.tolist())) == k
    assert not mask[idx].any()
    np.testing.assert_allclose(s, full[idx], rtol=1e-5, atol=tol)
    assert np.all(np.diff(s) <= 0)
    ties = np.diff(s) == 0
    assert np.all(np.diff(idx)[ties] > 0)
    rest = np.where(~mask)[0]
    rest = np.setdiff1d(rest, idx)
    if k and rest.size:
        # nothing outside beats the k-th by more than the float32 rounding of the scores
        assert full[rest].max() <= s[-1] + tol
        kth = np.partition(-full[~mask], k - 1)[k - 1]
        assert abs(-kth - s[-1]) <= tol


@pytest.mark.parametrize("storage", STORAGES)
@HSET
@given(
    n=st.integers(1, 3000),
    d=st.integers(1, 70),
    k=st.integers(0, 40),
    n_ex=st.integers(0, 50),
    seed=st.integers(0, 2**31),
)
def test_top_k_matches_argpartition(storage, n, d, k, n_ex, seed):
    rng = _rng(seed)
    V = rng.standard_normal((n, d)).astype(np.float32)
    f = ItemFeatures(V, storage=storage)
    u = rng.standard_normal(d).astype(np.float32)
    ex = rng.integers(0, n, size=n_ex)
    k = min(k, n - len(np.unique(ex)))
    s, idx = f.top_k(u, k, exclude=ex)
    assert s.shape == (k,) and idx.shape == (k,) and s.dtype == np.float32
    V64 = f.rows(np.arange(n))
    tol = 1e-4 * (np.abs(V64) @ np.abs(u) + 1).max()
    _check_topk(V64, u, k, ex, s, idx, tol)


def test_top_k_ties_go_to_lower_index():
    V = np.ones((100, 4), np.float32)
    s, idx = ItemFeatures(V, threads=2).top_k(np.ones(4), 5, exclude=[0, 2])
    assert idx.tolist() == [1, 3, 4, 5, 6]
    assert np.all(s == 4.0)


@pytest.mark.parametrize("storage", STORAGES)
def test_thread_count_and_batch_independence(storage):
    rng = _rng(8)
    V = rng.standard_normal((40_000, 64)).astype(np.float32)
    V[::7] = V[3]  # plenty of exact ties
    U = rng.standard_normal((5, 64)).astype(np.float32)
    ex = [rng.integers(0, 40_000, 100) for _ in range(5)]
    res = []
    for threads in (1, 2, 3):
        f = ItemFeatures(V, storage=storage, threads=threads)
        res.append(
            (
                f.top_k(U, 50, exclude=ex),
                f.sample_softmax(U, 50, exclude=ex, temperature=0.5, seed=11),
            )
        )
    for other in res[1:]:
        for a, b in zip(res[0], other, strict=True):
            np.testing.assert_array_equal(a[0], b[0])
            np.testing.assert_array_equal(a[1], b[1])
    # batch rows equal single-query top-k calls
    f = ItemFeatures(V, storage=storage, threads=2)
    for q in range(5):
        s, i = f.top_k(U[q], 50, exclude=ex[q])
        np.testing.assert_array_equal(s, res[0][0][0][q])
        np.testing.assert_array_equal(i, res[0][0][1][q])


def test_batch_exclude_forms_agree():
    rng = _rng(9)
    f = ItemFeatures(rng.standard_normal((500, 8)))
    U = rng.standard_normal((3, 8))
    lists = [np.array([1, 2, 3]), np.array([], np.int64), np.array([7])]
    padded = np.array([[1, 2, 3], [-1, -1, -1], [7, -1, -1]])
    a = f.top_k(U, 10, exclude=lists)
    b = f.top_k(U, 10, exclude=padded)
    np.testing.assert_array_equal(a[1], b[1])
    assert not np.isin(a[1][0], [1, 2, 3]).any()
    assert a[1].shape == (3, 10)


def test_exclude_everything_but_k():
    f = ItemFeatures(_rng(10).standard_normal((30, 4)))
    s, idx = f.top_k(np.ones(4), 3, exclude=np.arange(3, 30))
    assert sorted(idx.tolist()) == [0, 1, 2]
    assert f.top_k(np.ones(4), 0)[1].shape == (0,)


# ---------------------------------------------------------------------------------- sampling
def test_gumbel_top_k_matches_softmax_distribution():
    """First draw ~ softmax(V u / T); second draw given the first ~ renormalised softmax."""
    rng = _rng(11)
    n, Q, T = 6, 40_000, 0.7
    V = rng.standard_normal((n, 3)).astype(np.float32)
    u = rng.standard_normal(3).astype(np.float32)
    f = ItemFeatures(V)
    logits = f.rows(np.arange(n)) @ u.astype(np.float64) / T
    p = np.exp(logits - logits.max())
    p /= p.sum()
    keys, idx = f.sample_softmax(np.tile(u, (Q, 1)), 2, exclude=[[5]] * Q, temperature=T, seed=3)
    assert not (idx == 5).any()
    assert np.all(keys[:, 0] >= keys[:, 1])
    p5 = p[:5] / p[:5].sum()
    counts = np.bincount(idx[:, 0], minlength=5)
    assert stats.chisquare(counts, p5 * Q).pvalue > 1e-3
    # second draw conditioned on the first being item 0
    sel = idx[:, 0] == int(np.argmax(p5))
    q2 = p5.copy()
    q2[np.argmax(p5)] = 0
    q2 /= q2.sum()
    c2 = np.bincount(idx[sel, 1], minlength=5)
    keep = q2 > 0
    assert stats.chisquare(c2[keep], q2[keep] * sel.sum()).pvalue > 1e-3
    # the reference sampler agrees in distribution
    ref = ref_core.ItemFeatures(V)
    rc = np.bincount(
        [ref.sample_softmax(u, 1, exclude=[5], temperature=T, seed=s)[1][0] for s in range(3000)],
        minlength=5,
    )
    assert stats.chisquare(rc, p5 * 3000).pvalue > 1e-3


def test_softmax_seed_reproducible_and_varies():
    f = ItemFeatures(_rng(12).standard_normal((1000, 5)))
    u = np.ones(5)
    a = f.sample_softmax(u, 10, seed=1)
    assert np.array_equal(a[1], f.sample_softmax(u, 10, seed=1)[1])
    assert not np.array_equal(a[1], f.sample_softmax(u, 10, seed=2)[1])
    # very low temperature: the top-k
    np.testing.assert_array_equal(
        f.sample_softmax(u, 10, temperature=1e-6, seed=5)[1], f.top_k(u, 10)[1]
    )


@pytest.mark.parametrize("k", [1, 3, 6])  # sparse (rejection) and dense (hash-order) paths
def test_random_sampling_uniform_and_masked(k):
    n, Q = 10, 20_000
    f = ItemFeatures(_rng(13).standard_normal((n, 2)))
    ex = [[0, 4, -1]] * Q
    out = f.sample_random(k, exclude=ex, seed=7)
    assert out.shape == (Q, k)
    assert not np.isin(out, [0, 4]).any()
    assert all(len(set(r)) == k for r in out[:500].tolist())
    counts = np.bincount(out.ravel(), minlength=n)[[1, 2, 3, 5, 6, 7, 8, 9]]
    assert stats.chisquare(counts).pvalue > 1e-3
    single = f.sample_random(k, exclude=[0, 4], seed=7)
    np.testing.assert_array_equal(single, out[0])
    assert f.sample_random(2, n_queries=3, seed=1).shape == (3, 2)


# --------------------------------------------------------------------------------- bad input
def test_bad_features():
    with pytest.raises(ValueError, match="non-empty"):
        ItemFeatures(np.zeros((0, 3)))
    with pytest.raises(ValueError, match="non-empty"):
        ItemFeatures(np.zeros(5))
    with pytest.raises(ValueError, match="NaN or inf"):
        ItemFeatures(np.array([[1.0, np.nan]]))
    with pytest.raises(ValueError, match="NaN or inf"):
        ItemFeatures(np.array([[1e39, 0]]))  # overflows float32
    with pytest.raises(ValueError, match="storage"):
        ItemFeatures(np.ones((2, 2)), storage="bfloat16")
    with pytest.raises(TypeError, match="real numeric"):
        ItemFeatures(np.array([["a", "b"]]))
    with pytest.raises(ValueError, match="threads"):
        ItemFeatures(np.ones((2, 2)), threads=-1)
    with pytest.raises(ValueError, match="threads"):
        ItemFeatures(np.ones((2, 2)), threads=10**6)
    f = ItemFeatures(np.ones((2, 2)))
    with pytest.raises(ValueError, match="threads"):
        f.threads = -3


def test_bad_queries_and_k():
    f = ItemFeatures(_rng(14).standard_normal((10, 3)))
    with pytest.raises(ValueError, match="shape"):
        f.top_k(np.ones(4), 2)
    with pytest.raises(ValueError, match="NaN or inf"):
        f.top_k(np.array([1.0, np.inf, 0]), 2)
    with pytest.raises(ValueError, match="exceeds the 8 items"):
        f.top_k(np.ones(3), 9, exclude=[0, 1, 1])
    with pytest.raises(ValueError, match="exceeds"):
        f.sample_softmax(np.ones(3), 11)
    with pytest.raises(ValueError, match="exceeds"):
        f.sample_random(10, exclude=[3])
    with pytest.raises(ValueError, match="k must be >= 0"):
        f.top_k(np.ones(3), -1)
    with pytest.raises(ValueError, match="exceeds"):  # refused before allocating the output
        f.top_k(np.ones((2, 3)), 10**15)
    with pytest.raises(ValueError, match="exceeds"):
        f.sample_random(10**15, n_queries=3)
    with pytest.raises(TypeError, match="k must be an int"):
        f.top_k(np.ones(3), 2.0)
    with pytest.raises(IndexError, match="outside"):
        f.top_k(np.ones(3), 2, exclude=[10])
    with pytest.raises(IndexError, match="outside"):
        f.top_k(np.ones(3), 2, exclude=[-2])
    with pytest.raises(TypeError, match="integer"):
        f.top_k(np.ones(3), 2, exclude=[1.5])
    with pytest.raises(ValueError, match="one per query"):
        f.top_k(np.ones((2, 3)), 2, exclude=[[1]])
    with pytest.raises(TypeError, match="one per query"):
        f.top_k(np.ones((2, 3)), 2, exclude=np.array([1, 2]))
    with pytest.raises(ValueError, match="temperature"):
        f.sample_softmax(np.ones(3), 2, temperature=0)
    with pytest.raises(IndexError, match="outside"):
        f.rows([10])


def test_bad_round_state():
    f = ItemFeatures(_rng(15).standard_normal((10, 3)))
    s = RoundState(f)
    with pytest.raises(ValueError, match="NaN or inf"):
        s.append([1], [np.nan])
    with pytest.raises(ValueError, match="differ in length"):
        s.append([1, 2], [1.0])
    with pytest.raises(IndexError, match="outside"):
        s.append([10], [1.0])
    with pytest.raises(TypeError, match="integer"):
        s.append([1.0], [1.0])
    s.append([1], [1.0])
    with pytest.raises(ValueError, match="twice"):
        s.append([1], [1.0])
    with pytest.raises(ValueError, match="twice"):
        s.append([2, 2], [1.0, 1.0])
    assert s.size == 1  # failed appends change nothing
    with pytest.raises(ValueError, match="ridge"):
        RoundState(f, ridge=-1)
    with pytest.raises(ValueError, match="prior"):
        RoundState(f, prior=np.ones(4), mix=0.5)
    with pytest.raises(ValueError, match="mix"):
        RoundState(f, prior=np.ones(3), mix=1.5)
    with pytest.raises(ValueError, match="NaN"):
        RoundState(f, prior=np.array([1, np.nan, 0]), mix=0.5)
    with pytest.raises(TypeError, match="ItemFeatures"):
        RoundState(np.ones((3, 3)))


def test_core_boundary_rejects_wrong_arrays():
    """The extension itself checks dtype, order and shapes: no crash on raw calls."""
    V = np.ones((10, 3), np.float32)
    with pytest.raises(TypeError, match="float32"):
        _core.Features(V.astype(np.float64))
    with pytest.raises(TypeError, match="numpy array"):
        _core.Features([[1.0, 2.0]])
    with pytest.raises(ValueError, match="C-contiguous"):
        _core.Features(np.ones((3, 10), np.float32).T)
    f = _core.Features(V)
    with pytest.raises(TypeError, match="float32"):
        f.top_k(np.ones((1, 3)), 2)
    with pytest.raises(ValueError, match="2-D"):
        f.top_k(np.ones(3, np.float32), 2)
    with pytest.raises(ValueError, match="Q \\+ 1"):
        f.top_k(np.ones((1, 3), np.float32), 2, np.array([1]), np.array([0, 1, 1]))
    with pytest.raises(ValueError, match="start at 0"):
        f.top_k(np.ones((1, 3), np.float32), 2, np.array([1]), np.array([0, 5]))
    with pytest.raises(TypeError, match="int64"):
        f.rows(np.array([1], np.int32))
    s = _core.LeastSquares(f)
    with pytest.raises(TypeError, match="float64"):
        s.append(np.array([1]), np.array([1.0], np.float32))
    del f  # the state keeps its features alive
    s.append(np.array([1]), np.array([1.0]))
    assert np.all(np.isfinite(s.solve()))


def test_concurrent_calls_from_python_threads():
    rng = _rng(16)
    f = ItemFeatures(rng.standard_normal((20_000, 32)), threads=1)
    U = rng.standard_normal((4, 32))
    expect = [f.top_k(U[q], 20)[1] for q in range(4)]
    got = [None] * 4

    def work(q):
        got[q] = f.top_k(U[q], 20)[1]

    threads = [threading.Thread(target=work, args=(q,)) for q in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for q in range(4):
        np.testing.assert_array_equal(got[q], expect[q])


def test_generic_and_simd_kernels_agree():
    """CROSSKNN_NO_SIMD=1 (portable path) picks the same items; int8 scores are exact integers."""
    import json
    import os
    import subprocess

    code = (
        "import json, numpy as np\n"
        "from crossknn.core import ItemFeatures, kernel_name\n"
        "rng = np.random.default_rng(0)\n"
        "V = rng.standard_normal((3000, 77)).astype(np.float32)\n"
        "U = rng.standard_normal((3, 77)).astype(np.float32)\n"
        "out = {'kernel': kernel_name()}\n"
        "for st in ('float32', 'float16', 'int8'):\n"
        "    s, i = ItemFeatures(V, storage=st).top_k(U, 20)\n"
        "    out[st] = (s.tolist(), i.tolist())\n"
        "print(json.dumps(out))\n"
    )
    runs = []
    for no_simd in ("1", "0"):
        env = dict(os.environ, CROSSKNN_NO_SIMD=no_simd)
        res = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        runs.append(json.loads(res.stdout))
    generic, native = runs
    assert generic["kernel"] == "generic"
    np.testing.assert_array_equal(generic["int8"][0], native["int8"][0])
    np.testing.assert_array_equal(generic["int8"][1], native["int8"][1])
    for storage in ("float32", "float16"):
        g_s, g_i = generic[storage]
        n_s, n_i = native[storage]
        np.testing.assert_allclose(g_s, n_s, rtol=1e-5, atol=1e-5)
        for a, b in zip(g_i, n_i, strict=True):
            assert len(set(a) ^ set(b)) <= 2  # near-ties at the k-th place may swap


def test_int8_scores_within_documented_error():
    rng = _rng(18)
    V = rng.standard_normal((2000, 300)).astype(np.float32)
    u = rng.standard_normal(300) * np.logspace(-3, 0, 300)  # entries of very different sizes
    f = ItemFeatures(V, storage="int8")
    s, idx = f.top_k(u, 50)
    exact = f.rows(idx) @ u.astype(np.float32).astype(np.float64)
    bound = np.abs(f.rows(idx)).sum(axis=1) * np.abs(u).max() / 65534
    assert np.all(np.abs(s - exact) <= bound + 1e-5 * np.abs(exact))
