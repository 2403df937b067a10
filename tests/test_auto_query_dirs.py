"""``auto``'s query-subspace block: extra item features ``V A`` (A = the top eigendirections of the
train queries' DE vectors) with a zero prior, so the online correction is cheap along them."""

import numpy as np
import pytest

from crossknn.index.auto import AUTO_QUERY_DIRS, AUTO_ROW_VECTORS, auto_index_of
from crossknn.index.files import Index
from crossknn.retrievers import make_retriever
from crossknn.scorers import MatrixScorer
from crossknn.search import auto as auto_mod
from crossknn.search.auto import (
    AUTO,
    QUERY_DIRS,
    RHO_Q,
    AutoIndex,
    IndexCallBudget,
    build_auto_index,
    query_directions,
)
from crossknn.synthetic import synthetic_matrix
from crossknn.topk import topk_recall


def _subspace(seed=0, n=120, N=400, d=32, r=3):
    """Queries near an r-dim subspace of the d-dim DE space; the CE's query vector is q + M q with
    M mapping into that subspace: the CE departs from the DE along directions queries occupy."""
    rng = np.random.default_rng(seed)
    basis = np.linalg.qr(rng.standard_normal((d, r)))[0]
    Qv = rng.standard_normal((n, r)) @ basis.T + 0.05 * rng.standard_normal((n, d))
    Iv = rng.standard_normal((N, d))
    M = 2.0 * basis @ rng.standard_normal((r, r)) @ basis.T
    S = (Qv + Qv @ M.T) @ Iv.T + 0.1 * rng.standard_normal((n, N))
    return S.astype(np.float32), Qv.astype(np.float32), Iv.astype(np.float32), basis


def test_query_directions_are_the_scaled_top_eigendirections():
    S, Qv, Iv, basis = _subspace()
    A = query_directions(Qv, 5, var=600.0)
    assert A.shape == (32, 5) and A.dtype == np.float32
    C = Qv.astype(np.float64).T @ Qv / len(Qv)
    ev = np.linalg.eigvalsh(C)[::-1]
    # column j: unit eigenvector x sqrt(var x eigenvalue_j / trace), columns orthogonal
    np.testing.assert_allclose(
        np.sum(A.astype(np.float64) ** 2, 0), 600.0 * ev[:5] / ev.sum(), 1e-4
    )
    G = A.T.astype(np.float64) @ A
    np.testing.assert_allclose(G - np.diag(np.diag(G)), 0, atol=1e-3)
    # the first three span the queries' subspace
    P = basis @ basis.T
    top = A[:, :3] / np.linalg.norm(A[:, :3], axis=0)
    np.testing.assert_allclose(np.linalg.norm(P @ top, axis=0), 1.0, atol=1e-2)
    np.testing.assert_array_equal(A, query_directions(Qv[::-1], 5, var=600.0))  # order-free
    assert query_directions(Qv[:2], 5).shape == (32, 2)  # at most as many as queries
    assert query_directions(Qv, 0).shape == (32, 0)
    with pytest.raises(ValueError, match="need r >= 0 and var > 0; got r=-1"):
        query_directions(Qv, -1)
    with pytest.raises(ValueError, match=r"finite \(n x d\) matrix; got shape \(32,\)"):
        query_directions(Qv[0], 3)


def test_query_block_lifts_recall_when_the_ce_departs_along_query_directions():
    S, Qv, Iv, _ = _subspace()
    train, test = np.arange(60), list(range(60, 120))
    de = make_retriever("de", item_vectors=Iv, query_vectors=Qv)

    def recall(dirs, budget):
        idx = AutoIndex(
            Iv, np.zeros((0, Iv.shape[0])), rho_d=0.3, rounds=5, first_share=None, query_dirs=dirs
        )
        res = AUTO(idx, prior=Qv, first=de).search(MatrixScorer(S), test, budget=budget, k=10)
        assert res.ce_calls.max() <= budget
        return topk_recall(S, test, res.indices, 10).mean()

    A = query_directions(Qv[train], QUERY_DIRS)
    # measured: B = 10 0.350 -> 0.673, B = 20 0.685 -> 1.000 (no block -> the block)
    assert recall(A, 10) >= recall(None, 10) + 0.2
    assert recall(A, 20) >= recall(None, 20) + 0.2


