"""Issue 54: the living index under an unlucky operator. One test per case of the issue's table
(``test_caseNN_...``), each of which failed before its fix: entries of the query log used only
for the item they scored (1, 2), a log that survives rotation, a full disk and a wide umask (3,
4, 5), a lock never followed through a symbolic link (6), the version loaded at start released
like any other (7), a maximum query length and caches bounded in bytes (8), the log checked
before any model loads (9), removing a removed id is a no-op (10), one rule for empty texts (11),
a served file cut in place never kills the server silently (12), nothing created for a wrong
path (13), headers and /info state that hold (14), every CE call of a killed refine counted (15).

The index-level cases run on cheap deterministic stand-in models (tests/lifecycle_stubs); the
serve cases against a real ``crossknn serve`` (uvicorn in a subprocess on a free loopback port)
over a small index built here with the embedded models."""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import socket
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from crossknn.cli import main
from crossknn.corpus.edit import add_items, remove_items
from crossknn.corpus.query_log import QueryLog, read_log
from crossknn.corpus.refine import refine_index
from crossknn.corpus.versions import index_version
from crossknn.corpus_folder import open_index
from crossknn.data import Corpus
from crossknn.index.auto import AUTO_ARRAY
from lifecycle_stubs import StubCE, StubDE, build, corpus, queries, write_items

try:
    import httpx
except ImportError:  # the serve extra: the serve cases are skipped without it
    httpx = None

HERE = Path(__file__).resolve()
KEY = "lifecycle-defects-key"


# -- helpers ------------------------------------------------------------------------------------


def _stub_models(monkeypatch) -> list[str]:
    """The CLI's search/add/refine open the stand-in models; returns the list of opens."""
    from crossknn.commands import _common

    opened: list[str] = []

    def fake(*a, **k):
        opened.append("models")
        return StubCE(), StubDE()

    # search, add and refine open them through _common.index_models
    monkeypatch.setattr(_common, "open_index_models", fake)
    return opened


def _log_searches(monkeypatch, idx: Path, log: Path, qs: list[str], budget: int) -> None:
    """``crossknn search IDX ... --log-queries LOG`` (the stand-in models)."""
    _stub_models(monkeypatch)
    argv = ["search", str(idx), *qs, "--budget", str(budget), "-k", "3", "--quiet"]
    assert main([*argv, "--log-queries", str(log)]) == 0


def _rows_are_exact(idx: Path) -> tuple[int, int]:
    """(wrong, total) stored auto row entries against the stand-in CE's exact scores."""
    index = open_index(idx)
    rows = np.asarray(index[AUTO_ARRAY], np.float32)
    ce = StubCE()
    ce.set_items(index.corpus.texts)
    every = np.arange(len(index), dtype=np.int64)
    wrong = 0
    for q, row in zip(index.params["auto"]["row_queries"], rows, strict=True):
        wrong += int(np.sum(~np.isclose(row, ce.score(q, every), rtol=1e-5, atol=1e-6)))
    return wrong, rows.size


# -- the real server ----------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cli(env, *argv: str, timeout: float = 300) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "crossknn.cli", *argv]
    penv = dict(os.environ, CROSSKNN_CACHE=env["cache"])
    return subprocess.run(cmd, capture_output=True, text=True, env=penv, timeout=timeout)


