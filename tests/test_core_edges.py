"""Edge cases of crossknn.core (issue 10, items 6, 7, 13): each ends in a right answer or one
clear error. Expected orders come from independent numpy computations in float64."""

from __future__ import annotations

import numpy as np
import pytest

from crossknn import _core
from crossknn.core import ItemFeatures, RoundState

STORAGES = ("float32", "float16", "int8")


def _rng(seed=0):
    return np.random.default_rng(seed)


def _np_top_k(f: ItemFeatures, u, k, exclude=()):
    """Top-k by float64 V_stored u, ties to the lower index, excluded ids left out."""
    s = f.rows(np.arange(f.n_items)) @ np.asarray(u, np.float64)
    order = [int(i) for i in np.lexsort((np.arange(f.n_items), -s)) if i not in set(exclude)]
    return np.array(order[:k])


def _separated(n, d, seed):
    """V with integer entries and u whose scores are distinct integers (no near-ties)."""
    rng = _rng(seed)
    V = rng.integers(-20, 21, (n, d)).astype(np.float64)
    u = np.zeros(d)
    u[0] = 1.0
    V[:, 0] = rng.permutation(n) * 2 - n  # distinct, and dominant for u = e_0 + small rest
    u[1:] = rng.integers(-1, 2, d - 1) / (64.0 * d)  # perturbs by < 1/2: order by column 0
    return V, u


# ------------------------------------------------------------------ item 6: float16 range, solve
def test_float16_storage_refuses_values_beyond_its_range_naming_the_row():
    with pytest.raises(ValueError, match=r"row 0, column 0.*float16 range"):
        ItemFeatures([[1e5, 1], [1, 2], [3, 1]], storage="float16")
    with pytest.raises(ValueError, match=r"row 2, column 1.*float16"):
        ItemFeatures([[1, 1], [1, 2], [3, -65520.0]], storage="float16")
    # what rounds to at most 65504 is still stored (RNE); the other storages take 1e5
    f = ItemFeatures([[65519.0, -65504.0], [1, 2]], storage="float16")
    assert f.rows([0]).tolist() == [[65504.0, -65504.0]]
    for storage in ("float32", "int8"):
        ItemFeatures([[1e5, 1], [1, 2], [3, 1]], storage=storage)


def test_float32_overflow_in_V_is_refused_naming_the_row():
    with pytest.raises(ValueError, match=r"row 1, column 0.*float32 range"):
        ItemFeatures(np.array([[1.0, 2.0], [-1e39, 0.0]]))
    with pytest.raises(ValueError, match=r"NaN or inf \(row 0, column 1\)"):
        ItemFeatures(np.array([[1.0, np.inf]]), storage="int8")


@pytest.mark.parametrize("storage", STORAGES)
def test_solve_on_the_issue_example_is_finite(storage):
    V = [[65504.0, 1], [1, 2], [3, 1]] if storage == "float16" else [[1e5, 1], [1, 2], [3, 1]]
    f = ItemFeatures(V, storage=storage)
    s = RoundState(f)
    s.append([0, 1, 2], [1.0, 2.0, 3.0])
    u = s.solve()
    assert np.all(np.isfinite(u))
    X = f.rows([0, 1, 2])
    expect = np.linalg.lstsq(X, [1.0, 2.0, 3.0], rcond=None)[0]
    # sigma_min^2 ~ 4 is near delta = 1e-10 * 1e10: solved to (1/5)^4 (module docstring)
    np.testing.assert_allclose(X @ u, X @ expect, rtol=3e-3)


def test_solve_overflowing_float64_raises_instead_of_nan():
    f = ItemFeatures(np.full((3, 2), 1e-40) + np.eye(3, 2) * 1e-40)
    s = RoundState(f)
    s.append([0, 1, 2], [1e300, -1e300, 3e300])  # u ~ 1e340: beyond float64
    with pytest.raises(ValueError, match="overflows float64"):
        s.solve()
    s2 = RoundState(f, ridge=0.5)  # the same rows with a ridge: small and finite
    s2.append([0, 1, 2], [1e300, -1e300, 3e300])
    assert np.all(np.isfinite(s2.solve()))


