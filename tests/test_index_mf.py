"""Sparse matrix G sampling, the MF fit (transductive / inductive), normalization, MF/CUR builds."""

from __future__ import annotations

import numpy as np
import pytest

from crossknn.index import build_cur_index, build_mf_index, fit_mf, load_index, sample_g
from crossknn.index.mf import mf_score_map, query_embeddings
from crossknn.index.mf_fit import gated_mlp_numpy
from crossknn.jobs import JobOptions
from crossknn.topk import topk_by_vectors
from test_jobs_scorer import LookupScorer


def _moments_map(ce, approx):
    """[scale, offset] of the map whose inverse gives ``ce`` the mean and std of ``approx``:
    (ce - offset) / scale has mean(approx) and std(approx)."""
    ce, approx = np.asarray(ce, np.float64), np.asarray(approx, np.float64)
    scale = ce.std() / approx.std()
    return [scale, ce.mean() - scale * approx.mean()]


def _synthetic(n_q=12, n_i=60, d=8, seed=0):
    """Low-rank 'CE' scores plus DE vectors that are a noisy view of the true factors."""
    rng = np.random.default_rng(seed)
    Uq = rng.standard_normal((n_q, d)).astype(np.float32) / np.sqrt(d)
    Vi = rng.standard_normal((n_i, d)).astype(np.float32)
    S = Uq @ Vi.T
    DQ = (Uq + 0.3 * rng.standard_normal(Uq.shape) / np.sqrt(d)).astype(np.float32)
    DI = (Vi + 0.3 * rng.standard_normal(Vi.shape)).astype(np.float32)
    return S.astype(np.float32), DQ, DI


@pytest.mark.parametrize("block", [1, 7, 1000])
def test_topk_by_vectors_matches_brute_force(block):
    rng = np.random.default_rng(1)
    A, B = rng.standard_normal((5, 4)), rng.standard_normal((33, 4))
    B[10] = B[3]  # a tie: the lower index wins
    got = topk_by_vectors(A, B, 6, block=block)
    S = A @ B.T
    want = np.stack([np.lexsort((np.arange(33), -s))[:6] for s in S])
    np.testing.assert_array_equal(got, want)


def test_sample_g_strategies():
    rng = np.random.default_rng(0)
    Q, It = rng.standard_normal((4, 3)), rng.standard_normal((20, 3))
    qp, it = sample_g(4, 20, 5, vectors=(Q, It))
    assert len(qp) == 20 and np.all(np.bincount(qp) == 5)
    for q in range(4):
        assert set(it[qp == q]) == set(np.argsort(-(Q[q] @ It.T))[:5])
    qp, it = sample_g(4, 20, 2, per="item", strategy="uniform", seed=3)
    assert np.all(np.bincount(it, minlength=20) == 2)
    pairs = set(zip(qp.tolist(), it.tolist(), strict=True))
    assert len(pairs) == 40  # distinct queries per item
    again = sample_g(4, 20, 2, per="item", strategy="uniform", seed=3)
    np.testing.assert_array_equal(again[0], qp)
    assert np.all(np.diff(qp) >= 0)  # sorted by query: one CE batch per query in a shard
    qp, it = sample_g(4, 20, 2, per="item", vectors=(Q, It))
    for i in range(20):
        assert set(qp[it == i]) == set(np.argsort(-(It[i] @ Q.T))[:2])
    with pytest.raises(ValueError, match=r"k_d must be in \[1, 20\]"):
        sample_g(4, 20, 21, strategy="uniform")
    with pytest.raises(ValueError, match="needs vectors"):
        sample_g(4, 20, 3)


@pytest.mark.parametrize("mode", ["transductive", "inductive"])
def test_fit_lowers_loss_and_is_seeded(mode):
    S, DQ, DI = _synthetic()
    qp, it = sample_g(12, 60, 30, strategy="uniform", seed=1)
    kw = dict(de_queries=DQ, de_items=DI, mode=mode, epochs=25, lr=0.01, batch_size=64, seed=4)
    r = fit_mf(qp, it, S[qp, it], **kw)
    assert r.item_embeddings.shape == (60, 8) and r.query_embeddings.shape == (12, 8)
    assert len(r.loss_curve) == 26 and r.loss_curve[-1] < 0.5 * r.loss_curve[0]
    pred = np.einsum("ij,ij->i", r.query_embeddings[qp], r.item_embeddings[it])
    assert np.mean((pred - S[qp, it]) ** 2) == pytest.approx(r.loss_curve[-1], rel=1e-4)
    r2 = fit_mf(qp, it, S[qp, it], **kw)
    np.testing.assert_array_equal(r.item_embeddings, r2.item_embeddings)
    if mode == "inductive":
        assert set(r.mlp) == {f"{t}_{n}" for t in "qi" for n in ("W1", "b1", "W2", "b2", "w_skip")}
        assert r.mlp["q_W1"].shape == (16, 8)
        # the numpy encoder reproduces the torch one
        m = r.mlp
        np.testing.assert_allclose(
            gated_mlp_numpy(DI, m["i_W1"], m["i_b1"], m["i_W2"], m["i_b2"], m["i_w_skip"]),
            r.item_embeddings,
            atol=1e-5,
        )
    else:
        assert not r.mlp


