"""Issue 10: a corpus build killed anywhere and rerun on another corpus ends in exactly the index
a clean build of the new corpus writes; stale state is never reused; one build per folder;
files honour the umask. Cheap deterministic stand-in models keep it fast."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from crossknn.corpus.build import build_corpus_index
from crossknn.corpus_folder import open_index
from crossknn.data import Corpus
from crossknn.fileio import FolderInUse, atomic_write_bytes, folder_lock

HERE = Path(__file__).resolve()
CHUNK = 2
TRAIN = ["alpha beta", "gamma delta"]


def _vec(text: str, dim: int) -> np.ndarray:
    h = hashlib.sha256(text.encode()).digest()
    v = np.frombuffer(h, np.uint8)[:dim].astype(np.float32) - 127.5
    return v / np.linalg.norm(v)


class StubDE:
    model_id, model_hash, max_length, precision, dim = "stub-de", "de-hash-1", 64, "fp32", 8

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay

    def encode(self, texts, **_):
        time.sleep(self.delay)
        return np.stack([_vec(t, self.dim) for t in texts])


class StubCE:
    model_id, model_hash, max_length, precision = "stub-ce", "ce-hash-1", 64, "fp32"

    def __init__(self, delay: float = 0.0) -> None:
        self.delay, self.items = delay, []

    def set_items(self, texts) -> None:
        self.items = list(texts)

    @property
    def n_items(self) -> int:
        return len(self.items)

    def score(self, query, items):
        return self.score_batch([query], [items])[0]

    def score_batch(self, queries, items_list):
        time.sleep(self.delay)
        return [
            np.array([_vec(q + "|" + self.items[int(i)], 4)[0] for i in its], np.float32)
            for q, its in zip(queries, items_list, strict=True)
        ]


def corpus(name: str) -> Corpus:
    n = {"A": 16, "B": 16, "C": 10}[name]
    ids = [f"d{i}" for i in range(n)] if name != "B" else [f"d{i}" for i in range(n)]
    texts = [f"{name} item number {i} about topic {i % 3} words words" for i in range(n)]
    return Corpus(ids, texts, f"stub:{name}")


def build(name: str, out, *, delay: float = 0.0, **kw):
    return build_corpus_index(
        corpus(name),
        out,
        ce=StubCE(delay),
        de=StubDE(delay),
        train_queries=TRAIN,
        cur=True,
        calibration_items=6,
        progress=False,
        chunk=CHUNK,
        **kw,
    )


def snapshot(out: Path) -> dict:
    """Every file of an index folder (index.json without timing fields)."""
    snap = {}
    for p in sorted(out.iterdir()):
        if p.name == "index.json":
            doc = json.loads(p.read_text())
            snap[p.name] = {k: v for k, v in doc.items() if "time" not in k and "second" not in k}
        else:
            snap[p.name] = p.read_bytes() if p.is_file() else "dir"
    return snap


def _spawn(name: str, out: Path, delay: float) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(HERE), name, str(out), str(delay)],
        stderr=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
    )


def _chunks(out: Path) -> int:
    return len(list((out / ".build" / "de").glob("de_*.npy")))


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    snaps = {}
    for name in ("B", "C"):
        d = tmp_path_factory.mktemp(f"clean{name}")
        build(name, d)
        snaps[name] = snapshot(d)
    return snaps


def test_build_discards_stale_de_chunks_of_another_corpus(tmp_path, clean):
    out = tmp_path / "idx"
    p = _spawn("A", out, 0.05)
    t0 = time.monotonic()
    while _chunks(out) < 1 and time.monotonic() - t0 < 20:
        time.sleep(0.002)
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert _chunks(out) >= 1
    r = subprocess.run(
        [sys.executable, str(HERE), "B", str(out), "0"], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    assert "discarding the DE vectors of an earlier build" in r.stderr
    assert snapshot(out) == clean["B"]


def test_build_killed_anywhere_then_rerun_on_changed_corpus_equals_clean_build(tmp_path, clean):
    rng = np.random.default_rng(10)
    for it in range(8):
        out = tmp_path / f"idx{it}"
        over_complete = it % 2 == 1
        if over_complete:  # the folder holds a finished index of another corpus
            build("C", out)
        p = _spawn("A", out, 0.02)
        target = int(rng.integers(0, 16 // CHUNK + 1))
        t0 = time.monotonic()
        while _chunks(out) < target and p.poll() is None and time.monotonic() - t0 < 20:
            time.sleep(0.001)
        time.sleep(float(rng.uniform(0, 0.03)))
        p.send_signal(signal.SIGKILL)
        p.wait()
        # whatever was left opens as one whole index (the old one, or the new one if the kill
        # came after it was complete) or not at all
        if (out / "index.json").exists():
            idx = open_index(out)
            assert idx.corpus.texts in (corpus("C").texts, corpus("A").texts)
        r = subprocess.run(
            [sys.executable, str(HERE), "B", str(out), "0"], capture_output=True, text=True
        )
        assert r.returncode == 0, r.stderr
        assert snapshot(out) == clean["B"], f"iteration {it} (chunks {target})"


def _search(out: Path):
    from crossknn.searcher import Searcher

    hits = Searcher(open_index(out), ce=StubCE(), de=StubDE()).search(
        ["topic 1 words"], k=3, budget=6
    )
    return hits[0].ids, hits[0].scores.tolist()


def _index_files(out: Path) -> dict:
    """The index's own files (not its work folder)."""
    return {k: v for k, v in snapshot(out).items() if not k.startswith(".")}


