"""``auto``'s learned prior: partial rows of other train queries, fitted, borrowed by neighbours."""

from dataclasses import replace

import numpy as np
import pytest

from crossknn.index.auto import (
    AUTO_ITEM_COV,
    AUTO_PRIOR_DELTAS,
    AUTO_PRIOR_VECTORS,
    AUTO_ROW_VECTORS,
    auto_index_of,
)
from crossknn.index.files import Index
from crossknn.retrievers import make_retriever
from crossknn.scorers import BudgetExceededError, MatrixScorer
from crossknn.search import auto as auto_mod
from crossknn.search.auto import (
    AUTO,
    PARTIAL_ITEMS,
    PRIOR_KERNEL_TAU,
    PRIOR_RIDGE,
    AutoIndex,
    IndexCallBudget,
    build_auto_index,
    fit_prior_ridge,
    partial_plan,
)
from crossknn.topk import topk_recall


def _topics(seed=0, K=16, per=20, N=400, d=16):
    """A query's CE row is ``V M_t q``: the item vectors times its topic's map of its DE vector,
    so the DE (``V q``) misses the CE in a way that DE-near queries share."""
    rng = np.random.default_rng(seed)
    topic = np.repeat(np.arange(K), per)
    Q = rng.standard_normal((K, d))[topic] + 0.4 * rng.standard_normal((K * per, d))
    Q /= np.linalg.norm(Q, axis=1, keepdims=True)
    V = rng.standard_normal((N, d)) / np.sqrt(d)
    M = np.eye(d) + 1.2 * rng.standard_normal((K, d, d)) / np.sqrt(d)
    U = np.einsum("qij,qj->qi", M[topic], Q)
    S = U @ V.T + 0.05 * rng.standard_normal((K * per, N))
    return S.astype(np.float32), Q.astype(np.float32), V.astype(np.float32)


def test_partial_plan():
    # nfcorpus-minilm-gpu at 1% of dense: test (1,677 train rows) and a pseudo split (1,377)
    assert partial_plan(60_930, 3633, 1677) == (16, 28)
    assert partial_plan(50_026, 3633, 1377) == (13, 27)
    # 32 rows' calls: 4% kept from the complete rows -> 30 rows and 72 partial rows
    assert partial_plan(32 * 3633, 3633, 1677) == (30, 72)
    # cross-validated (m >= 64), fewer than 2 rows, no partial items, rows over half of N, too
    # few other train queries: the complete rows alone, as before the learned prior
    assert partial_plan(64 * 3633, 3633, 1677) == (64, 0)
    assert partial_plan(7000, 3633, 1677) == (1, 0)
    assert partial_plan(60_930, 3633, 1677, 0) == (16, 0)
    assert partial_plan(10 * 150, 150, 500, 100) == (10, 0)
    assert partial_plan(60_930, 3633, 20) == (16, 0)
    assert partial_plan(60_930, 3633, 24) == (16, 8)
    with pytest.raises(ValueError, match="need index_calls >= 0"):
        partial_plan(-1, 3633, 10)


def test_fit_prior_ridge_is_the_primal_solve():
    rng = np.random.default_rng(3)
    X = rng.standard_normal((30, 12))
    a = rng.standard_normal(30)
    p0 = rng.standard_normal(12)
    pen = rng.uniform(0.05, 2.0, 12)
    w, c = fit_prior_ridge(X, a, p0, pen, eps=1e-3)
    Z = np.hstack([X, (X @ p0)[:, None]])
    theta = np.linalg.solve(Z.T @ Z + np.diag(np.r_[pen, 1e-3]), Z.T @ a)
    np.testing.assert_allclose(np.r_[w, c], theta, rtol=1e-8, atol=1e-10)


def _split(seed):
    S, Q, V = _topics(seed)
    perm = np.random.default_rng(seed).permutation(S.shape[0])
    return S, Q, V, np.sort(perm[60:]), np.sort(perm[:60])


