import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ref_search as ref
from crossknn.retrievers import DenseRetriever
from crossknn.score_map import ScoreMap
from crossknn.scorers import MatrixScorer
from crossknn.search import (
    ADACUR,
    ANNCUR,
    AXN,
    RNR,
    CurIndex,
    query_seed,
    split_sizes,
)
from crossknn.synthetic import synthetic_matrix
from shared_fixtures import RecordingScorer as Recording

N_Q, N_I = 36, 150
S, DQ, DI = synthetic_matrix(N_Q, N_I, rank=8, noise=0.2, de_dim=12, seed=3)
TRAIN = np.arange(0, 24)
TEST = np.arange(24, N_Q)
INDEX = CurIndex.from_matrix(S, TRAIN, test_rows=TEST)
DE = DenseRetriever(DI, query_vectors=DQ)


def de_ranked(q):
    return ref.topk(DI.astype(np.float64) @ DQ[q].astype(np.float64), N_I)


def search(method, budget, k, queries=TEST, seed=0):
    return method.search(MatrixScorer(S), list(queries), budget=budget, k=k, seed=seed)


# ---- against the independent numpy references ---------------------------------------------


@pytest.mark.parametrize("budget,k", [(10, 1), (40, 10), (150, 20)])
def test_rnr_matches_reference(budget, k):
    res = search(RNR(DE), budget, k)
    for j, q in enumerate(TEST):
        expect = ref.rnr(S[q], de_ranked(q), budget, k)
        assert res.indices[j].tolist() == expect.tolist()
        np.testing.assert_array_equal(res.scores[j], S[q, expect])
    assert res.ce_calls.tolist() == [budget] * len(TEST)


@pytest.mark.parametrize("budget,split", [(20, 0.5), (40, 0.25), (60, 0.6)])
@pytest.mark.parametrize("final", ["all", "retrieved"])
def test_anncur_matches_reference(budget, split, final):
    m = ANNCUR(INDEX, split=split, ridge=1e-2, final=final)
    res = search(m, budget, 10)
    k_i = round(split * budget)
    anchors, _ = m.anchors(k_i)
    assert anchors.size == k_i and np.unique(anchors).size == k_i
    for j, q in enumerate(TEST):
        expect = ref.anncur(S[q], S[TRAIN], anchors, budget, 10, 1e-2, final=final)
        assert res.indices[j].tolist() == expect.tolist()
        assert set(anchors.tolist()) <= set(res.scored_items[j].tolist())


@pytest.mark.parametrize("rounds", [1, 3, 5])
@pytest.mark.parametrize("split", [None, 0.4])
@pytest.mark.parametrize("ridge", [0.0, 1e-2])
def test_adacur_matches_reference(rounds, split, ridge):
    budget, k = 30, 10
    res = search(ADACUR(INDEX, rounds=rounds, split=split, ridge=ridge), budget, k)
    n_round = budget if split is None else round(split * budget)
    n0 = ref.sizes(n_round, rounds)[0]
    for j, q in enumerate(TEST):
        first = res.scored_items[j][:n0]  # the random first round is the method's; the rest is ref
        expect = ref.rounds_search(
            S[q], S[TRAIN].T, first, budget, k, rounds, split=split, ridge=ridge
        )
        assert res.indices[j].tolist() == expect.tolist()


def test_adacur_paper_final_and_de_first_match_reference():
    budget, k, rounds, split = 40, 10, 4, 0.5
    m = ADACUR(INDEX, rounds=rounds, split=split, first=DE, final="retrieved")
    res = search(m, budget, k)
    n0 = ref.sizes(round(split * budget), rounds)[0]
    for j, q in enumerate(TEST):
        first = de_ranked(q)[:n0]
        assert res.scored_items[j][:n0].tolist() == first.tolist()
        expect = ref.rounds_search(
            S[q],
            S[TRAIN].T,
            first,
            budget,
            k,
            rounds,
            split=split,
            ridge=m.ridge,
            final="retrieved",
        )
        assert res.indices[j].tolist() == expect.tolist()


