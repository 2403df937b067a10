"""Export a local Hugging Face checkpoint directory to an ONNX model directory.

Three kinds (see :mod:`crossknn.ce.manifest`):

- ``cls-ce``: ``AutoModelForSequenceClassification``; the graph outputs raw ``logits``
  (batch, num_labels); the runtime applies the activation sentence-transformers would apply
  (sigmoid for one label unless the checkpoint says otherwise), or none on request.
- ``joint-ce``: ``AutoModel`` + a pooling spec (the [EMB]-CE of the ANNCUR paper): one joint pass
  over ``[CLS] q [SEP] d [SEP]``; the query vector is the mean of the last hidden state over the
  query-segment tokens, the item vector the mean over the item-segment tokens (special tokens and
  padding excluded: the runtime passes these positions as ``pool_mask`` 1 / 2), both
  L2-normalized (``normalize``), score = dot product. The graph outputs ``scores`` (batch,).
- ``dual-encoder``: ``AutoModel``, mean pooling over all non-padding tokens (special tokens
  included, as sentence-transformers does), L2-normalized; the graph outputs ``embeddings``.

Graphs are traced with ``torch.onnx.export(..., dynamo=False)`` on a batch of 2 with eager
attention, dynamic batch and sequence axes. Optional: ``optimize`` (ONNX Runtime offline graph
optimization, level "extended", for the CPU provider) and ``quantize`` (int8 recipes of
:mod:`crossknn.ce.quantize`, each written as ``model.<recipe>.onnx`` with its fidelity to fp32 on
a calibration set recorded in the manifest).

Export needs torch and transformers (the ``export`` extra); the runtime does not. Nothing is
downloaded: checkpoints are read from local directories only.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any

from crossknn.ce.manifest import FORMAT_VERSION, MANIFEST, file_entry, write_manifest
from crossknn.ce.quantize import quantize_variants, record_fidelity, requested_recipes
from crossknn.ce.rewrite import optimize_for_cpu
from crossknn.fileio import sha256_file

__all__ = [
    "export_cross_encoder",
    "export_dual_encoder",
    "checkpoint_hash",
    "DEFAULT_JOINT_POOLING",
    "EXPORT_RECIPE",
]

log = logging.getLogger("crossknn.ce")
#: one INFO line per export step ("loading weights", "tracing", ...): ``crossknn export`` shows them
stages = logging.getLogger("crossknn.ce.export.stages")

DEFAULT_JOINT_POOLING: dict[str, Any] = {
    "query": "mean",
    "item": "mean",
    "special_tokens": "exclude",
    "normalize": True,
    "score": "dot",
}
_OPSET = 17
# bumped whenever the exported graphs or the quantization recipe change (part of cache keys)
EXPORT_RECIPE = 3
_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


def require_checkpoint(hf_dir: Path) -> list[Path]:
    """The files that make the checkpoint; FileNotFoundError naming the first missing one."""
    if not hf_dir.is_dir():
        raise FileNotFoundError(f"checkpoint directory not found: {hf_dir}")
    config = hf_dir / "config.json"
    if not config.is_file():
        raise FileNotFoundError(f"missing file {config}: not a Hugging Face checkpoint directory")
    weights = [hf_dir / w for w in _WEIGHT_FILES if (hf_dir / w).is_file()]
    if not weights:
        raise FileNotFoundError(
            f"missing file {hf_dir / _WEIGHT_FILES[0]} (or {_WEIGHT_FILES[1]}): "
            "the checkpoint has no weights"
        )
    return [config, weights[0]]


# the files a tokenizer is built from: a fast tokenizer.json, or a slow tokenizer's vocabulary
_TOKENIZER_FILES = (
    "tokenizer.json",
    "vocab.txt",
    "vocab.json",
    "spiece.model",
    "sentencepiece.bpe.model",
    "tokenizer.model",
)
# weights an export may lack or leave unused: the bare encoder's pooler (no exported graph reads
# it), and the heads of other tasks (MLM, QA ...) or old buffers in the checkpoint
_UNUSED_MISSING = re.compile(r"(^|\.)pooler\.")
_UNUSED_EXTRA = re.compile(
    r"(^|\.)(pooler|classifier|cls|lm_head|qa_outputs|score)\.|(^|\.)position_ids$"
)


def _require_tokenizer(hf_dir: Path) -> None:
    """The checkpoint has its tokenizer files; ValueError naming what is missing otherwise (a
    tokenizer made up without them maps every word to [UNK])."""
    if not any((hf_dir / name).is_file() for name in _TOKENIZER_FILES):
        raise ValueError(
            f"{hf_dir}: no tokenizer files (tokenizer.json, or vocab.txt / vocab.json + "
            "merges.txt / a sentencepiece .model); copy the checkpoint's tokenizer files there"
        )
    if (hf_dir / "vocab.json").is_file() and not any(
        (hf_dir / n).is_file() for n in ("tokenizer.json", "merges.txt")
    ):
        raise ValueError(f"{hf_dir}: vocab.json without merges.txt: the tokenizer is incomplete")


def _check_weights_file(hf_dir: Path) -> None:
    """A ``model.safetensors`` that is truncated or corrupt: one line naming it."""
    path = hf_dir / _WEIGHT_FILES[0]
    if not path.is_file():
        return
    # the numpy view of the file: the check needs no torch (a missing torch is reported after)
    from safetensors import safe_open

    try:
        with safe_open(str(path), "numpy") as f:
            f.keys()
    except Exception as exc:  # noqa: BLE001 - SafetensorError and I/O errors alike
        raise ValueError(
            f"{path}: not a readable safetensors file, truncated or corrupt ({exc}); copy the "
            "checkpoint again"
        ) from None


def _load_checked(hf_dir: Path, *, classifier: bool):
    """The checkpoint as a sequence classifier or a bare encoder (eager attention, eval), like
    :func:`crossknn.ce.graphs.load_model`, refusing weights the architecture in config.json does
    not match: missing ones (they would be newly initialized at random) or unexpected ones
    (ignored), named in the message."""
    # transformers: optional (export extra), slow to import
    from transformers import AutoModel, AutoModelForSequenceClassification
    from transformers.utils import logging as hf_logging

    load = AutoModelForSequenceClassification if classifier else AutoModel
    level, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()  # its load report is a table; ours is the one line below
    hf_logging.disable_progress_bar()
    try:
        model, info = load.from_pretrained(
            str(hf_dir),
            local_files_only=True,
            attn_implementation="eager",
            output_loading_info=True,
        )
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()
    missing = [
        k for k in info.get("missing_keys", []) if classifier or not _UNUSED_MISSING.search(k)
    ]
    extra = [k for k in info.get("unexpected_keys", []) if not _UNUSED_EXTRA.search(k)]
    mismatched = [str(k[0] if isinstance(k, tuple) else k) for k in info.get("mismatched_keys", [])]
    if missing or extra or mismatched:
        arch = (_config(hf_dir).get("architectures") or ["?"])[0]
        parts = []
        for what, keys in (
            ("missing (would be newly initialized)", missing),
            ("unexpected (unused)", extra),
            ("of another shape", mismatched),
        ):
            if keys:
                shown = ", ".join(sorted(keys)[:4]) + (", ..." if len(keys) > 4 else "")
                parts.append(f"{len(keys)} weights {what}: {shown}")
        raise ValueError(
            f"{hf_dir}: the weights do not match the {'classifier' if classifier else 'encoder'} "
            f"that config.json describes ({arch}); " + "; ".join(parts)
        )
    return model.eval()


def checkpoint_hash(hf_dir: str | os.PathLike) -> str:
    """sha256 over the checkpoint's config, weights and tokenizer files (identifies the source)."""
    hf_dir = Path(hf_dir)
    files = require_checkpoint(hf_dir)
    for name in ("tokenizer.json", "vocab.txt", "tokenizer_config.json"):
        if (hf_dir / name).is_file():
            files.append(hf_dir / name)
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode())
        h.update(sha256_file(f).encode())
    return h.hexdigest()


