"""``auto``'s row prior: a query starts from the CE rows of its DE neighbours among row queries."""

import numpy as np
import pytest

from crossknn.index.auto import AUTO_ITEM_COV, AUTO_ROW_VECTORS, auto_index_of
from crossknn.index.files import Index
from crossknn.retrievers import make_retriever
from crossknn.scorers import MatrixScorer
from crossknn.search import auto as auto_mod
from crossknn.search.auto import (
    AUTO,
    PRIOR_ALPHA,
    AutoIndex,
    IndexCallBudget,
    build_auto_index,
    item_covariance,
)
from crossknn.synthetic import synthetic_matrix
from crossknn.topk import topk_recall


def _topics(seed=0, K=6, per=10, N=300, d=16):
    """Queries in K topics: a query's CE row is its topic's (heavy-tailed) row plus noise; its DE
    vector finds its topic's queries, but the DE item vectors know nothing of the CE rows."""
    rng = np.random.default_rng(seed)
    A = rng.standard_normal((K, N)) ** 3
    topic = np.repeat(np.arange(K), per)
    S = (A[topic] + 0.3 * rng.standard_normal((K * per, N))).astype(np.float32)
    Qv = rng.standard_normal((K, d))[topic] + 0.3 * rng.standard_normal((K * per, d))
    Iv = rng.standard_normal((N, d))
    Qv /= np.linalg.norm(Qv, axis=1, keepdims=True)
    Iv /= np.linalg.norm(Iv, axis=1, keepdims=True)
    rows = [t * per for t in range(K)]  # one row query per topic
    return S, Qv.astype(np.float32), Iv.astype(np.float32), rows


def test_row_prior_points_at_the_nearest_row_query():
    S, Qv, Iv, rows = _topics()
    idx = AutoIndex(Iv, S[rows], row_vectors=Qv[rows], prior_alpha=3.0)
    v = Qv[rows[2]].astype(np.float64)
    p = idx.row_prior(v)
    assert p.shape == (len(rows),) and np.argmax(p) == 2 and np.all(p >= 0)
    # alpha x the spread of the query's DE scores, shared out by the softmax weights
    np.testing.assert_allclose(p.sum(), 3.0 * np.std(Iv.astype(np.float64) @ v), rtol=1e-6)
    prior = AUTO(idx, prior=Qv).priors([rows[2]])[0]
    np.testing.assert_allclose(prior, np.r_[v, p, 0.0])
    plain = AutoIndex(Iv, S[rows], row_vectors=Qv[rows])  # alpha 0: the plain DE prior
    assert not plain.row_prior(v).any()


def test_row_prior_equals_the_std_of_the_de_scores():
    """The spread from the cached item covariance (sqrt(v C v)) is np.std(V v) of the old code up
    to float64 rounding, for unit and far-from-unit query vectors and a mean far from zero."""
    from ref_rounds import auto_row_prior

    S, Qv, Iv, rows = _topics()
    Iv = Iv + 3.0  # a large common mean: the covariance must centre it
    idx = AutoIndex(Iv, S[rows], row_vectors=Qv[rows], prior_alpha=3.0)
    rng = np.random.default_rng(5)
    for scale in (1.0, 1e-6, 1e4):
        for v in rng.standard_normal((20, Iv.shape[1])) * scale:
            np.testing.assert_allclose(idx.row_prior(v), auto_row_prior(idx, v), rtol=1e-12)
    C = auto_mod.item_covariance(Iv)
    np.testing.assert_allclose(C, np.cov(Iv.astype(np.float64).T, bias=True), rtol=1e-12)
    assert idx.prior_tables()[2] is idx.prior_tables()[2]  # computed once


def test_row_prior_lifts_recall_when_the_de_misses_the_ce():
    S, Qv, Iv, rows = _topics()
    test = [q for q in range(S.shape[0]) if q not in rows]
    de = make_retriever("de", item_vectors=Iv, query_vectors=Qv)

    def recall(alpha, budget):
        idx = AutoIndex(
            Iv, S[rows], rounds=5, first_share=None, row_vectors=Qv[rows], prior_alpha=alpha
        )
        res = AUTO(idx, prior=Qv, first=de).search(MatrixScorer(S), test, budget=budget, k=10)
        assert res.ce_calls.max() <= budget
        return topk_recall(S, test, res.indices, 10).mean()

    # measured: B = 10 0.294 -> 0.739, B = 20 0.883 -> 0.985 (alpha 0 -> 3)
    assert recall(3.0, 10) >= recall(0.0, 10) + 0.3
    assert recall(3.0, 20) >= recall(0.0, 20) + 0.05