class Server:
    """A ``crossknn serve`` of ``idx`` with the API key, on a free port (stopped by PID)."""

    def __init__(self, env, idx: Path, *args: str, key_file: Path | None = None) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.auth = {"Authorization": f"Bearer {KEY}"}
        cmd = [sys.executable, "-m", "crossknn.cli", "serve", str(idx), "--port", str(self.port)]
        cmd += ["--api-key-file", str(key_file or env["key_file"]), "--log-level", "info", *args]
        self.log_path = env["root"] / f"server-{self.port}.log"
        self.log = open(self.log_path, "w")  # noqa: SIM115
        penv = dict(os.environ, CROSSKNN_CACHE=env["cache"])
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=penv)
        t = time.monotonic()
        while time.monotonic() - t < 180:
            if self.proc.poll() is not None:
                raise AssertionError(f"the server exited: {self.output()[-2000:]}")
            try:
                if httpx.get(self.url + "/readyz", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise TimeoutError(f"server not ready: {self.output()[-2000:]}")

    def search(self, q: str):
        return httpx.post(
            self.url + "/search", json={"query": q, "k": 3, "budget": 10}, headers=self.auth,
            timeout=120,
        )  # fmt: skip

    def info(self) -> dict:
        return httpx.get(self.url + "/info", headers=self.auth, timeout=30).json()

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if not self.log.closed:
            self.log.close()
        return self.proc.returncode

    def output(self) -> str:
        if not self.log.closed:
            self.log.flush()
        return self.log_path.read_text()


@pytest.fixture(scope="module")
def env(model_cache, tmp_path_factory):
    if httpx is None:
        pytest.skip("httpx is not installed (the serve extra)")
    pytest.importorskip("fastapi")
    mp = pytest.MonkeyPatch()
    mp.setenv("CROSSKNN_CACHE", str(model_cache))
    root = tmp_path_factory.mktemp("lifecycle-defects")
    topics = ["dates and times", "compression", "email", "shell commands", "csv files"]
    rows = [
        {"id": f"d{i}", "text": f"document {i} about {topics[i % len(topics)]} and more {i}"}
        for i in range(40)
    ]
    (root / "c.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    idx = root / "idx"
    args = ["--calibration-queries", "2", "--calibration-items", "4", "--index-calls", "80"]
    assert main(["build", str(root / "c.jsonl"), str(idx), *args, "--quiet"]) == 0
    key_file = root / "key"
    key_file.write_text(KEY + "\n")
    key_file.chmod(0o600)
    yield {"root": root, "idx": idx, "cache": str(model_cache), "key_file": key_file}
    mp.undo()


@pytest.fixture(scope="module")
def served(env):
    """One server with the key and --log-queries, shared by the cases that only send requests."""
    log = env["root"] / "served" / "queries.log"
    s = Server(env, env["idx"], "--log-queries", str(log), "--watch-index", "0")
    s.log_queries = log
    yield s
    s.stop()


# -- case 1: refine on the log of another index with the same ids -----------------------------


def test_case01_refine_uses_no_entry_of_another_index_with_the_same_ids(
    tmp_path, monkeypatch, capsys
):
    ours, other = tmp_path / "ours", tmp_path / "other"
    build(ours, corpus(60, seed=0))
    build(other, corpus(60, seed=7))  # ids d0..d59 again, other texts
    assert open_index(ours).corpus.ids == open_index(other).corpus.ids
    log = tmp_path / "other.log"
    _log_searches(monkeypatch, other, log, queries(12, seed=3), budget=60)
    capsys.readouterr()
    r = refine_index(ours, log, ce=StubCE(), de=StubDE())
    err = capsys.readouterr().err
    wrong, total = _rows_are_exact(ours)
    assert wrong == 0, f"{wrong} of {total} stored row entries are another index's scores"
    assert r.log_entries_used == 0
    lines = [x for x in err.splitlines() if "logged entries not used" in x]
    assert len(lines) == 1 and "not the item in the index" in lines[0], err


# -- case 2: an id removed and added again with another text ----------------------------------


def test_case02_refine_uses_no_entry_of_a_removed_item_for_its_successor(tmp_path, monkeypatch):
    idx = tmp_path / "idx"
    build(idx, corpus(60))
    log = tmp_path / "q.log"
    _log_searches(monkeypatch, idx, log, queries(12, seed=5), budget=60)  # every item scored
    assert all("d7" in r.items for r in read_log(log))
    remove_items(idx, ["d7"], compact_at=1.0)
    new = Corpus(["d7"], ["w1 w2 w3 w4 w5 a different d7"], "new")
    add_items(idx, new, ce=StubCE(), de=StubDE())
    r = refine_index(idx, log, ce=StubCE(), de=StubDE(), quiet=True)
    wrong, total = _rows_are_exact(idx)
    assert wrong == 0, f"{wrong} of {total} stored row entries are of the item removed before"
    assert r.log_entries_used > 0  # the entries of items that did not change were used


# -- case 3: the log file removed or rotated while serve writes it; SIGHUP ---------------------


@pytest.mark.slow
def test_case03_rotation_deletion_and_sighup_start_a_new_log(env, tmp_path):
    log = tmp_path / "queries.log"
    s = Server(env, env["idx"], "--log-queries", str(log), "--watch-index", "0")
    try:
        _rotations(s, log, tmp_path)
    finally:
        s.stop()


def _rotations(s: Server, log: Path, tmp_path: Path) -> None:
    for what in ("mv", "rm"):
        assert s.search(f"before the {what}").status_code == 200
        assert len(read_log(log, quiet=True)) >= 1
        if what == "mv":
            log.rename(tmp_path / "rotated.log")
        else:
            log.unlink()
        for q in ("rotation one", "rotation two", "rotation three"):
            assert s.search(q).status_code == 200
        assert log.is_file(), f"after {what}, no new log at the path"
        assert [r.query for r in read_log(log)] == [
            "rotation one",
            "rotation two",
            "rotation three",
        ]
    assert len(read_log(tmp_path / "rotated.log")) >= 1  # the renamed file kept its records
    # SIGHUP: the server reopens the log at once (and lives on)
    log.rename(tmp_path / "rotated-2.log")
    s.proc.send_signal(signal.SIGHUP)
    t = time.monotonic()
    while not log.is_file() and time.monotonic() - t < 10:
        time.sleep(0.1)
    assert s.proc.poll() is None, s.output()
    assert log.is_file() and log.stat().st_size == 0
    assert s.search("after sighup").status_code == 200
    assert [r.query for r in read_log(log)] == ["after sighup"]


# -- case 4: a full disk during searches --------------------------------------------------------


@pytest.mark.slow
def test_case04_a_full_disk_leaves_no_partial_record_and_loses_none(served):
    s = served
    log = s.log_queries
    assert s.search("before the disk fills").status_code == 200
    n0 = len(read_log(log))
    size = log.stat().st_size
    soft, hard = resource.prlimit(s.proc.pid, resource.RLIMIT_FSIZE)
    # the server may not grow the log by more than 100 bytes: the next record is cut short,
    # the ones after it fail outright (as on a full disk)
    resource.prlimit(s.proc.pid, resource.RLIMIT_FSIZE, (size + 100, hard))
    try:
        for i in range(5):
            assert s.search(f"while the disk is full {i}").status_code == 200
        assert log.stat().st_size <= size + 100
    finally:
        resource.prlimit(s.proc.pid, resource.RLIMIT_FSIZE, (soft, hard))
    for i in range(3):
        assert s.search(f"after space came back {i}").status_code == 200
    raw = log.read_bytes()
    assert raw.endswith(b"\n")
    for line in raw.splitlines()[n0:]:
        try:
            json.loads(line)
        except ValueError:
            raise AssertionError(f"a partial record is left in the log: {line[:120]!r}") from None
    qs = [r.query for r in read_log(log)][n0:]
    assert qs == [f"while the disk is full {i}" for i in range(5)] + [
        f"after space came back {i}" for i in range(3)
    ]
    assert "failed" in s.info()["query_log"] and s.info()["query_log"]["pending"] == 0


def test_case04_records_wait_for_room_and_are_written_at_close(tmp_path):
    """In a process whose file-size limit is reached (as on a full disk), appends fail but
    every record is kept, none is half written, and they are written once there is room."""
    path = tmp_path / "q.log"
    code = textwrap.dedent(
        f"""
        import resource
        from crossknn.corpus.query_log import QueryLog
        soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        log = QueryLog({str(path)!r})
        log.append("fits", ["d1"], [1.0])
        resource.setrlimit(resource.RLIMIT_FSIZE, (300, hard))
        failed = 0
        for i in range(4):
            try:
                log.append("while full %d " % i + "x" * 100, ["d1", "d2"], [0.5, 0.25])
            except OSError:
                failed += 1
        assert failed >= 3, failed
        assert open({str(path)!r}, "rb").read().endswith(b"\\n")
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        log.close()
        """
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    got = [x.query.split()[0:3] for x in read_log(path)]
    assert got == [["fits"]] + [["while", "full", str(i)] for i in range(4)], got


# -- case 5: the log's mode ---------------------------------------------------------------------


def test_case05_the_log_is_created_0600_and_a_wider_one_warns(tmp_path, capsys):
    old = os.umask(0o022)
    try:
        with QueryLog(tmp_path / "new.log") as log:
            log.append("q", ["d1"], [1.0])
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "new.log").stat().st_mode) == 0o600
    assert "warning" not in capsys.readouterr().err
    wide = tmp_path / "wide.log"
    wide.write_text("")
    wide.chmod(0o644)
    with QueryLog(wide):
        pass
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "readable by its group and everyone" in err[0], err
    assert f"chmod 600 {wide}" in err[0]


# -- case 6: the index lock through a symbolic link (and other odd files) -----------------------


@pytest.mark.parametrize("how", ["symlink", "fifo", "hardlink"])
def test_case06_a_lock_file_is_never_written_through(tmp_path, monkeypatch, how, capsys):
    idx = tmp_path / "idx"
    build(idx, corpus(40))
    log = tmp_path / "q.log"
    _log_searches(monkeypatch, idx, log, queries(6), budget=20)
    write_items(tmp_path / "new.jsonl", corpus(3, prefix="n", seed=9))
    victim = tmp_path / "victim.txt"
    victim.write_text("precious content\n")
    lock = idx / ".lock"
    if how == "symlink":
        lock.symlink_to(victim)
    elif how == "fifo":
        os.mkfifo(lock)
    else:
        os.link(victim, lock)
    (tmp_path / "rm.txt").write_text("d1\n")
    capsys.readouterr()
    for argv in (
        ["remove", str(idx), "--ids", str(tmp_path / "rm.txt")],
        ["add", str(idx), str(tmp_path / "new.jsonl"), "--quiet"],
        ["refine", str(idx), "--queries", str(log), "--quiet"],
    ):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert "lock file" in err and len(err.strip().splitlines()) == 1, err
    with pytest.raises(ValueError, match="lock file"):  # crossknn.fileio.UnsafeLockFile
        build(idx, corpus(40))
    assert victim.read_text() == "precious content\n"
    assert index_version(open_index(idx)) == 1
    assert lock.is_symlink() if how == "symlink" else lock.exists()


# -- case 7: the version loaded at start is released after its swap ---------------------------


def _mapped_deleted(pid: int, folder: Path) -> list[str]:
    """Files of ``folder`` the process still maps although they were deleted."""
    out = set()
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        if str(folder) in line and line.endswith("(deleted)"):
            out.add(line.split()[-2])
    return sorted(out)


@pytest.mark.slow
def test_case07_the_first_version_is_released_like_any_other(env, tmp_path):
    idx = tmp_path / "idx"
    shutil.copytree(env["idx"], idx)
    s = Server(env, idx, "--watch-index", "0")
    try:
        assert s.search("a first search").status_code == 200
        for k in range(4):
            new = tmp_path / f"add{k}.jsonl"
            new.write_text(
                "".join(
                    json.dumps({"id": f"n{k}-{j}", "text": f"new item {j} on csv files, {k}"})
                    + "\n"
                    for j in range(2)
                )
            )
            r = _cli(env, "add", str(idx), str(new), "--quiet")
            assert r.returncode == 0, r.stderr
            rel = httpx.post(s.url + "/admin/reload", headers=s.auth, timeout=120).json()
            assert rel["status"] == "swapped", rel
            t = time.monotonic()
            while s.info()["reload"]["releases"] < k + 1 and time.monotonic() - t < 60:
                time.sleep(0.1)
            assert s.search(f"search {k}").status_code == 200
        assert s.info()["reload"]["releases"] == 4
        assert _mapped_deleted(s.proc.pid, idx) == []
    finally:
        s.stop()


# -- case 8: a maximum query length; caches bounded in bytes ------------------------------------


@pytest.mark.slow
def test_case08_a_query_over_the_maximum_length_is_422(served):
    s = served
    n0 = len(read_log(s.log_queries, quiet=True))
    big = "a very long query " * 55_000  # ~1 MB, within the body limit
    small = {"k": 3, "budget": 10}
    r = httpx.post(s.url + "/search", json={"query": big, **small}, headers=s.auth, timeout=60)
    assert r.status_code == 422 and "at most 4,096" in r.text, r.text[:300]
    r = httpx.post(
        s.url + "/search",
        json={"queries": ["short", "x" * 4097], **small},
        headers=s.auth,
        timeout=60,
    )
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "queries", 1]
    r = httpx.post(
        s.url + "/rerank",
        json={"query": "y" * 5000, "texts": ["a text"]},
        headers=s.auth,
        timeout=60,
    )
    assert r.status_code == 422, r.text[:300]
    assert s.search("q" * 4096).status_code == 200  # at the maximum: answered
    assert len(read_log(s.log_queries, quiet=True)) == n0 + 1  # nothing refused was logged


