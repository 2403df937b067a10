"""Finding BEIR folders by name ($CROSSKNN_DATA), ``crossknn data``, and the data-test rule:
without data a data test is skipped with one summary line, with CI=true it fails."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from crossknn.cli import main
from crossknn.data import describe_beir, find_beir, list_beir, load_beir
from shared_fixtures import made_beir

REPO = Path(__file__).resolve().parents[1]


def test_find_beir_by_name_in_each_layout(tmp_path, monkeypatch):
    a = made_beir(tmp_path / "a" / "tiny")
    b = made_beir(tmp_path / "b" / "data" / "other", n_items=5, n_queries=2)
    monkeypatch.setenv("CROSSKNN_DATA", os.pathsep.join([str(tmp_path / "a"), str(tmp_path / "b")]))
    assert find_beir("tiny") == a and find_beir("other") == b
    assert find_beir(str(a)) == a  # a path is taken as it is
    assert list_beir() == [a, b]
    d = describe_beir("other")
    assert d == {
        "path": str(b),
        "items": 5,
        "queries": 2,
        "qrels": {"test": {"queries": 2, "judgments": 2}},
    }
    beir = load_beir(find_beir("tiny"))
    assert len(beir.item_ids) == 12 and beir.qrels["test"]["q0"] == {beir.item_ids[0]: 1}


def test_find_beir_errors_say_where_and_what(tmp_path, monkeypatch):
    monkeypatch.delenv("CROSSKNN_DATA", raising=False)
    with pytest.raises(FileNotFoundError, match=r"'nope' not found: .*CROSSKNN_DATA is not set"):
        find_beir("nope")
    monkeypatch.setenv("CROSSKNN_DATA", str(tmp_path))
    with pytest.raises(FileNotFoundError, match=r"looked in .*nope, .*data/nope; .*beir-cellar"):
        find_beir("nope")
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "corpus.jsonl").write_text("{}\n")
    with pytest.raises(
        FileNotFoundError, match=r"half is not a BEIR folder: queries.jsonl missing"
    ):
        find_beir(tmp_path / "half")
    with pytest.raises(NotADirectoryError, match="is a file"):
        find_beir(tmp_path / "half" / "corpus.jsonl")


def test_data_command_lists_checks_and_says_how_to_get_data(tmp_path, monkeypatch, capsys):
    made_beir(tmp_path / "tiny")
    monkeypatch.setenv("CROSSKNN_DATA", str(tmp_path))
    assert main(["data"]) == 0
    out = capsys.readouterr().out
    assert out == f"{tmp_path / 'tiny'}: 12 items, 3 queries; qrels: test 3 queries/3 judgments\n"
    assert main(["data", "tiny", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["items"] == 12
    monkeypatch.setenv("CROSSKNN_DATA", str(tmp_path / "empty"))
    assert main(["data"]) == 1
    err = capsys.readouterr().err
    assert "no BEIR dataset found" in err and "corpus.jsonl" in err and "beir-cellar" in err
    assert main(["data", "missing"]) == 2
    assert "'missing' not found" in capsys.readouterr().err


def test_score_matrix_help_names_only_files_in_the_repository(capsys):
    with pytest.raises(SystemExit):
        main(["score-matrix", "--help"])
    out = capsys.readouterr().out
    assert "BENCHMARKS.md" not in out and "docs/data.md" in out
    assert (REPO / "docs" / "data.md").is_file()


def _pytest_data_test(tmp_path, **env) -> subprocess.CompletedProcess:
    """Run one data test in a child pytest whose data root is an empty folder."""
    child = {k: v for k, v in os.environ.items() if k != "CI"}
    child.update(CROSSKNN_DATA=str(tmp_path / "no-data"), **env)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs"]
        + [str(REPO / "tests" / "test_corpus.py"), str(REPO / "tests" / "test_eval.py")]
        + ["-m", "data"],
        cwd=REPO,
        env=child,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_without_data_the_data_tests_are_skipped_with_one_summary_line(tmp_path):
    r = _pytest_data_test(tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    skipped = [line for line in r.stdout.splitlines() if line.startswith("SKIPPED")]
    assert len(skipped) == 1, r.stdout
    assert skipped[0].startswith("SKIPPED [3] ") and "set CROSSKNN_DATA" in skipped[0]
    assert "3 skipped" in r.stdout


def test_with_ci_true_a_data_test_without_data_fails(tmp_path):
    r = _pytest_data_test(tmp_path, CI="true")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "CI=true and no test data" in r.stdout and "3 errors" in r.stdout


@pytest.mark.parametrize(
    "line, message",
    [
        ('{"id": "a", "title": "T"}', "1: item 'a' is missing 'text'"),
        ('{"id": "a", "text": 3}', "1: 'text' must be a string; got int"),
        ('{"id": "a", "text": null}', "1: 'text' must be a string; got NoneType"),
        ('{"id": "a", "text": "x", "title": ["T"]}', "1: 'title' must be a string; got list"),
    ],
)
def test_a_corpus_line_says_what_is_wrong_with_its_text(tmp_path, line, message):
    from crossknn.data import load_corpus

    path = tmp_path / "corpus.jsonl"
    path.write_text(line + "\n", encoding="utf-8")
    with pytest.raises(ValueError) as err:
        load_corpus(path)
    assert str(err.value) == f"{path}:{message}"
