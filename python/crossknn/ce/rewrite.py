"""Rewrites of an exported ONNX graph: int8 quantization and CPU graph optimization (at export
time), fp16 conversion (made once, when a CUDA session first runs ``precision="fp16"``, and cached
by the fp32 graph's hash: :func:`fp16_graph`).

The int8 recipes, and :func:`crossknn.ce.quantize.quantize_variants` that runs them for an
export, live in :mod:`crossknn.ce.quantize`; the fidelity check in :mod:`crossknn.ce.fidelity`.

onnxruntime is imported inside the functions; :func:`to_fp16` also needs ``onnx`` (the ``export``
extra), which the rest of the runtime does not: without it, it raises an ImportError that says so.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from crossknn.ce.cache import cache_root

__all__ = [
    "optimize_for_cpu",
    "to_fp16",
    "fp16_graph",
    "write_cached",
    "cache_paths",
]

#: bumped when the fp16 conversion changes (a new cached file is made)
FP16_RECIPE = 1

log = logging.getLogger("crossknn.ce")


def optimize_for_cpu(path: Path) -> None:
    """ONNX Runtime offline graph optimization (extended level, CPU provider), in place."""
    # onnxruntime: loaded only where a model runs (CPU or GPU wheel)
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
        # onnx (export extra) and the converter: only an fp16 conversion needs them
        import onnx
        from onnxruntime.transformers.float16 import convert_float_to_float16
    except ImportError as exc:
        raise ImportError(
            "fp16 on the CUDA provider converts the graph to fp16 once (then cached), which "
            f"needs the onnx package ({exc}): install the 'export' extra, or run fp16 with "
            "provider='tensorrt' (no conversion needed), or use precision fp32"
        ) from None

    proto = convert_float_to_float16(onnx.load(str(path)), keep_io_types=True)
    return proto.SerializeToString()


def fp16_graph(src: Path, sha256: str, *, cache_dir: str | os.PathLike | None = None) -> Path:
    """The fp16 copy of the fp32 graph ``src`` (whose file hash is ``sha256``), made once.

    Looked for beside ``src`` (``model.fp16-<hash>.onnx``), then in the crossknn cache
    (``cache_root()/fp16/<hash>.onnx``); made by :func:`to_fp16` when neither exists, written
    beside ``src`` or, when that folder is read-only, into the cache. Written to a temporary
    file and renamed into place: a half-written copy is never used, and two processes making it
    at once both end with a complete file.
    """
    paths = cache_paths(Path(src), "fp16", f"{sha256[:16]}-r{FP16_RECIPE}", cache_dir)
    for path in paths:
        if path.is_file():
            return path
    return write_cached(to_fp16(src), paths)


def cache_paths(src: Path, tag: str, key: str, cache_dir=None) -> list[Path]:
    """Where a graph derived from ``src`` is kept: beside it (``<stem>.<tag>-<key>.onnx``),
    else in the crossknn cache (``cache_root()/<tag>/<key>.onnx``), in that order."""
    return [
        src.parent / f"{src.stem}.{tag}-{key}.onnx",
        cache_root(cache_dir) / tag / f"{key}.onnx",
    ]


def write_cached(data: bytes, paths: list[Path]) -> Path:
    """Write ``data`` to the first of ``paths`` that can be written (a temporary file renamed
    into place: a half-written file is never seen, and two processes writing at once both end
    with a complete file); an OSError naming the last folder when none can."""
    for path in paths:
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_bytes(data)
            os.replace(tmp, path)
        except OSError as exc:
            log.info("crossknn.ce: cannot write %s (%s)", path, exc)
            try:
                tmp.unlink(missing_ok=True)
            except OSError:
                pass
            continue
        log.info("crossknn.ce: wrote %s", path)
        return path
    raise OSError(
        f"cannot write {paths[0].name} beside the model nor into {paths[-1].parent}: set "
        "CROSSKNN_CACHE to a writable folder"
    )