def test_case08_query_caches_are_bounded_in_bytes(monkeypatch, model_cache):
    import crossknn.ce
    import crossknn.ce.model_base as model_base
    from crossknn.searcher import _QueryVectors

    qv = _QueryVectors(StubDE())
    for i in range(100):
        qv(f"{i} " + "x" * 1_000_000)
    held = sum(len(t) + v.nbytes for t, v in qv.cache.items())
    assert held <= 32 << 20, f"the DE query cache holds {held / 1e6:.0f} MB"
    # the CE's query cache (token ids by query text): a lower cap here, the same rule
    monkeypatch.setenv("CROSSKNN_CACHE", str(model_cache))
    monkeypatch.setattr(model_base, "QUERY_CACHE_BYTES", 1 << 20)
    ce = crossknn.ce.default_cross_encoder()
    ce.set_items(["an item", "another item"])
    for i in range(12):
        ce.score(f"{i} " + "long query text " * 12_000, np.arange(2))
    held = sum(len(q) + st.flat.nbytes for q, st in ce._qcache.items())
    assert held <= 2 << 20 and len(ce._qcache) < 12, held


# -- case 9: a log that cannot be written, before any model loads ------------------------------


def test_case09_search_checks_the_log_before_any_model_opens(tmp_path, monkeypatch, capsys):
    idx = tmp_path / "idx"
    build(idx, corpus(30))
    opened = _stub_models(monkeypatch)
    (tmp_path / "a-file").write_text("")
    bad = tmp_path / "a-file" / "q.log"  # its folder is a file: it cannot be created
    run = tmp_path / "out.run"
    argv = ["search", str(idx), "a query", "--budget", "10", "--quiet", "--run", str(run)]
    assert main([*argv, "--log-queries", str(bad)]) == 2
    assert opened == [], "the models were opened before the log was checked"
    assert "--log-queries" in capsys.readouterr().err


