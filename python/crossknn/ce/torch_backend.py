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
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from crossknn.ce.export import checkpoint_hash
from crossknn.ce.manifest import read_manifest
from crossknn.ce.runtime import OnnxCrossEncoder, length_batches
from crossknn.ce.tokenize import (
    IdStore,
    TokenizerPlan,
    assemble_pairs,
    assemble_single,
    check_texts,
)

__all__ = ["DTYPES", "TorchCrossEncoder", "TorchDualEncoder", "check_precision"]

log = logging.getLogger("crossknn.ce")

#: the compute precisions of the torch backend
DTYPES = ("fp32", "fp16", "bf16")
_PROVIDERS = ("auto", "cpu", "cuda")
_ENCODE_CHUNK = 8192


def check_precision(precision: str) -> None:
    """The torch backend runs the fp32 weights: any other model precision is an error."""
    if precision != "fp32":
        raise ValueError(
            f"the torch backend runs the fp32 checkpoint; precision {precision!r} is an ONNX "
            "variant: use --backend onnx for it (for half precision on torch, pass dtype "
            "'fp16' or 'bf16')"
        )


def _positive(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive int; got {value!r}")
    return int(value)


def _progress(iterable, enabled: bool, desc: str, total: int):
    if not enabled:
        return iterable

    return tqdm(iterable, desc=desc, total=total, unit="batch")


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
            torch.set_num_threads(_positive("threads", threads))
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
    """What both torch scorers share: the session, the tokenizer, the options, the identity."""

    backend = "torch"
    _kinds: tuple[str, ...] = ()
    _template = "pair"
    _batch_size = 16
    _max_batch_tokens = 2048

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
        self.batch_size = _positive("batch_size", bs)
        self.max_batch_tokens = _positive("max_batch_tokens", mbt)
        if fp16 and dtype not in (None, "fp16"):
            raise ValueError(f"fp16=True and dtype={dtype!r} disagree; pass one of them")
        dtype = "fp16" if fp16 else (dtype or "fp32")
        m = read_manifest(model_dir)
        if m["kind"] not in self._kinds:
            other = "TorchDualEncoder" if m["kind"] == "dual-encoder" else "TorchCrossEncoder"
            raise ValueError(f"{model_dir} holds a {m['kind']} model; load it with {other}")
        self._s = _TorchSession(
            model_dir, precision=precision, provider=provider, dtype=dtype, threads=threads
        )
        self._plan = TokenizerPlan(Path(model_dir) / "tokenizer.json")
        limit = int(m.get("max_positions", 512))
        if max_length is not None and (
            isinstance(max_length, bool)
            or not isinstance(max_length, (int, np.integer))
            or not 8 <= max_length <= limit
        ):
            raise ValueError(f"max_length must be an int in [8, {limit}]; got {max_length!r}")
        self.max_length = int(m["max_length"] if max_length is None else max_length)
        self.show_progress_bar = bool(show_progress_bar)
        self._tpl = self._plan.pair if self._template == "pair" else self._plan.single
        self._room = self.max_length - self._tpl.n_special
        self._lock = threading.Lock()
        self._warned = False

    # -- identity (crossknn.ce.interface.ModelInfo) -------------------------------------------
    @property
    def model_id(self) -> str:
        return str(self._s.manifest["model_id"])

    @property
    def model_hash(self) -> str:
        """sha256 of the model folder's fp32 ONNX file: the model's identity on every backend."""
        return self._s.model_hash

    @property
    def provider(self) -> str:
        """The torch device that runs the model, e.g. ``cpu`` or ``cuda:0``."""
        return self._s.provider

    @property
    def precision(self) -> str:
        return self._s.precision

    @property
    def dtype(self) -> str:
        """The compute precision: fp32, fp16 or bf16."""
        return self._s.dtype

    @property
    def model_dir(self) -> Path:
        return self._s.model_dir

    @property
    def source(self) -> str | None:
        return self._s.source

    @property
    def kind(self) -> str:
        return str(self._s.manifest["kind"])

    def close(self) -> None:
        """Drop the model (and the cached CUDA memory); the scorer is unusable afterwards."""
        self._s.close()

    def _warn_truncated(self, n: int) -> None:
        with self._lock:
            if self._warned:
                return
            self._warned = True
        log.warning(
            "crossknn.ce: %d input(s) longer than max_length=%d were truncated (longest_first for "
            "pairs); this warning is shown once per scorer",
            n,
            self.max_length,
        )

    def _encode_store(self, texts: list[str], progress: bool = False) -> IdStore:
        ids: list[list[int]] = []
        chunks = range(0, len(texts), _ENCODE_CHUNK)
        it = _progress(chunks, progress and len(texts) > _ENCODE_CHUNK, "tokenize", len(chunks))
        for start in it:
            ids.extend(self._plan.encode(texts[start : start + _ENCODE_CHUNK]))
        return IdStore(ids, self._room)


class TorchCrossEncoder(_TorchModel):
    """A cross-encoder ([CLS]-CE or joint [EMB]-CE) on PyTorch; the API of
    :class:`crossknn.ce.runtime.OnnxCrossEncoder` (``items``, ``query_cache_size`` and the
    options of the module docstring)."""

    _kinds = ("cls-ce", "joint-ce")

    def __init__(
        self,
        model_dir: str | os.PathLike,
        *,
        items: list[str] | None = None,
        query_cache_size: int = 4096,
        **options: Any,
    ) -> None:
        super().__init__(model_dir, **options)
        m = self._s.manifest
        self._joint = m["kind"] == "joint-ce"
        self.num_labels = 1 if self._joint else int(m["num_labels"])
        self.activation = "none" if self._joint else str(m["activation"])
        self._items: IdStore | None = None
        self._qcache: OrderedDict[str, IdStore] = OrderedDict()
        self._qcache_size = int(query_cache_size)
        if items is not None:
            self.set_items(items)

    def __repr__(self) -> str:
        return (
            f"TorchCrossEncoder(model_id={self.model_id!r}, kind={self.kind!r}, "
            f"dtype={self.dtype!r}, provider={self.provider!r}, max_length={self.max_length}, "
            f"n_items={self.n_items})"
        )

    @property
    def n_items(self) -> int:
        store = self._items
        return 0 if store is None else len(store)

    def set_items(self, texts: list[str]) -> None:
        """Tokenize the item texts once; :meth:`score` then takes item indices into this list."""
        store = self._encode_store(check_texts(texts, "items"), self.show_progress_bar)
        with self._lock:
            self._items = store

    def _query_store(self, query: str) -> IdStore:
        with self._lock:
            store = self._qcache.get(query)
            if store is not None:
                self._qcache.move_to_end(query)
                return store
        store = IdStore(self._plan.encode([query]), self._room)
        with self._lock:
            self._qcache[query] = store
            while len(self._qcache) > self._qcache_size:
                self._qcache.popitem(last=False)
        return store

    # the pair loop of the ONNX scorer, shared (one loop for both backends): it truncates each
    # pair longest-first, batches by length under the token budget and runs self._s on
    # self._pair_feeds(...); this backend's session takes the same feeds and returns numpy
    _pair_feeds = staticmethod(assemble_pairs)
    _run_pairs = OnnxCrossEncoder._run_pairs

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
        if isinstance(pairs, (str, bytes)):
            raise TypeError("pairs must be a list of (query, document) string pairs, got a string")
        kw = {
            "batch_size": batch_size,
            "apply_activation": apply_activation,
            "show_progress_bar": show_progress_bar,
        }
        if (
            isinstance(pairs, (tuple, list))
            and len(pairs) == 2
            and all(isinstance(x, str) for x in pairs)
        ):
            return self.predict([tuple(pairs)], **kw)[0]
        pairs = list(pairs)
        qs: dict[str, int] = {}
        ds: dict[str, int] = {}
        ia = np.empty(len(pairs), np.int64)
        ib = np.empty(len(pairs), np.int64)
        for i, pair in enumerate(pairs):
            if (
                isinstance(pair, (str, bytes))
                or len(pair) != 2
                or not isinstance(pair[0], str)
                or not isinstance(pair[1], str)
            ):
                raise TypeError(
                    "pairs must be a list of (query, document) string pairs; "
                    f"got {type(pair).__name__} {pair!r:.60} at position {i}"
                )
            ia[i] = qs.setdefault(pair[0], len(qs))
            ib[i] = ds.setdefault(pair[1], len(ds))
        A, B = self._encode_store(list(qs)), self._encode_store(list(ds))
        return self._run_pairs(A, ia, B, ib, **kw)

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
        :meth:`crossknn.ce.runtime.OnnxCrossEncoder.rank`."""
        if not isinstance(query, str):
            raise TypeError(f"query must be a string; got {type(query).__name__}")
        documents = check_texts(documents, "documents")
        if doc_ids is not None:
            doc_ids = list(doc_ids)
            if len(doc_ids) != len(documents):
                raise ValueError(
                    f"doc_ids and documents differ in length: {len(doc_ids)} vs {len(documents)}"
                )
        if top_k is not None:
            _positive("top_k", top_k)
        if self.num_labels != 1:
            raise ValueError(f"rank needs a one-score model; this one has {self.num_labels} labels")
        scores = self._run_pairs(
            self._query_store(query),
            np.zeros(len(documents), np.int64),
            self._encode_store(documents),
            np.arange(len(documents), dtype=np.int64),
            batch_size=batch_size,
            apply_activation=apply_activation,
            show_progress_bar=show_progress_bar,
        )
        out = []
        for i in np.argsort(-scores, kind="stable")[:top_k]:
            row: dict[str, Any] = {"corpus_id": int(i), "score": float(scores[i])}
            if doc_ids is not None:
                row["id"] = doc_ids[i]
            if return_documents:
                row["text"] = documents[i]
            out.append(row)
        return out

    def _store(self) -> IdStore:
        store = self._items
        if store is None:
            raise ValueError("no items set: pass items=[...] or call set_items(texts) first")
        return store

    @staticmethod
    def _item_indices(items, n: int) -> np.ndarray:
        arr = np.asarray(items)
        if arr.size == 0:
            return np.zeros(0, np.int64)
        if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
            raise TypeError(
                f"items must be a 1-D integer array of item indices; got {arr.dtype} {arr.shape}"
            )
        arr = arr.astype(np.int64, copy=False)
        lo, hi = int(arr.min()), int(arr.max())
        if lo < 0 or hi >= n:
            raise IndexError(f"item index {lo if lo < 0 else hi} out of range for {n} items")
        return arr

    def score(self, query: str, items) -> np.ndarray:
        """CE scores of one query text against item indices (into the item texts), float32."""
        if not isinstance(query, str):
            raise TypeError(
                f"query must be a string (this is a text CE); got {type(query).__name__}"
            )
        store = self._store()
        idx = self._item_indices(items, len(store))
        return self._run_pairs(self._query_store(query), np.zeros(len(idx), np.int64), store, idx)

    def score_batch(self, queries: list[str], items: list) -> list[np.ndarray]:
        """Many queries, each against its own item indices, in one length-sorted batch run."""
        queries = check_texts(queries, "queries")
        items = list(items)
        if len(queries) != len(items):
            raise ValueError(f"queries and items differ in length: {len(queries)} vs {len(items)}")
        if not queries:
            return []
        store = self._store()
        idx = [self._item_indices(x, len(store)) for x in items]
        ia = np.repeat(np.arange(len(queries), dtype=np.int64), [len(x) for x in idx])
        flat = self._run_pairs(self._encode_store(queries), ia, store, np.concatenate(idx))
        return list(np.split(flat, np.cumsum([len(x) for x in idx])[:-1]))


class TorchDualEncoder(_TorchModel):
    """A dual encoder on PyTorch: ``encode(texts)`` -> float32 (n, ``dim``), L2-normalized."""

    _kinds = ("dual-encoder",)
    _template = "single"
    _batch_size = 32
    _max_batch_tokens = 4096

    @property
    def dim(self) -> int:
        return int(self._s.manifest["dim"])

    def __repr__(self) -> str:
        return (
            f"TorchDualEncoder(model_id={self.model_id!r}, dim={self.dim}, dtype={self.dtype!r}, "
            f"provider={self.provider!r}, max_length={self.max_length})"
        )

    def encode(
        self,
        texts: list[str],
        *,
        batch_size: int | None = None,
        show_progress_bar: bool | None = None,
    ) -> np.ndarray:
        texts = check_texts(texts, "texts")
        out = np.empty((len(texts), self.dim), np.float32)
        if not texts:
            return out
        bs = _positive("batch_size", self.batch_size if batch_size is None else batch_size)
        progress = self.show_progress_bar if show_progress_bar is None else show_progress_bar
        store = self._encode_store(texts, progress)
        kept = np.minimum(store.lengths, self._room)
        n_cut = int(np.count_nonzero(kept < store.lengths))
        if n_cut:
            self._warn_truncated(n_cut)
        batches = length_batches(kept + self._tpl.n_special, bs, self.max_batch_tokens)
        for idx in _progress(batches, progress, "encode", len(batches)):
            feeds = assemble_single(self._tpl, self._plan.pad_id, store, idx, kept[idx])
            out[idx] = self._s.run(feeds)
        return out