def write_tokenizer(hf_dir: Path, out_dir: Path) -> None:
    """Copy tokenizer.json, or build it from the slow-tokenizer files with transformers."""
    src = hf_dir / "tokenizer.json"
    dst = out_dir / "tokenizer.json"
    if src.is_file():
        shutil.copyfile(src, dst)
        return
    try:
        # transformers: optional (export extra), slow to import
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(hf_dir), use_fast=True, local_files_only=True)
        backend = getattr(tok, "backend_tokenizer", None)
    except Exception as exc:  # noqa: BLE001 - any failure means: no usable tokenizer
        raise FileNotFoundError(
            f"missing file {src}, and no fast tokenizer could be built from {hf_dir} ({exc})"
        ) from None
    if backend is None:
        raise FileNotFoundError(f"missing file {src}: the checkpoint has no fast tokenizer")
    size, want = backend.get_vocab_size(), _config(hf_dir).get("vocab_size")
    if isinstance(want, int) and size < want // 2:
        raise ValueError(
            f"{hf_dir}: the tokenizer built from its files has {size} tokens, but the model's "
            f"vocabulary has {want}: the tokenizer files are incomplete or of another model"
        )
    backend.save(str(dst))


def _offline_env() -> None:
    # never touch the network: everything is loaded from local directories
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def _cls_activation(config: dict[str, Any], num_labels: int, activation: str) -> str:
    """The activation sentence-transformers' CrossEncoder applies to this checkpoint."""
    if activation in ("sigmoid", "none"):
        return activation
    if activation != "auto":
        raise ValueError(f"activation must be 'auto', 'sigmoid' or 'none'; got {activation!r}")
    st = config.get("sentence_transformers") or {}
    name = st.get("activation_fn") or config.get("sbert_ce_default_activation_function")
    if name:
        return "sigmoid" if name.endswith("Sigmoid") else "none"
    return "sigmoid" if num_labels == 1 else "none"


