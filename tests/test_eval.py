import json

import numpy as np
import pytest

from crossknn.cli import main
from crossknn.data import item_text, load_beir
from crossknn.eval import EvalConfig, evaluate, format_table
from crossknn.matrix import load_score_matrix
from crossknn.retrievers import (
    RETRIEVERS,
    Bm25Retriever,
    TfidfRetriever,
    make_retriever,
    register_retriever,
)
from crossknn.search import choose_on_dev, dev_split
from crossknn.synthetic import synthetic_matrix, write_synthetic_matrix
from crossknn.topk import exact_top_k, top_k_rows, topk_recall


def test_topk_recall_by_hand():
    scores = np.array([[0.9, 0.1, 0.5, 0.7], [0.0, 1.0, 2.0, 3.0]], np.float32)
    assert exact_top_k(scores[0], 2).tolist() == [0, 3]
    got = np.array([[3, 2], [3, -1]])
    np.testing.assert_allclose(topk_recall(scores, [0, 1], got, 2), [0.5, 0.5])
    np.testing.assert_allclose(topk_recall(scores, [0, 1], got, 1), [0.0, 1.0])


def test_dev_split_is_a_partition_of_train():
    train = np.arange(10, 40)
    idx, dev = dev_split(train, fraction=0.2, seed=3)
    assert dev.size == 6 and idx.size == 24
    assert sorted(np.concatenate([idx, dev]).tolist()) == train.tolist()
    again = dev_split(train, fraction=0.2, seed=3)
    assert again[1].tolist() == dev.tolist()
    with pytest.raises(ValueError, match=">= 2 train rows"):
        dev_split([1])


def test_choose_on_dev_only_sees_train_rows():
    S = np.zeros((10, 5), np.float32)
    seen = []

    class Probe:
        def search(self, scorer, queries, **kw):
            seen.extend(queries)
            from crossknn.search import SearchResult

            return SearchResult(
                np.zeros((len(queries), 1)),
                np.zeros((len(queries), 1), int),
                np.ones(len(queries), int),
            )

    best, table = choose_on_dev(
        lambda v, rows: Probe(), [0.2, 0.4], S, [0, 1, 2, 3, 4], budget=2, k=1
    )
    assert set(seen) <= {0, 1, 2, 3, 4} and best == 0.4 and set(table) == {0.2, 0.4}  # tie: later


def test_synthetic_matrix_shapes_and_skew():
    S, dq, di = synthetic_matrix(7, 50, rank=4, noise=1.0, skew=1.0, de_dim=6, seed=1)
    assert S.shape == (7, 50) and dq.shape == (7, 6) and di.shape == (50, 6)
    np.testing.assert_allclose(np.linalg.norm(di, axis=1), 1.0, rtol=1e-5)
    S2, _, _ = synthetic_matrix(7, 50, rank=4, noise=0.0, seed=1)
    resid = (S - S2).ravel()
    assert np.mean((resid - resid.mean()) ** 3) > 0  # right-skewed noise
    assert np.linalg.matrix_rank(S2.astype(np.float64), tol=1e-4) == 4


@pytest.fixture(scope="module")
def synth_dir(tmp_path_factory):
    return write_synthetic_matrix(
        tmp_path_factory.mktemp("m") / "synth", 40, 300, n_train=24, rank=6, noise=0.2, seed=5
    )


def test_evaluate_all_methods_on_synthetic(synth_dir):
    cfg = EvalConfig(
        methods=["rnr", "anncur", "adacur", "adacur-split", "adacur-softmax", "axn"],
        budgets=[20, 60],
        ks=[1, 10, 50],
        rounds=[1, 4],
        firsts=["random", "de"],
    )
    rows = evaluate(synth_dir, cfg, progress=False)
    keys = {"method", "budget", "k", "rounds", "first", "recall", "n_test", "ce_calls_max"}
    assert all(keys <= set(r) for r in rows)
    assert all(r["ce_calls_max"] <= r["budget"] and r["n_test"] == 16 for r in rows)
    assert not any(r["k"] > r["budget"] for r in rows)
    by = {(r["method"], r["first"], r["rounds"], r["budget"], r["k"]): r["recall"] for r in rows}
    # 6 methods: rnr/anncur once per first, the 4 round methods for 2 rounds values
    assert len(rows) == (2 + 4 * 2) * 2 * (2 + 3)
    # a low-rank matrix: adaptive CUR search beats random rerank by far
    assert by[("adacur", "random", 4, 60, 10)] > by[("rnr", "random", 1, 60, 10)] + 0.3
    assert all("split" in r and "dev_recall" in r for r in rows if r["method"] == "anncur")
    table = format_table(rows)
    assert "adacur-split (de) R=4" in table and "k=50" in table


def test_eval_cli_writes_json_and_png(synth_dir, tmp_path, capsys):
    out = tmp_path / "r.json"
    rc = main(
        [
            "eval",
            str(synth_dir),
            "--method",
            "adacur",
            "--method",
            "rnr",
            "--first",
            "de",
            "--budget",
            "30",
            "--k",
            "1",
            "--k",
            "10",
            "--k",
            "50",
            "--json",
            str(out),
            "--quiet",
        ]
    )
    assert rc == 0
    doc = json.loads(out.read_text())
    assert len(doc["rows"]) == 4  # k=50 > B=30 is skipped
    assert {r["method"] for r in doc["rows"]} == {"adacur", "rnr"}
    assert all(r["rounds"] == (5 if r["method"] == "adacur" else 1) for r in doc["rows"])
    png = out.with_suffix(".png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "adacur (de) R=5" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, match",
    [
        (["--method", "adacur", "--budget", "301", "--k", "1"], "must be in [1, 300]"),
        (
            ["--method", "rnr", "--first", "tfidf", "--budget", "30", "--k", "1"],
            "names no 'dataset'",
        ),
    ],
)
def test_eval_cli_errors(synth_dir, tmp_path, capsys, argv, match):
    rc = main(["eval", str(synth_dir), *argv, "--json", str(tmp_path / "x.json"), "--quiet"])
    assert rc == 2
    assert match in capsys.readouterr().err


