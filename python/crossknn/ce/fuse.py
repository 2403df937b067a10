"""The graph a CUDA session runs: the exported graph with its transformer blocks fused.

The exported graph is the model as ``torch.onnx`` traced it: about 550 nodes for a 6-layer
MiniLM, a third of them shape arithmetic. On a GPU every node is a kernel launch (and the shape
nodes run on the CPU between them), so a 20-pair round call is dominated by launches, not by
arithmetic. onnxruntime's transformer optimizer (``onnxruntime.transformers.optimizer``, BERT
fusions) rewrites it into fused operators (EmbedLayerNormalization, Attention,
SkipLayerNormalization, BiasGelu): 80 nodes for the same model, with no shape subgraph left,
which is also what CUDA graph capture needs (:mod:`crossknn.ce.cuda_graph`).

:func:`fused_graph` makes that graph once per model file (fp32, or fp16 with fp32 inputs and
outputs), checks it against the exported graph on the CPU provider before it is ever used
(scores within 1e-4 on a fixed set of padded pairs, else the fused graph is not used: the
session runs the exported graph as before, and a marker file records why, so the check is not
redone at every open), and caches it beside the model or in the crossknn cache under the model
file's hash and :data:`FUSE_RECIPE`.

Needs ``onnx`` (the ``export`` extra); without it :func:`fused_graph` returns ``None`` and says so
in the log (fp32 then runs the exported graph; fp16 converts it without fusion).
"""

from __future__ import annotations

import json
import logging
import os
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from crossknn.ce.rewrite import cache_paths, write_cached

__all__ = ["FUSE_RECIPE", "attention_shape", "check_fused", "fuse", "fused_graph"]

#: bumped when the fusion (or its fp16 conversion) changes: a new cached file is made
FUSE_RECIPE = 1
#: largest |fused - exported| score difference accepted, relative to max(1, max |score|)
FUSE_TOLERANCE = 1e-4

log = logging.getLogger("crossknn.ce")


def attention_shape(proto) -> tuple[int, int]:
    """``(num_heads, hidden_size)`` read from an exported BERT-style graph: the width of the
    word embedding table (the initializer gathered by ``input_ids``) and the head count of the
    attention reshapes (``[.., .., heads, head_size]`` with heads x head_size = hidden, or
    ``[.., .., -1, head_size]``, a constant or a Concat of constants); ``(0, 0)`` where either
    is not found."""
    # onnx (export extra): only the fusion reads graphs
    from onnx import numpy_helper

    inits = {t.name: t for t in proto.graph.initializer}
    hidden = 0
    for node in proto.graph.node:
        if node.op_type == "Gather" and len(node.input) == 2 and node.input[0] in inits:
            dims = list(inits[node.input[0]].dims)
            if len(dims) == 2 and "input_ids" in node.input[1]:
                hidden = int(dims[1])
                break
    if not hidden:
        return 0, 0
    # small int64 constants by name (initializers and Constant nodes)
    small = {
        t.name: numpy_helper.to_array(t).ravel()
        for t in proto.graph.initializer
        if t.data_type == 7 and int(np.prod(t.dims)) <= 4
    }
    for node in proto.graph.node:
        for a in node.attribute:
            if node.op_type == "Constant" and a.name == "value" and a.t.data_type == 7:
                if int(np.prod(a.t.dims)) <= 4:
                    small[node.output[0]] = numpy_helper.to_array(a.t).ravel()
    # the shape an attention Reshape splits the hidden size into: [.., .., heads, head_size],
    # a constant or a Concat of constants (dynamic batch and length dimensions)
    heads: Counter = Counter()
    for node in proto.graph.node:
        if node.op_type not in ("Concat", "Reshape"):
            continue
        parts = node.input if node.op_type == "Concat" else node.input[1:]
        values = [int(v) for name in parts if name in small for v in small[name]]
        for h, d in zip(values, values[1:], strict=False):
            if h == -1 and d > 1 and hidden % d == 0 and d < hidden:
                h = hidden // d  # [.., .., -1, head_size]
            if h > 1 and d > 1 and h * d == hidden:
                heads[h] += 1
    return (heads.most_common(1)[0][0], hidden) if heads else (0, 0)