@pytest.mark.slow
def test_case09_serve_checks_the_log_before_loading(env, tmp_path):
    (tmp_path / "a-file").write_text("")
    t = time.monotonic()
    r = _cli(env, "serve", str(env["idx"]), "--port", str(_free_port()), "--log-queries",
             str(tmp_path / "a-file" / "q.log"))  # fmt: skip
    assert r.returncode == 2, (r.returncode, r.stderr[-500:])
    assert "--log-queries" in r.stderr and "loading failed" not in r.stderr, r.stderr[-500:]
    assert time.monotonic() - t < 60


# -- case 10: removing a removed id -------------------------------------------------------------


def test_case10_removing_a_removed_id_is_a_no_op_before_and_after_compaction(tmp_path):
    idx = tmp_path / "idx"
    build(idx, corpus(100))
    for i in range(20, 30):
        remove_items(idx, [f"d{i}"], compact_at=1.0)
    add_items(idx, corpus(2, prefix="a", seed=3), ce=StubCE(), de=StubDE())
    add_items(idx, corpus(2, prefix="b", seed=4), ce=StubCE(), de=StubDE())
    v = index_version(open_index(idx))
    r = remove_items(idx, ["d20"], compact_at=1.0)
    assert r["already"] and index_version(open_index(idx)) == v
    # a compaction drops the removed items: removing one again is still a no-op
    remove_items(idx, ["d31"], compact_at=0.05)
    index = open_index(idx)
    assert "d20" not in index.corpus.ids and "tombstones" not in index.arrays
    v = index_version(index)
    r = remove_items(idx, ["d20", "d25"], compact_at=1.0)
    assert r["already"] and index_version(open_index(idx)) == v
    # an id never in the index is still refused, and a live one is removed
    with pytest.raises(ValueError, match="not in the index"):
        remove_items(idx, ["never-there"])
    r = remove_items(idx, ["d20", "d40"], compact_at=1.0)
    assert not r["already"] and r["removed"] == 1 and index_version(open_index(idx)) == v + 1
    # an id removed, compacted away and added again is live again: removing it removes it
    add_items(idx, Corpus(["d20"], ["w3 w4 w5 w6 w7 d20 again"], "again"), ce=StubCE(), de=StubDE())
    r = remove_items(idx, ["d20"], compact_at=1.0)
    assert not r["already"] and r["removed"] == 1


