"""The registry of CE/DE backends: a name (``--backend``, ``backend=``) -> how to open a model.

A backend opens a crossknn model folder (``crossknn_model.json``; a Hugging Face folder is
resolved to one first by :func:`crossknn.ce.folders.resolve_model`) or, given ``None``, the
embedded default, as an object satisfying :class:`crossknn.ce.interface.CrossEncoder` /
:class:`~crossknn.ce.interface.DualEncoder`. The model folder is the model's identity
(``model_id``, ``model_hash``); the backend is only how it runs, so an index built on one backend
is searched on another (its record names the backend apart: ``model_record``).

- ``onnx``: ONNX Runtime (:class:`crossknn.ce.runtime.OnnxCrossEncoder`), the default.
- ``torch``: PyTorch (:mod:`crossknn.ce.torch_backend`): the folder's source checkpoint, CPU or
  CUDA, fp32 / fp16 / bf16 compute.

Adding a backend is one module and one :func:`register` call here.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import crossknn.ce
from crossknn.ce.models import DEFAULT_CE, DEFAULT_DE, ensure_model
from crossknn.ce.runtime import FP16, OnnxCrossEncoder, OnnxDualEncoder
from crossknn.ce.torch_backend import TorchCrossEncoder, TorchDualEncoder

__all__ = ["BACKENDS", "DEFAULT_BACKEND", "Backend", "get_backend", "register"]

DEFAULT_BACKEND = "onnx"

#: ``opener(model_dir | None, *, precision, cache_dir, **options)``; ``None``: the embedded default
Opener = Callable[..., Any]


@dataclass(frozen=True)
class Backend:
    """One entry: its name, a one-line description, its CE and DE openers and the model
    precisions it runs (``None``: every one a model folder holds)."""

    name: str
    about: str
    open_ce: Opener
    open_de: Opener
    precisions: tuple[str, ...] | None = None

    def check(self, precision: str) -> None:
        """ValueError if this backend cannot run ``precision`` (before anything is exported)."""
        if self.precisions is not None and precision not in self.precisions:
            raise ValueError(
                f"backend {self.name!r} runs precision {' or '.join(self.precisions)}; got "
                f"{precision!r} (an ONNX variant: use backend 'onnx')"
            )


BACKENDS: dict[str, Backend] = {}


def register(backend: Backend) -> Backend:
    """Add ``backend`` to the registry (a name already taken is an error)."""
    if backend.name in BACKENDS:
        raise ValueError(f"backend {backend.name!r} is already registered")
    BACKENDS[backend.name] = backend
    return backend


def get_backend(name: str | None) -> Backend:
    """The registered backend ``name`` (``None``: the default); ValueError naming the choices."""
    name = DEFAULT_BACKEND if name is None else name
    if name not in BACKENDS:
        raise ValueError(f"backend must be one of {tuple(BACKENDS)}; got {name!r}")
    return BACKENDS[name]


def _fp16_option(precision: str, options: dict[str, Any]) -> str:
    """The embedded default's folder variant for ``precision``: fp16 is its fp32 graph run in
    half precision (``fp16=True``) on a GPU provider."""
    if precision == FP16:
        options["fp16"] = True
        return "fp32"
    return precision


def _onnx_ce(model_dir: Path | None, *, precision: str, cache_dir=None, **options: Any):
    if model_dir is None:
        # looked up on the package at call time (one place to substitute the default)

        precision = _fp16_option(precision, options)
        return crossknn.ce.default_cross_encoder(
            precision=precision, cache_dir=cache_dir, **options
        )

    return OnnxCrossEncoder(model_dir, precision=precision, **options)


def _onnx_de(model_dir: Path | None, *, precision: str, cache_dir=None, **options: Any):
    if model_dir is None:
        precision = _fp16_option(precision, options)
        return crossknn.ce.default_dual_encoder(precision=precision, cache_dir=cache_dir, **options)

    return OnnxDualEncoder(model_dir, precision=precision, **options)


def _torch_folder(name: str, model_dir: Path | None, precision: str, cache_dir) -> Path:
    if model_dir is not None:
        return Path(model_dir)
    return ensure_model(name, precision=precision, cache_dir=cache_dir)


def _torch_ce(
    model_dir: Path | None, *, precision: str, cache_dir: str | os.PathLike | None = None, **opts
):
    path = _torch_folder(DEFAULT_CE, model_dir, precision, cache_dir)
    return TorchCrossEncoder(path, precision=precision, **opts)


def _torch_de(
    model_dir: Path | None, *, precision: str, cache_dir: str | os.PathLike | None = None, **opts
):
    path = _torch_folder(DEFAULT_DE, model_dir, precision, cache_dir)
    return TorchDualEncoder(path, precision=precision, **opts)


register(Backend("onnx", "ONNX Runtime (CPU, CUDA, TensorRT providers)", _onnx_ce, _onnx_de))
register(
    Backend(
        "torch",
        "PyTorch on the model folder's source checkpoint (CPU, CUDA; fp32/fp16/bf16 compute)",
        _torch_ce,
        _torch_de,
        precisions=("fp32",),
    )
)
