"""TREC runs users can trust: full-precision scores, a stated tie order that every measure uses,
and ``evaluate`` refusing (file:line) what trec_eval/ir_measures would score silently."""

from __future__ import annotations

import json

import numpy as np
import pytest

from crossknn.cli import main
from crossknn.data import read_qrels
from crossknn.trec import format_score, read_run, run_metrics, trec_order, write_run

QRELS = {"q1": {"a": 1}, "q2": {"m": 2, "n": 1}}


def _qrels_file(path, qrels=QRELS):
    path.write_text(
        "query-id\tcorpus-id\tscore\n"
        + "".join(f"{q}\t{d}\t{r}\n" for q, ds in qrels.items() for d, r in ds.items()),
        encoding="utf-8",
    )
    return path


def _err(capsys, argv) -> str:
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err
    return err


def test_scores_are_written_at_full_precision_and_read_back_exactly(tmp_path):
    rng = np.random.default_rng(0)
    scores = rng.normal(size=50).astype(np.float32) * np.float32(1e-3)
    ids = [f"d{i}" for i in range(50)]
    write_run(tmp_path / "r.trec", [("q", ids, scores)], "t")
    back = read_run(tmp_path / "r.trec")["q"]
    assert back == {d: float(s) for d, s in zip(ids, scores, strict=True)}
    assert format_score(np.float32(0.1)) == repr(float(np.float32(0.1)))


def test_scores_equal_to_six_decimals_keep_their_order_in_the_file(tmp_path):
    """The issue's case: '%.6f' made two different scores equal in the file, so evaluate and
    metrics.json (the in-memory run) disagreed. Now the file's run is the in-memory run."""
    ids, scores = ["a", "z"], [np.float32(0.5000001), np.float32(0.5)]
    assert f"{scores[0]:.6f}" == f"{scores[1]:.6f}"  # what the old writer wrote for both
    write_run(tmp_path / "r.trec", [("q1", ids, scores)], "t")
    memory = {"q1": dict(zip(ids, map(float, scores), strict=True))}
    measures = {"q1": {"a": 1}}
    assert run_metrics(read_run(tmp_path / "r.trec"), measures) == run_metrics(memory, measures)
    assert run_metrics(memory, measures)["nDCG@10"] == 1.0


def test_ties_are_broken_by_docid_descending_for_every_measure(tmp_path):
    """ir_measures' own providers disagree on ties (nDCG@10 by pytrec_eval: docid descending;
    RR@10 by the msmarco provider: ascending); crossknn ranks them one way for all."""
    run = {"q1": {"a": 1.0, "b": 1.0, "c": 1.0}}
    got = run_metrics(run, {"q1": {"a": 1}})
    # 'a' is third in docid-descending order: RR = 1/3, nDCG = 1/log2(4) = 0.5
    assert got["RR@10"] == pytest.approx(1 / 3) and got["nDCG@10"] == pytest.approx(0.5)
    assert trec_order(["a", "c", "b", "x"], [1.0, 1.0, 1.0, 2.0]) == [
        ("x", 2.0),
        ("c", 1.0),
        ("b", 1.0),
        ("a", 1.0),
    ]
    write_run(tmp_path / "r.trec", [("q1", ["a", "b", "c"], [1.0, 1.0, 1.0])], "t")
    lines = (tmp_path / "r.trec").read_text().splitlines()
    assert [ln.split()[2:4] for ln in lines] == [["c", "1"], ["b", "2"], ["a", "3"]]


def test_write_run_refuses_non_finite_scores_and_repeated_docids(tmp_path):
    with pytest.raises(ValueError, match=r"query 'q', docid 'b': score nan is not finite"):
        write_run(tmp_path / "r.trec", [("q", ["a", "b"], [1.0, float("nan")])], "t")
    with pytest.raises(ValueError, match=r"query 'q': docid 'a' appears twice"):
        write_run(tmp_path / "r.trec", [("q", ["a", "a"], [1.0, 0.5])], "t")
    assert not (tmp_path / "r.trec").exists()


@pytest.mark.parametrize("bad", ["nan", "NaN", "inf", "-inf", "Infinity"])
def test_evaluate_refuses_a_non_finite_score_with_file_and_line(tmp_path, capsys, bad):
    run = tmp_path / "r.trec"
    run.write_text(f"q1 Q0 x 1 2.0 t\nq1 Q0 a 2 {bad} t\n", encoding="utf-8")
    qrels = _qrels_file(tmp_path / "q.tsv")
    err = _err(capsys, ["evaluate", str(run), "--qrels", str(qrels)])
    assert f"{run}:2: score '{bad}' is not a finite number (query 'q1', docid 'a')" in err


