"""A build of the same corpus with the same models and settings into a folder that holds that
build's finished index does nothing (``force`` rebuilds); any change of the items, the models,
a setting, or of the index since (a new version) builds again. Stand-in models keep it fast."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from crossknn.corpus.build import WORK_KEY, build_corpus_index, settle_up_to_date
from crossknn.corpus.edit import remove_items
from crossknn.data import Corpus
from crossknn.fileio import FolderInUse, folder_lock
from test_reliability_build import TRAIN, StubCE, StubDE, corpus


class CountingCE(StubCE):
    def __init__(self, model_hash: str = "ce-hash-1") -> None:
        super().__init__()
        self.model_hash, self.calls = model_hash, 0

    def score_batch(self, queries, items_list):
        self.calls += sum(len(i) for i in items_list)
        return super().score_batch(queries, items_list)


def _build(out, *, ce=None, items=None, **kw):
    ce = ce or CountingCE()
    idx = build_corpus_index(
        items or corpus("A"),
        out,
        ce=ce,
        de=StubDE(),
        train_queries=TRAIN,
        calibration_items=6,
        progress=False,
        **kw,
    )
    return idx, ce


def _stamp(out) -> tuple[int, str]:
    meta = out / "index.json"
    return meta.stat().st_mtime_ns, meta.read_text(encoding="utf-8")


def test_the_same_build_again_does_nothing_and_force_rebuilds(tmp_path):
    out = tmp_path / "idx"
    first, ce = _build(out)
    assert ce.calls > 0 and first.info["build_key"]
    before = _stamp(out)
    again, ce = _build(out)
    assert ce.calls == 0 and _stamp(out) == before
    assert again.info["build_key"] == first.info["build_key"]
    forced, ce = _build(out, force=True)
    assert ce.calls > 0 and _stamp(out)[0] != before[0]
    assert forced.info["build_key"] == first.info["build_key"]


@pytest.mark.parametrize(
    "change",
    [
        {"seed": 1},
        {"calibration_queries": 8},
        {"index_calls": 100},  # (0 would spend no CE call at all)
        {"ce": CountingCE(model_hash="another-ce")},
        {"items": Corpus(corpus("A").ids, [t + " more" for t in corpus("A").texts], "stub")},
    ],
    ids=["seed", "calibration", "index-calls", "model", "items"],
)
def test_a_changed_input_builds_again(tmp_path, change):
    out = tmp_path / "idx"
    first, _ = _build(out)
    again, ce = _build(out, **change)
    assert ce.calls > 0 and again.info["build_key"] != first.info["build_key"]


def test_an_index_changed_since_its_build_is_built_again(tmp_path):
    out = tmp_path / "idx"
    _build(out)
    remove_items(out, ["d3"])  # version 2: a living index, never replaced without force
    with pytest.raises(ValueError, match="living index"):
        _build(out)
    again, ce = _build(out, force=True)
    assert ce.calls > 0 and again.info.get("version", 1) == 1
    assert len(again.corpus) == len(corpus("A"))


@pytest.mark.slow
def test_the_cli_says_up_to_date_and_force_rebuilds(tmp_path, model_cache):
    lines = [json.dumps({"id": f"d{i}", "text": f"item {i} about topic {i % 3}"}) for i in range(8)]
    (tmp_path / "corpus.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    env = {**os.environ, "CROSSKNN_CACHE": str(model_cache)}

    def build(*extra):
        return subprocess.run(
            [sys.executable, "-m", "crossknn.cli", "build", "corpus.jsonl", "idx", "--quiet"]
            + list(extra),
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env=env,
            timeout=600,
        )

    first = build()
    assert first.returncode == 0, first.stderr
    assert "CE maximum length: 128 tokens" in first.stdout, first.stdout
    second = build()
    assert second.returncode == 0, second.stderr
    assert second.stdout.strip() == (
        "index idx is up to date: built from the same 8 items with the same models and "
        "settings (--force rebuilds it)"
    )
    forced = build("--force")
    assert forced.returncode == 0 and "CE calls spent" in forced.stdout, forced.stderr


class _KilledAfterTheSwap(Exception):
    pass


def _build_killed_after_the_swap(out, monkeypatch):
    """A build that stops right after its index is moved in, before it removes its work (as a
    kill -9 there leaves it), with the lock file of the dead process left behind."""
    import types

    import crossknn.corpus.build as build_mod

    real = build_mod.shutil

    def rmtree(path, *a, **kw):
        if Path(path).name == ".build":
            raise _KilledAfterTheSwap
        return real.rmtree(path, *a, **kw)

    monkeypatch.setattr(build_mod, "shutil", types.SimpleNamespace(rmtree=rmtree))
    with pytest.raises(_KilledAfterTheSwap):
        _build(out)
    monkeypatch.setattr(build_mod, "shutil", real)
    (out / ".lock").write_text("999999999\n", encoding="utf-8")  # no such process holds it


def test_the_same_build_after_one_killed_past_its_swap_clears_its_work_and_lock(
    tmp_path, monkeypatch, capfd
):
    out = tmp_path / "idx"
    _build_killed_after_the_swap(out, monkeypatch)
    key = json.loads((out / "index.json").read_text(encoding="utf-8"))["info"]["build_key"]
    assert (out / ".build" / WORK_KEY).read_text(encoding="utf-8") == key
    before = _stamp(out)
    assert settle_up_to_date(out, key)
    assert "taking over the stale lock" in capfd.readouterr().err
    assert not (out / ".build").exists() and not (out / ".lock").exists()
    assert _stamp(out) == before  # the index itself untouched
    # the library's build path does the same
    _build_killed_after_the_swap(tmp_path / "idx2", monkeypatch)
    again, ce = _build(tmp_path / "idx2")
    assert ce.calls == 0 and sorted(p.name for p in (tmp_path / "idx2").iterdir()) == sorted(
        p.name for p in out.iterdir()
    )


def test_the_work_of_another_build_beside_an_up_to_date_index_is_kept(tmp_path):
    out = tmp_path / "idx"
    first, _ = _build(out)
    other = out / ".build"
    other.mkdir()
    (other / WORK_KEY).write_text("the key of another build", encoding="utf-8")
    (other / "piece.npy").write_bytes(b"resumable work")
    assert settle_up_to_date(out, first.info["build_key"])
    assert (other / "piece.npy").read_bytes() == b"resumable work"
    assert not settle_up_to_date(out, "another key")


def test_settling_an_up_to_date_index_waits_for_no_live_build(tmp_path):
    out = tmp_path / "idx"
    first, _ = _build(out)
    with folder_lock(out / ".lock"), pytest.raises(FolderInUse, match="in use by process"):
        settle_up_to_date(out, first.info["build_key"])