def test_fit_zero_epochs_transductive_keeps_de_and_normalizes():
    S, DQ, DI = _synthetic()
    qp, it = sample_g(12, 60, 10, vectors=(DQ, DI))
    r = fit_mf(qp, it, S[qp, it] * 3 + 1, de_queries=DQ, de_items=DI, epochs=0, normalize=True)
    np.testing.assert_array_equal(r.item_embeddings, DI)
    de_g = np.einsum("ij,ij->i", DQ[qp], DI[it])
    np.testing.assert_allclose(r.score_map.to_list(), _moments_map(S[qp, it] * 3 + 1, de_g), 1e-5)
    z = r.score_map.to_approx(S[qp, it] * 3 + 1)
    assert z.mean() == pytest.approx(de_g.mean(), abs=1e-5)
    assert z.std() == pytest.approx(de_g.std(), rel=1e-5)
    assert r.loss_curve[0] == pytest.approx(np.mean((de_g - z) ** 2), rel=1e-4)


def test_fit_rejects_bad_input():
    S, DQ, DI = _synthetic()
    with pytest.raises(ValueError, match="mode"):
        fit_mf([0], [0], [1.0], de_queries=DQ, de_items=DI, mode="svd")
    with pytest.raises(ValueError, match="items up to 60"):
        fit_mf([0], [60], [1.0], de_queries=DQ, de_items=DI)
    with pytest.raises(ValueError, match="NaN"):
        fit_mf([0], [1], [np.nan], de_queries=DQ, de_items=DI)
    with pytest.raises(ValueError, match="share d"):
        fit_mf([0], [1], [1.0], de_queries=DQ, de_items=DI[:, :3])


@pytest.mark.parametrize("mode", ["transductive", "inductive"])
def test_build_mf_index_end_to_end(tmp_path, mode):
    S, DQ, DI = _synthetic(n_q=10, n_i=40)
    train = [1, 3, 5, 7]
    scorer = LookupScorer(S)
    idx, res = build_mf_index(
        tmp_path / "mf",
        scorer,
        train,
        de_queries=DQ[train],
        de_items=DI,
        k_d=6,
        mode=mode,
        epochs=3,
        normalize=True,
        options=JobOptions(shard_pairs=5, progress=False),
        de={"model_id": "de", "model_hash": "x"},
    )
    assert idx.kind == "mf" and idx.ce_calls == 24 == scorer.pairs
    assert idx.models["ce"] == {"model_id": "lookup", "model_hash": scorer.model_hash}
    np.testing.assert_array_equal(
        idx["g_scores"], S[np.array(train)[idx["g_query_pos"]], idx["g_items"]]
    )
    np.testing.assert_array_equal(idx["items"], res.item_embeddings)
    assert idx.params["mode"] == mode
    assert idx.params["score_map"] == res.score_map.to_list()
    # the normalization matches the moments of the CE scores of G to those of the DE scores
    de_g = np.einsum("ij,ij->i", DQ[train][idx["g_query_pos"]], DI[idx["g_items"]])
    np.testing.assert_allclose(idx.params["score_map"], _moments_map(idx["g_scores"], de_g), 1e-5)
    assert len(idx.info["loss_curve"]) == 4
    loaded = load_index(tmp_path / "mf", kind="mf", ce=scorer)
    assert mf_score_map(loaded) == res.score_map
    q = query_embeddings(loaded, DQ[train])
    np.testing.assert_allclose(
        q, res.query_embeddings if mode == "inductive" else DQ[train], atol=1e-5
    )


def test_build_cur_index(tmp_path):
    S = np.random.default_rng(2).standard_normal((9, 25)).astype(np.float32)
    scorer = LookupScorer(S)
    idx = build_cur_index(
        tmp_path / "cur",
        scorer,
        [8, 0, 4],
        query_ids=["q8", "q0", "q4"],
        options=JobOptions(shard_pairs=10, progress=False),
    )
    np.testing.assert_array_equal(idx["R"], S[[8, 0, 4]])
    assert idx.ce_calls == 75 and idx.info["anchor_query_ids"] == ["q8", "q0", "q4"]
    assert isinstance(idx["R"], np.memmap)


def test_cur_build_resumes_from_kept_job(tmp_path):
    S = np.random.default_rng(3).standard_normal((4, 30)).astype(np.float32)
    first = LookupScorer(S)
    build_cur_index(
        tmp_path / "cur",
        first,
        [0, 1, 2],
        options=JobOptions(shard_pairs=8, progress=False, keep_job=True),
    )
    assert (tmp_path / "cur" / ".job" / "manifest.json").exists()
    again = LookupScorer(S)
    idx = build_cur_index(
        tmp_path / "cur", again, [0, 1, 2], options=JobOptions(shard_pairs=8, progress=False)
    )
    assert again.pairs == 0  # every shard was already done
    assert not (tmp_path / "cur" / ".job").exists()
    np.testing.assert_array_equal(idx["R"], S[:3])


def test_cur_job_of_another_model_is_not_reused(tmp_path):
    S = np.random.default_rng(4).standard_normal((3, 12)).astype(np.float32)
    a = {"model_id": "m", "model_hash": "a" * 64}
    build_cur_index(
        tmp_path / "cur",
        LookupScorer(S),
        [0, 1],
        ce=a,
        options=JobOptions(progress=False, keep_job=True),
    )
    with pytest.raises(ValueError, match="different job"):
        build_cur_index(
            tmp_path / "cur",
            LookupScorer(S),
            [0, 1],
            options=JobOptions(progress=False),
            ce={"model_id": "m", "model_hash": "b" * 64},
        )