def test_rebuild_keeps_old_index_usable_and_disk_full_leaves_it_whole(tmp_path, monkeypatch):
    """#28 item 4: the old index opens and searches all through a rebuild, and a full disk at
    any write of the rebuild leaves it whole; the rerun then completes the new index."""
    import errno

    import crossknn.corpus.build as ci
    from crossknn import fileio

    out = tmp_path / "idx"
    build("C", out)
    old_files, old_hits = _index_files(out), _search(out)
    clean_b = tmp_path / "b"
    build("B", clean_b)
    writes = []

    def spy(path, data):  # every write of the rebuild: the old index still opens and searches
        writes.append(Path(path).name)
        assert _search(twin) == old_hits
        atomic_write_bytes(path, data)

    twin = tmp_path / "twin"
    shutil.copytree(out, twin)
    monkeypatch.setattr(fileio, "atomic_write_bytes", spy)
    monkeypatch.setattr(ci, "atomic_write_bytes", spy)
    build("B", twin)  # a rebuild of a copy of C's index: C's index searched before each write
    monkeypatch.undo()
    assert _index_files(twin) == _index_files(clean_b)
    assert writes[-1] == "index.json" and len(writes) > 10
    n_writes = len(writes)
    for k in sorted({0, 1, 3, n_writes // 2, n_writes - 3, n_writes - 2, n_writes - 1}):
        calls = []

        def full(path, data, calls=calls, k=k):
            calls.append(path)
            if len(calls) > k:
                raise OSError(errno.ENOSPC, "No space left on device", str(path))
            atomic_write_bytes(path, data)

        shutil.rmtree(out / ".build", ignore_errors=True)  # each try makes every write again
        monkeypatch.setattr(fileio, "atomic_write_bytes", full)
        monkeypatch.setattr(ci, "atomic_write_bytes", full)
        with pytest.raises(OSError, match="No space left"):
            build("B", out)
        monkeypatch.undo()
        assert _index_files(out) == old_files, f"write {k}"
        assert _search(out) == old_hits
        assert not list(out.glob(".index-stage-*"))
    build("B", out)  # the rerun resumes and completes
    assert _index_files(out) == _index_files(clean_b)


def test_second_build_into_same_folder_fails_naming_holder(tmp_path):
    out = tmp_path / "idx"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from crossknn.fileio import folder_lock\n"
            "with folder_lock(sys.argv[1]):\n    print('locked', flush=True); time.sleep(30)",
            str(out / ".lock"),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(FolderInUse, match=f"in use by process {holder.pid}"):
            build("B", out)
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()
    build("B", out)  # the lock dies with its holder
    assert not (out / ".lock").exists()


def test_folder_lock_is_exclusive_in_one_process_and_removed(tmp_path):
    lock = tmp_path / "d" / ".lock"
    with folder_lock(lock):
        assert lock.read_text().strip() == str(os.getpid())
        with pytest.raises(FolderInUse, match=str(os.getpid())):
            with folder_lock(lock):
                pass
    assert not lock.exists()


def test_output_files_respect_umask(tmp_path):
    old = os.umask(0o027)
    try:
        atomic_write_bytes(tmp_path / "f", b"x")
        assert (tmp_path / "f").stat().st_mode & 0o777 == 0o640
        os.umask(0o002)
        atomic_write_bytes(tmp_path / "f", b"y")
        assert (tmp_path / "f").stat().st_mode & 0o777 == 0o664
    finally:
        os.umask(old)


def _cli_argv(corpus_file: Path, out: Path, delay: float) -> list[str]:
    return [sys.executable, str(HERE), "cli", str(corpus_file), str(out), str(delay)]


def _write_jsonl(c: Corpus, path: Path) -> Path:
    path.write_text(
        "".join(
            json.dumps({"id": i, "text": t}) + "\n" for i, t in zip(c.ids, c.texts, strict=True)
        ),
        encoding="utf-8",
    )
    return path


def test_stale_lock_of_a_dead_process_is_taken_over_saying_so(tmp_path, capsys):
    """#28 item 6: a lock file whose holder is gone is taken over with one line."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    lock = tmp_path / ".lock"
    lock.write_text(f"{dead.pid}\n")
    with folder_lock(lock, what="index folder X"):
        assert lock.read_text().strip() == str(os.getpid())
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert f"taking over the stale lock {lock} of process {dead.pid}, which is gone" in err[0]


def test_cli_build_killed_at_random_points_then_same_command_rerun_equals_clean(tmp_path):
    """#28 item 6: ``crossknn build`` SIGKILLed anywhere (imports, lock, DE chunks, CUR rows,
    the final swap), then the same command rerun: it succeeds (a stale lock is taken over) and
    the index equals an uninterrupted build's."""
    src = _write_jsonl(corpus("A"), tmp_path / "corpus.jsonl")
    clean_dir = tmp_path / "clean"
    t0 = time.monotonic()
    r = subprocess.run(_cli_argv(src, clean_dir, 0.01), capture_output=True, text=True)
    took = time.monotonic() - t0
    assert r.returncode == 0, r.stderr
    clean = snapshot(clean_dir)
    rng = np.random.default_rng(28)
    took_over = 0
    for it in range(5):
        out = tmp_path / f"idx{it}"
        p = subprocess.Popen(
            _cli_argv(src, out, 0.01), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        if it == 0:  # anywhere, most likely while it imports (before the lock)
            time.sleep(float(rng.uniform(0.1, 1.0)) * took)
        else:  # once it holds the lock, after a random number of DE chunks
            target = int(rng.integers(0, 16 // CHUNK + 1))
            t0 = time.monotonic()
            while p.poll() is None and time.monotonic() - t0 < 30:
                if (out / ".lock").exists() and (target == 0 or _chunks(out) >= target):
                    break
                time.sleep(0.001)
            time.sleep(float(rng.uniform(0, 0.02)))
        p.send_signal(signal.SIGKILL)
        p.wait()
        r = subprocess.run(_cli_argv(src, out, 0.01), capture_output=True, text=True)
        assert r.returncode == 0, f"iteration {it}: {r.stderr}"
        assert "not part of an index" not in r.stderr
        took_over += "taking over the stale lock" in r.stderr
        assert snapshot(out) == clean, f"iteration {it}"
        assert not (out / ".lock").exists()
    assert took_over >= 1  # kills came while the build held its lock


def test_cli_rebuild_on_a_full_disk_says_the_old_index_is_unchanged(tmp_path, monkeypatch, capsys):
    """#28 item 4 from the CLI: before, the old index.json was deleted first and the error did
    not say so; now the old index is whole, and the one line says it."""
    import errno

    import crossknn.commands.build_cmd as build_cmd
    import crossknn.corpus.build as ci
    from crossknn import fileio
    from crossknn.cli import main

    monkeypatch.setattr(build_cmd, "open_cross_encoder", lambda *a, **k: StubCE())
    monkeypatch.setattr(build_cmd, "open_dual_encoder", lambda *a, **k: StubDE())
    out = tmp_path / "idx"
    argv = ["build", "", str(out), "--quiet", "--calibration-items", "6"]
    argv[1] = str(_write_jsonl(corpus("C"), tmp_path / "c.jsonl"))
    assert main(argv) == 0
    before = _index_files(out)
    argv[1] = str(_write_jsonl(corpus("B"), tmp_path / "b.jsonl"))

    def full(path, data):
        if Path(path).name == "index.json":
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        atomic_write_bytes(path, data)

    monkeypatch.setattr(fileio, "atomic_write_bytes", full)
    monkeypatch.setattr(ci, "atomic_write_bytes", full)
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "No space left on device" in err[0]
    assert f"the old index in {out} is unchanged and still usable" in err[0]
    assert _index_files(out) == before
    assert open_index(out).corpus.texts == corpus("C").texts


def _cli_build(corpus_file: str, out: str, delay: float) -> int:
    """``crossknn build CORPUS OUT --train-queries Q --cur`` with the stand-in models."""
    import crossknn.commands.build_cmd as build_cmd
    from crossknn.cli import main

    build_cmd.open_cross_encoder = lambda *a, **k: StubCE(delay)
    build_cmd.open_dual_encoder = lambda *a, **k: StubDE(delay)
    queries = Path(out).parent / (Path(out).name + ".queries.txt")
    queries.write_text("\n".join(TRAIN) + "\n", encoding="utf-8")
    argv = ["build", corpus_file, out, "--train-queries", str(queries), "--cur", "--quiet"]
    return main([*argv, "--calibration-items", "6"])


if __name__ == "__main__":  # the build a test kills: NAME OUT DELAY, or cli CORPUS OUT DELAY
    if sys.argv[1] == "cli":
        sys.exit(_cli_build(sys.argv[2], sys.argv[3], float(sys.argv[4])))
    build(sys.argv[1], sys.argv[2], delay=float(sys.argv[3]))