# -- case 11: queries and items of combining marks only -----------------------------------------


MARKS = ["\u034f", "\ufe0f", "\u0301", "\u0e31", "\u0301\u0302 \ufe0f", "\u200b\u0301"]


@pytest.mark.slow
def test_case11_marks_only_is_an_empty_query_text_and_item(served, tmp_path):
    s = served
    n0 = len(read_log(s.log_queries, quiet=True))
    for q in MARKS:
        r = httpx.post(s.url + "/search", json={"query": q}, headers=s.auth, timeout=60)
        assert r.status_code == 422 and r.json()["detail"][0]["msg"] == "the query is empty", q
        r = httpx.post(
            s.url + "/rerank", json={"query": q, "texts": ["a"]}, headers=s.auth, timeout=60
        )
        assert r.status_code == 422, q
        r = httpx.post(
            s.url + "/rerank", json={"query": "ok", "texts": ["a", q]}, headers=s.auth, timeout=60
        )
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "texts", 1], q
    assert len(read_log(s.log_queries, quiet=True)) == n0  # nothing logged
    # a real word with marks is a query
    assert s.search("cafe\u0301 su\u0301r").status_code == 200
    idx = tmp_path / "idx"
    build(idx, corpus(30))
    for text in ["\u200b\u200b", *MARKS]:
        with pytest.raises(ValueError, match="empty text"):
            add_items(idx, Corpus(["z1"], [text], "marks"), ce=StubCE(), de=StubDE())
    assert index_version(open_index(idx)) == 1