def test_evaluate_refuses_a_docid_twice_for_one_query(tmp_path, capsys):
    run = tmp_path / "r.trec"
    run.write_text("q1 Q0 a 1 2.0 t\nq2 Q0 a 1 2.0 t\nq1 Q0 a 2 1.0 t\n", encoding="utf-8")
    err = _err(capsys, ["evaluate", str(run), "--qrels", str(_qrels_file(tmp_path / "q.tsv"))])
    assert f"{run}:3: docid 'a' appears twice for query 'q1' (first at line 1)" in err


@pytest.mark.parametrize(
    ("content", "what"),
    [
        (b"q1 Q0 a 1 2.0 t\n\x00\x01\x02binary\n", ":2: a binary file (NUL byte)"),
        (b"q1 Q0 a 1 2.0 t\nq1 Q0 \xff\xfe 2 1.0 t\n", ":2: not UTF-8 text"),
    ],
)
def test_evaluate_names_the_file_of_a_binary_run(tmp_path, capsys, content, what):
    run = tmp_path / "r.bin"
    run.write_bytes(content)
    err = _err(capsys, ["evaluate", str(run), "--qrels", str(_qrels_file(tmp_path / "q.tsv"))])
    assert f"{run}{what}" in err and "qid Q0 docid rank score tag" in err


def test_a_two_column_qrels_line_says_file_line_and_what_was_expected(tmp_path, capsys):
    run = tmp_path / "r.trec"
    write_run(run, [("q1", ["a"], [1.0])], "t")
    trec2 = tmp_path / "two.qrels"
    trec2.write_text("q1 0 a 1\nq1 a\n", encoding="utf-8")
    err = _err(capsys, ["evaluate", str(run), "--qrels", str(trec2)])
    assert f"{trec2}:2: expected 4 columns 'qid 0 docid relevance'" in err and "got 2" in err
    beir2 = tmp_path / "two.tsv"
    beir2.write_text("query-id\tcorpus-id\tscore\nq1\ta\t1\nq1\tb\n", encoding="utf-8")
    err = _err(capsys, ["evaluate", str(run), "--qrels", str(beir2)])
    assert f"{beir2}:3: expected 3 tab-separated columns (query-id, corpus-id, score)" in err
    only2 = tmp_path / "only2.txt"
    only2.write_text("q1 a\n", encoding="utf-8")
    err = _err(capsys, ["evaluate", str(run), "--qrels", str(only2)])
    assert f"{only2}:1: expected 4 columns" in err and "None" not in err
    assert read_qrels(_qrels_file(tmp_path / "ok.tsv")) == QRELS


def test_evaluate_takes_metrics_in_ir_measures_syntax(tmp_path, capsys):
    import ir_measures

    run = tmp_path / "r.trec"
    rows = [("q1", ["x", "a", "y"], [3.0, 2.0, 1.0]), ("q2", ["n", "m"], [2.0, 1.0])]
    write_run(run, rows, "t")
    qrels = _qrels_file(tmp_path / "q.tsv")
    capsys.readouterr()
    argv = ["evaluate", str(run), "--qrels", str(qrels), "--metrics", "P@1, AP nDCG@3 P(rel=2)@2"]
    assert main([*argv, "--json"]) == 0
    got = json.loads(capsys.readouterr().out)["runs"][str(run)]
    want = ir_measures.calc_aggregate(
        [ir_measures.parse_measure(m) for m in ("P@1", "AP", "nDCG@3", "P(rel=2)@2")],
        QRELS,
        ir_measures.read_trec_run(str(run)),
    )
    assert {k: got[k] for k in map(str, want)} == pytest.approx(
        {str(k): v for k, v in want.items()}
    )
    assert got["P@1"] == 0.5 and got["P(rel=2)@2"] == 0.25 and got["n_queries"] == 2
    assert main(argv) == 0
    header = capsys.readouterr().out.splitlines()[0].split()
    assert header == ["run", "P@1", "AP", "nDCG@3", "P(rel=2)@2", "queries"]
    err = _err(capsys, ["evaluate", str(run), "--qrels", str(qrels), "--metrics", "nDGC@10"])
    assert "--metrics: 'nDGC@10' is not an ir_measures measure" in err
