"""``crossknn refine`` (issue 47 item 2): auto's rows re-fitted on logged queries, the log's
paid-for entries used instead of CE calls, a new version beside the old one, real rows never
replaced by pseudo rows, a rerun does nothing."""

from __future__ import annotations

import numpy as np
import pytest

from crossknn.corpus.query_log import QueryLog, read_log
from crossknn.corpus.refine import refine_index
from crossknn.corpus.versions import index_version
from crossknn.corpus_folder import open_index
from crossknn.searcher import Searcher
from lifecycle_stubs import StubCE, StubDE, build, corpus, index_files, queries


def _serve_and_log(index_dir, log_path, qs, budget=30):
    s = Searcher(open_index(index_dir), ce=StubCE(), de=StubDE())
    s.record_paid = True
    hits = s.search(qs, k=5, budget=budget)
    with QueryLog(log_path) as log:
        log.append_hits(
            hits, s.corpus.ids, s.corpus.texts, index_version=1, ce_model_hash=StubCE.model_hash
        )
    return read_log(log_path)


def _exact_recall(index_dir, qs, budget=30, k=5):
    s = Searcher(open_index(index_dir), ce=StubCE(), de=StubDE())
    return float(np.mean([h.recall for h in s.search(qs, k=k, budget=budget, exact=True)]))


def test_refine_fits_rows_of_logged_queries_and_uses_the_log(tmp_path):
    idx = tmp_path / "idx"
    build(idx, rows=4)
    before = open_index(idx)
    assert index_version(before) == 1
    pseudo_rows = before.params["auto"]["row_queries"]
    logged = queries(40)
    recs = _serve_and_log(idx, tmp_path / "q.log", logged)
    ce = StubCE()
    r = refine_index(idx, tmp_path / "q.log", ce=ce, de=StubDE(), quiet=True)
    after = open_index(idx)
    assert r.version == 2 == index_version(after) and r.previous == 1
    auto = after.params["auto"]
    assert auto["rows"] == 4 and auto["real_rows"] == 4 and auto["row_source"] == "query log"
    assert set(auto["row_queries"]) <= set(logged) and not set(auto["row_queries"]) & set(
        pseudo_rows
    )
    # the log's 30 entries of each row query were not scored again
    assert r.log_entries_used >= 4 * 30
    assert ce.calls == r.ce_calls == r.index_calls - r.log_entries_used
    # the rows are the CE's exact rows of those queries
    full = StubCE()
    full.set_items(after.corpus.texts)
    for q, row in zip(auto["row_queries"], after["auto_rows"], strict=True):
        np.testing.assert_allclose(row, full.score(q, np.arange(len(after))), rtol=1e-6)
    hist = after.info["history"]
    assert hist[-1]["op"] == "refine" and hist[-1]["version"] == 2
    assert after.ce_calls == before.ce_calls + r.ce_calls
    assert len(recs) == 40
    # the old version's auto files are gone, the unchanged arrays kept as they were
    names = {p.name for p in idx.iterdir()}
    assert "de_items.npy" in names and "auto_rows.npy" not in names
    assert "auto_rows.v2.npy" in names and not (idx / ".build").exists()


def test_rerun_of_a_committed_refine_does_nothing(tmp_path):
    idx = tmp_path / "idx"
    build(idx, rows=3)
    _serve_and_log(idx, tmp_path / "q.log", queries(20))
    refine_index(idx, tmp_path / "q.log", ce=StubCE(), de=StubDE(), quiet=True)
    files = index_files(idx)
    ce = StubCE()
    r = refine_index(idx, tmp_path / "q.log", ce=ce, de=StubDE(), quiet=True)
    assert r.already and r.version == 2 and ce.calls == 0
    assert index_files(idx) == files


def test_refine_on_served_queries_beats_pseudo_rows_on_those_queries(tmp_path):
    """Served queries of one kind (a few topic words): rows of them search held-out queries of
    that kind better than pseudo rows cut from item texts."""
    idx = tmp_path / "idx"
    build(idx, corpus(300), rows=4)
    train, test = queries(60, seed=3), queries(40, seed=4)
    before = _exact_recall(idx, test, budget=30, k=10)
    _serve_and_log(idx, tmp_path / "q.log", train)
    refine_index(idx, tmp_path / "q.log", ce=StubCE(), de=StubDE(), quiet=True)
    after = _exact_recall(idx, test, budget=30, k=10)
    assert after > before


def test_fewer_logged_queries_than_rows_keep_pseudo_rows_for_the_rest(tmp_path):
    idx = tmp_path / "idx"
    build(idx, rows=5)
    pseudo = open_index(idx).params["auto"]["row_queries"]
    logged = queries(3)
    _serve_and_log(idx, tmp_path / "q.log", logged)
    ce = StubCE()
    r = refine_index(idx, tmp_path / "q.log", ce=ce, de=StubDE(), quiet=True)
    auto = open_index(idx).params["auto"]
    assert r.real_rows == 3 and auto["rows"] == 5
    assert set(logged) <= set(auto["row_queries"])
    assert len(set(auto["row_queries"]) & set(pseudo)) == 2
    # a later refine on a smaller budget would drop real rows: refused, index unchanged
    files = index_files(idx)
    _serve_and_log(idx, tmp_path / "q2.log", queries(10, seed=9))
    with pytest.raises(ValueError, match="never replaced by pseudo rows"):
        refine_index(
            idx, tmp_path / "q.log", ce=StubCE(), de=StubDE(), index_calls=2 * 120, quiet=True
        )
    assert index_files(idx) == files


def test_refine_cli_and_its_errors(tmp_path, monkeypatch, capsys):
    from crossknn.cli import main
    from crossknn.commands import _common  # index_models opens the index's CE and DE

    idx = tmp_path / "idx"
    build(idx, rows=3)
    monkeypatch.setattr(_common, "open_index_models", lambda *a, **k: (StubCE(), StubDE()))
    log = tmp_path / "q.log"
    _serve_and_log(idx, log, queries(1))
    assert main(["refine", str(idx), "--queries", str(log), "--quiet"]) == 2
    assert "at least 2 distinct logged queries" in capsys.readouterr().err
    _serve_and_log(idx, log, queries(12, seed=5))
    assert main(["refine", str(idx), "--queries", str(log), "--index-calls", "100"]) == 2
    assert "fewer than 2 complete rows" in capsys.readouterr().err
    assert main(["refine", str(idx), "--queries", str(log), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "version 1 -> 2" in out and "3 auto rows" in out
    assert main(["refine", str(idx), "--queries", str(log), "--quiet"]) == 0
    assert "already refined" in capsys.readouterr().out
