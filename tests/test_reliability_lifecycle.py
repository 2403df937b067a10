"""Issue 47 item 5: ``refine``, ``add`` and ``remove`` SIGKILLed at random points leave the
previous version whole and searchable (or the new one, once committed); rerunning the same
command finishes the job and ends in exactly the index an uninterrupted run writes; two writers
on one index are refused. Cheap deterministic stand-in models keep it fast
(tests/lifecycle_stubs)."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent))

from crossknn.corpus.query_log import QueryLog  # noqa: E402
from crossknn.corpus.versions import index_version  # noqa: E402
from crossknn.corpus_folder import open_index  # noqa: E402
from crossknn.fileio import FolderInUse, folder_lock  # noqa: E402
from crossknn.searcher import Searcher  # noqa: E402
from lifecycle_stubs import StubCE, StubDE, build, corpus, queries, write_items  # noqa: E402

DELAY = 0.03


def _state(out: Path) -> dict:
    """The index as a reader sees it: every file but work folders and the lock, index.json
    without its times (history entries' time/seconds, and the hash over them)."""
    snap = {}
    for p in sorted(out.iterdir()):
        if p.name.startswith("."):
            continue
        if p.name == "index.json":
            doc = json.loads(p.read_text())
            doc.pop("meta_sha256", None)
            for h in doc["info"].get("history", []):
                h.pop("time", None)
                h.pop("seconds", None)
            snap[p.name] = doc
        else:
            snap[p.name] = p.read_bytes()
    return snap


def _searchable(out: Path) -> int:
    """Opens (every hash checked) and searches the index; returns its version."""
    idx = open_index(out)
    s = Searcher(idx, ce=StubCE(), de=StubDE())
    hits = s.search(queries(2), k=3, budget=12)
    assert all(len(h.ids) == 3 for h in hits)
    return index_version(idx)


def _prepare(root: Path) -> dict:
    """An index (version 1) and the inputs of each operation."""
    idx = root / "base"
    build(idx, corpus(60), rows=3)
    s = Searcher(open_index(idx), ce=StubCE(), de=StubDE())
    s.record_paid = True
    with QueryLog(root / "q.log") as log:
        log.append_hits(s.search(queries(12), k=3, budget=15), s.corpus.ids, s.corpus.texts)
    write_items(root / "new.jsonl", corpus(8, prefix="n", seed=4))
    (root / "rm.txt").write_text("d3\nd9\nd11\n")
    return {"base": idx}


def _argv(op: str, idx: Path, root: Path) -> list[str]:
    return [sys.executable, str(HERE), op, str(idx), str(root), str(DELAY)]


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    """The uninterrupted result of each operation on a copy of the base index, and its time."""
    root = tmp_path_factory.mktemp("lifecycle")
    _prepare(root)
    out = {"root": root}
    for op in ("refine", "add", "remove"):
        # twice: the kills are timed by the faster run (a first run in a fresh clone also
        # compiles the package's bytecode, and a busy machine slows one run: kills timed by
        # such a run all came after the commit)
        states, times = [], []
        for rep in range(2):
            d = root / f"clean-{op}-{rep}"
            shutil.copytree(root / "base", d)
            t0 = time.monotonic()
            r = subprocess.run(_argv(op, d, root), capture_output=True, text=True)
            assert r.returncode == 0, r.stderr
            times.append(time.monotonic() - t0)
            states.append(_state(d))
        assert states[0] == states[1], f"{op}: two uninterrupted runs wrote different indexes"
        out[op] = (states[0], min(times))
    return out


@pytest.mark.parametrize("op", ["refine", "add", "remove"])
def test_killed_at_random_points_then_rerun_equals_an_uninterrupted_run(op, clean, tmp_path):
    root = clean["root"]
    want, took = clean[op]
    rng = np.random.default_rng({"refine": 1, "add": 2, "remove": 3}[op])
    base_version = 1
    committed = 0
    for it in range(4):
        d = tmp_path / f"idx{it}"
        shutil.copytree(root / "base", d)
        p = subprocess.Popen(
            _argv(op, d, root), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        time.sleep(float(rng.uniform(0.3, 1.0)) * took)
        p.send_signal(signal.SIGKILL)
        p.wait()
        # whatever was left is one whole version: the previous one, or the new one committed
        v = _searchable(d)
        assert v in (base_version, base_version + 1), f"iteration {it}"
        committed += v == base_version + 1
        r = subprocess.run(_argv(op, d, root), capture_output=True, text=True)
        assert r.returncode == 0, f"iteration {it}: {r.stderr}"
        assert _state(d) == want, f"iteration {it}"
        assert _searchable(d) == base_version + 1
        assert not (d / ".lock").exists() and not (d / ".build").exists()
    assert committed < 4  # kills came before the commit (the previous version was left)


def test_a_second_writer_is_refused_naming_the_holder(clean, tmp_path):
    d = tmp_path / "idx"
    shutil.copytree(clean["root"] / "base", d)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from crossknn.fileio import folder_lock\n"
            "with folder_lock(sys.argv[1]):\n    print('locked', flush=True); time.sleep(60)",
            str(d / ".lock"),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        for op in ("refine", "add", "remove"):
            r = subprocess.run(_argv(op, d, clean["root"]), capture_output=True, text=True)
            assert r.returncode != 0
            assert f"in use by process {holder.pid}" in r.stderr
        assert _searchable(d) == 1
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()
    with folder_lock(d / ".lock"):  # and within one process too
        with pytest.raises(FolderInUse):
            _run("remove", d, clean["root"], 0.0)


def _run(op: str, idx: Path, root: Path, delay: float) -> None:
    from crossknn.corpus.edit import add_items, remove_items
    from crossknn.corpus.refine import refine_index
    from crossknn.data import load_corpus

    if op == "refine":
        refine_index(idx, root / "q.log", ce=StubCE(delay), de=StubDE(delay), quiet=True)
    elif op == "add":
        add_items(idx, load_corpus(root / "new.jsonl"), ce=StubCE(delay), de=StubDE(delay))
    elif op == "remove":
        ids = (root / "rm.txt").read_text().split()
        remove_items(idx, ids, compact_at=0.05)  # compacts: every array is rewritten
    else:
        raise ValueError(op)


if __name__ == "__main__":  # the command a test kills: OP INDEX ROOT DELAY
    _run(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), float(sys.argv[4]))
