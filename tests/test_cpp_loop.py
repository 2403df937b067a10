"""The C++ round loop (crossknn/search.h, via ``_core.run_search``) against Python's
``run_rounds`` on shared fixtures: identical scored items in identical order, identical top-k and
CE calls, for every plan kind (TopK / SoftMax / Random rounds, No-Split and Split, with and
without the prior mix lambda, random or given first items) and several seeds. Also the example's
fixture (cpp/tests/fixtures) against the Python package, the zero-copy item matrices, and the
boundary (bad input -> ValueError, the scorer's own exception propagates unchanged)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from crossknn import ADACUR, AXN, CurIndex, ItemFeatures, MatrixScorer, _core
from crossknn.score_map import ScoreMap
from crossknn.search import query_seed
from ref_rounds import run_rounds

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "cpp" / "tests" / "fixtures"
N, D, Q_TRAIN, Q_TEST = 700, 12, 20, 6


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(42)
    V = rng.standard_normal((N, D)).astype(np.float32)
    U = rng.standard_normal((Q_TRAIN + Q_TEST, D)).astype(np.float32)
    S = (U @ V.T + 0.5 * rng.standard_normal((Q_TRAIN + Q_TEST, N))).astype(np.float32)
    P = (U + 0.3 * rng.standard_normal(U.shape)).astype(np.float32)
    train = np.arange(Q_TRAIN)
    test = list(range(Q_TRAIN, Q_TRAIN + Q_TEST))
    index = CurIndex.from_matrix(S, train, test_rows=test)
    return V, S, P, index, test


def run_cpp(method, scorer, queries, *, budget, k, seed, given_first=False):
    """The same search through the C++ loop: the method only supplies its plan and settings."""
    plan = method.plan(budget)
    seeds = [query_seed(seed, q) for q in queries]
    first = None
    if given_first:  # the caller's first items (e.g. a retriever); here the method's own
        first = np.stack(method.first_items(queries, plan[0].n, seeds)).astype(np.int64)
    priors = method.priors(queries)
    P = None if method.mix == 0 else np.stack(priors).astype(np.float64)
    smap = getattr(method, "score_map", None)
    alpha, beta = (smap.scale, smap.offset) if smap is not None else (1.0, 0.0)
    calls = []

    def score(qs, items):
        calls.append(sum(len(it) for it in items))
        return scorer.score_batch([queries[q] for q in qs], items)

    out = _core.run_search(
        method.features_for(budget)._f,
        score,
        [(s.kind, s.n) for s in plan],
        [int(q) for q in queries],
        budget=budget,
        k=k,
        strategy=method.strategy,
        temperature=method.temperature,
        ridge=method.ridge,
        mix=method.mix,
        seed=seed,
        first_items=first,
        priors=P,
        score_alpha=alpha,
        score_beta=beta,
    )
    assert len(calls) == len(plan)  # one scorer batch per step
    return out


def assert_same(py, cpp):
    assert len(py.scored_items) == len(cpp["scored_items"])
    for a, b in zip(py.scored_items, cpp["scored_items"], strict=True):
        np.testing.assert_array_equal(a, b)  # same items, same order
    for a, b in zip(py.scored_scores, cpp["scored_scores"], strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(py.indices, cpp["indices"])
    np.testing.assert_array_equal(py.scores, cpp["scores"])
    np.testing.assert_array_equal(py.ce_calls, cpp["ce_calls"])


@pytest.mark.parametrize("seed", [0, 1, 12345])
@pytest.mark.parametrize("split", [None, 0.6])
@pytest.mark.parametrize("strategy", ["topk", "softmax", "random"])
def test_adacur_plans_match(data, strategy, split, seed):
    _, S, _, index, test = data
    m = ADACUR(index, rounds=4, split=split, strategy=strategy, temperature=0.3)
    scorer = MatrixScorer(S)
    py = run_rounds(m, scorer, test, budget=48, k=10, seed=seed)
    assert_same(py, run_cpp(m, scorer, test, budget=48, k=10, seed=seed))


@pytest.mark.parametrize("seed", [0, 3, 2**40 + 7])
@pytest.mark.parametrize("mix", [0.0, 0.5])
@pytest.mark.parametrize("strategy", ["topk", "softmax", "random"])
@pytest.mark.parametrize("given_first", [False, True])
def test_axn_prior_mix_match(data, strategy, mix, seed, given_first):
    V, S, P, _, test = data
    m = AXN(
        V,
        rounds=5,
        prior=P,
        mix=mix,
        ridge=1e-3 if mix else 0.0,
        score_map=ScoreMap(1.5, 0.2) if mix else None,
    )
    m.strategy, m.temperature = strategy, 0.7
    scorer = MatrixScorer(S)
    py = run_rounds(m, scorer, test, budget=50, k=7, seed=seed)
    assert_same(py, run_cpp(m, scorer, test, budget=50, k=7, seed=seed, given_first=given_first))


@pytest.mark.parametrize("storage", ["float16", "int8"])
def test_storages_match(data, storage):
    V, S, _, _, test = data
    m = AXN(V, rounds=4, storage=storage)
    scorer = MatrixScorer(S)
    py = run_rounds(m, scorer, test, budget=40, k=10, seed=9)
    assert_same(py, run_cpp(m, scorer, test, budget=40, k=10, seed=9))


def test_batch_equals_single(data):
    V, S, _, _, test = data
    m = AXN(V, rounds=4)
    m.strategy = "softmax"
    scorer = MatrixScorer(S)
    batch = run_cpp(m, scorer, test, budget=40, k=10, seed=5)
    for i, q in enumerate(test):
        one = run_cpp(m, scorer, [q], budget=40, k=10, seed=5)
        np.testing.assert_array_equal(one["scored_items"][0], batch["scored_items"][i])


def test_query_seed_matches_python():
    rng = np.random.default_rng(0)
    for s, q in [(0, 0), (1, 2**32), (2**64 - 1, 5)] + [
        (int(a), int(b)) for a, b in rng.integers(0, 2**63, (50, 2), dtype=np.int64)
    ]:
        assert _core.query_seed(s, q) == query_seed(s, q)


def test_budget_and_errors(data):
    V, S, _, _, test = data
    feats = ItemFeatures(V)
    scorer = MatrixScorer(S)

    def score(qs, items):
        return scorer.score_batch([test[q] for q in qs], items)

    def run(plan, **kw):
        args = dict(budget=20, k=5)
        args.update(kw)
        return _core.run_search(feats._f, score, plan, [0], **args)

    out = run([("first", 5), ("round", 15)])
    assert out["ce_calls"].tolist() == [20] and len(set(out["scored_items"][0].tolist())) == 20
    with pytest.raises(ValueError, match="budget"):
        run([("first", 5), ("round", 16)])
    with pytest.raises(ValueError, match="First step"):
        run([("round", 5)])
    with pytest.raises(ValueError, match="step kind"):
        run([("sideways", 5)])
    with pytest.raises(ValueError, match="strategy"):
        run([("first", 5)], strategy="best")
    with pytest.raises(ValueError, match="k=6 exceeds"):
        run([("first", 5)], budget=5, k=6)
    with pytest.raises(ValueError, match="twice"):
        run([("first", 3)], first_items=np.array([[1, 2, 1]], np.int64))
    with pytest.raises(ValueError, match=r"first_items must have shape \(Q, n\) = \(1, 3\)"):
        run([("first", 3)], first_items=np.array([[1, 2]], np.int64))
    with pytest.raises(ValueError, match="needs a prior"):
        run([("first", 5), ("round", 5)], mix=0.5)


class Boom(RuntimeError):
    pass


def test_scorer_errors_propagate(data):
    V, _, _, _, _ = data
    feats = ItemFeatures(V)
    plan = [("first", 4), ("round", 4)]

    def boom(qs, items):
        raise Boom("the CE is down")

    with pytest.raises(Boom, match="the CE is down"):
        _core.run_search(feats._f, boom, plan, [0, 1], budget=8, k=4)
    with pytest.raises(ValueError, match="3 scores for 4 items"):
        _core.run_search(feats._f, lambda qs, it: [np.zeros(3)] * len(qs), plan, [0], budget=8, k=4)
    with pytest.raises(ValueError, match="NaN/inf"):
        _core.run_search(
            feats._f, lambda qs, it: [np.full(len(x), np.nan) for x in it], plan, [0], budget=8, k=4
        )
    with pytest.raises(ValueError, match="sequence of 1 score arrays"):
        _core.run_search(feats._f, lambda qs, it: 3.0, plan, [0], budget=8, k=4)


def _fixture_module():
    spec = importlib.util.spec_from_file_location("make_fixture", FIXTURES / "make_fixture.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_example_fixture_is_the_python_result():
    """The ids ctest requires from examples/search_one are what the Python package returns."""
    mod = _fixture_module()
    folder = FIXTURES / "axn_small"
    lines = (folder / "expected.txt").read_text().splitlines()
    assert [ln.split(" | ")[0] for ln in lines] == mod.CASES
    for ln in lines:
        case, ids = ln.split(" | ")
        assert mod.python_ids(case, folder) == [int(x) for x in ids.split()], case


def test_views_are_zero_copy(tmp_path):
    rng = np.random.default_rng(1)
    V = rng.standard_normal((300, 8)).astype(np.float32)
    np.save(tmp_path / "V.npy", V)
    u = rng.standard_normal(8)
    ref = ItemFeatures(V.astype(np.float64))  # a copy (dtype differs)
    assert not ref.is_view
    for f in (
        ItemFeatures(V),
        ItemFeatures(np.load(tmp_path / "V.npy", mmap_mode="r")),
        ItemFeatures.from_npy(tmp_path / "V.npy"),
    ):
        assert f.is_view
        for a, b in zip(f.top_k(u, 7), ref.top_k(u, 7), strict=True):
            np.testing.assert_array_equal(a, b)
    # the view keeps its array alive
    f = ItemFeatures(V.copy())
    import gc

    gc.collect()
    np.testing.assert_array_equal(f.top_k(u, 7)[1], ref.top_k(u, 7)[1])
    # float16 and int8 inputs in their storage type are views too
    assert ItemFeatures(V.astype(np.float16), storage="float16").is_view
    q8 = np.clip(np.rint(V / (np.abs(V).max(1, keepdims=True) / 127)), -127, 127).astype(np.int8)
    sc = (np.abs(V).max(1) / 127).astype(np.float32)
    f8 = ItemFeatures(q8, storage="int8", scales=sc)
    assert f8.is_view
    np.testing.assert_array_equal(f8.rows([3]), ItemFeatures(V, storage="int8").rows([3]))
    with pytest.raises(ValueError, match="needs scales"):
        ItemFeatures(q8, storage="int8")
    bad = V.copy()
    bad[4, 2] = np.nan
    with pytest.raises(ValueError, match="NaN or inf"):
        ItemFeatures(bad)
    with pytest.raises(ValueError, match="C-contiguous"):
        _core.Features.view(np.asfortranarray(V))
    with pytest.raises(FileNotFoundError):
        ItemFeatures.from_npy(tmp_path / "missing.npy")
    np.save(tmp_path / "c.npy", V.astype(np.complex64))
    with pytest.raises(ValueError, match="dtype '<c8' is not supported"):
        ItemFeatures.from_npy(tmp_path / "c.npy")


def test_opening_an_index_matrix_holds_it_once(tmp_path):
    """Peak RSS of opening a 100k x 64 float32 matrix (25.6 MB) from .npy: view vs copy.
    VmHWM (the peak of the fresh process image; ru_maxrss would carry pytest's own peak across
    fork + exec)."""
    np.save(tmp_path / "V.npy", np.ones((100_000, 64), np.float32))
    code = (
        "import sys, numpy as np\n"
        "from crossknn import ItemFeatures\n"
        "def hwm():\n"
        "    for line in open('/proc/self/status'):\n"
        "        if line.startswith('VmHWM:'):\n"
        "            return int(line.split()[1]) * 1024\n"
        "base = hwm()\n"
        "V = np.load(sys.argv[1], mmap_mode='r')\n"
        "f = ItemFeatures(V) if sys.argv[2] == 'view' else ItemFeatures(np.array(V, np.float64))\n"
        "print(hwm() - base)\n"
    )
    grow = {}
    for mode in ("view", "copy"):
        out = subprocess.run(
            [sys.executable, "-c", code, str(tmp_path / "V.npy"), mode],
            capture_output=True,
            text=True,
            check=True,
        )
        grow[mode] = int(out.stdout.strip())
    assert grow["view"] < 1.3 * 25.6e6  # the matrix once (file pages read by the NaN check)
    assert grow["copy"] > 2 * 25.6e6  # a float64 copy and the float32 core copy


# ---- the product path (RoundMethod.search -> search_rounds -> _core.run_search) against the old
# Python loop (tests/ref_rounds.py) on the shared score matrices, for every method -------------
MATRICES = ("cisi-minilm", "nfcorpus-minilm-gpu")
VARIANTS = (
    "rnr",
    "anncur",
    "anncur-de",
    "anncur-retrieved",
    "adacur",
    "adacur-softmax",
    "adacur-random",
    "adacur-split",
    "adacur-split-retrieved",
    "adacur-de",
    "axn",
    "axn-plain",
    "auto",
    "auto-decay",
    "auto-row-prior",
    "auto-dirs",
)
_LOADED: dict = {}


def _matrix(name):
    import os

    from crossknn.matrix import load_score_matrix

    root = Path(os.environ.get("CROSSKNN_DATA", REPO.parent / "shared")) / "matrices" / name
    if not root.is_dir():
        pytest.skip(f"score matrix {root} not found (set CROSSKNN_DATA)")
    if name not in _LOADED:
        m = load_score_matrix(root)
        _LOADED[name] = (m, CurIndex.from_matrix(m.scores, m.train, test_rows=m.test))
    return _LOADED[name]


def _variant(name, m, cur):
    from crossknn.retrievers import make_retriever
    from crossknn.search import RNR, make_method
    from crossknn.search.auto import AUTO, AutoIndex, query_directions

    de = make_retriever("de", item_vectors=m.de_items, query_vectors=m.de_queries)
    if name == "rnr":
        return RNR(de, n_items=m.n_items)
    if name.startswith("anncur"):
        first = de if name == "anncur-de" else "random"
        final = "retrieved" if name.endswith("retrieved") else "all"
        return make_method("anncur", cur=cur, first=first, split=0.4, final=final)
    if name.startswith("adacur"):
        base = "adacur-split" if "split" in name else name.replace("-de", "")
        final = "retrieved" if name.endswith("retrieved") else "all"
        first = de if name.endswith("-de") else "random"
        return make_method(
            base, cur=cur, first=first, rounds=5, split=0.6, temperature=0.3, final=final
        )
    if name.startswith("axn"):
        V, P = m.de_items, m.de_queries
        if name == "axn-plain":
            return make_method("axn", item_vectors=V, first="random", prior=None)
        smap = ScoreMap.fit(m.scores[m.train], P[m.train] @ V.T)
        return make_method("axn", item_vectors=V, first=de, prior=P, mix=0.5, score_map=smap)
    take = m.train[: min(40, m.train.size)]
    decay = name == "auto-decay"
    row_prior = name == "auto-row-prior"  # the row prior of built indexes (PRIOR_ALPHA = 3)
    idx = AutoIndex(
        m.de_items,
        m.scores[take],
        rho_d=0.1,
        rho_r=0.3,
        rounds=5,
        first_share=0.3 if decay else None,
        decay=0.5 if decay else 0.0,
        row_vectors=m.de_queries[take] if row_prior else None,
        prior_alpha=3.0 if row_prior else 0.0,
        # auto-dirs: the query-subspace block (extra features with a zero prior)
        query_dirs=query_directions(m.de_queries[m.train], 8) if name == "auto-dirs" else None,
    )
    return AUTO(idx, prior=m.de_queries, first=de)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("matrix", MATRICES)
def test_product_path_equals_python_loop(matrix, variant):
    from ref_rounds import search as ref_search

    m, cur = _matrix(matrix)
    method = _variant(variant, m, cur)
    scorer = MatrixScorer(m.scores)
    rows = m.test[:: max(1, m.test.size // 8)][:8].tolist()
    for budget in (30, 100):
        new = method.search(scorer, rows, budget=budget, k=10, seed=3)
        old = ref_search(method, scorer, rows, budget=budget, k=10, seed=3)
        assert_same(
            old,
            {
                "scored_items": new.scored_items,
                "scored_scores": new.scored_scores,
                "indices": new.indices,
                "scores": new.scores,
                "ce_calls": new.ce_calls,
            },
        )
