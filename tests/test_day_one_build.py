"""The default build is the same on every machine, and every CE call of a build is inside its
stated index budget, the calibration included (issue 55). Stand-in models
(``lifecycle_stubs``): the CE's speed is made to vary; the real CE's check is
``bench/recall_bench.py day-one --part repro``."""

import subprocess
import sys
import time

import numpy as np
import pytest

import lifecycle_stubs as stubs
from crossknn.commands.build_cmd import budget_summary
from crossknn.corpus.build import _calibrate_from_rows, build_corpus_index
from crossknn.score_map import ScoreMap


class _UnevenCE(stubs.StubCE):
    """The stand-in CE, slow at its first call(s) (``delays``, seconds) and then jittery: a CE
    whose speed depends on the machine and on what else runs there."""

    def __init__(self, delays=(), jitter: float = 0.0) -> None:
        super().__init__()
        self.delays, self.jitter, self.n_calls = list(delays), jitter, 0
        self.rng = np.random.default_rng()  # unseeded on purpose: the timing is not ours

    def score_batch(self, queries, items_list):
        self.n_calls += 1
        time.sleep(self.delays.pop(0) if self.delays else self.rng.uniform(0, self.jitter))
        return super().score_batch(queries, items_list)


class _Busy:
    """``n`` processes that keep the CPU busy while the block runs."""

    def __init__(self, n: int) -> None:
        self.n, self.procs = n, []

    def __enter__(self):
        code = "import time\nt = time.time()\nwhile time.time() - t < 120: pass"
        self.procs = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(self.n)]
        return self

    def __exit__(self, *exc):
        for p in self.procs:
            p.kill()
        for p in self.procs:
            p.wait(30)


def _files(path):
    return {p.name: p.read_bytes() for p in sorted(path.iterdir()) if p.is_file()}


def test_two_default_builds_are_bitwise_equal_at_any_ce_speed_and_load(tmp_path):
    c = stubs.corpus(400)  # the default rule: 4 complete rows
    kw = {"de": stubs.StubDE(), "progress": False, "calibration_queries": 1}
    kw["calibration_items"] = 2
    fast = _UnevenCE(jitter=0.002)
    a = build_corpus_index(c, tmp_path / "a", ce=fast, **kw)
    # the second build's CE is slow at first (a cold CE, a busy machine) and runs beside four
    # busy processes: a budget from the measured speed would buy fewer rows here
    slow = _UnevenCE(delays=[0.8], jitter=0.02)
    with _Busy(4):
        b = build_corpus_index(c, tmp_path / "b", ce=slow, **kw)
    assert a.params["auto"]["rows"] == b.params["auto"]["rows"] == 4
    fa, fb = _files(tmp_path / "a"), _files(tmp_path / "b")
    assert sorted(fa) == sorted(fb) and "auto_rows.npy" in fa
    for name in fa:  # every array and index.json, byte for byte
        assert fa[name] == fb[name], name
    assert fast.calls == slow.calls == a.ce_calls == 4 * 400


