"""CMC: model shapes and permutation equivariance, training/resume, ONNX parity, runtime, errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

from shared_fixtures import lazy_importorskip

torch = lazy_importorskip("torch")

from crossknn.cli import main  # noqa: E402
from crossknn.cmc import CmcReranker, CmcRetriever  # noqa: E402
from crossknn.cmc.data import CmcData, matrix_data, sample_candidates  # noqa: E402
from crossknn.cmc.evaluate import ndcg_at, recall_at  # noqa: E402
from crossknn.cmc.export import export_onnx  # noqa: E402
from crossknn.retrievers import make_retriever  # noqa: E402
from crossknn.synthetic import write_synthetic_matrix  # noqa: E402
from shared_fixtures import lazy_module  # noqa: E402

# the model and its training import torch: imported when a test first uses them
cmc_model = lazy_module("crossknn.cmc.model")
cmc_train = lazy_module("crossknn.cmc.train")

DIM = 16
TINY = dict(k=12, pool=40, epochs=3, batch_size=4, checkpoint_every=2, seed=3)


def _unit(rng, shape):
    x = rng.standard_normal(shape).astype(np.float32)
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _model(seed=0, gate=0.5):
    torch.manual_seed(seed)
    m = cmc_model.CmcModel(cmc_model.CmcConfig(dim=DIM, layers=2, heads=2))
    with torch.no_grad():
        m.gate.fill_(gate)  # a non-trivial contextualization (the gate starts at 0)
    return m.eval()


@pytest.fixture(scope="module")
def synth(tmp_path_factory):
    folder = write_synthetic_matrix(
        tmp_path_factory.mktemp("cmc-matrix"), 24, 60, n_train=16, de_dim=DIM, seed=5
    )
    return folder


@pytest.fixture(scope="module")
def trained(synth, tmp_path_factory):
    out = tmp_path_factory.mktemp("cmc-model")
    info = cmc_train.train(
        matrix_data(synth),
        out,
        model_cfg=cmc_model.CmcConfig(dim=DIM, layers=2, heads=2),
        cfg=cmc_train.TrainConfig(**TINY),
        progress=False,
        threads=1,
    )
    export_onnx(out)
    return out, info


@pytest.mark.parametrize("k", [1, 7, 64])
@pytest.mark.parametrize("batch", [1, 3])
def test_model_shapes_any_k(k, batch):
    rng = np.random.default_rng(k)
    q, c = torch.from_numpy(_unit(rng, (batch, DIM))), torch.from_numpy(_unit(rng, (batch, k, DIM)))
    with torch.no_grad():
        s = _model()(q, c)
    assert s.shape == (batch, k)
    assert torch.isfinite(s).all()


def test_permuting_candidates_permutes_scores():
    rng = np.random.default_rng(1)
    q, c = torch.from_numpy(_unit(rng, (2, DIM))), torch.from_numpy(_unit(rng, (2, 9, DIM)))
    perm = torch.from_numpy(rng.permutation(9))
    m = _model()
    with torch.no_grad():
        a, b = m(q, c), m(q, c[:, perm])
    torch.testing.assert_close(b, a[:, perm], atol=1e-5, rtol=1e-5)


def test_candidates_interact_and_untrained_model_is_the_dual_encoder():
    rng = np.random.default_rng(2)
    q, c = torch.from_numpy(_unit(rng, (1, DIM))), torch.from_numpy(_unit(rng, (1, 6, DIM)))
    m = _model()
    with torch.no_grad():
        full, part = m(q, c), m(q, c[:, :3])
        # a candidate's score depends on the other candidates (self-attention over the set)
        assert not torch.allclose(full[:, :3], part, atol=1e-4)
        m.gate.zero_()  # the gated skip at 0: exactly scale * <q, c>
        de = (c @ q.unsqueeze(-1)).squeeze(-1) * m.log_scale.exp()
        torch.testing.assert_close(m(q, c), de, atol=1e-5, rtol=1e-5)


def test_model_rejects_bad_shapes():
    m = _model()
    with pytest.raises(ValueError, match="dim 16"):
        m(torch.zeros(1, 8), torch.zeros(1, 3, 8))
    with pytest.raises(ValueError, match=r"\(B, K, d\)"):
        m(torch.zeros(1, DIM), torch.zeros(3, DIM))
    with pytest.raises(ValueError, match="divisible"):
        cmc_model.CmcConfig(dim=10, heads=4)


def test_sample_candidates_top_sampled_and_gold():
    rng = np.random.default_rng(0)
    s = rng.standard_normal(100)
    c = sample_candidates(s, 20, n_top=10, pool=50, rng=np.random.default_rng(1))
    order = np.argsort(-s)
    assert c.size == 20 and np.unique(c).size == 20
    assert np.array_equal(c[:10], order[:10])
    assert np.isin(c[10:], order[10:50]).all()
    gold = np.array([int(order[-1])])  # the DE's worst item: never sampled from the pool
    g = sample_candidates(s, 20, n_top=10, pool=50, rng=np.random.default_rng(1), must=gold)
    assert g[-1] == gold[0] and np.array_equal(g[:19], c[:19])
    with pytest.raises(ValueError, match="only 100 items"):
        sample_candidates(s, 101, n_top=10, pool=50, rng=rng)


def test_training_writes_the_model_and_trains_the_gate(trained):
    out, info = trained
    assert info["finished"] and info["steps"] == 3 * 4  # 16 train rows / batch 4, 3 epochs
    assert (out / "model.pt").is_file() and (out / "model.onnx").is_file()
    saved = json.loads((out / "cmc.json").read_text())
    assert saved["onnx"]["parity"] <= 1e-4
    model, _ = cmc_train.load_model(out)
    assert float(model.gate.detach().abs().max()) > 0  # the contextualization was trained


def test_resume_gives_the_uninterrupted_result(synth, tmp_path):
    data = matrix_data(synth)
    mcfg = cmc_model.CmcConfig(dim=DIM, layers=1, heads=2)
    cmc_train.train(
        data,
        tmp_path / "a",
        model_cfg=mcfg,
        cfg=cmc_train.TrainConfig(**TINY),
        progress=False,
        threads=1,
    )
    part = cmc_train.train(
        data,
        tmp_path / "b",
        model_cfg=mcfg,
        cfg=cmc_train.TrainConfig(**TINY),
        progress=False,
        stop_after=5,
        threads=1,
    )
    assert not part["finished"] and not (tmp_path / "b" / "model.pt").exists()
    cmc_train.train(
        data,
        tmp_path / "b",
        model_cfg=mcfg,
        cfg=cmc_train.TrainConfig(**TINY),
        progress=False,
        threads=1,
    )
    a = torch.load(tmp_path / "a" / "model.pt", weights_only=True)
    b = torch.load(tmp_path / "b" / "model.pt", weights_only=True)
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_resume_refuses_a_checkpoint_of_another_encoder(synth, tmp_path):
    data = matrix_data(synth)
    mcfg = cmc_model.CmcConfig(dim=DIM, layers=1, heads=2)
    cmc_train.train(
        data,
        tmp_path,
        model_cfg=mcfg,
        cfg=cmc_train.TrainConfig(**TINY),
        progress=False,
        stop_after=1,
        threads=1,
    )
    other = CmcData(
        data.item_vectors,
        data.query_vectors,
        "another-encoder",
        data.train,
        data.test,
        "ce",
        scores=data.scores,
    )
    with pytest.raises(ValueError, match="another-encoder"):
        cmc_train.train(
            other,
            tmp_path,
            model_cfg=mcfg,
            cfg=cmc_train.TrainConfig(**TINY),
            progress=False,
            threads=1,
        )


@pytest.mark.parametrize("k", [1, 5, 60])
def test_onnx_runtime_matches_pytorch(trained, k):
    out, _ = trained
    model, _ = cmc_train.load_model(out)
    rng = np.random.default_rng(k)
    q, c = _unit(rng, (5, DIM)), _unit(rng, (5, k, DIM))
    with torch.no_grad():
        ref = model(torch.from_numpy(q), torch.from_numpy(c)).numpy()
    got = CmcReranker(out, batch_size=2).score(q, c)  # batched over queries
    assert got.shape == (5, k) and got.dtype == np.float32
    assert np.abs(got - ref).max() <= 1e-4


def test_retriever_reranks_de_candidates(trained, synth):
    out, _ = trained
    data = matrix_data(synth)
    ret = make_retriever(
        "cmc",
        cmc_model=out,
        item_vectors=data.item_vectors,
        query_vectors=data.query_vectors,
        cmc_candidates=20,
    )
    assert isinstance(ret, CmcRetriever)
    rows = data.test.tolist()
    got = ret.retrieve(rows, 10)
    cand, s = ret.scores(rows)
    de_top20 = make_retriever(
        "de", item_vectors=data.item_vectors, query_vectors=data.query_vectors
    ).retrieve(rows, 20)
    assert np.array_equal(cand, de_top20)
    for r in range(len(rows)):
        assert set(got[r]) <= set(cand[r])
        assert np.array_equal(got[r], cand[r][np.argsort(-s[r], kind="stable")[:10]])
    more = ret.retrieve(rows, 30)  # beyond K: CMC's K, then the DE's next items
    assert np.array_equal(
        more[:, 20:],
        make_retriever(
            "de", item_vectors=data.item_vectors, query_vectors=data.query_vectors
        ).retrieve(rows, 30)[:, 20:],
    )


def test_bad_inputs_have_clear_errors(trained, synth):
    out, _ = trained
    data = matrix_data(synth)
    with pytest.raises(ValueError, match="between 1 and the number of items"):
        CmcRetriever(out, data.item_vectors, query_vectors=data.query_vectors, candidates=61)
    with pytest.raises(ValueError, match="takes 16-dim vectors"):
        CmcRetriever(out, np.ones((60, 8), np.float32))
    with pytest.raises(ValueError, match="trained on vectors of encoder"):
        CmcRetriever(out, data.item_vectors, encoder_id="some-other-de")
    with pytest.raises(ValueError, match="must have dim 16"):
        CmcReranker(out).score(np.ones((1, 8), np.float32), np.ones((1, 4, 8), np.float32))
    with pytest.raises(ValueError, match="same encoder"):
        CmcData(
            data.item_vectors, np.ones((24, 8), np.float32), "x", [0], [1], "ce", scores=data.scores
        )
    with pytest.raises(ValueError, match="only 60 items"):
        cmc_train.train(
            data, out / "never", cfg=cmc_train.TrainConfig(k=61), progress=False, threads=1
        )
    with pytest.raises(ValueError, match="needs a trained model"):
        make_retriever("cmc", item_vectors=data.item_vectors)
    with pytest.raises(FileNotFoundError, match="cmc.json is missing"):
        CmcReranker(out / "nowhere")


def test_metrics_against_hand_values():
    rel = {3: 2, 7: 1}
    assert ndcg_at([3, 7, 1], rel, 10) == pytest.approx(1.0)
    want = (1 / np.log2(2) + 2 / np.log2(3)) / (2 / np.log2(2) + 1 / np.log2(3))
    assert ndcg_at([7, 3], rel, 10) == pytest.approx(want)
    assert recall_at([1, 2, 3], rel, 100) == 0.5 and recall_at([1], rel, 1) == 0.0


def test_cli_train_then_eval_first_cmc(synth, tmp_path, capsys):
    out = tmp_path / "m"
    assert (
        main(
            [
                "cmc",
                "train",
                "--matrix",
                str(synth),
                "--out",
                str(out),
                "--k",
                "12",
                "--pool",
                "40",
                "--epochs",
                "1",
                "--batch-size",
                "8",
                "--layers",
                "1",
                "--heads",
                "2",
                "--quiet",
            ]
        )
        == 0
    )
    assert (out / "model.onnx").is_file()
    js = tmp_path / "e.json"
    assert (
        main(
            [
                "eval",
                str(synth),
                "--method",
                "rnr",
                "--method",
                "adacur",
                "--first",
                "de",
                "--first",
                "cmc",
                "--cmc-model",
                str(out),
                "--cmc-candidates",
                "30",
                "--budget",
                "20",
                "--k",
                "5",
                "--json",
                str(js),
                "--no-plot",
                "--quiet",
            ]
        )
        == 0
    )
    rows = json.loads(js.read_text())["rows"]
    assert {(r["method"], r["first"]) for r in rows} == {
        ("rnr", "de"),
        ("rnr", "cmc"),
        ("adacur", "de"),
        ("adacur", "cmc"),
    }
    assert all(r["ce_calls_max"] <= 20 and 0 <= r["recall"] <= 1 for r in rows)
    capsys.readouterr()
    assert (
        main(
            [
                "cmc",
                "eval",
                str(out),
                "--matrix",
                str(synth),
                "--candidates",
                "30",
                "--budget",
                "20",
                "--k",
                "5",
                "--quiet",
            ]
        )
        == 0
    )
    assert "rnr (cmc)" in capsys.readouterr().out
    # a K larger than the corpus is a one-line user error
    assert (
        main(
            [
                "eval",
                str(synth),
                "--method",
                "rnr",
                "--first",
                "cmc",
                "--cmc-model",
                str(out),
                "--cmc-candidates",
                "999",
                "--budget",
                "20",
                "--k",
                "5",
                "--json",
                str(js),
                "--no-plot",
                "--quiet",
            ]
        )
        == 2
    )
    assert "between 1 and the number of items (60)" in capsys.readouterr().err


def test_gold_label_training_and_qrels_metrics(synth, tmp_path):
    from crossknn.cmc.evaluate import qrels_metrics, rank_cmc, rank_de

    m = matrix_data(synth)
    top3 = np.argsort(-m.scores, axis=1)[:, :3]  # "relevant" = the CE's top 3
    rel = {q: {int(i): 1 for i in top3[q]} for q in range(m.scores.shape[0])}
    gold = CmcData(
        m.item_vectors, m.query_vectors, m.encoder_id, m.train, m.test, "gold", relevant=rel
    )
    info = cmc_train.train(
        gold,
        tmp_path,
        model_cfg=cmc_model.CmcConfig(dim=DIM, layers=1, heads=2),
        cfg=cmc_train.TrainConfig(**TINY),
        progress=False,
        threads=1,
    )
    assert info["data"]["target"] == "gold" and info["finished"]
    export_onnx(tmp_path)
    test = gold.test.tolist()
    ranked = rank_cmc(gold, test, 20, CmcReranker(tmp_path), 30)
    assert ranked.shape == (len(test), 20)
    for name, r in (("cmc", ranked), ("de", rank_de(gold, test, 20))):
        got = qrels_metrics(r, test, gold)
        assert 0.0 <= got["ndcg@10"] <= 1.0 and got["n_queries"] == len(test), name
