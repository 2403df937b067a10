"""The PyTorch backend: :class:`TorchCrossEncoder` and :class:`TorchDualEncoder`.

They open the same crossknn model folder as the ONNX Runtime scorers (``crossknn_model.json``,
``tokenizer.json``) and run its **source checkpoint** (the Hugging Face folder the manifest records,
checked against the recorded sha256) in PyTorch, computing what the exported graph computes
(:mod:`crossknn.ce.graphs`):

- ``cls-ce``: the sequence classifier's logits; the manifest's activation (sigmoid or none) is
  applied as the ONNX runtime applies it;
- ``joint-ce`` ([EMB]-CE): the mean of the last hidden state over the query-segment tokens
  (``pool_mask`` 1) and over the item-segment tokens (2), both L2-normalized if the manifest's
  pooling says so, dot product;
- ``dual-encoder``: mean over all non-padding tokens, L2-normalized.

Pairs are tokenized and assembled by :mod:`crossknn.ce.tokenize` exactly as the ONNX runtime does
them (ids cached per text, ``longest_first`` truncation, the tokenizer's template), sorted by
length and cut into batches by ``batch_size`` and ``max_batch_tokens``, padded to the longest pair
of the batch; scores come back in input order. Pooling and scores are computed in float32 whatever
the compute ``dtype``.

Identity: ``model_id``, ``kind``, ``model_dir`` and ``model_hash`` are the model folder's (the
sha256 of its fp32 ONNX file), so an index built with the ONNX backend accepts this backend as the
same model. ``precision`` is ``"fp32"`` (the weights): int8 variants exist only as ONNX files.
Options: ``provider`` "auto" (CUDA if torch sees a GPU, else CPU), "cpu" or "cuda";
``dtype`` "fp32", "fp16" or "bf16" (compute precision; ``fp16=True`` is the same as "fp16");
``threads`` sets torch's intra-op threads (process-wide); ``batch_size``, ``max_batch_tokens``,
``max_length``, ``show_progress_bar`` as for the ONNX scorers.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from crossknn.ce.cuda_graph import dummy_feeds
from crossknn.ce.export import checkpoint_hash
from crossknn.ce.manifest import read_manifest
from crossknn.ce.model_base import (
    CrossEncoderBase,
    DualEncoderBase,
    check_positive,
)
from crossknn.ce.models import DEFAULT_CE, DEFAULT_DE, minilm_checkpoint_dir
from crossknn.ce.tokenize import assemble_pairs, assemble_single

__all__ = ["DTYPES", "TorchCrossEncoder", "TorchDualEncoder", "check_precision"]

log = logging.getLogger("crossknn.ce")

#: the compute precisions of the torch backend
DTYPES = ("fp32", "fp16", "bf16")
_PROVIDERS = ("auto", "cpu", "cuda")


def _embedded_source(model_id: Any, sha256: Any) -> str | None:
    """The installed embedded checkpoint, for an embedded model whose recorded source path is
    gone (the export cache outlived the environment that made it): only when its weights hash
    as recorded; else None."""
    if model_id not in (DEFAULT_CE, DEFAULT_DE) or not sha256:
        return None
    try:
        path = minilm_checkpoint_dir()
    except (ModuleNotFoundError, FileNotFoundError):
        return None
    return str(path) if checkpoint_hash(path) == sha256 else None


def check_precision(precision: str) -> None:
    """The torch backend runs the fp32 weights: any other model precision is an error."""
    if precision != "fp32":
        raise ValueError(
            f"the torch backend runs the fp32 checkpoint; precision {precision!r} is an ONNX "
            "variant: use --backend onnx for it (for half precision on torch, pass dtype "
            "'fp16' or 'bf16')"
        )


class _TorchSession:
    """The source checkpoint of a crossknn model folder, on a torch device, as the graph runs."""

    def __init__(
        self,
        model_dir: str | os.PathLike,
        *,
        precision: str,
        provider: str,
        dtype: str,
        threads: int | None,
    ) -> None:
        # torch and transformers are optional heavy dependencies: only this backend needs them
        import torch
        import transformers

        check_precision(precision)
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}; got {dtype!r}")
        if provider not in _PROVIDERS:
            raise ValueError(f"provider must be one of {_PROVIDERS} (torch); got {provider!r}")
        self.model_dir = Path(model_dir)
        self.manifest = m = read_manifest(self.model_dir)
        variants = m["variants"]
        if "fp32" not in variants:
            raise ValueError(
                f"{self.model_dir} has no fp32 variant (has {sorted(variants)}): the torch "
                "backend identifies its model by the fp32 export"
            )
        self.precision = "fp32"
        self.model_hash = str(m["files"][variants["fp32"]]["sha256"])
        src = m.get("source") or {}
        self.source = src.get("path")
        if not self.source or not (Path(self.source) / "config.json").is_file():
            self.source = _embedded_source(m.get("model_id"), src.get("sha256")) or self.source
        if not self.source or not (Path(self.source) / "config.json").is_file():
            raise FileNotFoundError(
                f"{self.model_dir}: the torch backend runs the source checkpoint "
                f"{self.source!r} the manifest records, which is not there; use --backend onnx"
            )
        now = checkpoint_hash(self.source)
        if src.get("sha256") and now != src["sha256"]:
            raise ValueError(
                f"{self.model_dir}: its source {self.source} changed since the export (sha256 "
                f"{src['sha256'][:12]} recorded, {now[:12]} now); re-export the model"
            )
        if threads is not None:
            check_positive("threads", threads)
            torch.set_num_threads(int(threads))
        if provider == "auto":
            provider = "cuda" if torch.cuda.is_available() else "cpu"
        if provider == "cuda" and not torch.cuda.is_available():
            raise ValueError(
                "provider 'cuda' was requested but this torch sees no CUDA device "
                f"(torch {torch.__version__}); use provider 'cpu'"
            )
        self.device = torch.device("cuda" if provider == "cuda" else "cpu")
        self.provider = (
            str(self.device) if provider == "cpu" else f"cuda:{torch.cuda.current_device()}"
        )
        self.dtype = dtype
        self._torch = torch
        kind = m["kind"]
        load = (
            transformers.AutoModelForSequenceClassification
            if kind == "cls-ce"
            else transformers.AutoModel
        )
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is local: never the network
        bars = transformers.utils.logging.is_progress_bar_enabled()
        transformers.utils.logging.disable_progress_bar()  # no "Loading weights" bar per open
        try:
            model = load.from_pretrained(str(self.source), local_files_only=True)
        finally:
            if bars:
                transformers.utils.logging.enable_progress_bar()
        torch_dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
        self.model = model.eval().to(device=self.device, dtype=torch_dtype[dtype])
        self.inputs = [n for n in m["inputs"] if n != "pool_mask"]
        self.kind = kind
        self.normalize = bool((m.get("pooling") or {}).get("normalize", True))
        log.info("crossknn.ce: %s on torch %s (%s)", self.model_dir.name, self.provider, dtype)

    def run(self, feeds: dict[str, np.ndarray]) -> np.ndarray:
        """What the exported graph outputs for one batch of assembled inputs (float32)."""
        torch = self._torch
        dev = self.device
        with torch.inference_mode():
            t = {k: torch.from_numpy(feeds[k]).to(dev, non_blocking=True) for k in self.inputs}
            out = self.model(**t)[0]
            if self.kind == "cls-ce":
                return out.float().cpu().numpy()
            h = out.float()  # pooling in float32 whatever the compute dtype
            if self.kind == "dual-encoder":
                v = _mean(h, t["attention_mask"])
                return _l2(v).cpu().numpy() if self.normalize else v.cpu().numpy()
            pool = torch.from_numpy(feeds["pool_mask"]).to(dev, non_blocking=True)
            q, d = _mean(h, pool == 1), _mean(h, pool == 2)
            if self.normalize:
                q, d = _l2(q), _l2(d)
            return (q * d).sum(-1).cpu().numpy()

    def warmup(self, max_rows: int, max_columns: int) -> dict[str, Any]:
        """On CUDA, one run of the largest batch now (the caching allocator grown to it, the
        kernels chosen), not in a request; on the CPU nothing."""
        if self.device.type != "cuda":
            return {"buckets": 0, "seconds": 0.0}
        t = time.perf_counter()
        names = [*self.inputs, "pool_mask"] if self.kind == "joint-ce" else self.inputs
        self.run(dummy_feeds(names, max_rows, max_columns))
        return {"buckets": 0, "seconds": round(time.perf_counter() - t, 3)}

    def close(self) -> None:
        self.model = None
        if self.device.type == "cuda":
            self._torch.cuda.empty_cache()


def _mean(h, mask):
    """Mean of ``h`` (batch, seq, dim) over the positions where ``mask`` is nonzero (0 if none)."""
    w = mask.to(h.dtype).unsqueeze(-1)
    return (h * w).sum(1) / w.sum(1).clamp(min=1.0)


def _l2(v):
    return v / v.norm(dim=-1, keepdim=True).clamp(min=1e-12)


class _TorchModel:
    """The torch session under both torch scorers (the rest: crossknn.ce.model_base)."""

    backend = "torch"
    _names = ("TorchDualEncoder", "TorchCrossEncoder")
    _pair_feeds = staticmethod(assemble_pairs)
    _single_feeds = staticmethod(assemble_single)

    def __init__(
        self,
        model_dir: str | os.PathLike,
        *,
        precision: str = "fp32",
        max_length: int | None = None,
        threads: int | None = None,
        batch_size: int | None = None,
        max_batch_tokens: int | None = None,
        provider: str = "auto",
        dtype: str | None = None,
        fp16: bool = False,
        show_progress_bar: bool = False,
    ) -> None:
        bs = self._batch_size if batch_size is None else batch_size
        mbt = self._max_batch_tokens if max_batch_tokens is None else max_batch_tokens
        check_positive("batch_size", bs)
        check_positive("max_batch_tokens", mbt)
        if fp16 and dtype not in (None, "fp16"):
            raise ValueError(f"fp16=True and dtype={dtype!r} disagree; pass one of them")
        dtype = "fp16" if fp16 else (dtype or "fp32")
        m = read_manifest(model_dir)
        if m["kind"] not in self._kinds:  # before loading a checkpoint for nothing
            other = self._names[0] if m["kind"] == "dual-encoder" else self._names[1]
            raise ValueError(f"{model_dir} holds a {m['kind']} model; load it with {other}")
        self._s = _TorchSession(
            model_dir, precision=precision, provider=provider, dtype=dtype, threads=threads
        )
        self._setup(
            max_length=max_length,
            batch_size=bs,
            max_batch_tokens=mbt,
            show_progress_bar=show_progress_bar,
        )

    @property
    def dtype(self) -> str:
        """The compute precision: fp32, fp16 or bf16."""
        return self._s.dtype


class TorchCrossEncoder(_TorchModel, CrossEncoderBase):
    """A cross-encoder ([CLS]-CE or joint [EMB]-CE) on PyTorch; the API of
    :class:`crossknn.ce.runtime.OnnxCrossEncoder` (``items``, ``query_cache_size`` and the
    options of the module docstring)."""

    def __init__(
        self,
        model_dir: str | os.PathLike,
        *,
        items: list[str] | None = None,
        query_cache_size: int = 4096,
        **options: Any,
    ) -> None:
        super().__init__(model_dir, **options)
        self._setup_items(items, query_cache_size)

    def __repr__(self) -> str:
        return (
            f"TorchCrossEncoder(model_id={self.model_id!r}, kind={self.kind!r}, "
            f"dtype={self.dtype!r}, provider={self.provider!r}, max_length={self.max_length}, "
            f"n_items={self.n_items})"
        )

    def predict(
        self,
        pairs,
        *,
        batch_size: int | None = None,
        apply_activation: bool = True,
        show_progress_bar: bool | None = None,
    ) -> np.ndarray:
        """Scores of ``(query, document)`` string pairs, float32, in input order (one pair: its
        score alone), as :meth:`crossknn.ce.runtime.OnnxCrossEncoder.predict`."""
        scores, single = self._score_pairs(
            pairs,
            batch_size=batch_size,
            apply_activation=apply_activation,
            show_progress_bar=show_progress_bar,
        )
        return scores[0] if single else scores

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
    ) -> list[dict[str, Any]]:
        """Documents sorted by score (ties: lower ``corpus_id`` first), as
        :meth:`crossknn.ce.runtime.OnnxCrossEncoder.rank` (``top_k`` None: all, 0: none)."""
        return self._rank(
            query,
            documents,
            top_k,
            doc_ids,
            return_documents,
            batch_size=batch_size,
            apply_activation=apply_activation,
            show_progress_bar=show_progress_bar,
        )


class TorchDualEncoder(_TorchModel, DualEncoderBase):
    """A dual encoder on PyTorch: ``encode(texts)`` -> float32 (n, ``dim``), L2-normalized."""

    def __repr__(self) -> str:
        return (
            f"TorchDualEncoder(model_id={self.model_id!r}, dim={self.dim}, dtype={self.dtype!r}, "
            f"provider={self.provider!r}, max_length={self.max_length})"
        )
