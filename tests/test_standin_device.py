"""``bench/_standin_device.py``: the stand-in GPU of the serve bench (``gpu_bench.py
--standin-device``). What its rows rest on: models opened under it say they run on the CUDA
provider (so ``serve`` takes its GPU defaults), a pair's score does not depend on the batch it is
in, DE vectors are unit length, and a session run takes at least its modelled time. Run in a
fresh interpreter: the stand-in patches crossknn's session class for the whole process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"

SNIPPET = r"""
import json, sys, time
import numpy as np
sys.path.insert(0, sys.argv[1])
import _standin_device as standin_device
from crossknn.ce import default_cross_encoder, default_dual_encoder
standin_device.install(standin_device.parse("2,0.5"))  # CE: 2 + 0.5 ms a pair
ce = default_cross_encoder(threads=1)
de = default_dual_encoder(threads=1)
docs = ["a short one", "a much longer document about sorting lists in place", "x y z"]
q = "how to sort a list"
alone = [float(ce.predict([(q, d)])[0]) for d in docs]
t = time.perf_counter()
together = ce.predict([(q, d) for d in docs]).tolist()
dt = time.perf_counter() - t
v = de.encode(["one query", "another query text"])
print(json.dumps({
    "ce_provider": ce.provider, "de_provider": de.provider, "alone": alone,
    "together": together, "seconds": dt, "norms": np.linalg.norm(v, axis=1).tolist(),
}))
"""


@pytest.mark.slow
def test_standin_device_answers_as_a_gpu_session_would(model_cache):
    env = {**os.environ, "CROSSKNN_CACHE": str(model_cache)}
    out = subprocess.run(
        [sys.executable, "-c", SNIPPET, str(BENCH)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["ce_provider"] == got["de_provider"] == "CUDAExecutionProvider"
    # the same pair, the same score, alone or in a batch of three (padded wider)
    assert got["alone"] == pytest.approx(got["together"], abs=1e-6)
    assert len(set(round(x, 6) for x in got["together"])) == 3
    assert got["seconds"] >= (2 + 0.5 * 3) / 1000.0
    assert got["norms"] == pytest.approx([1.0, 1.0], abs=1e-5)


def test_timings_are_parsed_or_refused():
    sys.path.insert(0, str(BENCH))
    try:
        import _standin_device as standin_device
    finally:
        sys.path.remove(str(BENCH))
    assert standin_device.parse("0.5,0.021") == (0.5, 0.021, 0.5, 0.02)
    assert standin_device.parse("1,2,3,4") == (1.0, 2.0, 3.0, 4.0)
    for bad in ("1", "1,2,3", "-1,2"):
        with pytest.raises(ValueError, match="stand-in device timings"):
            standin_device.parse(bad)