@pytest.mark.parametrize("mix", [0.0, 0.5])
def test_axn_matches_reference(mix):
    budget, k, rounds = 36, 10, 4
    smap = ScoreMap.fit(S[TRAIN], DQ[TRAIN] @ DI.T)
    m = AXN(DI, rounds=rounds, first=DE, prior=DQ, mix=mix, score_map=smap)
    res = search(m, budget, k)
    for j, q in enumerate(TEST):
        first = de_ranked(q)[: ref.sizes(budget, rounds)[0]]
        expect = ref.rounds_search(
            S[q], DI, first, budget, k, rounds, prior=DQ[q], mix=mix, affine=smap.to_list()
        )
        assert res.indices[j].tolist() == expect.tolist()


def test_recall_matches_reference_on_average():
    """Same seeds -> same recall as the reference (the aggregate the eval reports)."""
    res = search(ADACUR(INDEX, rounds=3), 45, 10)
    ours, theirs = [], []
    for j, q in enumerate(TEST):
        first = res.scored_items[j][:15]
        expect = ref.rounds_search(S[q], S[TRAIN].T, first, 45, 10, 3, ridge=1e-2)
        ours.append(ref.recall(S[q], res.indices[j], 10))
        theirs.append(ref.recall(S[q], expect, 10))
    assert np.mean(ours) == pytest.approx(np.mean(theirs))
    assert np.mean(ours) > 0.5  # and the method actually works on a low-rank matrix


# ---- budget, no double scoring, determinism, batching --------------------------------------


def make(name, rounds):
    return {
        "rnr": lambda: RNR(DE),
        "rnr-random": lambda: RNR("random", n_items=N_I),
        "anncur": lambda: ANNCUR(INDEX, split=0.3),
        "anncur-de": lambda: ANNCUR(INDEX, split=0.3, first=DE),
        "adacur": lambda: ADACUR(INDEX, rounds=rounds),
        "adacur-split": lambda: ADACUR(INDEX, rounds=rounds, split=0.5),
        "adacur-softmax": lambda: ADACUR(INDEX, rounds=rounds, strategy="softmax"),
        "adacur-random": lambda: ADACUR(INDEX, rounds=rounds, strategy="random", final="retrieved"),
        "axn": lambda: AXN(DI, rounds=rounds, prior=DQ, mix=0.3),
    }[name]()


METHOD_NAMES = [
    "rnr",
    "rnr-random",
    "anncur",
    "anncur-de",
    "adacur",
    "adacur-split",
    "adacur-softmax",
    "adacur-random",
    "axn",
]


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    name=st.sampled_from(METHOD_NAMES),
    budget=st.integers(1, N_I),
    rounds=st.integers(1, 12),
    kfrac=st.floats(0.0, 1.0),
    seed=st.integers(0, 2**31),
)
def test_budget_never_exceeded_and_no_item_scored_twice(name, budget, rounds, kfrac, seed):
    rounds = min(rounds, budget)
    k = max(1, int(kfrac * budget))
    rec = Recording(S)
    queries = TEST[:4].tolist()
    res = make(name, rounds).search(rec, queries, budget=budget, k=k, seed=seed)
    assert res.ce_calls.max() <= budget
    assert len(rec.pairs) == len(set(rec.pairs)) == res.ce_calls.sum()
    assert res.indices.shape == res.scores.shape == (len(queries), k)
    for j, q in enumerate(queries):
        got = res.indices[j][res.indices[j] >= 0]
        assert np.unique(got).size == got.size
        assert set(got.tolist()) <= {i for qq, i in rec.pairs if qq == q}
        np.testing.assert_array_equal(res.scores[j][: got.size], S[q, got])
        assert np.all(np.diff(res.scores[j][: got.size]) <= 0)
    # one scorer batch per step: all queries of a step go together
    assert rec.batches == len(make(name, rounds).plan(budget))


@pytest.mark.parametrize("name", METHOD_NAMES)
def test_recall_is_one_when_budget_covers_all_items(name):
    res = search(make(name, 5), N_I, 20)
    for j, q in enumerate(TEST):
        assert ref.recall(S[q], res.indices[j], 20) == 1.0