# -- case 12: a served file cut in place --------------------------------------------------------


@pytest.mark.slow
def test_case12_a_served_file_cut_in_place_is_never_a_silent_death(env, tmp_path):
    """A small index is read into memory when served (issue 64, item 13): a file of the folder
    cut in place (what cp / rsync --inplace over it do) no longer kills the server, which said
    at start how it holds the arrays; it answers as before the cut. (Before, the server died
    under the next request with a 'Bus error' line; a mapped index still would, and its
    start-up line says so: tests/test_tenant_isolation.py.)"""
    idx = tmp_path / "idx"
    shutil.copytree(env["idx"], idx)
    s = Server(env, idx, "--watch-index", "0")
    try:
        before = s.search("before the cut")
        assert before.status_code == 200
        os.truncate(idx / "de_items.npy", 0)  # what cp / rsync --inplace over the folder does
        after = s.search("before the cut")
        assert after.status_code == 200, after.text
        assert after.json()["hits"][0]["results"] == before.json()["hits"][0]["results"]
        assert s.proc.poll() is None  # still serving
    finally:
        s.stop()
    out = s.output()
    assert "index arrays read into memory" in out, out[-2000:]
    assert "Bus error" not in out


# -- case 13: a path that is no index -----------------------------------------------------------


def test_case13_a_missing_index_path_creates_nothing(tmp_path, monkeypatch, capsys):
    _stub_models(monkeypatch)
    ids = tmp_path / "ids.txt"
    ids.write_text("d1\n")
    write_items(tmp_path / "new.jsonl", corpus(2, prefix="n"))
    (tmp_path / "q.log").write_text("")
    gone = tmp_path / "no" / "such" / "deep" / "path"
    for argv in (
        ["remove", str(gone), "--ids", str(ids)],
        ["add", str(gone), str(tmp_path / "new.jsonl")],
        ["refine", str(gone), "--queries", str(tmp_path / "q.log")],
    ):
        assert main(argv) == 2, argv
        assert not (tmp_path / "no").exists(), argv
        assert len(capsys.readouterr().err.strip().splitlines()) == 1
    plain = tmp_path / "plain"
    plain.mkdir()
    assert main(["remove", str(plain), "--ids", str(ids)]) == 2
    assert list(plain.iterdir()) == []
    assert "not an index" in capsys.readouterr().err