# ------------------------------------------------------------- item 7: keys that cannot overflow
@pytest.mark.parametrize("storage", STORAGES)
@pytest.mark.parametrize("scale", [3e38, 1e300, 1e-300, 1e-40, 5e-324])
def test_top_k_with_huge_or_tiny_u_ranks_by_score(storage, scale):
    V, u = _separated(300, 6, 1)
    f = ItemFeatures(V, storage=storage)
    expect = _np_top_k(f, u, 10, exclude=[int(np.argmax(V[:, 0]))])
    s, idx = f.top_k(u * scale, 10, exclude=[int(np.argmax(V[:, 0]))])
    np.testing.assert_array_equal(idx, expect)
    assert s.dtype == np.float32 and not np.isnan(s).any()
    # scores are V u rounded to float32 (+-inf beyond it), after the ranking
    with np.errstate(over="ignore"):
        want = (f.rows(expect) @ u * scale).astype(np.float32)
    np.testing.assert_allclose(s, want, rtol=1e-5, atol=0)


def test_top_k_batch_rows_scaled_independently():
    V, u = _separated(200, 5, 2)
    f = ItemFeatures(V)
    U = np.stack([u * 3e38, u, -u * 1e-300, u * 0.0])
    s, idx = f.top_k(U, 7)
    np.testing.assert_array_equal(idx[0], _np_top_k(f, u, 7))
    np.testing.assert_array_equal(idx[1], _np_top_k(f, u, 7))
    np.testing.assert_array_equal(idx[2], _np_top_k(f, -u, 7))
    np.testing.assert_array_equal(idx[3], np.arange(7))  # all zero: ties to the lower index
    assert np.all(np.isinf(s[0])) and np.all(s[3] == 0)


@pytest.mark.parametrize("storage", STORAGES)
def test_top_k_and_softmax_in_range_unchanged_from_the_core(storage):
    """Where nothing can overflow, the wrapper passes u (and the keys) through bit for bit."""
    rng = _rng(3)
    V = rng.standard_normal((500, 8)).astype(np.float32)
    U = rng.standard_normal((3, 8)).astype(np.float32)
    f = ItemFeatures(V, storage=storage)
    raw = _core.Features(V, storage=storage)
    for a, b in zip(f.top_k(U, 20), raw.top_k(U, 20), strict=True):
        np.testing.assert_array_equal(a, b)
    for T in (1.0, 0.37, 1e-6, 40.0):
        got = f.sample_softmax(U, 20, temperature=T, seed=9)
        ref = raw.sample_softmax(U, 20, None, None, T, 9)
        np.testing.assert_array_equal(got[1], ref[1])
        np.testing.assert_array_equal(got[0], ref[0])


@pytest.mark.parametrize("storage", STORAGES)
@pytest.mark.parametrize(("scale", "T"), [(1.0, 1e-40), (1.0, 1e-300), (3e38, 1e-20), (1e300, 1)])
def test_softmax_with_tiny_temperature_is_top_k(storage, scale, T):
    V, u = _separated(300, 6, 4)
    f = ItemFeatures(V, storage=storage)
    ex = [5, 17, -1, 5]
    keys, idx = f.sample_softmax(u * scale, 8, temperature=T, seed=2, exclude=ex)
    np.testing.assert_array_equal(idx, _np_top_k(f, u, 8, exclude=[5, 17]))
    assert np.all(np.isfinite(keys)) and np.all(np.diff(keys) <= 0)


def test_softmax_batch_with_tiny_temperature_each_row_top_k():
    V, u = _separated(200, 5, 5)
    f = ItemFeatures(V)
    U = np.stack([u * 1e30, -u, u * 1e-30])
    keys, idx = f.sample_softmax(U, 6, temperature=1e-38, seed=1)
    for q, w in enumerate([u, -u, u]):
        np.testing.assert_array_equal(idx[q], _np_top_k(f, w, 6))
    assert np.all(np.isfinite(keys))


def test_softmax_scaled_u_and_temperature_sample_softmax_of_the_logits():
    """u and T scaled by 1e-35 together: the same logits, so the first pick follows
    softmax(V u / T) (checked against numpy over many seeds)."""
    V = np.array([[0.0], [1.0], [2.0], [-1.0]])
    f = ItemFeatures(V)
    u, T = np.array([1e-35]), 1e-35 * 1.5
    counts = np.bincount(
        [int(f.sample_softmax(u, 1, temperature=T, seed=s)[1][0]) for s in range(4000)],
        minlength=4,
    )
    p = np.exp(V[:, 0] / 1.5)
    p /= p.sum()
    assert np.all(np.abs(counts / 4000 - p) < 4 * np.sqrt(p * (1 - p) / 4000) + 1e-3)