@pytest.mark.parametrize(
    "name", ["rnr-random", "anncur", "adacur", "adacur-softmax", "adacur-random", "axn"]
)
def test_deterministic_and_batch_equals_one_at_a_time(name):
    a = search(make(name, 4), 24, 5, seed=7)
    b = search(make(name, 4), 24, 5, seed=7)
    np.testing.assert_array_equal(a.indices, b.indices)
    for j, q in enumerate(TEST[:5]):
        single = search(make(name, 4), 24, 5, queries=[q], seed=7)
        np.testing.assert_array_equal(single.indices[0], a.indices[j])
        np.testing.assert_array_equal(single.scored_items[0], a.scored_items[j])
    # reversed batch order: the same per-query results (seeds come from the query ids)
    rev = search(make(name, 4), 24, 5, queries=TEST[::-1], seed=7)
    np.testing.assert_array_equal(rev.indices[::-1], a.indices)


def test_seed_changes_random_choices():
    a = search(ADACUR(INDEX, rounds=2), 20, 5, seed=1)
    b = search(ADACUR(INDEX, rounds=2), 20, 5, seed=2)
    pairs = zip(a.scored_items, b.scored_items, strict=True)
    assert any(x.tolist() != y.tolist() for x, y in pairs)
    assert query_seed(0, 5) != query_seed(1, 5) != query_seed(0, 6)
    assert query_seed(0, "a text") == query_seed(0, "a text")


def test_result_unpacks_like_faiss():
    scores, indices = search(ADACUR(INDEX, rounds=2), 20, 5)
    assert scores.dtype == np.float32 and indices.dtype == np.int64
    assert scores.shape == indices.shape == (len(TEST), 5)


def test_split_sizes():
    assert split_sizes(10, 3) == [4, 3, 3]
    assert split_sizes(5, 5) == [1] * 5
    with pytest.raises(ValueError, match="rounds > budget"):
        split_sizes(3, 4)


# ---- bad inputs ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "call, err, match",
    [
        (lambda: search(ADACUR(INDEX), 10, 11), ValueError, "k=11 exceeds the budget"),
        (lambda: search(ADACUR(INDEX), N_I + 1, 5), ValueError, "exceeds the number of items"),
        (lambda: search(ADACUR(INDEX, rounds=8), 6, 2), ValueError, "rounds=8 exceeds the budget"),
        (lambda: search(AXN(DI, rounds=8), 6, 2), ValueError, "rounds=8 exceeds the budget"),
        (lambda: search(ADACUR(INDEX), 10, 0), ValueError, "k must be >= 1"),
        (lambda: CurIndex(np.zeros((0, 10))), ValueError, "non-empty"),
        (lambda: CurIndex.from_matrix(S, []), ValueError, "at least one anchor"),
        (
            lambda: CurIndex.from_matrix(S, [1, 2, 30], test_rows=TEST),
            ValueError,
            "must come from train rows; rows \\[30\\] are test rows",
        ),
        (lambda: CurIndex(np.full((2, 3), np.nan)), ValueError, "NaN"),
        (
            lambda: ADACUR(CurIndex(S[:5, :40])).search(MatrixScorer(S), [30], budget=10, k=2),
            ValueError,
            "index has 40 items but the scorer has 150",
        ),
        (lambda: ADACUR(INDEX, strategy="best"), ValueError, "strategy must be"),
        (lambda: ADACUR(INDEX, split=1.5), ValueError, "split"),
        (lambda: ANNCUR(INDEX, split=0.0), ValueError, "split"),
        (lambda: ADACUR(INDEX, rounds=0), ValueError, "rounds must be >= 1"),
        (lambda: AXN(DI, mix=0.5), ValueError, "needs a prior"),
        (lambda: AXN(DI, prior=DQ, mix=2.0), ValueError, "mix"),
        (lambda: ADACUR(INDEX, first="bm25"), ValueError, "make_retriever"),
        (lambda: RNR("random"), ValueError, "non-empty item set"),
    ],
)
def test_bad_inputs(call, err, match):
    with pytest.raises(err, match=match):
        call()


