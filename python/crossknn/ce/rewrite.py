"""Rewrites of an exported ONNX graph: int8 quantization and CPU graph optimization (at export
time), fp16 conversion (made once, when a CUDA session first runs ``precision="fp16"``, and cached
by the fp32 graph's hash: :func:`fp16_graph`).

The int8 recipes live in :mod:`crossknn.ce.quantize`, the fidelity check in
:mod:`crossknn.ce.fidelity`; :func:`quantize_variants` and :func:`record_fidelity` run them for
an export.

onnxruntime is imported inside the functions; :func:`to_fp16` also needs ``onnx`` (the ``export``
extra), which the rest of the runtime does not: without it, it raises an ImportError that says so.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "quantize_variants",
    "record_fidelity",
    "requested_recipes",
    "optimize_for_cpu",
    "to_fp16",
    "fp16_graph",
    "write_cached",
]

#: bumped when the fp16 conversion changes (a new cached file is made)
FP16_RECIPE = 1

log = logging.getLogger("crossknn.ce")


def requested_recipes(quantize: bool | str | Sequence[str], kind: str) -> tuple[str, ...]:
    """The int8 precisions an export's ``quantize`` argument asks for (checked), maybe none.

    ``True`` means ``("int8",)``; a name or a sequence of names of
    :data:`crossknn.ce.quantize.RECIPES`. Dual encoders take only ``int8`` / ``int8-dynamic``
    (always dynamic: the other recipes are chosen and checked on cross-encoder pairs).
    """
    from crossknn.ce.quantize import RECIPES

    if quantize is False or quantize is None:
        return ()
    names = (
        ("int8",) if quantize is True else (quantize,) if isinstance(quantize, str) else quantize
    )
    names = tuple(dict.fromkeys(names))
    for n in names:
        if not isinstance(n, str) or n not in RECIPES:
            raise ValueError(
                f"quantize must be True or int8 recipe names from {', '.join(RECIPES)}; got {n!r}"
            )
        if kind == "dual-encoder" and n not in ("int8", "int8-dynamic"):
            raise ValueError(
                f"recipe {n!r} is for cross-encoders; a dual encoder takes 'int8' or 'int8-dynamic'"
            )
    return names


def quantize_variants(
    out_dir: Path,
    names: Sequence[str],
    *,
    kind: str,
    max_length: int,
    calibration: tuple[Sequence[str], Sequence[str]] | None = None,
) -> tuple[dict[str, str], dict[str, Any], Any]:
    """Write ``model.<name>.onnx`` for each recipe from ``out_dir/model.onnx``.

    Cross-encoders: a calibration set (``calibration`` = (queries, item pool) texts, default
    :func:`crossknn.ce.fidelity.default_calibration_texts`) is scored in fp32 first; it feeds the
    recipes that need it and the fidelity record. Returns (variants, per-variant info, the
    calibration or None).
    """
    from crossknn.ce import fidelity
    from crossknn.ce.quantize import quantize, variant_file

    src = out_dir / "model.onnx"
    cal = None
    if kind != "dual-encoder":
        queries, items = calibration or fidelity.default_calibration_texts()
        cal = fidelity.build_calibration(
            src, out_dir / "tokenizer.json", list(queries), list(items), max_length=max_length
        )
    variants, infos = {}, {}
    for name in names:
        variants[name] = variant_file(name)
        recipe = "int8-dynamic" if kind == "dual-encoder" else name
        infos[name] = quantize(src, out_dir / variants[name], recipe, calibration=cal)
    return variants, infos, cal


def record_fidelity(out_dir: Path, variants: dict[str, str], infos: dict[str, Any], cal) -> dict:
    """Score the calibration set with each final quantized file; the manifest's record."""
    from crossknn.ce import fidelity

    out = {}
    for name, info in infos.items():
        entry = dict(info)
        if cal is not None:
            got = fidelity.score_feeds(out_dir / variants[name], cal.feeds, cal.order)
            entry["fidelity"] = fidelity.compare(cal.fp32, got, cal.query, cal.top)
            entry["calibration"] = cal.info
            log.info("crossknn.ce: %s vs fp32 on the calibration set: %s", name, entry["fidelity"])
        out[name] = entry
    return out


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
    from crossknn.ce.models import cache_root

    src = Path(src)
    key = f"{sha256[:16]}-r{FP16_RECIPE}"
    beside = src.parent / f"{src.stem}.fp16-{key}.onnx"
    cached = cache_root(cache_dir) / "fp16" / f"{key}.onnx"
    for path in (beside, cached):
        if path.is_file():
            return path
    return write_cached(to_fp16(src), [beside, cached])


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
