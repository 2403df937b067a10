"""The `crossknn score-matrix` and `crossknn index` commands, with the embedded CE and on the
shared CISI matrix."""

from __future__ import annotations

import json

import numpy as np
import pytest

from crossknn.cli import main
from crossknn.index import load_index
from crossknn.index.files import ModelMismatchError
from crossknn.matrix import make_splits, matrix_identity


def test_splits_reproduce_the_shared_matrix(shared_dir):
    want = json.loads((shared_dir / "matrices/cisi-minilm/splits.json").read_text())
    assert make_splits(112, 50, 0) == want


@pytest.mark.slow
@pytest.mark.data
def test_score_matrix_reproduces_cisi_subset(shared_dir, tmp_path):
    ref = shared_dir / "matrices/cisi-minilm"
    out = tmp_path / "m"
    rc = main(
        [
            "score-matrix",
            str(shared_dir / "data/cisi"),
            str(out),
            "--query-ids",
            "1,8",
            "--n-items",
            "40",
            "--shard-pairs",
            "32",
            "--quiet",
        ]
    )
    assert rc == 0
    names = {
        "scores.npy",
        "query_ids.json",
        "item_ids.json",
        "splits.json",
        "de_queries.npy",
        "de_items.npy",
        "meta.json",
    }
    assert {p.name for p in out.iterdir()} == names  # the job folder is gone
    S = np.load(out / "scores.npy")
    assert S.dtype == np.float32 and S.shape == (2, 40)
    np.testing.assert_allclose(S, np.load(ref / "scores.npy")[[0, 7], :40], atol=1e-4, rtol=0)
    np.testing.assert_allclose(
        np.load(out / "de_queries.npy"), np.load(ref / "de_queries.npy")[[0, 7]], atol=1e-4, rtol=0
    )
    np.testing.assert_allclose(
        np.load(out / "de_items.npy"), np.load(ref / "de_items.npy")[:40], atol=1e-4, rtol=0
    )
    assert json.loads((out / "query_ids.json").read_text()) == ["1", "8"]
    assert json.loads((out / "item_ids.json").read_text()) == [str(i) for i in range(1, 41)]
    meta = json.loads((out / "meta.json").read_text())
    assert meta["dataset"] == "cisi" and meta["ce"]["model_id"] == "minilm-l6-joint"
    assert meta["ce_calls"] == 80 and meta["precision"] == "fp32"
    # an index built from this matrix carries the real CE's identity
    ce, de = matrix_identity(out)
    assert ce == meta["ce"] and de == meta["de_model"]


@pytest.mark.data
def test_index_commands_on_the_shared_matrix(shared_dir, tmp_path, capsys):
    m = shared_dir / "matrices/cisi-minilm"
    assert main(["index", "cur", str(m), str(tmp_path / "cur"), "--n-train", "5", "--quiet"]) == 0
    ce, de = matrix_identity(m)
    cur = load_index(tmp_path / "cur", kind="cur", ce=ce)
    rows = cur.info["train_rows"]
    assert len(rows) == 5 and set(rows) <= set(json.loads((m / "splits.json").read_text())["train"])
    np.testing.assert_array_equal(cur["R"], np.load(m / "scores.npy")[rows])
    assert cur.ce_calls == 5 * 1460
    with pytest.raises(ModelMismatchError):
        load_index(tmp_path / "cur", ce={"model_id": "minilm-l6-joint", "model_hash": "0" * 64})

    assert (
        main(
            [
                "index",
                "mf",
                str(m),
                str(tmp_path / "mf"),
                "--k-d",
                "10",
                "--epochs",
                "2",
                "--normalize",
                "--quiet",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "620 CE calls" in out and "loss (MSE on G) by epoch:" in out
    mf = load_index(tmp_path / "mf", kind="mf", ce=ce, de=de)
    assert mf["items"].shape == (1460, 384) and mf.params["mode"] == "inductive"
    assert len(mf.info["loss_curve"]) == 3
    # G: 10 items per train query, scored from the matrix; --normalize: the score map gives the
    # CE scores of G the mean and std of the DE scores of the same pairs
    rows = np.asarray(mf.info["train_rows"])
    qpos, items = mf["g_query_pos"], mf["g_items"]
    assert len(rows) == 62 and np.all(np.bincount(qpos) == 10)
    np.testing.assert_array_equal(mf["g_scores"], np.load(m / "scores.npy")[rows[qpos], items])
    g = mf["g_scores"].astype(np.float64)
    de_g = np.einsum(
        "ij,ij->i",
        np.load(m / "de_queries.npy")[rows[qpos]].astype(np.float64),
        np.load(m / "de_items.npy")[items].astype(np.float64),
    )
    scale = g.std() / de_g.std()
    np.testing.assert_allclose(
        mf.params["score_map"], [scale, g.mean() - scale * de_g.mean()], rtol=1e-5
    )
    assert main(["index", "mf", str(m), str(tmp_path / "bad"), "--k-d", "2000", "--quiet"]) == 2


@pytest.mark.slow
def test_index_mf_on_a_beir_folder_with_the_embedded_models(tmp_path):
    d = tmp_path / "beir"
    d.mkdir()
    items = [
        "Cats purr when content.",
        "The stock market fell today.",
        "Dogs bark at strangers.",
        "Interest rates rose again.",
        "Kittens sleep a lot.",
    ]
    (d / "corpus.jsonl").write_text(
        "".join(
            json.dumps({"_id": f"d{i}", "title": "", "text": t}) + "\n" for i, t in enumerate(items)
        )
    )
    (d / "queries.jsonl").write_text(
        "".join(
            json.dumps({"_id": f"q{i}", "text": t}) + "\n"
            for i, t in enumerate(["feline behaviour", "finance news", "pets"])
        )
    )
    assert (
        main(
            [
                "index",
                "mf",
                str(d),
                str(tmp_path / "mf"),
                "--k-d",
                "2",
                "--epochs",
                "3",
                "--mode",
                "transductive",
                "--quiet",
                "--shard-pairs",
                "4",
            ]
        )
        == 0
    )
    idx = load_index(tmp_path / "mf", kind="mf")
    assert idx.models["ce"]["model_id"] == "minilm-l6-joint"
    assert idx.models["de"]["model_id"] == "minilm-l6-de" and idx.ce_calls == 6
    from crossknn.ce import default_cross_encoder

    ce = default_cross_encoder(items=items)
    qp, it, g = idx["g_query_pos"], idx["g_items"], idx["g_scores"]
    texts = ["feline behaviour", "finance news", "pets"]
    for p in range(len(g)):
        np.testing.assert_allclose(g[p], ce.score(texts[qp[p]], [it[p]])[0], atol=1e-5)
    load_index(tmp_path / "mf", ce=ce)  # the same CE is accepted
