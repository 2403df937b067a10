"""ONNX export of a trained CMC model (dynamic batch and K), with a parity check.

``model.onnx`` takes ``query`` float32 (B, d) and ``candidates`` float32 (B, K, d) and returns
``scores`` float32 (B, K). After export the ONNX Runtime output is compared with PyTorch on
random unit vectors for a few K; the largest absolute difference is written to ``cmc.json``
(``onnx.parity``) and the export fails when it exceeds ``tolerance``.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np

__all__ = ["OPSET", "export_onnx", "parity"]

OPSET = 17


def _unit(rng: np.random.Generator, shape) -> np.ndarray:
    x = rng.standard_normal(shape).astype(np.float32)
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def parity(model, onnx_path, *, ks=(1, 7, 64, 300), batch: int = 3, seed: int = 0) -> float:
    """Largest |ONNX Runtime - PyTorch| over random inputs with the given K."""
    # onnxruntime and torch (export extra): only the parity check needs them
    import onnxruntime as ort
    import torch

    sess = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(seed)
    worst = 0.0
    d = model.cfg.dim
    for k in ks:
        q, c = _unit(rng, (batch, d)), _unit(rng, (batch, k, d))
        with torch.no_grad():
            ref = model(torch.from_numpy(q), torch.from_numpy(c)).numpy()
        got = sess.run(["scores"], {"query": q, "candidates": c})[0]
        worst = max(worst, float(np.abs(got - ref).max()))
    return worst


def export_onnx(model_dir, *, tolerance: float = 1e-4) -> Path:
    """Writes ``model_dir/model.onnx`` from ``model.pt`` and records the parity in cmc.json."""
    # torch and crossknn.cmc.train (imports torch): the export extra
    import torch

    from crossknn.cmc.train import load_model

    model_dir = Path(model_dir)
    model, info = load_model(model_dir)
    d = model.cfg.dim
    path = model_dir / "model.onnx"
    tmp = model_dir / "model.onnx.tmp"
    args = (torch.zeros(2, d), torch.zeros(2, 5, d))
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tracer notes on the shape checks (same branch always)
        torch.onnx.export(
            model,
            args,
            str(tmp),
            input_names=["query", "candidates"],
            output_names=["scores"],
            dynamic_axes={
                "query": {0: "batch"},
                "candidates": {0: "batch", 1: "k"},
                "scores": {0: "batch", 1: "k"},
            },
            opset_version=OPSET,
            do_constant_folding=True,
            dynamo=False,
        )
    err = parity(model, tmp)
    if err > tolerance:
        tmp.unlink()
        raise RuntimeError(f"ONNX export differs from PyTorch by {err:.2e} (> {tolerance:.0e})")
    tmp.replace(path)
    info["onnx"] = {
        "file": "model.onnx",
        "opset": OPSET,
        "parity": err,
        "inputs": {"query": "float32 (batch, dim)", "candidates": "float32 (batch, k, dim)"},
        "output": "scores float32 (batch, k)",
    }
    (model_dir / "cmc.json").write_text(json.dumps(info, indent=1))
    return path
