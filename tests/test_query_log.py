"""The query log (issue 47 item 1): append-only, one whole line per query, a torn last record
skipped with one line, the paid-for entries of each search, ``search --log-queries``."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from crossknn.corpus.query_log import QueryLog, read_log
from crossknn.corpus_folder import open_index
from crossknn.searcher import Searcher
from lifecycle_stubs import StubCE, StubDE, build, queries


def test_records_round_trip_and_ids_are_unique(tmp_path):
    path = tmp_path / "q.log"
    with QueryLog(path) as log:
        a = log.append("first query", ["d1", "d2"], [1.5, -0.25], index_version=3)
        b = log.append("second query", ["d9"], [2.0], de_model_hash="h", ce_model_hash="c")
    recs = read_log(path)
    assert [r.query for r in recs] == ["first query", "second query"]
    assert a != b and [r.id for r in recs] == [a, b]
    assert recs[0].items == ["d1", "d2"] and recs[0].scores.tolist() == [1.5, -0.25]
    assert recs[0].index_version == 3 and recs[1].de_model_hash == "h"
    assert recs[1].ce_model_hash == "c"
    raw = json.loads(path.read_text().splitlines()[0])
    assert {"id", "time", "query", "de", "items", "scores"} <= set(raw)
    assert raw["de"]["text_sha256"]  # the DE vector's reference: model and text hashes


def test_torn_last_record_is_skipped_with_one_line_and_appends_go_on(tmp_path, capsys):
    path = tmp_path / "q.log"
    with QueryLog(path) as log:
        log.append("whole one", ["d1"], [1.0])
    with open(path, "ab") as f:  # a crash in the middle of the next write
        f.write(b'{"id": "q-x", "query": "torn", "items": ["d')
    recs = read_log(path)
    err = capsys.readouterr().err.strip().splitlines()
    assert [r.query for r in recs] == ["whole one"]
    assert len(err) == 1 and "q.log:2" in err[0] and "torn" in err[0]
    with QueryLog(path) as log:  # the next writer starts on a line of its own
        log.append("after the crash", ["d2"], [0.5])
    assert [r.query for r in read_log(path, quiet=True)] == ["whole one", "after the crash"]


def test_concurrent_writers_never_interleave_lines(tmp_path):
    path = tmp_path / "q.log"
    code = textwrap.dedent(
        f"""
        import sys
        from crossknn.corpus.query_log import QueryLog
        with QueryLog({str(path)!r}) as log:
            for i in range(300):
                log.append(sys.argv[1] + " " + "x" * 500, ["d%d" % j for j in range(100)],
                           [0.5] * 100)
        """
    )
    procs = [subprocess.Popen([sys.executable, "-c", code, f"w{i}"]) for i in range(3)]
    assert all(p.wait(120) == 0 for p in procs)
    recs = read_log(path)
    assert len(recs) == 900
    assert {r.query.split()[0] for r in recs} == {"w0", "w1", "w2"}


def test_searcher_records_every_entry_it_paid_for(tmp_path):
    build(tmp_path / "idx")
    s = Searcher(open_index(tmp_path / "idx"), ce=StubCE(), de=StubDE())
    s.record_paid = True
    hits = s.search(queries(3), k=4, budget=25)
    for h in hits:
        idx, sc = h.paid
        assert idx.size == h.ce_calls == 25 and len(set(idx.tolist())) == 25
        # the top-k are among them, with their scores
        got = dict(zip(idx.tolist(), sc.tolist(), strict=True))
        np.testing.assert_allclose([got[int(i)] for i in h.indices], h.scores, rtol=1e-6)
        ce = StubCE()
        ce.set_items(s.corpus.texts)
        np.testing.assert_allclose(sc, ce.score(h.query, idx), rtol=1e-6)


def test_cli_search_log_queries_appends_each_answered_query(tmp_path, monkeypatch):
    from crossknn.cli import main
    from crossknn.commands import _common  # index_models opens the index's CE and DE

    build(tmp_path / "idx")
    monkeypatch.setattr(_common, "open_index_models", lambda *a, **k: (StubCE(), StubDE()))
    log = tmp_path / "served.log"
    qs = queries(4)
    for q in qs[:2], qs[2:]:
        argv = ["search", str(tmp_path / "idx"), *q, "--budget", "20", "-k", "3", "--quiet"]
        assert main([*argv, "--log-queries", str(log)]) == 0
    recs = read_log(log)
    assert [r.query for r in recs] == qs
    assert all(len(r.items) == 20 and r.index_version == 1 for r in recs)
    assert all(r.ce_model_hash == StubCE.model_hash for r in recs)


@pytest.mark.parametrize("bad", [b"not json\n", b'{"query": "", "items": [], "scores": []}\n'])
def test_unreadable_records_are_skipped(tmp_path, bad, capsys):
    path = tmp_path / "q.log"
    path.write_bytes(bad)
    with QueryLog(path) as log:
        log.append("good", ["d1"], [1.0])
    assert [r.query for r in read_log(path)] == ["good"]
    assert "unreadable" in capsys.readouterr().err
