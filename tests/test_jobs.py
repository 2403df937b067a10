"""Sharded, resumable scoring jobs: results, resume, refusal of a different job, kill -9."""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from crossknn.fileio import atomic_save_npy
from crossknn.jobs import DensePairs, LazyScorer, ScoreJob, SparsePairs
from test_jobs_scorer import LookupScorer, lookup_matrix, make_lookup_scorer

TESTS = Path(__file__).resolve().parent


@pytest.mark.parametrize("shard_pairs", [1, 7, 64, 10_000])
def test_dense_job_equals_matrix(tmp_path, shard_pairs):
    M = lookup_matrix(5, 13)
    s = LookupScorer(M)
    job = ScoreJob(tmp_path / "j", s, list(range(5)), DensePairs(5, 13), shard_pairs=shard_pairs)
    stats = job.run(progress=False)
    assert stats["pairs"] == 65 and s.pairs == 65
    np.testing.assert_array_equal(job.result().reshape(5, 13), M)


def test_sparse_job_and_query_subset(tmp_path):
    M = lookup_matrix(6, 20, seed=3)
    rng = np.random.default_rng(1)
    qpos = np.sort(rng.integers(0, 3, 50))
    items = rng.integers(0, 20, 50)
    rows = [4, 1, 5]  # job query positions map to these matrix rows
    job = ScoreJob(tmp_path, LookupScorer(M), rows, SparsePairs(qpos, items), shard_pairs=9)
    job.run(progress=False)
    np.testing.assert_array_equal(job.result(), M[np.array(rows)[qpos], items])


def test_resume_scores_each_pair_once(tmp_path):
    M = lookup_matrix(4, 30)
    s = LookupScorer(M)
    job = ScoreJob(tmp_path, s, range(4), DensePairs(4, 30), shard_pairs=16)
    assert job.n_shards == 8
    job.run(progress=False, max_shards=3)
    assert s.pairs == 48 and len(job.pending()) == 5
    with pytest.raises(ValueError, match="not finished: 5 of 8"):
        job.result()
    # a stale temp file of a killed writer is ignored and removed
    (job.shard_dir / ".000004.npy.abc.tmp").write_bytes(b"partial")
    s2 = LookupScorer(M)
    job2 = ScoreJob(tmp_path, s2, range(4), DensePairs(4, 30), shard_pairs=16)
    job2.run(progress=False)
    assert s2.pairs == 120 - 48
    assert not list(job.shard_dir.glob(".*.tmp"))
    np.testing.assert_array_equal(job2.result().reshape(4, 30), M)
    # a damaged shard (wrong length) is redone, not trusted
    atomic_save_npy(job.shard_path(2), np.zeros(3, np.float32))
    s3 = LookupScorer(M)
    ScoreJob(tmp_path, s3, range(4), DensePairs(4, 30), shard_pairs=16).run(progress=False)
    assert s3.pairs == 16
    np.testing.assert_array_equal(job2.result().reshape(4, 30), M)


def test_different_job_in_same_dir_is_refused(tmp_path):
    M = lookup_matrix(3, 10)
    ScoreJob(tmp_path, LookupScorer(M), range(3), DensePairs(3, 10), shard_pairs=4).run(
        progress=False
    )
    with pytest.raises(ValueError, match="different job.*shard_pairs"):
        ScoreJob(tmp_path, LookupScorer(M), range(3), DensePairs(3, 10), shard_pairs=5).run(
            progress=False
        )
    with pytest.raises(ValueError, match="different job.*scorer"):
        ScoreJob(tmp_path, LookupScorer(M + 1), range(3), DensePairs(3, 10), shard_pairs=4).run(
            progress=False
        )
    with pytest.raises(ValueError, match="different job.*queries"):
        ScoreJob(tmp_path, LookupScorer(M), [0, 2, 1], DensePairs(3, 10), shard_pairs=4).run(
            progress=False
        )


def test_bad_arguments():
    s = LookupScorer(lookup_matrix(2, 3))
    with pytest.raises(ValueError, match="refer to 3 queries but only 2"):
        ScoreJob("unused", s, [0, 1], DensePairs(3, 3))
    with pytest.raises(ValueError, match="equal length"):
        SparsePairs([0, 1], [0])
    with pytest.raises(ValueError, match="backend"):
        ScoreJob("unused", s, [0, 1], DensePairs(2, 3)).run(backend="mpi")


def test_lazy_scorer_pickles_without_session():
    lazy = LazyScorer(make_lookup_scorer, 3, 8, seed=2, n_items=8)
    assert not lazy.loaded and lazy.n_items == 8
    out = lazy.score(1, np.array([0, 7]))
    assert lazy.loaded
    clone = pickle.loads(pickle.dumps(lazy))
    assert not clone.loaded
    np.testing.assert_array_equal(clone.score(1, np.array([0, 7])), out)
    assert lazy.identity() == {"model_id": "lookup", "model_hash": clone.model_hash}


_KILL_SCRIPT = textwrap.dedent("""
    import sys
    from test_jobs_scorer import make_lookup_scorer
    from crossknn.jobs import DensePairs, ScoreJob
    job = ScoreJob(sys.argv[1], make_lookup_scorer(7, 50, seed=5, sleep=float(sys.argv[2])),
                   list(range(7)), DensePairs(7, 50), shard_pairs=11)
    job.run(progress=False)
""")


def test_sigkill_then_resume_equals_uninterrupted_run(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(_KILL_SCRIPT)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
    }
    killed = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, str(script), str(killed), "0.05"], env=env)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            shards = killed / "shards"
            if shards.exists() and len(list(shards.glob("0*.npy"))) >= 4:
                break
            time.sleep(0.01)
        else:
            pytest.fail("the job wrote no shards within 60 s")
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    n_shards = -(-7 * 50 // 11)
    done_at_kill = len(list((killed / "shards").glob("0*.npy")))
    assert 4 <= done_at_kill < n_shards, "the kill came too late to test a resume"
    subprocess.run([sys.executable, str(script), str(killed), "0"], env=env, check=True)
    clean = tmp_path / "clean"
    subprocess.run([sys.executable, str(script), str(clean), "0"], env=env, check=True)
    job = ScoreJob(
        killed, make_lookup_scorer(7, 50, seed=5), range(7), DensePairs(7, 50), shard_pairs=11
    )
    ref = ScoreJob(
        clean, make_lookup_scorer(7, 50, seed=5), range(7), DensePairs(7, 50), shard_pairs=11
    )
    a, b = job.result(), ref.result()
    assert a.tobytes() == b.tobytes()
    np.testing.assert_array_equal(a.reshape(7, 50), lookup_matrix(7, 50, seed=5))
    assert sorted(p.name for p in (killed / "shards").iterdir()) == sorted(
        p.name for p in (clean / "shards").iterdir()
    )
