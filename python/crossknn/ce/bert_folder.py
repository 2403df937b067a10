"""A Hugging Face BERT checkpoint exported into a crossknn model folder without torch.

The graphs are :mod:`crossknn.ce.bert_onnx`'s (numpy + onnx, as the embedded models are built):
a ``*ForSequenceClassification`` as a [CLS]-CE (``cls-ce``), a bare encoder as an [EMB]-CE
(``joint-ce``) or as a dual encoder (mean pooling). :func:`covers` says whether a checkpoint is
one the builder writes (a BERT with absolute positions, GELU and ``model.safetensors``); others go
through the traced export (:mod:`crossknn.ce.export`, the ``export`` extra). Used where a model
folder or a Hub id is exported on first use (:func:`crossknn.ce.folders.resolve_model`), so a
light install without torch opens a Hub cross-encoder such as
``cross-encoder/ms-marco-MiniLM-L-6-v2``. Where torch is installed the traced export is used
(it is what ``crossknn export`` writes, so the two give the same model hash).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from crossknn.ce.bert_onnx import OPSET, build_bert_graph
from crossknn.ce.export import (
    DEFAULT_JOINT_POOLING,
    _cls_activation,
    finish_export,
    write_tokenizer,
)

__all__ = ["BERT_RECIPE", "covers", "export_bert"]

#: bumped whenever these graphs or their manifests change (part of the export cache's names)
BERT_RECIPE = 1
_KINDS = {"cls": "cls-ce", "joint": "joint-ce", "de": "dual-encoder"}


def _config(hf_dir: Path) -> dict[str, Any]:
    return json.loads((hf_dir / "config.json").read_text(encoding="utf-8"))


def covers(hf_dir: str | Path) -> bool:
    """Whether the torch-free builder writes this checkpoint's graphs."""
    hf_dir = Path(hf_dir)
    if not (hf_dir / "model.safetensors").is_file() or not (hf_dir / "config.json").is_file():
        return False
    c = _config(hf_dir)
    return (
        c.get("model_type") == "bert"
        and c.get("hidden_act") == "gelu"
        and c.get("position_embedding_type", "absolute") == "absolute"
    )


def export_bert(
    hf_dir: str | Path,
    out: str | Path,
    *,
    kind: str,
    max_length: int,
    model_id: str,
    precision: str = "fp32",
) -> dict[str, Any]:
    """Write ``hf_dir``'s ``kind`` ("cls" | "joint" | "de") model folder into ``out`` at
    ``precision`` ("fp32" or an int8 recipe); returns its manifest."""
    # onnx and onnxruntime: only an export needs their versions here
    import onnx
    import onnxruntime

    hf_dir, out = Path(hf_dir), Path(out)
    graph = _KINDS[kind]
    config = _config(hf_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_tokenizer(hf_dir, out)
    manifest: dict[str, Any] = {"kind": graph, "model_id": model_id, "max_length": int(max_length)}
    if graph == "joint-ce":
        manifest["pooling"] = dict(DEFAULT_JOINT_POOLING)
    elif graph == "dual-encoder":
        manifest["pooling"] = {"mode": "mean", "special_tokens": "include", "normalize": True}
        manifest["dim"] = int(config["hidden_size"])
    manifest.update(build_bert_graph(hf_dir, out / "model.onnx", kind=graph))
    if graph == "cls-ce":  # the activation sentence-transformers applies to these logits
        manifest["activation"] = _cls_activation(config, manifest["num_labels"], "auto")
    int8 = precision != "fp32"
    return finish_export(
        hf_dir,
        out,
        manifest,
        config,
        optimize=False,
        quantize=precision if int8 else False,
        fp32=not int8,
        exported_with={
            "builder": f"crossknn.ce.bert_onnx b{BERT_RECIPE}",
            "onnx": onnx.__version__,
            "onnxruntime": onnxruntime.__version__,
        },
        opset=OPSET,
        recipe=BERT_RECIPE,
    )
