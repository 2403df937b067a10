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

    def predict(
        self,
        pairs,
        prompt_name: str | None = None,
        prompt: str | None = None,
        batch_size: int | None = None,
        show_progress_bar: bool | None = None,
        activation_fn: Callable | None = None,
        apply_softmax: bool | None = False,
        convert_to_numpy: bool = True,
        convert_to_tensor: bool = False,
        device: str | None = None,
        *,
        apply_activation: bool = True,
    ):
        """Scores of ``(query, document)`` pairs, in input order, as sentence-transformers'
        ``CrossEncoder.predict`` gives them::

            model.predict([("what is a cat", "Cats are small felines."), ("q", "d")])
            # array([0.83, 0.12], dtype=float32)

        Args:
            pairs (list[tuple[str, str]]): ``(query, document)`` string pairs (one pair alone:
                its score alone).
            prompt_name: not supported (refused), as ``prompt``.
            prompt: not supported (refused).
            batch_size: pairs per model call (default: the model's).
            show_progress_bar: a bar over the batches.
            activation_fn: applied to the logits instead of the model's own activation
                (default: the one given when the model was opened, else the model's).
            apply_softmax: a softmax over the labels of a multi-label model.
            convert_to_numpy: False gives a list of one torch tensor per pair.
            convert_to_tensor: one torch tensor.
            device: ``"cpu"`` or ``"cuda[:N]"``: must be where the model runs (chosen when
                it is opened).
            apply_activation: False gives the raw logits (crossknn's).

        Returns:
            scores (numpy.ndarray): float32, one per pair (a torch tensor when asked for).
        """
        if activation_fn is None and apply_activation:
            activation_fn = self.activation_fn
        return super().predict(
            pairs,
            prompt_name,
            prompt,
            batch_size,
            show_progress_bar,
            activation_fn,
            apply_softmax,
            convert_to_numpy,
            convert_to_tensor,
            device,
            apply_activation=apply_activation,
        )

    def rank(
        self,
        query: str,
        documents: list[str],
        top_k: int | None = None,
        return_documents: bool = False,
        prompt_name: str | None = None,
        prompt: str | None = None,
        batch_size: int | None = None,
        show_progress_bar: bool | None = None,
        activation_fn: Callable | None = None,
        device: str | None = None,
        *,
        doc_ids: list | None = None,
        apply_activation: bool = True,
    ) -> list[dict[str, Any]]:
        """The documents ranked by their score for ``query``, best first, as
        sentence-transformers' ``CrossEncoder.rank`` ranks them::

            model.rank("what is a cat", ["Dogs bark.", "Cats are small felines."], top_k=1)
            # [{"corpus_id": 1, "score": 0.83}]

        Args:
            query: the query.
            documents: the texts to rank.
            top_k: keep the best k (None: all; 0: none); ties keep the lower ``corpus_id``
                first.
            return_documents: add each document's ``text``.
            prompt_name: not supported (refused), as ``prompt``.
            prompt: not supported (refused).
            batch_size: pairs per model call (default: the model's).
            show_progress_bar: a bar over the batches.
            activation_fn: applied to the logits instead of the model's own activation
                (default: the one given when the model was opened, else the model's).
            device: ``"cpu"`` or ``"cuda[:N]"``: must be where the model runs.
            doc_ids: one id per document, returned as ``id`` (crossknn's).
            apply_activation: False ranks by the raw logits (crossknn's).

        Returns:
            ``[{"corpus_id": i, "score": s, ("id": doc_ids[i]), ("text": documents[i])}, ...]``.
        """
        if activation_fn is None and apply_activation:
            activation_fn = self.activation_fn
        return super().rank(
            query,
            documents,
            top_k,
            return_documents,
            prompt_name,
            prompt,
            batch_size,
            show_progress_bar,
            activation_fn,
            device,
            doc_ids=doc_ids,
            apply_activation=apply_activation,
        )