def test_eval_cli_rounds_below_one_is_an_argument_error(synth_dir, tmp_path, capsys):
    argv = ["--method", "adacur", "--budget", "30", "--k", "1", "--rounds", "0"]
    with pytest.raises(SystemExit) as exc:
        main(["eval", str(synth_dir), *argv, "--json", str(tmp_path / "x.json"), "--quiet"])
    assert exc.value.code == 2
    assert "argument --rounds" in capsys.readouterr().err


def test_load_score_matrix_rejects_mismatched_shapes(synth_dir, tmp_path):
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(synth_dir, bad)
    (bad / "item_ids.json").write_text(json.dumps(["a", "b"]))
    with pytest.raises(ValueError, match="item_ids.json has 2"):
        load_score_matrix(bad)
    shutil.copy(synth_dir / "item_ids.json", bad / "item_ids.json")
    np.save(bad / "de_items.npy", np.zeros((5, 3), np.float32))
    with pytest.raises(ValueError, match="expected 300 rows"):
        load_score_matrix(bad)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_score_matrix(tmp_path / "nope")


DOCS = [
    "apples and pears are fruit",
    "the stock market fell today",
    "pears grow on trees",
    "quantum physics of small particles",
]


@pytest.mark.parametrize("cls", [TfidfRetriever, Bm25Retriever])
def test_text_retrievers_rank_matching_items_first(cls):
    r = cls(DOCS, query_texts=["market stock", "pears"])
    top = r.retrieve([0, "quantum particles", 1], 2)
    assert top.shape == (3, 2)
    assert top[0, 0] == 1 and top[1, 0] == 3
    assert set(top[2].tolist()) == {0, 2}
    with pytest.raises(ValueError, match="cannot retrieve k=5"):
        r.retrieve(["x"], 5)
    with pytest.raises(ValueError, match="must be strings; got int at position 1"):
        cls(["a", 3])


def test_top_k_rows_ties_to_lower_index():
    s = np.array([[1.0, 3.0, 3.0, 0.0, 3.0]])
    assert top_k_rows(s, 2).tolist() == [[1, 2]]
    assert top_k_rows(s, 4).tolist() == [[1, 2, 4, 0]]


def test_retriever_registry():
    assert {"de", "tfidf", "bm25"} <= set(RETRIEVERS)
    register_retriever("const", lambda **kw: "sentinel")
    try:
        assert make_retriever("const") == "sentinel"
    finally:
        del RETRIEVERS["const"]
    with pytest.raises(ValueError, match="unknown retriever 'nope'"):
        make_retriever("nope")
    with pytest.raises(ValueError, match="needs item texts"):
        make_retriever("bm25")


def test_item_text_convention():
    assert item_text("", "body") == "body"
    assert item_text("Title", "Title starts body") == "Title starts body"
    assert item_text("Title", "body") == "Title body"


@pytest.mark.data
def test_cisi_matrix_and_corpus_line_up(shared_dir):
    m = load_score_matrix(shared_dir / "matrices" / "cisi-minilm")
    assert m.scores.shape == (112, 1460) and m.test.size == 50
    corpus = load_beir(m.corpus_dir())
    texts = corpus.items_in_order(m.item_ids)
    assert len(texts) == 1460 and all(isinstance(t, str) and t for t in texts)
    assert len(corpus.queries_in_order(m.query_ids)) == 112


@pytest.mark.data
def test_cisi_eval_reproduces_adacur_over_rnr(shared_dir, tmp_path):
    cfg = EvalConfig(methods=["rnr", "adacur"], budgets=[100], ks=[10], firsts=["tfidf"])
    rows = evaluate(shared_dir / "matrices" / "cisi-minilm", cfg, progress=False)
    by = {r["method"]: r["recall"] for r in rows}
    assert by["adacur"] > by["rnr"]


def test_eval_cli_axn_over_an_mf_index(synth_dir, tmp_path, capsys):
    from crossknn.index import save_index

    m = load_score_matrix(synth_dir)
    # a transductive MF index whose item embeddings are the DE vectors: same as the default axn
    save_index(
        tmp_path / "mf",
        "mf",
        {"items": m.de_items},
        ce={"model_hash": "x"},
        params={"mode": "transductive", "normalize": False},
    )
    argv = ["--method", "axn", "--budget", "40", "--k", "10", "--quiet", "--no-plot"]
    assert main(["eval", str(synth_dir), *argv, "--json", str(tmp_path / "a.json")]) == 0
    assert (
        main(
            [
                "eval",
                str(synth_dir),
                *argv,
                "--index",
                str(tmp_path / "mf"),
                "--json",
                str(tmp_path / "b.json"),
            ]
        )
        == 0
    )
    a = json.loads((tmp_path / "a.json").read_text())["rows"]
    b = json.loads((tmp_path / "b.json").read_text())["rows"]
    assert [r["recall"] for r in a] == [r["recall"] for r in b]
    save_index(tmp_path / "cur", "cur", {"R": m.scores[m.train]}, ce={"model_hash": "x"})
    rc = main(
        [
            "eval",
            str(synth_dir),
            *argv,
            "--index",
            str(tmp_path / "cur"),
            "--json",
            str(tmp_path / "c.json"),
        ]
    )
    assert rc == 2 and "kind 'mf'" in capsys.readouterr().err