# -- case 14: headers and /info -----------------------------------------------------------------


@pytest.mark.slow
def test_case14_the_version_header_goes_to_key_holders_only(served):
    s = served
    for path in ("/healthz", "/readyz"):
        r = httpx.get(s.url + path, timeout=30)
        assert r.status_code == 200 and "x-index-version" not in r.headers, path
    r = httpx.post(s.url + "/search", json={"query": "no key"}, timeout=30)
    assert r.status_code == 401 and "x-index-version" not in r.headers
    r = httpx.get(s.url + "/info", headers=s.auth, timeout=30)
    assert r.headers["x-index-version"] == str(r.json()["index"]["version"])
    r = s.search("with the key")
    assert r.headers["x-index-version"] == str(r.json()["index_version"])


def test_case14_the_version_header_is_the_body_version_across_a_swap(env, tmp_path, monkeypatch):
    """A swap between a search's end and its answer: the header names the version the search
    ran on, as the body does (before: the version serving when the answer went out)."""
    import asyncio

    from crossknn.serve.app import create_app
    from crossknn.serve.service import SearchService, ServeConfig

    idx = tmp_path / "idx"
    shutil.copytree(env["idx"], idx)
    config = ServeConfig(index=str(idx), watch_index_s=0)
    svc = SearchService(config)
    svc.load()
    real = svc.search

    def search_then_swap(req, ctx):
        out = real(req, ctx)
        remove_items(idx, [f"d{svc.index_version}"], compact_at=1.0)  # a new version commits
        assert svc.follower.reload()["status"] == "swapped"
        return out

    monkeypatch.setattr(svc, "search", search_then_swap)
    app = create_app(config, service=svc, load="none")

    async def go():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            return await c.post("/search", json={"query": "csv files", "k": 3, "budget": 10})

    try:
        for _ in range(2):
            r = asyncio.run(go())
            assert r.status_code == 200, r.text
            assert r.headers["x-index-version"] == str(r.json()["index_version"])
    finally:
        svc.close()


def test_case14_no_retry_after_on_a_request_that_can_never_be_admitted(env, monkeypatch):
    """A request expected to take more than the limit even alone is refused at once (429); a
    retry of it cannot help, so the answer has no Retry-After (a full queue's 429 keeps it)."""
    import asyncio

    from crossknn.serve.admission import Decision
    from crossknn.serve.app import create_app
    from crossknn.serve.service import SearchService, ServeConfig

    config = ServeConfig(index=str(env["idx"]), watch_index_s=0, timeout_s=4.0)
    svc = SearchService(config)
    svc.load()
    app = create_app(config, service=svc, load="none")
    body = {"query": "a river", "texts": ["a text"] * 3}

    async def post():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            return await c.post("/rerank", json=body)

    try:
        for reason, retry in (("too_large", False), ("queue_full", True)):
            refuse = Decision(ticket=None, expected_s=120.0, retry_after_s=3, reason=reason)
            monkeypatch.setattr(svc.admission, "try_admit", lambda cost, d=refuse: d)
            r = asyncio.run(post())
            assert r.status_code == 429, r.text
            assert ("retry-after" in r.headers) == retry, (reason, dict(r.headers))
    finally:
        svc.close()


