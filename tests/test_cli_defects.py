"""The command line over a living index and with filters (issue 64, part C): ``build`` never
replaces a living index without ``--force``; ``search --first-stage-run`` keeps each query's own
depth; ``--ids`` says how many of its ids the index lacks, reads a file with a byte-order mark
and names a file that is not UTF-8; a query file's bad filter is named by file and line.
Stand-in models (tests/lifecycle_stubs.py) keep every test fast."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from crossknn.cli import main
from crossknn.corpus.build import build_corpus_index
from crossknn.corpus.edit import add_items, remove_items
from crossknn.corpus.versions import index_version
from crossknn.corpus_folder import open_index
from crossknn.data import Corpus
from lifecycle_stubs import StubCE, StubDE, build, corpus, index_files, write_items


class CE(StubCE):
    provider = "CPUExecutionProvider"  # what --json reports


@pytest.fixture(scope="module")
def idx(tmp_path_factory):
    """80 items with a ``year`` field, searched and never changed by the tests."""
    c = corpus(80)
    meta = [{"year": 2000 + i % 20} for i in range(len(c))]
    out = tmp_path_factory.mktemp("cli-defects") / "idx"
    build(out, Corpus(c.ids, c.texts, c.source, meta))
    return out


@pytest.fixture
def stub_models(monkeypatch):
    from crossknn.commands import _common

    monkeypatch.setattr(_common, "open_index_models", lambda *a, **k: (CE(), StubDE()))


def _search(idx, *argv) -> int:
    return main(["search", str(idx), *argv, "--budget", "20", "--quiet"])


# -- 1: build over a living index ------------------------------------------------------------


def test_build_refuses_a_living_index_and_force_replaces_it(tmp_path, monkeypatch, capsys):
    import crossknn.commands.build_cmd as build_cmd

    monkeypatch.setattr(build_cmd, "open_cross_encoder", lambda *a, **k: StubCE())
    monkeypatch.setattr(build_cmd, "open_dual_encoder", lambda *a, **k: StubDE())
    src = write_items(tmp_path / "corpus.jsonl", corpus(120))
    out = tmp_path / "idx"
    argv = ["build", str(src), str(out), "--quiet", "--calibration-items", "6"]
    assert main(argv) == 0
    capsys.readouterr()
    # an untouched version 1: up to date, nothing redone
    before = index_files(out)
    assert main(argv) == 0
    assert "is up to date" in capsys.readouterr().out and index_files(out) == before
    # add and remove: version 3, which a build would replace by a version 1 of corpus.jsonl
    add_items(out, corpus(4, prefix="n", seed=5), ce=StubCE(), de=StubDE())
    remove_items(out, ["d3", "d4"])
    living = index_files(out)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert f"{out} holds a living index (version 3: 1 add, 1 remove since its build)" in err[0]
    assert "the 4 items added" in err[0] and "the removal of 2 items" in err[0]
    assert "give --force to replace it" in err[0]
    assert index_files(out) == living
    with pytest.raises(ValueError, match="holds a living index"):  # the Python function too
        build_corpus_index(corpus(120), out, ce=StubCE(), de=StubDE(), progress=False)
    assert index_files(out) == living
    assert main([*argv, "--force"]) == 0
    index = open_index(out)
    assert index_version(index) == 1 and index.corpus.ids == corpus(120).ids


# -- 9: the first-stage run with per-query filters --------------------------------------------


def test_first_stage_run_gives_each_query_min_k_and_its_allowed(idx, tmp_path, stub_models):
    ids = open_index(idx).corpus.ids
    qf = tmp_path / "q.jsonl"
    qf.write_text(
        "".join(
            json.dumps({"id": f"q{n}", "text": "w1 w2 w3", "filter": {"id": {"$in": ids[:n]}}})
            + "\n"
            for n in (1, 12, 51)
        ),
        encoding="utf-8",
    )
    qrels = tmp_path / "qrels.tsv"
    qrels.write_text("".join(f"q{n} 0 {ids[0]} 1\n" for n in (1, 12, 51)), encoding="utf-8")
    run = tmp_path / "de.trec"
    argv = ["--queries", str(qf), "-k", "10", "--first-stage-run", str(run)]
    assert _search(idx, *argv, "--qrels", str(qrels), "--metrics", str(tmp_path / "m.json")) == 0
    lines = Counter(line.split()[0] for line in run.read_text().splitlines())
    assert lines == {"q1": 1, "q12": 10, "q51": 10}


# -- 11, 12: --ids -------------------------------------------------------------------------------


def test_unknown_ids_are_said_in_one_stderr_line(idx, tmp_path, stub_models, capsys):
    f = tmp_path / "ids.txt"
    f.write_text("d1\nd2\nnope\nd3\nmissing\nnope\nd9\n", encoding="utf-8")
    assert _search(idx, "w1 w2", "-k", "3", "--ids", str(f), "--json") == 0
    got = capsys.readouterr()
    assert got.err.strip() == "crossknn search: 2 of 6 --ids are not in the index (ignored)"
    hits = json.loads(got.out)["hits"]
    assert [h["unknown_ids"] for h in hits] == [2]
    assert hits[0]["allowed"] == 4
    assert {r["id"] for r in hits[0]["results"]} <= {"d1", "d2", "d3", "d9"}
    f.write_text("d1\nd2\n", encoding="utf-8")
    assert _search(idx, "w1 w2", "w3", "-k", "3", "--ids", str(f), "--json") == 0
    got = capsys.readouterr()
    assert got.err == "" and [h["unknown_ids"] for h in json.loads(got.out)["hits"]] == [0, 0]


def test_an_ids_file_with_a_byte_order_mark_keeps_its_first_id(idx, tmp_path, stub_models, capsys):
    f = tmp_path / "ids.txt"
    f.write_bytes("d7\nd8\n".encode("utf-8-sig"))
    assert _search(idx, "w1 w2", "-k", "5", "--ids", str(f), "--json") == 0
    hit = json.loads(capsys.readouterr().out)["hits"][0]
    assert hit["allowed"] == 2 and {r["id"] for r in hit["results"]} == {"d7", "d8"}


def test_an_ids_file_that_is_not_utf8_is_named(idx, tmp_path, stub_models, capsys):
    f = tmp_path / "ids.txt"
    f.write_bytes(b"d1\nd\xff2\n")
    assert _search(idx, "w1 w2", "--ids", str(f)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"--ids {f}:2: not UTF-8 text" in err[0], err


# -- 12: a query file's bad filter ------------------------------------------------------------


def test_a_query_files_bad_filter_is_named_by_file_and_line(idx, tmp_path, stub_models, capsys):
    qf = tmp_path / "q.jsonl"
    qf.write_text(
        json.dumps({"text": "w1 w2", "filter": {"year": 2003}})
        + "\n\n"
        + json.dumps({"text": "w3 w4", "filter": {"year": {"$gte": "recent"}}})
        + "\n",
        encoding="utf-8",
    )
    assert _search(idx, "--queries", str(qf), "--filter", '{"year": {"$lt": 2019}}') == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert f"{qf}:3: filter.year.$gte: expected a number" in err[0], err
