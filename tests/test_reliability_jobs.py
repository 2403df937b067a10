"""Issue 10 for score-matrix jobs: edited texts are never mixed into resumed scores, a second job
never leaves a mixed folder that loads, two runs into one folder fail with one clear line."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

import crossknn.ce
import crossknn.matrix
import crossknn.score_matrix_job as smj
from crossknn.fileio import FolderInUse
from crossknn.jobs import DensePairs, JobOptions, ScoreJob
from crossknn.matrix import load_score_matrix
from test_reliability_build import StubCE, StubDE

OPTS = JobOptions(shard_pairs=4, progress=False)


class _Boom(Exception):
    pass


@pytest.fixture
def stubs(monkeypatch):
    state = {"fail_after": None, "calls": 0}

    class CE(StubCE):
        def score_batch(self, queries, items_list):
            state["calls"] += 1
            if state["fail_after"] is not None and state["calls"] > state["fail_after"]:
                raise _Boom("killed")
            return super().score_batch(queries, items_list)

    def scorer(item_texts, **_):
        ce = CE()
        ce.set_items(item_texts)
        return ce

    monkeypatch.setattr(smj, "embedded_ce_scorer", scorer)
    monkeypatch.setattr(crossknn.ce, "default_dual_encoder", lambda **_: StubDE())
    return state


def beir(folder, tag=""):
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "corpus.jsonl", "w") as f:
        for i in range(6):
            f.write(json.dumps({"_id": f"d{i}", "text": f"item {i}{tag} text"}) + "\n")
    with open(folder / "queries.jsonl", "w") as f:
        for i in range(4):
            f.write(json.dumps({"_id": f"q{i}", "text": f"query {i}"}) + "\n")
    return folder


def test_score_matrix_resume_refuses_edited_item_texts(tmp_path, stubs):
    ds, out = beir(tmp_path / "ds"), tmp_path / "out"
    stubs["fail_after"] = 2
    with pytest.raises(_Boom):
        smj.build_score_matrix(ds, out, options=OPTS, n_test=1)
    stubs["fail_after"] = None
    beir(ds, tag=" edited")  # same ids, new texts
    with pytest.raises(ValueError, match="different job"):
        smj.build_score_matrix(ds, out, options=OPTS, n_test=1)
    smj.build_score_matrix(ds, out, options=OPTS, n_test=1, overwrite=True)
    clean = tmp_path / "clean"
    smj.build_score_matrix(ds, clean, options=OPTS, n_test=1)
    np.testing.assert_array_equal(load_score_matrix(out).scores, load_score_matrix(clean).scores)


def test_score_matrix_second_job_never_leaves_a_mixed_folder(tmp_path, stubs, monkeypatch):
    ds, out = beir(tmp_path / "ds"), tmp_path / "out"
    smj.build_score_matrix(ds, out, options=OPTS, n_test=1, query_ids="q0,q1")
    x = load_score_matrix(out)
    with pytest.raises(ValueError, match="finished score matrix of a different job"):
        smj.build_score_matrix(ds, out, options=OPTS, n_test=1, query_ids="q2,q3")
    assert load_score_matrix(out).query_ids == x.query_ids == ["q0", "q1"]
    real = crossknn.matrix.atomic_save_npy

    def killed_after_de_queries(path, arr):
        real(path, arr)
        if str(path).endswith("de_queries.npy"):
            raise _Boom("killed")

    monkeypatch.setattr(crossknn.matrix, "atomic_save_npy", killed_after_de_queries)
    with pytest.raises(_Boom):
        smj.build_score_matrix(ds, out, options=OPTS, n_test=1, query_ids="q2,q3", overwrite=True)
    with pytest.raises(FileNotFoundError, match="meta.json is missing"):
        load_score_matrix(out)
    monkeypatch.setattr(crossknn.matrix, "atomic_save_npy", real)
    smj.build_score_matrix(ds, out, options=OPTS, n_test=1, query_ids="q2,q3")  # resumes
    assert load_score_matrix(out).query_ids == ["q2", "q3"]


def _hold(lock):
    p = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from crossknn.fileio import folder_lock\n"
            "with folder_lock(sys.argv[1]):\n    print('locked', flush=True); time.sleep(30)",
            str(lock),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert p.stdout.readline().strip() == "locked"
    return p


def test_two_score_matrix_runs_into_one_folder_fail_naming_holder(tmp_path, stubs):
    ds, out = beir(tmp_path / "ds"), tmp_path / "out"
    p = _hold(out / ".lock")
    try:
        with pytest.raises(FolderInUse, match=f"score-matrix folder .* process {p.pid}"):
            smj.build_score_matrix(ds, out, options=OPTS, n_test=1)
    finally:
        p.kill()
        p.wait()
        p.stdout.close()
    smj.build_score_matrix(ds, out, options=OPTS, n_test=1)
    assert sorted(x.name for x in out.iterdir())[0] == "de_items.npy"  # no .lock, no .job


def test_score_job_lock_names_holder(tmp_path):
    ce = StubCE()
    ce.set_items(["a", "b"])
    job = ScoreJob(tmp_path / "job", ce, ["q"], DensePairs(1, 2))
    p = _hold(tmp_path / "job" / ".lock")
    try:
        with pytest.raises(FolderInUse, match=f"job folder .* process {p.pid}"):
            job.run(progress=False)
    finally:
        p.kill()
        p.wait()
        p.stdout.close()
    job.run(progress=False)
    assert job.result().shape == (2,)
