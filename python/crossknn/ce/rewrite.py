"""Rewrites of an exported ONNX graph: int8 quantization and CPU graph optimization (at export
time), fp16 conversion (when a CUDA session opens with ``fp16=True``).

onnxruntime is imported inside the functions; :func:`to_fp16` also needs ``onnx`` (the ``export``
extra), which the rest of the runtime does not: without it, it raises an ImportError that says so.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

__all__ = ["quantize_int8", "optimize_for_cpu", "to_fp16"]


def quantize_int8(src: Path, dst: Path) -> None:
    """Dynamic int8 quantization of the MatMul weights, per-channel scales, ``src`` -> ``dst``."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # quantize_dynamic logs a pre-processing hint on the root logger
    try:
        # MatMul weights only (embeddings stay fp32), per-channel int8 scales: per-tensor scales
        # lose ~2x more rank correlation on this model family
        quantize_dynamic(
            str(src),
            str(dst),
            per_channel=True,
            weight_type=QuantType.QInt8,
            op_types_to_quantize=["MatMul"],
            extra_options={"MatMulConstBOnly": True},
        )
    finally:
        root.setLevel(level)


def optimize_for_cpu(path: Path) -> None:
    """ONNX Runtime offline graph optimization (extended level, CPU provider), in place."""
    import onnxruntime as ort

    tmp = path.with_suffix(".opt.tmp")
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    so.optimized_model_filepath = str(tmp)
    ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    os.replace(tmp, path)


def to_fp16(path: Path) -> bytes:
    """The graph at ``path`` converted to fp16 (inputs and outputs keep their types), serialized.

    Needs ``onnx``: onnxruntime's converter works on onnx protos. Without it, an ImportError
    names the ``export`` extra and the alternatives that need no conversion.
    """
    try:
        import onnx
        from onnxruntime.transformers.float16 import convert_float_to_float16
    except ImportError as exc:
        raise ImportError(
            "fp16=True on the CUDA provider converts the graph to fp16 when the session opens, "
            f"which needs the onnx package ({exc}): install the 'export' extra, or run fp16 with "
            "provider='tensorrt' (no conversion needed), or leave fp16=False"
        ) from None

    proto = convert_float_to_float16(onnx.load(str(path)), keep_io_types=True)
    return proto.SerializeToString()
