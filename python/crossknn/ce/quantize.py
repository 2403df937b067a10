"""int8 quantization recipes for an exported ONNX graph (ONNX Runtime quantization tools).

Recipes (named precisions of an export and of the runtime; ``int8`` is the measured best, see
docs/ce.md):

- ``int8-dynamic``: dynamic quantization of every weight MatMul, int8 weights with per-channel
  scales, activations quantized per batch (uint8, per tensor); the attention products QKᵀ and ·V
  and the embeddings stay fp32.
- ``int8-ffn``: the same on the feed-forward MatMuls only; the attention projections (Q, K, V and
  the attention output) stay fp32.
- ``int8-mixed``: dynamic quantization with the most sensitive MatMul groups kept in fp32, chosen
  by a measured sensitivity pass: each group (per layer: the attention projections, the FFN input,
  the FFN output) is quantized alone, the calibration set (each calibration query's fp32 top
  candidates plus random ones, :mod:`crossknn.ce.fidelity`) is scored, and the groups whose
  quantization moves the top of the ranking most (centered RMS deviation on the top candidates)
  stay fp32, up to ``MIXED_FP32_SHARE`` of the quantizable weights.
- ``int8-static``: static QDQ quantization of the weight MatMuls, activation ranges calibrated
  on the calibration pairs (``STATIC_METHOD``), per-channel weight scales.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from crossknn.ce import fidelity
from crossknn.ce.fidelity import compare, score_feeds

__all__ = [
    "RECIPES",
    "PRECISIONS",
    "DEFAULT_INT8",
    "MIXED_FP32_SHARE",
    "STATIC_METHODS",
    "STATIC_METHOD",
    "check_precision",
    "resolve_recipe",
    "needs_calibration",
    "variant_file",
    "weight_matmuls",
    "node_groups",
    "quantize",
    "sensitivity",
    "requested_recipes",
    "quantize_variants",
    "record_fidelity",
]

#: quantized precisions an export can write and the runtime can load ("int8" = DEFAULT_INT8)
RECIPES = ("int8", "int8-dynamic", "int8-ffn", "int8-mixed", "int8-static")
#: every precision name of an exported model
PRECISIONS = ("fp32", *RECIPES)
#: the recipe behind "int8": the best point measured by bench/ce_bench.py (docs/ce.md)
DEFAULT_INT8 = "int8-mixed"
#: int8-mixed keeps at most this share of the quantizable MatMul weights in fp32
MIXED_FP32_SHARE = 0.25
STATIC_METHODS = ("minmax", "entropy", "percentile")
STATIC_METHOD = "minmax"

log = logging.getLogger("crossknn.ce")


def check_precision(name: str) -> str:
    """``name`` if it is a known precision, else a ValueError listing them."""
    if name not in PRECISIONS:
        raise ValueError(f"unknown precision {name!r}; expected one of {', '.join(PRECISIONS)}")
    return name


def resolve_recipe(name: str) -> str:
    """The recipe a quantized precision runs (``int8`` -> :data:`DEFAULT_INT8`)."""
    if name not in RECIPES:
        raise ValueError(f"unknown int8 recipe {name!r}; expected one of {', '.join(RECIPES)}")
    return DEFAULT_INT8 if name == "int8" else name


def needs_calibration(name: str) -> bool:
    return resolve_recipe(name) in ("int8-mixed", "int8-static")


def variant_file(name: str) -> str:
    """The ONNX file of a precision in an exported directory."""
    check_precision(name)
    return "model.onnx" if name == "fp32" else f"model.{name}.onnx"


def weight_matmuls(path: str | Path) -> list[str]:
    """Names of the MatMul nodes whose second input is a weight (an initializer), graph order."""
    # onnx: a base dependency, loaded only where a graph is read
    import onnx

    g = onnx.load(str(path), load_external_data=False).graph
    inits = {i.name for i in g.initializer}
    return [n.name for n in g.node if n.op_type == "MatMul" and n.input[1] in inits]


_LAYER = re.compile(r"layers?[._/](\d+)")


def _part(name: str) -> str:
    if "attention" in name or "attn" in name:
        return "attn"
    if "intermediate" in name:
        return "ffn-in"
    return "ffn-out" if re.search(r"[./]output[./]", name) else "other"


def node_groups(names: list[str]) -> dict[str, list[str]]:
    """Weight MatMuls grouped per layer: attention projections, FFN input, FFN output.

    Names without a layer number form one group each.
    """
    groups: dict[str, list[str]] = {}
    for n in names:
        m = _LAYER.search(n)
        key = f"layer{m.group(1)}.{_part(n)}" if m else n
        groups.setdefault(key, []).append(n)
    return groups


@contextmanager
def _quiet():
    # quantize_dynamic/static log pre-processing hints on the root logger
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        yield
    finally:
        root.setLevel(level)


def _dynamic(src: Path, dst: Path, *, nodes: list[str] | None = None, exclude=()) -> None:
    # onnxruntime: loaded only where a model runs (CPU or GPU wheel)
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with _quiet():
        quantize_dynamic(
            str(src),
            str(dst),
            per_channel=True,
            weight_type=QuantType.QInt8,
            op_types_to_quantize=["MatMul"],
            nodes_to_quantize=list(nodes) if nodes else None,
            nodes_to_exclude=list(exclude),
            extra_options={"MatMulConstBOnly": True},
        )


def _single_rows(feeds, pad_id: int) -> list[dict[str, np.ndarray]]:
    """The feeds as one pair per feed, all padded to the longest: the histogram calibrators
    (entropy, percentile) stack the tensors of all feeds, so every feed must have one shape."""
    width = max(f["input_ids"].shape[1] for f in feeds)
    out = []
    for f in feeds:
        for r in range(f["input_ids"].shape[0]):
            row = {}
            for k, v in f.items():
                pad = np.full((1, width), pad_id if k == "input_ids" else 0, dtype=v.dtype)
                pad[0, : v.shape[1]] = v[r]
                row[k] = pad
            out.append(row)
    return out


class _Reader:
    """onnxruntime CalibrationDataReader over the calibration feeds."""

    def __init__(self, feeds: list[dict[str, np.ndarray]], names: set[str]) -> None:
        self._it = iter([{k: v for k, v in f.items() if k in names} for f in feeds])

    def get_next(self):
        return next(self._it, None)


def _static(src: Path, dst: Path, feeds, method: str, pad_id: int) -> None:
    # onnxruntime: loaded only where a model runs (CPU or GPU wheel)
    import onnxruntime as ort
    from onnxruntime.quantization import (
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    if method not in STATIC_METHODS:
        raise ValueError(
            f"static calibration method must be one of {STATIC_METHODS}; got {method!r}"
        )
    names = {i.name for i in ort.InferenceSession(str(src)).get_inputs()}
    if method != "minmax":
        feeds = _single_rows(feeds, pad_id)
    calib = {
        "minmax": CalibrationMethod.MinMax,
        "entropy": CalibrationMethod.Entropy,
        "percentile": CalibrationMethod.Percentile,
    }[method]
    with _quiet():
        quantize_static(
            str(src),
            str(dst),
            _Reader(feeds, names),
            quant_format=QuantFormat.QDQ,
            per_channel=True,
            activation_type=QuantType.QUInt8,
            weight_type=QuantType.QInt8,
            op_types_to_quantize=["MatMul"],
            nodes_to_quantize=weight_matmuls(src),
            calibrate_method=calib,
            extra_options={"MatMulConstBOnly": True, "CalibMaxIntermediateOutputs": 64},
        )


def sensitivity(
    src: Path,
    work: Path,
    score: Callable[[Path], np.ndarray],
    error: Callable[[np.ndarray], float],
    *,
    progress: bool = False,
) -> list[dict[str, Any]]:
    """Quantize each MatMul group alone, measure ``error(score(graph))``; most sensitive first."""
    groups = node_groups(weight_matmuls(src))
    rows = []
    items = list(groups.items())
    if progress:
        items = tqdm(items, desc="sensitivity", unit="group")
    for key, nodes in items:
        tmp = work / f".sens-{re.sub(r'[^A-Za-z0-9_.-]', '_', key)}.onnx"
        _dynamic(src, tmp, nodes=nodes)
        err = float(error(score(tmp)))
        tmp.unlink()
        rows.append({"group": key, "nodes": nodes, "error": err})
    rows.sort(key=lambda r: -r["error"])
    return rows


def _weight_sizes(path: Path) -> dict[str, int]:
    # onnx: a base dependency, loaded only where a graph is read
    import onnx

    g = onnx.load(str(path)).graph
    sizes = {i.name: int(np.prod(i.dims)) for i in g.initializer}
    return {
        n.name: sizes[n.input[1]] for n in g.node if n.op_type == "MatMul" and n.input[1] in sizes
    }


def choose_fp32(rows: list[dict[str, Any]], sizes: dict[str, int], share: float) -> list[str]:
    """Groups kept fp32: most sensitive first while their weights stay within ``share``."""
    total = sum(sizes.values())
    kept, used = [], 0
    for r in rows:
        w = sum(sizes[n] for n in r["nodes"])
        if used + w > share * total:
            break
        kept.append(r["group"])
        used += w
    return kept


def quantize(
    src: str | Path,
    dst: str | Path,
    recipe: str,
    *,
    calibration=None,
    method: str | None = None,
    share: float | None = None,
    progress: bool = False,
) -> dict[str, Any]:
    """Write ``dst``, the graph ``src`` quantized by ``recipe``; returns what was done.

    ``calibration``: a :class:`crossknn.ce.fidelity.Calibration` (needed by ``int8-mixed`` and
    ``int8-static``); ``method``: the static calibration method (default :data:`STATIC_METHOD`);
    ``share``: int8-mixed's fp32 share (default :data:`MIXED_FP32_SHARE`).
    """
    src, dst = Path(src), Path(dst)
    name = resolve_recipe(recipe)
    info: dict[str, Any] = {"recipe": name}
    if needs_calibration(name) and calibration is None:
        raise ValueError(f"recipe {name!r} needs calibration pairs (a fidelity.Calibration)")
    if name == "int8-dynamic":
        _dynamic(src, dst)
    elif name == "int8-ffn":
        kept = [n for n in weight_matmuls(src) if _part(n) == "attn"]
        _dynamic(src, dst, exclude=kept)
        info["fp32_nodes"] = kept
    elif name == "int8-static":
        method = method or STATIC_METHOD
        _static(src, dst, calibration.feeds, method, calibration.pad_id)
        info["calibration_method"] = method
    else:  # int8-mixed
        share = MIXED_FP32_SHARE if share is None else float(share)
        cal = calibration

        def score(path: Path) -> np.ndarray:
            return score_feeds(path, cal.feeds, cal.order)

        def error(got: np.ndarray) -> float:
            return compare(cal.fp32, got, cal.query, cal.top)["top_rms"]

        rows = sensitivity(src, dst.parent, score, error, progress=progress)
        keep = choose_fp32(rows, _weight_sizes(src), share)
        nodes = [n for r in rows if r["group"] in keep for n in r["nodes"]]
        _dynamic(src, dst, exclude=nodes)
        info["fp32_share"] = share
        info["fp32_groups"] = keep
        info["sensitivity"] = [{"group": r["group"], "top_rms": r["error"]} for r in rows]
    return info


def requested_recipes(quantize: bool | str | Sequence[str], kind: str) -> tuple[str, ...]:
    """The int8 precisions an export's ``quantize`` argument asks for (checked), maybe none.

    ``True`` means ``("int8",)``; a name or a sequence of names of
    :data:`crossknn.ce.quantize.RECIPES`. Dual encoders take only ``int8`` / ``int8-dynamic``
    (always dynamic: the other recipes are chosen and checked on cross-encoder pairs).
    """
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
    src = out_dir / "model.onnx"
    cal = None
    if kind != "dual-encoder" and names:  # without a recipe, nothing reads the calibration
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