@pytest.mark.slow
def test_case14_reload_error_clears_once_the_folder_is_whole_again(env, tmp_path):
    from crossknn.corpus.versions import write_version

    idx = tmp_path / "idx"
    shutil.copytree(env["idx"], idx)
    s = Server(env, idx, "--watch-index", "0")
    try:
        good = (idx / "index.json").read_bytes()
        index = open_index(idx)
        v = np.asarray(index["de_items"], np.float32).copy()
        write_version(index, changed={"de_items": v}, params=index.params, op={"op": "test"})
        f = idx / "de_items.v2.npy"
        f.write_bytes(f.read_bytes()[:-8] + b"\x00\x01\x02\x03\x04\x05\x06\x07")
        r = httpx.post(s.url + "/admin/reload", headers=s.auth, timeout=60)
        assert r.status_code == 409
        assert s.info()["reload"]["last_error"]
        (idx / "index.json").write_bytes(good)  # the operator puts version 1 back
        r = httpx.post(s.url + "/admin/reload", headers=s.auth, timeout=60)
        assert r.status_code == 200 and r.json()["status"] == "unchanged", r.text
        rel = s.info()["reload"]
        assert rel["last_error"] is None and rel["refused"] == 1
    finally:
        s.stop()


@pytest.mark.slow
def test_case14_the_key_file_warning_is_printed_once(env, tmp_path):
    key = tmp_path / "open.key"
    key.write_text(KEY + "\n")
    key.chmod(0o644)
    s = Server(env, env["idx"], key_file=key)
    try:
        assert s.search("a query").status_code == 200
    finally:
        s.stop()
    warn = [x for x in s.output().splitlines() if "chmod 600" in x]
    assert len(warn) == 1, warn


# -- case 15: a refine killed and rerun counts every CE call ------------------------------------


def test_case15_a_killed_refine_counts_the_ce_calls_of_both_runs(tmp_path, monkeypatch):
    base = tmp_path / "base"
    build(base, corpus(80), rows=6)
    log = tmp_path / "q.log"
    _log_searches(monkeypatch, base, log, queries(16, seed=11), budget=20)
    clean = tmp_path / "clean"
    shutil.copytree(base, clean)
    r = refine_index(clean, log, ce=StubCE(), de=StubDE(), quiet=True)
    want = r.ce_calls
    assert want > 0
    killed = tmp_path / "killed"
    shutil.copytree(base, killed)
    work = killed / ".build" / "lifecycle" / "refine"
    p = subprocess.Popen([sys.executable, str(HERE), "refine", str(killed), str(log)])
    try:
        # killed once a row or two are kept (a CE batch takes 0.3 s there: the kill lands
        # long before the refine could end, however loaded the machine)
        t = time.monotonic()
        while len(list(work.glob("row_*.npy"))) < 2 and time.monotonic() - t < 120:
            assert p.poll() is None, "the refine ended before two rows were kept"
            time.sleep(0.02)
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    assert index_version(open_index(killed)) == 1 and list(work.glob("row_*.npy"))
    r = refine_index(killed, log, ce=StubCE(), de=StubDE(), quiet=True)
    hist = open_index(killed).info["history"][-1]
    assert hist["ce_calls"] == r.ce_calls >= want, (hist["ce_calls"], want)
    assert open_index(killed).ce_calls == open_index(base).ce_calls + r.ce_calls


def _refine_main(idx: str, log: str) -> None:  # the refine case 15 kills
    refine_index(idx, log, ce=StubCE(0.3), de=StubDE(), quiet=True)


if __name__ == "__main__":  # python tests/test_lifecycle_defects.py refine IDX LOG
    sys.path.insert(0, str(HERE.parent))
    _refine_main(sys.argv[2], sys.argv[3])