def test_build_reads_partial_rows_within_the_budget():
    S, Q, V, train, test = _split(0)
    C = 4 * 400
    reader = IndexCallBudget(MatrixScorer(S), train.tolist(), C)
    idx = build_auto_index(reader, train.tolist(), V, Q[train], index_calls=C, partial_items=20)
    assert (idx.n_rows, idx.partial_rows) == partial_plan(C, 400, train.size, 20) == (3, 20)
    assert idx.index_calls == reader.calls == 3 * 400 + 20 * 20 <= C
    # the row queries and the partial-row queries, each fitted once, less those whose fitted
    # slope is not positive (here the CE map of a topic can turn a query against its DE vector)
    n = idx.prior_vectors.shape[0]
    assert 15 <= n <= 23 and idx.prior_deltas.shape == (n, 16 + 3 + idx.n_dirs + 1)
    hit = (idx.prior_vectors[:, None, :] == Q[train][None]).all(-1)
    assert np.all(hit.sum(1) == 1)  # each one a train query's DE vector, no test query's
    assert idx.meta()["learned_prior"] == n and idx.meta()["partial_rows"] == 20
    # no test query was read: the reader refuses them
    with pytest.raises(PermissionError):
        reader.score(int(test[0]), [0])
    with pytest.raises(BudgetExceededError):
        reader.score(int(np.setdiff1d(train, idx.row_ids)[0]), np.arange(400))
    # the prior: the DE vector plus the kernel ridge regression of the fitted queries'
    # corrections on their DE vectors, scaled to the query's spread
    assert (idx.prior_ridge, idx.prior_kernel_tau) == (PRIOR_RIDGE, PRIOR_KERNEL_TAU) == (0.1, 2)
    v = Q[test[0]].astype(np.float64)
    p = AUTO(idx, prior=Q).priors([int(test[0])])[0]
    W = idx.prior_vectors.astype(np.float64)
    Wn = W / np.linalg.norm(W, axis=1, keepdims=True)
    D = idx.prior_deltas.astype(np.float64)
    kern = np.exp(2.0 * (Wn @ Wn.T - 1.0))
    dual = np.linalg.solve(kern + 0.1 * np.eye(n), D - D.mean(0))
    k = np.exp(2.0 * (Wn @ (v / np.linalg.norm(v)) - 1.0))
    spread = np.std(V.astype(np.float64) @ v)
    ref = spread * (D.mean(0) + k @ dual)
    ref[:16] += v
    np.testing.assert_allclose(p, ref, rtol=1e-5, atol=1e-9)
    # it interpolates: a fitted query's own prior is close to its own correction
    u = W[n // 2]
    own = AUTO(idx, prior=W).priors([n // 2])[0]
    own[:16] -= u
    err = np.abs(own / np.std(V.astype(np.float64) @ u) - D[n // 2]).max()
    assert err < 0.2 * np.abs(D[n // 2]).max()
    # prior_ridge = 0 (the indexes built before the kernel ridge): the softmax average
    old = replace(idx, prior_ridge=0.0)
    cos = W @ v / (np.linalg.norm(W, axis=1) * np.linalg.norm(v))
    w = np.exp(old.prior_tau * (cos - cos.max()))
    ref = spread * (w / w.sum()) @ D
    ref[:16] += v
    np.testing.assert_allclose(AUTO(old, prior=Q).priors([int(test[0])])[0], ref, rtol=1e-5)
    assert idx.row_prior(v).shape == (3,) and not idx.row_prior(v).any()  # replaced


def test_learned_prior_lifts_recall_when_de_near_queries_share_the_ce_departure():
    """Equal index calls: 4 complete rows vs 3 + 20 partial rows of 20 entries (measured: B = 10
    0.347 / 0.308 / 0.360 -> 0.538 / 0.478 / 0.482, B = 20 0.777 / 0.722 / 0.795 -> 0.867 /
    0.843 / 0.867 on seeds 0-2)."""
    for seed in range(3):
        S, Q, V, train, test = _split(seed)
        de = make_retriever("de", item_vectors=V, query_vectors=Q)
        rec = {}
        for part in (0, 20):
            reader = IndexCallBudget(MatrixScorer(S), train.tolist(), 1600)
            idx = build_auto_index(
                reader, train.tolist(), V, Q[train], index_calls=1600, partial_items=part
            )
            assert reader.calls <= 1600 and (idx.prior_deltas is None) == (part == 0)
            for B in (10, 20):
                res = AUTO(idx, prior=Q, first=de).search(
                    MatrixScorer(S), test.tolist(), budget=B, k=10
                )
                assert res.ce_calls.max() <= B
                rec[part, B] = float(topk_recall(S, test, res.indices, 10).mean())
        assert rec[20, 10] >= rec[0, 10] + 0.08, (seed, rec)
        assert rec[20, 20] >= rec[0, 20] + 0.04, (seed, rec)


def test_default_partial_items_and_the_corpus_round_trip(monkeypatch):
    S, Q, V, train, _ = _split(1)
    monkeypatch.setattr(auto_mod, "PARTIAL_ITEMS", 20)  # read at call time, not at import
    idx = build_auto_index(
        IndexCallBudget(MatrixScorer(S), train.tolist(), 1600),
        train.tolist(),
        V,
        Q[train],
        index_calls=1600,
    )
    assert idx.partial_rows == 20 and PARTIAL_ITEMS == 100
    params = {"auto": idx.meta()}
    arrays = {
        "de_items": V,
        "auto_rows": idx.rows,
        AUTO_ROW_VECTORS: idx.row_vectors,
        "auto_query_dirs": idx.query_dirs,
        AUTO_ITEM_COV: idx.prior_tables()[2],
        AUTO_PRIOR_VECTORS: idx.prior_vectors,
        AUTO_PRIOR_DELTAS: idx.prior_deltas,
    }
    back = auto_index_of(Index("corpus", arrays, {}, params))
    assert back.partial_rows == 20
    qs = list(range(10))
    for a, b in zip(AUTO(back, prior=Q).priors(qs), AUTO(idx, prior=Q).priors(qs), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-12)
    assert (back.prior_ridge, back.prior_kernel_tau) == (0.1, 2.0)
    # an index built before the kernel ridge (no prior_ridge in its params) searches as it did:
    # the softmax average of the corrections
    new_keys = ("prior_ridge", "prior_kernel_tau")
    before = {k: v for k, v in params["auto"].items() if k not in new_keys}
    prev = auto_index_of(Index("corpus", arrays, {}, {"auto": before}))
    assert prev.prior_ridge == 0.0
    for a, b in zip(
        AUTO(prev, prior=Q).priors(qs),
        AUTO(replace(idx, prior_ridge=0.0), prior=Q).priors(qs),
        strict=True,
    ):
        np.testing.assert_allclose(a, b, rtol=1e-12)
    # an index without the learned prior's arrays searches with the row prior
    del arrays[AUTO_PRIOR_VECTORS], arrays[AUTO_PRIOR_DELTAS]
    old = auto_index_of(Index("corpus", arrays, {}, params))
    assert old.prior_deltas is None and old.row_prior(Q[0].astype(np.float64)).any()


def test_learned_prior_input_errors():
    S, Q, V, train, _ = _split(0)
    R = S[train[:3]]
    with pytest.raises(ValueError, match="needs both prior_vectors and prior_deltas"):
        AutoIndex(V, R, prior_vectors=Q[:5])
    with pytest.raises(ValueError, match=r"finite P x 16 vectors and P x 20 deltas"):
        AutoIndex(V, R, prior_vectors=Q[:5], prior_deltas=np.zeros((5, 19)))
    bad = np.zeros((5, 20))
    bad[1, 2] = np.nan
    with pytest.raises(ValueError, match=r"finite P x 16 vectors"):
        AutoIndex(V, R, prior_vectors=Q[:5], prior_deltas=bad)
    with pytest.raises(ValueError, match=r"need prior_ridge >= 0 and prior_kernel_tau > 0; got -1"):
        AutoIndex(V, R, prior_vectors=Q[:5], prior_deltas=np.zeros((5, 20)), prior_ridge=-1)
    ok = AutoIndex(V, R, prior_vectors=Q[:5], prior_deltas=np.zeros((5, 20)))
    v = Q[7].astype(np.float64)
    np.testing.assert_allclose(ok.prior_vector(v), np.r_[v, np.zeros(4)])  # zero corrections
    ok = AutoIndex(V, R, prior_vectors=Q[:5], prior_deltas=np.zeros((5, 20)), prior_ridge=0.1)
    np.testing.assert_allclose(ok.prior_vector(v), np.r_[v, np.zeros(4)])
