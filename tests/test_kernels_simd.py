"""The AVX-512 kernels give the bits of the AVX2 ones (CROSSKNN_SIMD=avx2) and the portable ones.

Each level is chosen once per process, so every run is a subprocess; the same script prints the
solvers' outputs (dual and primal regimes, ridge and min-norm, growing and refactoring) and the
top-k of float32 (through the int8 / float16 prefilter) and int8 storage as hex bytes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

SCRIPT = r"""
import json
import numpy as np
from crossknn import _core

rng = np.random.default_rng(3)
out = {"kernel": _core.kernel_name()}

def solves(V, ridge, steps):
    f = _core.Features(V.astype(np.float32), threads=2)
    s = _core.LeastSquares(f, ridge=ridge)
    ids = rng.permutation(V.shape[0])
    got, at = [], 0
    for m in steps:
        s.append(ids[at : at + m], rng.standard_normal(m))
        at += m
        got.append(s.solve().tobytes().hex())
    return got

# dual (|A| < d) with several appends: the Gram rows, the triangular solves over old rows
out["dual"] = solves(rng.standard_normal((900, 301)), 1e-2, [37, 64, 100, 17])
out["dual_minnorm"] = solves(rng.standard_normal((600, 130)) * 3, 0.0, [16, 50, 40])
# primal: the switch at |A| >= d refactors (X^T X tiles, blocked Cholesky), then rank-1 updates
out["primal"] = solves(rng.standard_normal((500, 67)), 0.0, [30, 40, 20, 33])
out["primal_ridge"] = solves(rng.standard_normal((500, 43)), 0.5, [50, 10])

V = rng.standard_normal((3000, 203)).astype(np.float32) * np.logspace(-1, 1, 203, dtype=np.float32)
for storage in ("float32", "int8"):
    f = _core.Features(V, storage=storage, threads=2)
    res = []
    for q in range(6):  # the prefilter starts at the second call
        u = rng.standard_normal((2, 203)).astype(np.float32)
        s, i = f.top_k(u, 40)
        res.append([s.tobytes().hex(), i.tobytes().hex()])
    out["topk_" + storage] = res
# d = 95: three 8-entry steps and 7 single entries after the 32-entry steps (exact rescoring)
W = rng.standard_normal((2500, 95)).astype(np.float32)
f = _core.Features(W, threads=1)
res = []
for q in range(5):
    s, i = f.top_k(rng.standard_normal((1, 95)).astype(np.float32), 30)
    res.append([s.tobytes().hex(), i.tobytes().hex()])
out["topk_d95"] = res
print(json.dumps(out))
"""


def _run(env_extra: dict) -> dict:
    env = dict(os.environ)
    env.pop("CROSSKNN_NO_SIMD", None)
    env.pop("CROSSKNN_SIMD", None)
    env.update(env_extra)
    res = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(res.stdout)


def test_avx512_avx2_and_generic_paths_give_the_same_bits():
    native = _run({})
    if native["kernel"] != "avx512":
        pytest.skip(f"no AVX-512 on this CPU (kernels: {native['kernel']})")
    avx2 = _run({"CROSSKNN_SIMD": "avx2"})
    generic = _run({"CROSSKNN_NO_SIMD": "1"})
    assert avx2["kernel"] == "avx2" and generic["kernel"] == "generic"
    keys = ("dual", "dual_minnorm", "primal", "primal_ridge", "topk_float32", "topk_int8")
    for key in (*keys, "topk_d95"):
        assert native[key] == avx2[key], key
    # the generic path: the same solver bits and int8 scores (float32 full scores may differ in
    # the last bits there, but the prefilter's exact rescoring gives the same items)
    for key in ("dual", "dual_minnorm", "primal", "primal_ridge", "topk_int8"):
        assert native[key] == generic[key], key


def test_simd_switch_names_the_level():
    assert _run({"CROSSKNN_SIMD": "generic"})["kernel"] == "generic"
    assert _run({"CROSSKNN_SIMD": "avx2"})["kernel"] in ("avx2", "generic")
