"""The item mask in the engine (crossknn/features.h, crossknn/search.h): every kernel that chooses
items honours a per-query allow mask; every method run on the C++ loop never chooses, scores or
returns a disallowed item; a mask that allows at most B items is searched exactly with one CE
call per allowed item; one that allows fewer than k gives them all, padded with -1."""

from __future__ import annotations

import numpy as np
import pytest

from crossknn import _core
from crossknn.core import ItemFeatures, allowed_count, pack_allow, unpack_allow
from crossknn.retrievers import DenseRetriever, TfidfRetriever
from crossknn.scorers import MatrixScorer
from crossknn.search import ADACUR, ANNCUR, AXN, RNR, CurIndex
from crossknn.search.auto import AUTO, IndexCallBudget, build_auto_index
from crossknn.synthetic import synthetic_matrix
from crossknn.topk import exact_top_k
from shared_fixtures import RecordingScorer as Recording

N_Q, N_I = 30, 400
S, DQ, DI = synthetic_matrix(N_Q, N_I, rank=8, noise=0.2, de_dim=12, seed=5)
TRAIN, TEST = np.arange(0, 20), np.arange(20, N_Q)
INDEX = CurIndex.from_matrix(S, TRAIN, test_rows=TEST)
DE = DenseRetriever(DI, query_vectors=DQ)


def _auto():
    r = IndexCallBudget(MatrixScorer(S), list(TRAIN), 6 * N_I)
    idx = build_auto_index(
        r, list(TRAIN), DI, DQ[TRAIN], index_calls=6 * N_I, budgets=(40,), ks=(5,)
    )
    return AUTO(idx, prior=DQ, first=DE)


METHODS = {
    "rnr": lambda: RNR(DE),
    "anncur": lambda: ANNCUR(INDEX, split=0.5),
    "anncur-de": lambda: ANNCUR(INDEX, split=0.5, first=DE),
    "adacur": lambda: ADACUR(INDEX, rounds=4),
    "adacur-softmax": lambda: ADACUR(INDEX, rounds=4, strategy="softmax", first=DE),
    "adacur-split": lambda: ADACUR(INDEX, rounds=3, split=0.5),
    "axn": lambda: AXN(DI, rounds=4, first=DE, prior=DQ, mix=0.5),
    "auto": _auto,
}


def _masks(rng, fracs):
    """One random mask per test query, each at its own selectivity."""
    return [rng.random(N_I) < f for f in fracs]


# ---- the kernels ---------------------------------------------------------------------------


@pytest.mark.parametrize("storage", ["float32", "float16", "int8"])
@pytest.mark.parametrize("frac", [0.6, 0.1, 0.01])
def test_masked_kernels_equal_the_exclusion_of_the_disallowed_items(storage, frac):
    """top_k / sample_softmax / sample_random under a mask give the bits of the same call with
    every disallowed item excluded (the few-items path reads only the allowed rows)."""
    rng = np.random.default_rng(1)
    n, d = 3000, 24
    f = ItemFeatures(rng.standard_normal((n, d)).astype(np.float32), storage=storage)
    U = rng.standard_normal((3, d))
    allow = rng.random((3, n)) < frac
    allow[:, :5] = True  # at least k allowed
    scored = [rng.choice(np.flatnonzero(a), 2, replace=False) for a in allow]
    off = [np.concatenate([np.flatnonzero(~a), s]) for a, s in zip(allow, scored, strict=True)]
    for _ in range(2):  # the second top_k call goes through the prefilter (float32)
        s, i = f.top_k(U, 3, exclude=scored, allow=allow)
        s2, i2 = f.top_k(U, 3, exclude=off)
        np.testing.assert_array_equal(i, i2)
        np.testing.assert_array_equal(s, s2)
    k, i = f.sample_softmax(U, 3, exclude=scored, allow=allow, seed=7, temperature=0.5)
    k2, i2 = f.sample_softmax(U, 3, exclude=off, seed=7, temperature=0.5)
    np.testing.assert_array_equal(i, i2)
    np.testing.assert_array_equal(k, k2)
    for q in range(3):
        r = f.sample_random(3, exclude=scored[q], allow=allow[q], seed=q)
        assert allow[q][r].all() and not set(r) & set(scored[q]) and len(set(r)) == 3


def test_a_mask_shared_by_the_batch_and_one_per_query_agree():
    rng = np.random.default_rng(2)
    f = ItemFeatures(rng.standard_normal((500, 8)).astype(np.float32))
    U = rng.standard_normal((4, 8))
    a = rng.random(500) < 0.3
    np.testing.assert_array_equal(f.top_k(U, 5, allow=a)[1], f.top_k(U, 5, allow=[a] * 4)[1])
    np.testing.assert_array_equal(
        f.top_k(U, 5, allow=a)[1], f.top_k(U, 5, allow=pack_allow(a, 4, 500))[1]
    )