def test_scores_with_huge_u_are_not_nan():
    f = ItemFeatures(np.array([[1e38, -1e38], [1.0, 2.0]]))
    s = f.scores(np.array([1e280, 1e280]), [0, 1])  # products 1e318: inf - inf before
    assert abs(s[0]) <= 1e-15 * 1e318 and s[1] == 3e280
    assert not np.isnan(f.scores(np.array([1e300, 1e300]), [0, 1])).any()
    with pytest.raises(ValueError, match="NaN or inf"):
        f.scores(np.array([np.nan, 0]), [0])


# --------------------------------------------------- item 13: scalar parameters named, in range
@pytest.mark.parametrize("k", [2**63, 2**64, 10**30, np.uint64(2**64 - 1), 11])
def test_k_beyond_the_items_names_k_not_a_pybind_dump(k):
    f = ItemFeatures(np.ones((10, 2)))
    for call in (
        lambda: f.top_k(np.ones(2), k),
        lambda: f.sample_softmax(np.ones(2), k),
        lambda: f.sample_random(k),
        lambda: f.sample_random(k, n_queries=2),
    ):
        with pytest.raises(
            ValueError, match=r"k=\d+ exceeds the 10 items \(k must be in \[0, 10\]"
        ):
            call()


@pytest.mark.parametrize(
    ("name", "call", "exc", "pattern"),
    [
        ("k", lambda f: f.top_k(np.ones(2), "3"), TypeError, r"k must be an int in \[0, 10\]"),
        ("k", lambda f: f.top_k(np.ones(2), True), TypeError, r"k must be an int"),
        ("k", lambda f: f.top_k(np.ones(2), -(2**70)), ValueError, r"k must be >= 0"),
        (
            "n_queries",
            lambda f: f.sample_random(1, n_queries=2**63),
            ValueError,
            r"n_queries .*\[0, 2147483647\]",
        ),
        (
            "n_queries",
            lambda f: f.sample_random(1, n_queries="2"),
            TypeError,
            r"n_queries must be an int",
        ),
        (
            "seed",
            lambda f: f.sample_random(1, seed=2**64),
            ValueError,
            r"seed must be in \[-9223372036854775808, 18446744073709551615\]",
        ),
        (
            "seed",
            lambda f: f.sample_softmax(np.ones(2), 1, seed=-(2**63) - 1),
            ValueError,
            r"seed must be in",
        ),
        (
            "seed",
            lambda f: f.sample_softmax(np.ones(2), 1, seed=1.0),
            TypeError,
            r"seed must be an int",
        ),
        (
            "temperature",
            lambda f: f.sample_softmax(np.ones(2), 1, temperature="x"),
            TypeError,
            r"temperature must be a real number in \(0, inf\)",
        ),
        (
            "temperature",
            lambda f: f.sample_softmax(np.ones(2), 1, temperature=10**400),
            ValueError,
            r"temperature must be a finite number in \(0, inf\)",
        ),
        (
            "temperature",
            lambda f: f.sample_softmax(np.ones(2), 1, temperature=-1e-300),
            ValueError,
            r"temperature must be a finite number",
        ),
        (
            "exclude",
            lambda f: f.top_k(np.ones(2), 1, exclude=[2**64]),
            IndexError,
            r"exclude: item id 18446744073709551616 is outside \[0, 10\) or -1",
        ),
        (
            "exclude",
            lambda f: f.top_k(np.ones(2), 1, exclude=np.array([2**64 - 1], np.uint64)),
            IndexError,
            r"exclude: item id 18446744073709551615 is outside",
        ),
        (
            "exclude",
            lambda f: f.top_k(np.ones((2, 2)), 1, exclude=[[1], [-(2**63) - 5]]),
            IndexError,
            r"exclude\[1\]: item id -9223372036854775813 is outside",
        ),
        (
            "exclude",
            lambda f: f.top_k(np.ones(2), 1, exclude=["a"]),
            TypeError,
            r"exclude must be integer item ids",
        ),
        (
            "items",
            lambda f: f.rows([2**63]),
            IndexError,
            r"items: item id 9223372036854775808 is outside \[0, 10\)$",
        ),
        (
            "items",
            lambda f: RoundState(f).append([2**63], [1.0]),
            IndexError,
            r"items: item id \d+ is outside \[0, 10\)",
        ),
        (
            "items",
            lambda f: RoundState(f).append([[1], [2, 3]], [1.0]),
            TypeError,
            r"items must be an array",
        ),
        (
            "threads",
            lambda f: ItemFeatures(np.ones((2, 2)), threads=2**63),
            ValueError,
            r"threads must be in \[0, 1024\]",
        ),
        (
            "threads",
            lambda f: setattr(f, "threads", 2**31),
            ValueError,
            r"threads must be in \[0, 1024\]",
        ),
        ("threads", lambda f: setattr(f, "threads", "2"), TypeError, r"threads must be an int"),
        (
            "refine",
            lambda f: RoundState(f, refine=2**31),
            ValueError,
            r"refine must be in \[0, 100\]",
        ),
        ("refine", lambda f: RoundState(f, refine=2.0), TypeError, r"refine must be an int"),
        (
            "ridge",
            lambda f: RoundState(f, ridge="0.1"),
            TypeError,
            r"ridge must be a real number in \[0, inf\)",
        ),
        (
            "ridge",
            lambda f: RoundState(f, ridge=10**400),
            ValueError,
            r"ridge must be a finite number in \[0, inf\)",
        ),
        (
            "ridge",
            lambda f: RoundState(f, ridge=float("nan")),
            ValueError,
            r"ridge must be a finite",
        ),
        (
            "mix",
            lambda f: RoundState(f, prior=np.ones(2), mix="a"),
            TypeError,
            r"mix must be a real number in \[0, 1\]",
        ),
        (
            "mix",
            lambda f: RoundState(f, prior=np.ones(2), mix=2**64),
            ValueError,
            r"mix must be a finite number in \[0, 1\]",
        ),
        (
            "jitter_rel",
            lambda f: RoundState(f, jitter_rel=1.0),
            ValueError,
            r"jitter_rel .*\(0, 1\)",
        ),
    ],
)
def test_scalar_parameters_are_checked_naming_the_parameter_and_range(name, call, exc, pattern):
    f = ItemFeatures(np.ones((10, 2)))
    with pytest.raises(exc, match=pattern) as info:
        call(f)
    assert name in str(info.value)
    assert "incompatible function arguments" not in str(info.value)