def test_row_prior_input_errors():
    S, Qv, Iv, rows = _topics()
    with pytest.raises(ValueError, match="needs the row queries' DE vectors"):
        AutoIndex(Iv, S[rows], prior_alpha=1.0)
    with pytest.raises(ValueError, match="row vectors must be 6 finite DE vectors"):
        AutoIndex(Iv, S[rows], row_vectors=Qv[:5], prior_alpha=1.0)
    with pytest.raises(ValueError, match="prior_alpha >= 0"):
        AutoIndex(Iv, S[rows], row_vectors=Qv[rows], prior_alpha=-1.0)
    AutoIndex(Iv, S[:0], prior_alpha=1.0)  # no rows: nothing to point at, nothing needed


def test_build_keeps_the_row_vectors_and_the_default_alpha(monkeypatch):
    monkeypatch.setattr(auto_mod, "GRID_D", (0.3,))
    monkeypatch.setattr(auto_mod, "GRID_R", (1.0,))
    monkeypatch.setattr(auto_mod, "GRID_ROUNDS", (5,))
    S, dq, di = synthetic_matrix(30, 120, rank=5, de_dim=8, seed=2)
    train = list(range(20))
    idx = build_auto_index(
        IndexCallBudget(MatrixScorer(S), train, 480),
        train,
        di,
        dq[train],
        index_calls=480,
        budgets=(20,),
        ks=(5,),
    )
    np.testing.assert_array_equal(idx.row_vectors, dq[idx.row_ids])
    assert idx.prior_alpha == PRIOR_ALPHA == idx.meta()["prior_alpha"]
    # the corpus index round trip: with the row vectors the prior comes back, without (an index
    # built before the row prior) search keeps the plain DE prior
    params = {"auto": idx.meta()}
    arrays = {"de_items": di, "auto_rows": idx.rows, AUTO_ROW_VECTORS: idx.row_vectors}
    back = auto_index_of(Index("corpus", arrays, {}, params))
    assert back.prior_alpha == PRIOR_ALPHA
    np.testing.assert_array_equal(back.row_vectors, idx.row_vectors)
    # without a stored covariance it is computed on first use; a stored one is used as it is
    np.testing.assert_array_equal(back.prior_tables()[2], item_covariance(di))
    arrays[AUTO_ITEM_COV] = np.full((di.shape[1], di.shape[1]), 0.5)
    kept = auto_index_of(Index("corpus", arrays, {}, params))
    assert np.all(kept.prior_tables()[2] == 0.5)
    arrays[AUTO_ITEM_COV] = np.zeros((3, 3))
    with pytest.raises(ValueError, match="item covariance must be a finite 8 x 8 matrix"):
        auto_index_of(Index("corpus", arrays, {}, params))
    del arrays[AUTO_ITEM_COV]
    del arrays[AUTO_ROW_VECTORS]
    old = auto_index_of(Index("corpus", arrays, {}, params))
    assert old.prior_alpha == 0.0 and old.row_vectors is None


def test_prior_products_on_one_thread_equal_numpy():
    """The core's products behind the prior (crossknn/prior.h) against numpy in float64, and
    ``AutoIndex.spread`` through the packed factor against ``sqrt(v C v)``; bad shapes refused."""
    from crossknn import _core
    from crossknn.search.auto import packed_cholesky

    rng = np.random.default_rng(3)
    for m, d in ((1, 1), (7, 9), (167, 384)):
        A = rng.standard_normal((m, d)).astype(np.float32)
        v = rng.standard_normal(d)
        np.testing.assert_allclose(
            _core.rows_dot(A, v), A.astype(np.float64) @ v, rtol=1e-12, atol=1e-12
        )
        B = rng.standard_normal((4 * d + 3, d))
        C = B.T @ B / B.shape[0]
        ap = packed_cholesky(C)
        assert ap.shape == (d * (d + 1) // 2,)
        assert _core.packed_lower_t_norm2(ap, v) == pytest.approx(float(v @ C @ v), rel=1e-10)
    with pytest.raises(ValueError, match="needs a vector of 9 values"):
        _core.rows_dot(np.zeros((2, 9), np.float32), np.zeros(8))
    with pytest.raises(ValueError, match=r"d \(d \+ 1\) / 2 = 45"):
        _core.packed_lower_t_norm2(np.zeros(44), np.zeros(9))
    # no factor (fewer items than dimensions): the spread from C itself, as np.std(V v)
    V = rng.standard_normal((5, 12)).astype(np.float32)
    idx = AutoIndex(V, np.zeros((0, 5), np.float32))
    assert packed_cholesky(item_covariance(V)) is False
    v = rng.standard_normal(12)
    assert idx.spread(v) == pytest.approx(float(np.std(V.astype(np.float64) @ v)), rel=1e-9)
    V = rng.standard_normal((300, 12)).astype(np.float32)
    idx = AutoIndex(V, np.zeros((0, 300), np.float32))
    assert idx.spread(v) == pytest.approx(float(np.std(V.astype(np.float64) @ v)), rel=1e-9)