def test_pack_unpack_and_count():
    rng = np.random.default_rng(3)
    for n in (1, 63, 64, 65, 1000):
        a = rng.random((2, n)) < 0.5
        w = pack_allow(a, 2, n)
        assert w.dtype == np.uint64 and w.shape == (2, (n + 63) // 64)
        np.testing.assert_array_equal(unpack_allow(w, n), a)
        np.testing.assert_array_equal(allowed_count(w, n), a.sum(1))


def test_mask_errors_name_what_was_expected():
    f = ItemFeatures(np.eye(70, dtype=np.float32))
    with pytest.raises(ValueError, match=r"exceeds the 2 items allowed"):
        f.top_k(np.ones(70), 3, allow=np.eye(70, dtype=bool)[0] | np.eye(70, dtype=bool)[1])
    with pytest.raises(ValueError, match=r"allow must have shape \(70,\)"):
        f.top_k(np.ones(70), 1, allow=np.ones(69, bool))
    with pytest.raises(TypeError, match="boolean array"):
        f.top_k(np.ones(70), 1, allow=np.ones(70, np.int8))
    with pytest.raises(ValueError, match="2 uint64 words"):
        f._f.top_k(np.ones((1, 70), np.float32), 1, None, None, np.ones(3, np.uint64))


# ---- every method on the loop --------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(METHODS))
def test_no_method_chooses_scores_or_returns_a_disallowed_item(name):
    rng = np.random.default_rng(11)
    masks = _masks(rng, [0.9, 0.5, 0.3, 0.2, 0.6, 0.4, 0.8, 0.35, 0.25, 0.45])
    method, scorer, B, k = METHODS[name](), Recording(S), 40, 5
    res = method.search(scorer, list(TEST), budget=B, k=k, allow=masks)
    assert scorer.pairs, "nothing was scored"
    for q, item in scorer.pairs:
        assert masks[list(TEST).index(q)][item], f"{name}: query {q} scored disallowed item {item}"
    for row, m in zip(res.indices, masks, strict=True):
        assert (row >= 0).all() and m[row].all()
    assert (res.ce_calls <= B).all()


@pytest.mark.parametrize("name", sorted(METHODS))
def test_a_mask_of_at_most_b_items_gets_the_exact_top_k_with_one_call_each(name):
    rng = np.random.default_rng(12)
    B, k = 40, 5
    sizes = [40, 17, 5, 3, 0, 40, 1, 22, 8, 39]
    masks = []
    for m in sizes:
        a = np.zeros(N_I, bool)
        a[rng.choice(N_I, m, replace=False)] = True
        masks.append(a)
    method, scorer = METHODS[name](), Recording(S)
    res = method.search(scorer, list(TEST), budget=B, k=k, allow=masks)
    for j, (q, a) in enumerate(zip(TEST, masks, strict=True)):
        allowed = np.flatnonzero(a)
        assert res.ce_calls[j] == allowed.size
        assert sorted(i for qq, i in scorer.pairs if qq == q) == sorted(allowed.tolist())
        want = allowed[exact_top_k(S[q, allowed], min(k, allowed.size))]
        got = res.indices[j]
        np.testing.assert_array_equal(got[: want.size], want)
        assert (got[want.size :] == -1).all()  # fewer than k allowed: padded


def test_unmasked_queries_in_a_masked_batch_search_as_alone():
    """A query with no mask (None) in a batch with masked queries gets its unmasked result."""
    rng = np.random.default_rng(13)
    masks = [None if j % 2 else rng.random(N_I) < 0.3 for j in range(len(TEST))]
    for name in ("axn", "adacur", "auto"):
        alone = METHODS[name]().search(MatrixScorer(S), list(TEST), budget=40, k=5)
        mixed = METHODS[name]().search(MatrixScorer(S), list(TEST), budget=40, k=5, allow=masks)
        for j, m in enumerate(masks):
            if m is None:
                np.testing.assert_array_equal(mixed.indices[j], alone.indices[j])


def test_an_all_true_mask_gives_the_unmasked_result():
    for name in ("axn", "adacur", "rnr", "auto"):
        a = METHODS[name]().search(MatrixScorer(S), list(TEST), budget=40, k=5)
        b = METHODS[name]().search(
            MatrixScorer(S), list(TEST), budget=40, k=5, allow=np.ones(N_I, bool)
        )
        np.testing.assert_array_equal(a.indices, b.indices)
        np.testing.assert_array_equal(a.scores, b.scores)


def test_text_retrievers_rerank_within_the_mask():
    texts = [f"item {i} word{i % 7} other{i % 11}" for i in range(N_I)]
    tf = TfidfRetriever(texts, query_texts=[f"word{q % 7}" for q in range(N_Q)])
    rng = np.random.default_rng(14)
    masks = _masks(rng, [0.5] * len(TEST))
    scorer = Recording(S)
    res = RNR(tf).search(scorer, list(TEST), budget=30, k=5, allow=masks)
    assert all(masks[list(TEST).index(q)][i] for q, i in scorer.pairs)
    assert all(m[r].all() for r, m in zip(res.indices, masks, strict=True))


def test_the_loop_refuses_first_items_outside_the_mask():
    f = ItemFeatures(np.eye(70, dtype=np.float32))
    allow = pack_allow(np.arange(70) >= 10, 1, 70)
    with pytest.raises(ValueError, match="allow mask excludes"):
        _core.run_search(
            f._f,
            lambda qs, items: [np.zeros(len(i), np.float32) for i in items],
            [("first", 20)],
            [0],
            budget=20,
            k=5,
            first_items=np.arange(20, dtype=np.int64)[None],
            allow=allow,
        )


def test_a_retriever_without_allow_masks_is_refused_in_one_line():
    class OldRetriever:  # a retriever written before masks: retrieve(queries, k)
        n_items = N_I

        def retrieve(self, queries, k):
            return np.tile(np.arange(k), (len(queries), 1))

    masks = [np.arange(N_I) % 2 == 0] * len(TEST)
    with pytest.raises(TypeError, match="OldRetriever cannot search within a subset"):
        RNR(OldRetriever()).search(MatrixScorer(S), list(TEST), budget=40, k=5, allow=masks)
    # without masks it runs as before
    assert RNR(OldRetriever()).search(MatrixScorer(S), list(TEST), budget=40, k=5).indices.shape