def test_scalar_parameters_accept_numpy_and_0d_values():
    f = ItemFeatures(np.eye(10, 2), threads=np.int32(1))
    f.threads = np.array(2)
    s, i = f.top_k(np.ones(2), np.int64(3), exclude=np.array([0], np.uint8))
    assert i.tolist() == [1, 2, 3]
    assert f.sample_random(np.uint64(2), seed=np.uint64(2**64 - 1)).shape == (2,)
    assert f.sample_random(2, seed=-1).tolist() == f.sample_random(2, seed=2**64 - 1).tolist()
    f.sample_softmax(np.ones(2), 2, temperature=np.float32(0.5), seed=np.array(3))
    st = RoundState(
        f, ridge=np.float64(0.1), prior=np.ones(2), mix=np.array(0.5), refine=np.int8(2)
    )
    st.append(np.array([1], np.uint16), [1.0])
    assert np.all(np.isfinite(st.solve()))


def test_sample_random_refuses_a_result_past_the_limit_before_allocating():
    """#28 item 10: 7 ids for 2**31 - 1 queries (15e9 ids, 120 GB) was a MemoryError, the raw
    binding's 2**40 queries a std::bad_alloc; both are a ValueError naming the limit now."""
    f = ItemFeatures(np.ones((10, 2), np.float32))
    with pytest.raises(ValueError, match=r"exceed the limit of 2\*\*28"):
        f.sample_random(7, n_queries=2**31 - 1)
    with pytest.raises(ValueError, match=r"n_queries x k = 1099511627776 x 7 .* limit of 2\*\*28"):
        _core.Features(np.ones((10, 2), np.float32)).sample_random(2**40, 7)
    assert f.sample_random(7, n_queries=3).shape == (3, 7)  # within the limit: as before