def fuse(path: Path) -> tuple[Any, dict[str, int]]:
    """The graph at ``path`` with onnxruntime's BERT fusions applied (onnxruntime's
    ``OnnxModel`` wrapper: ``.model`` is the ModelProto, ``convert_float_to_float16`` converts
    it in place), and the fused operator counts."""
    # onnx (export extra) and onnxruntime's transformer optimizer: only the fusion needs them
    import onnx
    from onnxruntime.transformers.optimizer import optimize_model

    heads, hidden = attention_shape(onnx.load(str(path), load_external_data=False))
    model = optimize_model(
        str(path),
        model_type="bert",
        num_heads=heads,
        hidden_size=hidden,
        opt_level=0,
        use_gpu=True,
    )
    stats = {k: int(v) for k, v in model.get_fused_operator_statistics().items() if v}
    return model, stats


def _probe_feeds(names: list[str], rows: int = 6, cols: int = 40) -> dict[str, np.ndarray]:
    """Padded pairs of several lengths (token ids below 1000, valid in any BERT vocabulary)."""
    rng = np.random.default_rng(0)
    lengths = np.linspace(cols // 4, cols, rows).astype(np.int64)
    live = np.arange(cols)[None, :] < lengths[:, None]
    first = np.arange(cols)[None, :] < (lengths // 2)[:, None]
    feeds = {
        "input_ids": np.where(live, rng.integers(1, 1000, (rows, cols)), 0),
        "attention_mask": live.astype(np.int64),
        "token_type_ids": (live & ~first).astype(np.int64),
        "pool_mask": np.where(live, np.where(first, 1, 2), 0),
    }
    return {k: v.astype(np.int64) for k, v in feeds.items() if k in names}


def check_fused(exported: Path, fused: bytes) -> float:
    """Largest |fused - exported| output on :func:`_probe_feeds`, both on the CPU provider,
    relative to max(1, max |exported|)."""
    # onnxruntime: loaded only where a model runs (CPU or GPU wheel)
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    cpu = ["CPUExecutionProvider"]
    a = ort.InferenceSession(str(exported), so, providers=cpu)
    b = ort.InferenceSession(fused, so, providers=cpu)
    feeds = _probe_feeds([i.name for i in a.get_inputs()])
    ya = np.asarray(a.run(None, feeds)[0], dtype=np.float64)
    yb = np.asarray(b.run(None, feeds)[0], dtype=np.float64)
    if ya.shape != yb.shape or not np.isfinite(yb).all():
        return float("inf")
    return float(np.abs(ya - yb).max() / max(1.0, np.abs(ya).max()))


def fused_graph(
    src: Path, sha256: str, *, fp16: bool, cache_dir: str | os.PathLike | None = None
) -> Path | None:
    """The fused (``fp16``: and half-precision) copy of the exported graph ``src`` whose file
    hash is ``sha256``, made and checked once; ``None`` where fusion does not apply (no
    attention block recognized, a check that fails, no ``onnx`` package): the caller runs the
    exported graph then. Looked for beside ``src`` (``model.cuda-fp16-<hash>.onnx``), then in
    ``cache_root()/cuda``."""
    src = Path(src)
    key = f"{'fp16' if fp16 else 'fp32'}-{sha256[:16]}-f{FUSE_RECIPE}"
    beside, cached = cache_paths(src, "cuda", key, cache_dir)
    for path in (beside, cached):
        if path.is_file():
            return path
        skip = path.with_suffix(".skip.json")
        if skip.is_file():
            log.info("crossknn.ce: %s is not fused (%s)", src, skip.read_text().strip())
            return None
    try:
        model, stats = fuse(src)
    except ImportError as exc:
        log.info("crossknn.ce: no fused GPU graph (%s): the exported graph runs", exc)
        return None
    why = None
    if not stats.get("Attention") and not stats.get("MultiHeadAttention"):
        why = f"no attention block recognized (fused: {stats})"
    else:
        diff = check_fused(src, model.model.SerializeToString())
        if not diff <= FUSE_TOLERANCE:
            why = f"fused scores differ by {diff:.3g} > {FUSE_TOLERANCE} from the exported graph"
    if why is not None:
        log.info("crossknn.ce: %s is not fused: %s", src, why)
        record = json.dumps({"reason": why, "recipe": FUSE_RECIPE}).encode()
        write_cached(record, [beside.with_suffix(".skip.json"), cached.with_suffix(".skip.json")])
        return None
    if fp16:  # inputs and outputs keep their types (int64 ids in, float32 scores out)
        model.convert_float_to_float16(keep_io_types=True)
    path = write_cached(model.model.SerializeToString(), [beside, cached])
    log.info("crossknn.ce: fused GPU graph of %s (%s) written to %s", src, stats, path)
    return path