def test_query_block_features_penalties_prior_and_errors():
    S, Qv, Iv, _ = _subspace()
    rows = [0, 5, 9]
    A = query_directions(Qv, 4)
    idx = AutoIndex(Iv, S[rows], row_vectors=Qv[rows], prior_alpha=3.0, query_dirs=A)
    d, m, N = Iv.shape[1], len(rows), Iv.shape[0]
    X = idx.features()
    assert X.shape == (N, d + m + 4 + 1) and idx.n_dirs == 4 and idx.meta()["query_dirs"] == 4
    np.testing.assert_allclose(X[:, d + m : d + m + 4], Iv.astype(np.float64) @ A, rtol=1e-5)
    np.testing.assert_array_equal(idx.penalties()[d + m : d + m + 4], RHO_Q)
    v = Qv[7].astype(np.float64)
    p0 = AUTO(idx, prior=Qv).priors([7])[0]
    np.testing.assert_allclose(p0, np.r_[v, idx.row_prior(v), np.zeros(4), 0.0])
    # without the block: the earlier features, penalties and prior exactly
    old = AutoIndex(Iv, S[rows], row_vectors=Qv[rows], prior_alpha=3.0)
    np.testing.assert_array_equal(X[:, : d + m], old.features()[:, : d + m])
    assert old.features().shape == (N, d + m + 1) and old.n_dirs == 0
    with pytest.raises(ValueError, match=r"finite \(32 x r\) matrix; got shape \(31, 4\)"):
        AutoIndex(Iv, S[rows], query_dirs=A[1:])
    with pytest.raises(ValueError, match="finite"):
        AutoIndex(Iv, S[rows], query_dirs=np.full((32, 2), np.nan))


def test_build_adds_the_block_from_all_train_queries_and_the_index_keeps_it(monkeypatch):
    monkeypatch.setattr(auto_mod, "GRID_D", (0.3,))
    monkeypatch.setattr(auto_mod, "GRID_R", (1.0,))
    monkeypatch.setattr(auto_mod, "GRID_ROUNDS", (5,))
    S, dq, di = synthetic_matrix(30, 120, rank=5, de_dim=8, seed=2)
    train = list(range(20))

    def build(C, **kw):
        r = IndexCallBudget(MatrixScorer(S), train, C)
        idx = build_auto_index(r, train, di, dq[train], index_calls=C, budgets=(20,), ks=(5,), **kw)
        assert r.calls <= C
        return idx

    idx = build(480)
    assert idx.n_rows == 4 and idx.n_dirs == min(QUERY_DIRS, 8)
    np.testing.assert_array_equal(idx.query_dirs, query_directions(dq[train], QUERY_DIRS))
    assert build(480, query_dirs=0).query_dirs is None  # switched off: the earlier index
    assert build(120).query_dirs is None  # one row: no cross-validation, the defaults as before
    # the corpus index round trip; an index built before the block searches without it
    params = {"auto": idx.meta()}
    arrays = {"de_items": di, "auto_rows": idx.rows, AUTO_ROW_VECTORS: idx.row_vectors}
    arrays[AUTO_QUERY_DIRS] = idx.query_dirs
    back = auto_index_of(Index("corpus", arrays, {}, params))
    np.testing.assert_array_equal(back.query_dirs, idx.query_dirs)
    np.testing.assert_array_equal(back.features(), idx.features())
    del arrays[AUTO_QUERY_DIRS]
    assert auto_index_of(Index("corpus", arrays, {}, params)).n_dirs == 0