def test_nan_scores_from_scorer_are_rejected():
    bad = S.copy()
    bad[TEST[0], :] = np.nan
    with pytest.raises(ValueError, match="NaN/inf score"):
        ADACUR(INDEX).search(MatrixScorer(bad), [int(TEST[0])], budget=10, k=2)


def test_mismatched_prior_shape():
    m = AXN(DI, rounds=2, prior=lambda q: np.zeros(3), mix=0.5)
    with pytest.raises(ValueError, match="prior query vector must have shape"):
        search(m, 10, 2)


def test_score_map_fit_matches_polyfit():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((6, 40))
    y = 0.4 * x + 0.6 + 0.05 * rng.standard_normal((6, 40))
    smap = ScoreMap.fit(y, x)
    np.testing.assert_allclose(smap.to_list(), np.polyfit(x.ravel(), y.ravel(), 1))
    np.testing.assert_allclose(smap.to_ce(smap.to_approx(y)), y)
    with pytest.raises(ValueError, match="do not depend"):
        ScoreMap.fit(y, np.ones_like(x))


def test_score_map_match_moments_gives_the_approx_moments():
    rng = np.random.default_rng(0)
    ce, de = rng.uniform(0.2, 0.9, 500), rng.normal(0.1, 0.05, 500)
    z = ScoreMap.match_moments(ce, de).to_approx(ce)
    assert abs(z.mean() - de.mean()) < 1e-9 and abs(z.std() - de.std()) < 1e-9
    assert ScoreMap.match_moments(np.ones(3), de[:3]) == ScoreMap(1.0, 0.0)


@pytest.mark.parametrize("bad", [[1e308, 1e308], [0.0, 1.0], [float("nan"), 0.0], [1.0], "x"])
def test_score_map_refuses_values_out_of_range(bad):
    with pytest.raises(ValueError, match="score map"):
        ScoreMap.from_list(bad)


@pytest.mark.parametrize("ridge", [0.0, 1e-2])
def test_anncur_embedding_matches_pinv(ridge):
    anchors = np.array([3, 17, 40, 41, 99])
    E = INDEX.anncur_embedding(anchors, ridge=ridge)
    R = S[TRAIN].astype(np.float64)
    C = R[:, anchors]
    W = np.linalg.pinv(C) if ridge == 0 else np.linalg.solve(C.T @ C + ridge * np.eye(5), C.T)
    np.testing.assert_allclose(E, W @ R, rtol=1e-9, atol=1e-9)
    # more anchors than anchor queries: the other Gram matrix, same solution
    many = np.arange(0, 60)
    C = R[:, many]
    W = np.linalg.solve(C.T @ C + 1e-2 * np.eye(60), C.T)
    np.testing.assert_allclose(INDEX.anncur_embedding(many, ridge=1e-2), W @ R, atol=1e-8)


def test_one_registry_feeds_every_method_list():
    """#32 item 2: the CLI choices, Searcher, eval and serve read the registry; serve accepts
    every method search runs (auto included) when the index holds its index kind."""
    import json

    from crossknn import eval as eval_mod
    from crossknn import searcher
    from crossknn.search import registry
    from crossknn.serve import schema

    names = registry.names()
    assert {"auto", "axn", "rnr", "adacur", "anncur"} <= set(names)
    assert tuple(searcher.METHODS) == tuple(eval_mod.METHODS) == tuple(schema.METHODS) == names
    kinds = {"cur", "auto"}
    for name in names:
        body = json.dumps({"query": "x", "method": name, "k": 2, "budget": 5}).encode()
        req = schema.parse_search_request(body, n_items=50, has_cur=True, indexes=kinds)
        assert req.method == name
    body = json.dumps({"query": "x", "method": "auto"}).encode()
    with pytest.raises(schema.RequestError, match="--index-calls"):
        schema.parse_search_request(body, n_items=500, has_cur=True, indexes={"cur"})
    assert registry.available(set()) == ["axn", "rnr", "gar"]
    assert "auto" in registry.available({"auto"})
    with pytest.raises(ValueError, match="unknown method 'bm42'"):
        registry.get("bm42")
    with pytest.raises(ValueError, match="needs a CUR index"):
        registry.check_available("adacur", set())