def _versions() -> dict[str, str]:
    # versions of the export extra (torch, transformers) and onnxruntime, loaded only here
    import onnxruntime
    import torch
    import transformers

    return {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "onnxruntime": onnxruntime.__version__,
    }


def finish_export(
    hf_dir: Path,
    out_dir: Path,
    manifest: dict[str, Any],
    config: dict[str, Any],
    *,
    optimize: bool,
    quantize: Any,
    fp32: bool,
    calibration: Any = None,
    exported_with: dict[str, str] | None = None,
    opset: int = _OPSET,
    recipe: int = EXPORT_RECIPE,
) -> dict[str, Any]:
    """Add the int8 variants to ``out_dir/model.onnx``, optimize, write the manifest (last);
    returns the manifest. ``exported_with``: the versions that made the graph (default: torch,
    transformers and onnxruntime, for a traced export)."""
    # int8 recipes and their fidelity record: crossknn.ce.quantize / crossknn.ce.fidelity
    recipes = requested_recipes(quantize, manifest["kind"])
    if recipes:
        stages.info("int8 variants %s (calibration on a sample of pairs)", list(recipes))
    variants, quantized, cal = quantize_variants(
        out_dir,
        recipes,
        kind=manifest["kind"],
        max_length=manifest["max_length"],
        calibration=calibration,
    )
    if fp32:
        variants["fp32"] = "model.onnx"
    else:
        (out_dir / "model.onnx").unlink()
    if optimize:
        stages.info("optimizing %d graph(s) for the CPU", len(variants))
        for name in variants.values():
            optimize_for_cpu(out_dir / name)
    if quantized:
        stages.info("measuring the int8 variants' fidelity to fp32")
        manifest["quantization"] = record_fidelity(out_dir, variants, quantized, cal)
    manifest["variants"] = variants
    manifest["optimized"] = "CPUExecutionProvider" if optimize else None
    files = ["tokenizer.json", *variants.values()]
    manifest["files"] = {name: file_entry(out_dir / name) for name in files}
    manifest["source"] = {"path": str(hf_dir), "sha256": checkpoint_hash(hf_dir)}
    manifest["format"] = FORMAT_VERSION
    manifest["exported_with"] = _versions() if exported_with is None else exported_with
    manifest["opset"] = opset
    manifest["recipe"] = recipe
    manifest["max_positions"] = int(config.get("max_position_embeddings", 512))
    write_manifest(out_dir, manifest)
    return manifest


