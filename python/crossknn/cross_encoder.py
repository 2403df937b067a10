"""``crossknn.CrossEncoder(folder)``: sentence-transformers' ``CrossEncoder`` constructor over a
crossknn model folder or a Hugging Face folder (exported to ONNX on first use, into the cache, as
``--model`` does).

    model = crossknn.CrossEncoder("my-hf-cross-encoder", device="cpu")
    model.predict([("query", "document"), ...])        # as sentence_transformers.CrossEncoder
    model.rank("query", documents, top_k=3, return_documents=True)

Keywords with sentence-transformers' meaning: ``device`` ("cpu", "cuda", "cuda:N"; crossknn's
``provider`` also works), ``max_length``, ``activation_fn`` (the default activation of
``predict``/``rank``), ``cache_folder`` (where exports are kept). A name that is not a folder
may be a Hugging Face Hub id, as sentence-transformers takes it:
``crossknn.CrossEncoder("cross-encoder/ms-marco-MiniLM-L-6-v2")`` reads the model from the
Hugging Face cache (downloading it there once when the Hub is reachable; with
``HF_HUB_OFFLINE=1`` or no route, the cache only) and exports it to ONNX once
(:mod:`crossknn.ce.hub`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from crossknn.ce.folders import resolve_model
from crossknn.ce.hub import looks_like_hub_id
from crossknn.ce.runtime import OnnxCrossEncoder, provider_of_device

__all__ = ["CrossEncoder"]


class CrossEncoder(OnnxCrossEncoder):
    """An :class:`~crossknn.ce.OnnxCrossEncoder` opened the way sentence-transformers opens one.

    ``model_name_or_path``: a crossknn model folder, a Hugging Face checkpoint folder
    (``*ForSequenceClassification``: a [CLS]-CE; a bare encoder: an [EMB]-CE) or a Hugging Face
    Hub id (``ORG/NAME[@REVISION]``, read from the Hugging Face cache), exported on first use
    into ``cache_folder`` (default ``$CROSSKNN_CACHE`` or ``~/.cache/crossknn``).
    ``precision`` picks the fp32 or an int8 variant; other keywords are
    :class:`OnnxCrossEncoder`'s (``threads``, ``batch_size``, ``max_batch_tokens``, ...).
    """

    def __init__(
        self,
        model_name_or_path: str | os.PathLike,
        *,
        device: str | None = None,
        max_length: int | None = None,
        activation_fn: Callable | None = None,
        cache_folder: str | os.PathLike | None = None,
        precision: str = "fp32",
        kind: str | None = None,
        provider: str | None = None,
        **options: Any,
    ) -> None:
        if not os.path.isdir(model_name_or_path) and not looks_like_hub_id(model_name_or_path):
            raise FileNotFoundError(
                f"model folder not found: {model_name_or_path} (pass a local Hugging Face or "
                "crossknn model folder, or a Hugging Face Hub id such as ORG/NAME)"
            )
        from_device = provider_of_device(device)
        if provider is not None and from_device is not None and provider != from_device:
            raise ValueError(f"device={device!r} and provider={provider!r} disagree; give one")
        if activation_fn is not None and not callable(activation_fn):
            raise TypeError(f"activation_fn must be callable; got {type(activation_fn).__name__}")
        folder = resolve_model(
            model_name_or_path,
            role="ce",
            kind=kind,
            precision="int8" if precision.startswith("int8") else "fp32",
            cache_dir=cache_folder,
        )
        super().__init__(
            folder,
            precision=precision,
            max_length=max_length,
            provider=provider or from_device or "auto",
            **options,
        )
        self.model_name_or_path = str(model_name_or_path)
        self.activation_fn = activation_fn

    def predict(self, pairs, *args, activation_fn: Callable | None = None, **kwargs):
        if activation_fn is None and len(args) < 5 and kwargs.get("apply_activation", True):
            activation_fn = self.activation_fn
        if activation_fn is not None:
            kwargs["activation_fn"] = activation_fn
        return super().predict(pairs, *args, **kwargs)

    def rank(self, query, documents, *args, activation_fn: Callable | None = None, **kwargs):
        if activation_fn is None and len(args) < 7 and kwargs.get("apply_activation", True):
            activation_fn = self.activation_fn
        if activation_fn is not None:
            kwargs["activation_fn"] = activation_fn
        return super().rank(query, documents, *args, **kwargs)
