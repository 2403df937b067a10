"""The one interface of a cross-encoder (CE) and of a dual encoder (DE), whatever runs it.

Every backend of :mod:`crossknn.ce.backends` (ONNX Runtime, PyTorch) returns objects that satisfy
these protocols; callers (``Searcher``, ``serve``, the commands, index records) use only what is
declared here.

- :class:`ModelInfo`: identity and run settings shared by CEs and DEs: ``backend`` (the registry
  name that runs it), ``model_id``, ``model_hash`` (sha256 of the crossknn model folder's model
  file of this precision: the same for every backend, so an index built on one backend is searched
  on another), ``source`` (the Hugging Face folder it came from), ``kind`` (the manifest kind:
  ``cls-ce``, ``joint-ce``, ``dual-encoder``), ``model_dir`` (the crossknn model folder),
  ``precision`` (the model variant: ``fp32`` or an int8 recipe), ``provider`` (where it runs),
  ``max_length``, the batch limits ``batch_size`` and ``max_batch_tokens``, and ``close()``.
- :class:`CrossEncoder`: the :class:`crossknn.scorers.Scorer` of item ids (``set_items``,
  ``n_items``, ``score``, ``score_batch``) plus scoring by text pairs (``predict``, ``rank``)
  and ``warmup`` (a GPU's first-use costs of batch shapes, paid before the first request).
- :class:`DualEncoder`: ``encode(texts)`` -> float32 (n, ``dim``), L2-normalized.

:func:`missing_members` lists what an object lacks of a protocol (name and expected kind, data
or method): ``isinstance`` of a runtime-checkable protocol only checks that names exist, and from
Python 3.12 on does not see members a proxy provides through ``__getattr__`` (serve's
``BatchedCE``); :func:`is_model` does.
"""

from __future__ import annotations

import os
from typing import Any, Protocol, runtime_checkable

import numpy as np

from crossknn.scorers import Scorer

__all__ = [
    "CrossEncoder",
    "DualEncoder",
    "ModelInfo",
    "is_model",
    "missing_members",
    "protocol_members",
]


@runtime_checkable
class ModelInfo(Protocol):
    """Identity, precision, provider and batch limits of a CE or DE (module docstring)."""

    backend: str
    model_id: str
    model_hash: str
    source: str | None
    kind: str
    model_dir: os.PathLike | None
    precision: str
    provider: str
    max_length: int
    batch_size: int
    max_batch_tokens: int

    def close(self) -> None:
        """Release the model (sessions, device memory); the object is unusable afterwards."""
        ...


@runtime_checkable
class CrossEncoder(Scorer, ModelInfo, Protocol):
    """A CE: scores by item ids (``set_items`` then ``score``/``score_batch``) and by pairs."""

    def set_items(self, texts: list[str]) -> None: ...

    def predict(
        self,
        pairs: Any,
        *,
        batch_size: int | None = None,
        apply_activation: bool = True,
        show_progress_bar: bool | None = None,
    ) -> np.ndarray: ...

    def rank(
        self,
        query: str,
        documents: list[str],
        top_k: int | None = None,
        *,
        return_documents: bool = False,
        doc_ids: list | None = None,
        batch_size: int | None = None,
        apply_activation: bool = True,
        show_progress_bar: bool | None = None,
    ) -> list[dict[str, Any]]: ...

    def warmup(self, max_pairs: int | None = None) -> dict[str, Any]:
        """Pay a GPU's first-use costs of batch shapes up to ``max_pairs`` pairs now."""
        ...


@runtime_checkable
class DualEncoder(ModelInfo, Protocol):
    """A DE: one L2-normalized float32 vector per text."""

    dim: int

    def encode(
        self,
        texts: list[str],
        *,
        batch_size: int | None = None,
        show_progress_bar: bool | None = None,
    ) -> np.ndarray: ...


def protocol_members(proto: type) -> dict[str, str]:
    """``{name: "data" | "method"}`` of every member a protocol (and its bases) declares."""
    out: dict[str, str] = {}
    for cls in reversed(proto.__mro__):
        if cls is object or cls is Protocol or not getattr(cls, "_is_protocol", False):
            continue
        for name in getattr(cls, "__annotations__", {}):
            out[name] = "data"
        for name, value in vars(cls).items():
            if callable(value) and not name.startswith("_"):
                out[name] = "method"
    return out


def missing_members(obj: Any, proto: type) -> list[str]:
    """What ``obj`` lacks of ``proto``: ``"name (data)"`` / ``"name (method)"`` for a member that
    is absent or of the other kind (a method where data is declared, or data where a method is)."""
    out = []
    for name, kind in protocol_members(proto).items():
        try:
            value = getattr(obj, name)
        except AttributeError:
            out.append(f"{name} ({kind})")
            continue
        if (kind == "method") != callable(value):
            out.append(f"{name} ({kind})")
    return out


def is_model(obj: Any) -> bool:
    """Whether ``obj`` provides every :class:`ModelInfo` member (directly or through a proxy's
    ``__getattr__``); a bare :class:`~crossknn.scorers.Scorer` (a score matrix, a stub) does not."""
    return not missing_members(obj, ModelInfo)