def _prepare_out(out_dir: Path, overwrite: bool) -> None:
    if out_dir.exists() and any(out_dir.iterdir()):
        if not overwrite:
            raise FileExistsError(f"{out_dir} exists and is not empty (pass overwrite=True)")
        # drop the manifest first: a half-overwritten directory is then never used
        (out_dir / MANIFEST).unlink(missing_ok=True)
    out_dir.mkdir(parents=True, exist_ok=True)


def export_cross_encoder(
    hf_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    kind: str = "cls",
    max_length: int = 512,
    activation: str = "auto",
    pooling: dict[str, Any] | None = None,
    model_id: str | None = None,
    optimize: bool = False,
    quantize: bool | str | tuple[str, ...] = False,
    fp32: bool = True,
    overwrite: bool = False,
    calibration: tuple[list[str], list[str]] | None = None,
) -> dict[str, Any]:
    """Export a cross-encoder checkpoint; returns the written manifest.

    ``kind="cls"``: a sequence classifier (``activation`` "auto" | "sigmoid" | "none" is stored and
    applied by the runtime). ``kind="joint"``: an encoder used as an [EMB]-CE with ``pooling``
    (default :data:`DEFAULT_JOINT_POOLING`). ``max_length`` is the default pair length of the
    runtime (pairs are truncated longest_first to it). ``quantize`` adds int8 variants: True
    (``int8``) or recipe names of :data:`crossknn.ce.quantize.RECIPES`, each checked on a
    calibration set (``calibration`` = (query texts, item pool texts); default: standard-library
    docstrings) and recorded in the manifest; ``fp32=False`` keeps only those.
    """
    if kind not in ("cls", "joint"):
        raise ValueError(f"kind must be 'cls' or 'joint'; got {kind!r}")
    requested_recipes(quantize, "cross-encoder")  # an unknown recipe fails before any work
    hf_dir = Path(hf_dir)
    out_dir = Path(out_dir)
    config = _open_checkpoint(hf_dir, max_length=max_length, fp32=fp32, quantize=quantize)
    pooling = dict(DEFAULT_JOINT_POOLING if pooling is None else pooling)
    if kind == "joint":
        _check_pooling(pooling)
    # crossknn.ce.graphs imports torch (export extra)
    from crossknn.ce import graphs

    t0 = time.perf_counter()
    model = _load_model(hf_dir, out_dir, classifier=kind == "cls", overwrite=overwrite)
    manifest: dict[str, Any] = {
        "kind": "joint-ce" if kind == "joint" else "cls-ce",
        "model_id": model_id or hf_dir.name,
        "max_length": int(max_length),
    }
    if kind == "joint":
        wrapper = graphs.JointCE(model, normalize=bool(pooling["normalize"]))
        manifest["pooling"] = pooling
    else:
        num_labels = int(model.config.num_labels)
        wrapper = graphs.ClsCE(model)
        manifest["num_labels"] = num_labels
        manifest["activation"] = _cls_activation(config, num_labels, activation)
    manifest.update(_trace(wrapper, out_dir))
    out = finish_export(
        hf_dir,
        out_dir,
        manifest,
        config,
        optimize=optimize,
        quantize=quantize,
        fp32=fp32,
        calibration=calibration,
    )
    log.info("exported %s CE %s -> %s in %.1fs", kind, hf_dir, out_dir, time.perf_counter() - t0)
    return out