def test_every_ce_call_of_a_build_is_inside_its_stated_budget(tmp_path):
    c = stubs.corpus(300)
    kw = {"de": stubs.StubDE(), "progress": False}
    # 100 train queries: the calibration used to score 100 x 32 pairs beside the rows
    ce = stubs.StubCE()
    idx = build_corpus_index(
        c, tmp_path / "t", ce=ce, train_queries=stubs.queries(100), index_calls=3 * 300, **kw
    )
    assert ce.calls <= 900
    budget = idx.params["budget"]
    assert ce.calls == idx.ce_calls == budget["ce_calls"] <= budget["index_calls"] == 900
    assert budget["spent"]["calibration"] == 0 and idx.params["calibration"] == "auto rows"
    assert budget["spent"]["auto_rows"] == 300 * idx.params["auto"]["rows"]
    # the default budget: rows of pseudo-queries, the calibration read from them
    ce = stubs.StubCE()
    idx = build_corpus_index(c, tmp_path / "d", ce=ce, **kw)
    budget = idx.params["budget"]
    assert budget["index_calls"] == 3 * 300 and budget["rule"].startswith("default: 3 complete")
    assert ce.calls == idx.ce_calls == budget["ce_calls"] <= 900
    assert sum(budget["spent"].values()) == idx.ce_calls
    # fewer calls than a row: the calibration alone, within C
    for C in (0, 1, 100, 299):
        ce = stubs.StubCE()
        idx = build_corpus_index(
            c, tmp_path / f"c{C}", ce=ce, train_queries=stubs.queries(5), index_calls=C, **kw
        )
        assert ce.calls == idx.ce_calls <= C
        assert idx.params["budget"]["spent"]["calibration"] == ce.calls
        assert ("score_map" in idx.params) == (ce.calls >= 2)
    # a corpus under 100 items: no row, the budget is the calibration's pairs
    ce = stubs.StubCE()
    idx = build_corpus_index(stubs.corpus(60), tmp_path / "small", ce=ce, **kw)
    assert "auto" not in idx.params and ce.calls == idx.ce_calls == 16 * 32
    assert idx.params["budget"]["index_calls"] == 16 * 32


def test_the_score_map_is_fitted_on_pairs_the_rows_already_paid_for(tmp_path):
    c = stubs.corpus(300)
    idx = build_corpus_index(
        c, tmp_path / "d", ce=stubs.StubCE(), de=stubs.StubDE(), progress=False, seed=3
    )
    V = np.asarray(idx["de_items"], np.float32)
    R, W = np.asarray(idx["auto_rows"]), np.asarray(idx["auto_row_vectors"])
    smap, pairs = _calibrate_from_rows(V, R, W, queries=16, items_per_query=32, seed=3)
    assert idx.params["score_map"] == smap.to_list()
    assert idx.params["n_calibration_queries"] == R.shape[0] == 3
    assert pairs == 3 * 32 * 6  # 16 queries' worth of pairs spread over 3 rows
    # the pairs are each row's DE-top half and a random half: refit by hand on the same pairs
    rng = np.random.default_rng(3)
    ce_s, de_s = [], []
    for row, w in zip(R, W, strict=True):
        s = V @ w
        top = np.argsort(-s, kind="stable")[:96]
        rest = np.setdiff1d(np.arange(300), top)
        it = np.concatenate([top, rng.choice(rest, size=96, replace=False)])
        ce_s.append(row[it])
        de_s.append(s[it])
    ref = ScoreMap.fit(np.concatenate(ce_s), np.concatenate(de_s))
    assert smap.scale == pytest.approx(ref.scale) and smap.offset == pytest.approx(ref.offset)


def test_a_time_cap_is_explicit_and_says_where_it_cut(tmp_path):
    c = stubs.corpus(400)
    ce = _UnevenCE(delays=[0.3] * 50)  # 0.3 s a row: a 1 s cap reads three rows
    idx = build_corpus_index(
        c, tmp_path / "cap", ce=ce, de=stubs.StubDE(), progress=False, index_minutes=1.0 / 60
    )
    cap = idx.params["budget"]["time_cap"]
    assert cap["cut"] is True and cap["rows_planned"] == 4 and 1 <= cap["rows_read"] < 4
    assert idx.params["auto"]["rows"] == cap["rows_read"] == idx["auto_rows"].shape[0]
    assert idx.params["auto"]["partial_rows"] == 0  # no partial rows after a cut
    assert ce.calls == idx.ce_calls == 400 * cap["rows_read"]
    line = budget_summary(idx.params["budget"])
    assert f"cut at {cap['rows_read']} of 4 rows" in line
    # without a cap nothing about time is recorded: the index is the machine-free one
    idx = build_corpus_index(
        c, tmp_path / "free", ce=stubs.StubCE(), de=stubs.StubDE(), progress=False
    )
    assert "time_cap" not in idx.params["budget"] and "time_cap" not in idx.params["auto"]
