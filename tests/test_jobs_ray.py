"""The --ray backend on a local Ray instance gives bitwise the local result."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import numpy as np
import pytest

from crossknn.jobs import DensePairs, LazyScorer, ScoreJob
from test_jobs_scorer import lookup_matrix, make_lookup_scorer

TESTS = Path(__file__).resolve().parent


@pytest.mark.slow
@pytest.mark.xdist_group("ray")  # one local Ray cluster at a time (tests/conftest.py)
def test_ray_backend_equals_local(tmp_path):
    ray = pytest.importorskip("ray")
    lazy = LazyScorer(
        make_lookup_scorer, 6, 40, seed=7, n_items=40, model_id="lookup", model_hash="h"
    )
    local = ScoreJob(tmp_path / "local", lazy, list(range(6)), DensePairs(6, 40), shard_pairs=17)
    local.run(progress=False)
    assert lazy.loaded  # the local run opened it in this process
    lazy2 = LazyScorer(
        make_lookup_scorer, 6, 40, seed=7, n_items=40, model_id="lookup", model_hash="h"
    )
    with warnings.catch_warnings():
        # Ray's own start-up noise (resource/deprecation notices) is not ours to fix
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", FutureWarning)
        warnings.simplefilter("ignore", ResourceWarning)
        ray.init(
            num_cpus=2,
            include_dashboard=False,
            log_to_driver=False,
            runtime_env={
                "env_vars": {
                    "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])
                }
            },
        )
        try:
            job = ScoreJob(
                tmp_path / "ray", lazy2, list(range(6)), DensePairs(6, 40), shard_pairs=17
            )
            stats = job.run(backend="ray", progress=False)
        finally:
            ray.shutdown()
    assert stats["shards"] == job.n_shards == 15
    assert not lazy2.loaded  # scored on the workers, never opened in the driver
    assert job.result().tobytes() == local.result().tobytes()
    np.testing.assert_array_equal(job.result().reshape(6, 40), lookup_matrix(6, 40, seed=7))