def export_dual_encoder(
    hf_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    max_length: int = 128,
    normalize: bool = True,
    model_id: str | None = None,
    optimize: bool = False,
    quantize: bool | str | tuple[str, ...] = False,
    fp32: bool = True,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Export an encoder as a dual encoder (mean pooling over all non-padding tokens)."""
    requested_recipes(quantize, "dual-encoder")  # int8 / int8-dynamic only
    hf_dir = Path(hf_dir)
    out_dir = Path(out_dir)
    config = _open_checkpoint(hf_dir, max_length=max_length, fp32=fp32, quantize=quantize)
    # crossknn.ce.graphs imports torch (export extra)
    from crossknn.ce import graphs

    model = _load_model(hf_dir, out_dir, classifier=False, overwrite=overwrite)
    manifest: dict[str, Any] = {
        "kind": "dual-encoder",
        "model_id": model_id or hf_dir.name,
        "max_length": int(max_length),
        "pooling": {"mode": "mean", "special_tokens": "include", "normalize": bool(normalize)},
        "dim": int(model.config.hidden_size),
        **_trace(graphs.DualEncoder(model, normalize=normalize), out_dir),
    }
    return finish_export(
        hf_dir, out_dir, manifest, config, optimize=optimize, quantize=quantize, fp32=fp32
    )


def _open_checkpoint(hf_dir: Path, *, max_length: int, fp32: bool, quantize: Any) -> dict:
    """The checks both exports make before writing anything; returns the checkpoint's config."""
    if not fp32 and not quantize:
        raise ValueError("fp32=False needs quantize=True: the export would have no model file")
    require_checkpoint(hf_dir)
    _require_tokenizer(hf_dir)
    _check_weights_file(hf_dir)
    _offline_env()
    # the export dependencies: a missing one fails here, before the output directory is touched
    import torch  # noqa: F401
    import transformers  # noqa: F401

    config = _config(hf_dir)
    _check_max_length(max_length, config)
    return config


def _load_model(hf_dir: Path, out_dir: Path, *, classifier: bool, overwrite: bool):
    """Prepare ``out_dir``, write the tokenizer there, then load the model (eval mode)."""
    stages.info("loading the weights of %s", hf_dir)
    model = _load_checked(hf_dir, classifier=classifier)  # refused before out_dir is touched
    _prepare_out(out_dir, overwrite)
    write_tokenizer(hf_dir, out_dir)
    return model


def _trace(wrapper, out_dir: Path) -> dict[str, Any]:
    """Trace a :class:`~crossknn.ce.graphs.Wrapper` to ``model.onnx``; its manifest entries."""
    stages.info("tracing the ONNX graph")
    names = wrapper.export(out_dir / "model.onnx", opset=_OPSET)
    return {"output": wrapper.output, "inputs": names}


def _config(hf_dir: Path) -> dict[str, Any]:
    """The checkpoint's config.json."""
    return json.loads((hf_dir / "config.json").read_text(encoding="utf-8"))


def _check_max_length(max_length: int, config: dict[str, Any]) -> None:
    limit = int(config.get("max_position_embeddings", 512))
    if not isinstance(max_length, int) or not 8 <= max_length <= limit:
        raise ValueError(
            f"max_length must be an int in [8, {limit}] for this model; got {max_length!r}"
        )


def _check_pooling(pooling: dict[str, Any]) -> None:
    allowed = {
        "query": ("mean",),
        "item": ("mean",),
        "special_tokens": ("exclude",),
        "score": ("dot",),
    }
    for key, values in allowed.items():
        if pooling.get(key) not in values:
            raise ValueError(f"pooling[{key!r}] must be one of {values}; got {pooling.get(key)!r}")
    if not isinstance(pooling.get("normalize"), bool):
        raise ValueError(f"pooling['normalize'] must be a bool; got {pooling.get('normalize')!r}")
