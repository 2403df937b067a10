"""ONNX Runtime scorers: :class:`OnnxCrossEncoder` and :class:`OnnxDualEncoder`.

Both load a directory written by :mod:`crossknn.ce.export` (``crossknn_model.json``,
``tokenizer.json``, ``model.onnx`` / ``model.int8.onnx``) and need only numpy, onnxruntime and
tokenizers at run time. The one exception is ``fp16=True`` on the CUDA provider: the graph is
converted to fp16 when the session opens, which needs ``onnx`` (the ``export`` extra; without it
an ImportError says so). TensorRT runs fp16 without a conversion.

How pairs are scored: every text is tokenized once without special tokens (items when they are
set, a query when first seen: a small LRU cache), pairs are assembled from the cached ids with the
exact Hugging Face ``longest_first`` pair truncation and the tokenizer's own special-token template,
sorted by length (longest first), cut into batches by a token budget (``max_batch_tokens``, at most
``batch_size`` pairs) and padded only to the longest pair of each batch; scores come back in input
order. Sessions, caches and the item store are safe to share between threads
(``InferenceSession.run`` is thread-safe; item sets are swapped atomically under a lock).

Bad input: a non-string text raises ``TypeError`` naming its position; empty lists give empty
results; an empty text is scored like any other text (for the joint CE a segment with no tokens
pools to the zero vector, so its score is 0.0); texts longer than ``max_length`` are truncated and a
warning is logged once per scorer (logger ``crossknn.ce``).
"""

from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from crossknn.ce.manifest import read_manifest
from crossknn.ce.rewrite import to_fp16
from crossknn.ce.tokenize import (
    IdStore,
    TokenizerPlan,
    assemble_pairs,
    assemble_single,
    check_texts,
    longest_first,
)

__all__ = [
    "PROVIDERS",
    "OnnxCrossEncoder",
    "OnnxDualEncoder",
    "ProviderUnavailableError",
    "available_providers",
]

log = logging.getLogger("crossknn.ce")

_PROVIDERS = {
    "cpu": "CPUExecutionProvider",
    "cuda": "CUDAExecutionProvider",
    "tensorrt": "TensorrtExecutionProvider",
}
#: the ``provider`` names every entry point accepts ("auto": the best one installed)
PROVIDERS = ("auto", *_PROVIDERS)
_ENCODE_CHUNK = 8192


class ProviderUnavailableError(RuntimeError, ValueError):
    """An execution provider was asked for that this onnxruntime does not offer (a user error:
    the CLI prints it as one line)."""


def available_providers() -> list[str]:
    """Execution providers this onnxruntime build offers (e.g. ``CPUExecutionProvider``)."""
    import onnxruntime as ort

    return list(ort.get_available_providers())


def _choose_provider(provider: str) -> str:
    avail = available_providers()
    if provider == "auto":
        for key in ("tensorrt", "cuda", "cpu"):
            if _PROVIDERS[key] in avail:
                return _PROVIDERS[key]
        raise RuntimeError(f"onnxruntime offers no usable provider (has {avail})")
    if provider not in _PROVIDERS:
        raise ValueError(f"provider must be 'auto', 'cpu', 'cuda' or 'tensorrt'; got {provider!r}")
    name = _PROVIDERS[provider]
    if name not in avail:
        raise ProviderUnavailableError(
            f"provider {provider!r} ({name}) was requested but this onnxruntime offers "
            f"only {avail}; "
            "install the GPU build (pip install 'crossknn[gpu]', i.e. onnxruntime-gpu with a "
            "matching CUDA/TensorRT), or use provider 'cpu'"
        )
    return name


def _check_positive(name: str, value: Any, *, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive int; got {value!r}")


class _Session:
    """One ONNX Runtime session over one variant of an exported model directory."""

    def __init__(
        self,
        model_dir: str | os.PathLike,
        *,
        precision: str,
        threads: int | None,
        provider: str,
        fp16: bool,
    ) -> None:
        import onnxruntime as ort

        self.model_dir = Path(model_dir)
        self.manifest = read_manifest(self.model_dir)
        variants = self.manifest["variants"]
        if precision not in variants:
            raise ValueError(
                f"{self.model_dir} has no {precision!r} variant (has {sorted(variants)}); "
                "export with quantize=True for int8"
            )
        self.precision = precision
        self.file = variants[precision]
        self.model_hash = self.manifest["files"][self.file]["sha256"]
        _check_positive("threads", threads, allow_none=True)
        self.provider = _choose_provider(provider)
        gpu = self.provider != _PROVIDERS["cpu"]
        if fp16 and not gpu:
            raise ValueError(
                "fp16=True needs the CUDA or TensorRT provider; this session runs on CPU"
            )
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.intra_op_num_threads = int(threads or 0)  # 0: one per physical core
        so.inter_op_num_threads = 1
        so.log_severity_level = 3
        model: Any = str(self.model_dir / self.file)
        options: dict[str, Any] = {}
        if self.provider == _PROVIDERS["tensorrt"]:
            options = {"trt_fp16_enable": bool(fp16)}
        elif fp16:  # CUDA: convert the graph to fp16 once, inputs/outputs stay as they are
            model = to_fp16(self.model_dir / self.file)
        self.fp16 = bool(fp16)
        providers: list[Any] = [(self.provider, options)]
        if self.provider == _PROVIDERS["tensorrt"] and _PROVIDERS["cuda"] in available_providers():
            providers.append(_PROVIDERS["cuda"])  # for subgraphs TensorRT does not take
        if gpu:
            providers.append("CPUExecutionProvider")  # for nodes the GPU providers do not take
        self.session = ort.InferenceSession(model, so, providers=providers)
        running = self.session.get_providers()
        if not running or running[0] != self.provider:
            raise RuntimeError(f"requested {self.provider} but onnxruntime runs {running}")
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.output = self.manifest["output"]
        self._gpu = gpu
        log.info("crossknn.ce: %s (%s) runs on %s", self.model_dir.name, precision, self.provider)

    def run(self, feeds: dict[str, np.ndarray]) -> np.ndarray:
        feeds = {k: v for k, v in feeds.items() if k in self.input_names}
        if not self._gpu:
            return self.session.run([self.output], feeds)[0]
        # GPU: bind inputs and outputs explicitly (one copy each way, no per-run allocation guess)
        io = self.session.io_binding()
        for name, arr in feeds.items():
            io.bind_cpu_input(name, arr)
        io.bind_output(self.output, "cuda")  # allocated on the device, copied back once
        self.session.run_with_iobinding(io)
        return io.copy_outputs_to_cpu()[0]


def _batches(lengths: np.ndarray, batch_size: int, max_batch_tokens: int) -> list[np.ndarray]:
    """Pair positions sorted by length (longest first), cut by the token budget."""
    order = np.argsort(-lengths, kind="stable")
    out = []
    i, n = 0, len(order)
    while i < n:
        longest = int(lengths[order[i]])
        m = max(1, min(batch_size, max_batch_tokens // max(longest, 1)))
        out.append(order[i : i + m])
        i += m
    return out


def _progress(iterable, enabled: bool, desc: str, total: int):
    if not enabled:
        return iterable
    from tqdm.auto import tqdm

    return tqdm(iterable, desc=desc, total=total, unit="batch")


def provider_of_device(device) -> str | None:
    """The crossknn ``provider`` of a sentence-transformers ``device``: "cpu" -> "cpu",
    "cuda" or "cuda:N" -> "cuda" (None stays None)."""
    if device is None:
        return None
    name = str(device).strip().lower()
    if name == "cpu":
        return "cpu"
    if name == "cuda" or (name.startswith("cuda:") and name[5:].isdigit()):
        return "cuda"
    raise ValueError(
        f"device must be 'cpu', 'cuda' or 'cuda:N' (as in sentence-transformers; provider= also "
        f"takes 'tensorrt'); got {device!r}"
    )


def _refuse_prompt(prompt_name, prompt) -> None:
    if prompt_name is not None or prompt is not None:
        raise ValueError(
            "crossknn cross-encoders take no prompts (prompt_name/prompt); put the text into "
            "the query"
        )


def _activation_choice(apply_activation: bool, activation_fn) -> bool:
    """Whether the model's own activation runs: not when ``activation_fn`` replaces it."""
    if activation_fn is None:
        return bool(apply_activation)
    if not callable(activation_fn):
        raise TypeError(f"activation_fn must be callable; got {type(activation_fn).__name__}")
    if not apply_activation:
        raise ValueError("give activation_fn or apply_activation=False, not both")
    return False


def _st_activation(scores: np.ndarray, activation_fn, apply_softmax, num_labels: int) -> np.ndarray:
    """sentence-transformers' order: ``activation_fn`` on the (n, num_labels) logits (a torch
    tensor when torch is installed), then a softmax over the labels if asked (num_labels > 1)."""
    if activation_fn is None and not (apply_softmax and num_labels > 1):
        return scores
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is optional at run time
        torch = None
    logits = scores.reshape(len(scores), num_labels)
    if torch is not None:
        t = torch.from_numpy(np.ascontiguousarray(logits))
        if activation_fn is not None:
            t = activation_fn(t)
        if apply_softmax and num_labels > 1:
            t = torch.nn.functional.softmax(t, dim=1)
        logits = t.detach().float().cpu().numpy()
    else:  # pragma: no cover
        if activation_fn is not None:
            logits = np.asarray(activation_fn(logits), dtype=np.float32)
        if apply_softmax and num_labels > 1:
            e = np.exp(logits - logits.max(axis=1, keepdims=True))
            logits = e / e.sum(axis=1, keepdims=True)
    logits = np.asarray(logits, dtype=np.float32)
    return logits.reshape(len(scores)) if num_labels == 1 else logits


def _st_convert(scores: np.ndarray, convert_to_numpy: bool, convert_to_tensor: bool):
    """sentence-transformers' output types: one tensor (``convert_to_tensor``), a numpy array
    (``convert_to_numpy``, the default), else a list of one tensor per pair."""
    if not convert_to_tensor and convert_to_numpy:
        return scores
    import torch

    t = torch.from_numpy(np.ascontiguousarray(scores))
    return t if convert_to_tensor else list(t)


class _OnnxModel:
    """What both scorers share: the session, the tokenizer, the options and the identity.

    Options (keywords of both classes): ``precision`` "fp32" or "int8" (a variant in the
    directory); ``max_length`` in tokens (default: the export's); ``threads`` intra-op threads
    (default: one per physical core); ``batch_size`` the most texts or pairs per batch and
    ``max_batch_tokens`` the most (padded) tokens per batch (defaults: per class);
    ``provider`` "auto" (TensorRT, then CUDA, then CPU: whichever this onnxruntime offers),
    "cpu", "cuda" or "tensorrt" (an error if not available, never a silent fallback);
    ``fp16`` half precision on a GPU provider; ``show_progress_bar`` tqdm bars for long runs.
    """

    backend = "onnx"  # its name in crossknn.ce.backends
    _kinds: tuple[str, ...] = ()
    _template = "pair"  # the TokenizerPlan template the model's inputs follow: "pair" or "single"
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
        fp16: bool = False,
        show_progress_bar: bool = False,
    ) -> None:
        batch_size = self._batch_size if batch_size is None else batch_size
        max_batch_tokens = self._max_batch_tokens if max_batch_tokens is None else max_batch_tokens
        _check_positive("batch_size", batch_size)
        _check_positive("max_batch_tokens", max_batch_tokens)
        self._s = _Session(
            model_dir, precision=precision, threads=threads, provider=provider, fp16=fp16
        )
        m = self._s.manifest
        if m["kind"] not in self._kinds:
            other = "OnnxDualEncoder" if m["kind"] == "dual-encoder" else "OnnxCrossEncoder"
            raise ValueError(f"{model_dir} holds a {m['kind']} model; load it with {other}")
        self._plan = TokenizerPlan(Path(model_dir) / "tokenizer.json")
        limit = int(m.get("max_positions", 512))
        if max_length is not None and (
            isinstance(max_length, bool)
            or not isinstance(max_length, (int, np.integer))
            or not 8 <= max_length <= limit
        ):
            raise ValueError(f"max_length must be an int in [8, {limit}]; got {max_length!r}")
        self.max_length = int(m["max_length"] if max_length is None else max_length)
        self.batch_size = int(batch_size)
        self.max_batch_tokens = int(max_batch_tokens)
        self.show_progress_bar = bool(show_progress_bar)
        self._tpl = getattr(self._plan, self._template)
        self._room = self.max_length - self._tpl.n_special  # tokens left for the text(s)
        self._lock = threading.Lock()
        self._warned = False

    # -- identity ---------------------------------------------------------------------------
    @property
    def model_id(self) -> str:
        return str(self._s.manifest["model_id"])

    @property
    def model_hash(self) -> str:
        """sha256 of the ONNX file that runs (also in the manifest)."""
        return self._s.model_hash

    @property
    def provider(self) -> str:
        """The execution provider that actually runs, e.g. ``CPUExecutionProvider``."""
        return self._s.provider

    @property
    def precision(self) -> str:
        return self._s.precision

    @property
    def model_dir(self) -> Path:
        """The exported model directory this scorer runs."""
        return self._s.model_dir

    @property
    def source(self) -> str | None:
        """The Hugging Face folder the model was exported from (per its manifest), if known."""
        src = self._s.manifest.get("source") or {}
        return src.get("path")

    @property
    def kind(self) -> str:
        return str(self._s.manifest["kind"])

    def close(self) -> None:
        """Drop the ONNX Runtime session (crossknn.ce.interface); the scorer is unusable after."""
        self._s.session = None

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

    def _encode_store(self, texts: list[str], cap: int, progress: bool = False) -> IdStore:
        ids: list[list[int]] = []
        chunks = range(0, len(texts), _ENCODE_CHUNK)
        it = _progress(chunks, progress and len(texts) > _ENCODE_CHUNK, "tokenize", len(chunks))
        for start in it:
            ids.extend(self._plan.encode(texts[start : start + _ENCODE_CHUNK]))
        return IdStore(ids, cap)


class OnnxCrossEncoder(_OnnxModel):
    """A cross-encoder (classic [CLS]-CE or joint [EMB]-CE) on ONNX Runtime.

    Parameters: ``model_dir`` an exported model directory; ``items`` texts to score against by
    index (:meth:`score`, :meth:`score_batch`; also :meth:`set_items`); ``query_cache_size`` how
    many tokenized queries to keep; ``options`` those of both scorers (see ``_OnnxModel``:
    ``precision``, ``max_length`` of a pair, ``threads``, ``batch_size`` pairs (default 16),
    ``max_batch_tokens`` (default 2048), ``provider``, ``fp16``, ``show_progress_bar``).
    """

    _kinds = ("cls-ce", "joint-ce")
    _template = "pair"
    _batch_size = 16
    _max_batch_tokens = 2048

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
            f"OnnxCrossEncoder(model_id={self.model_id!r}, kind={self.kind!r}, "
            f"precision={self.precision!r}, provider={self.provider!r}, "
            f"max_length={self.max_length}, n_items={self.n_items})"
        )

    # -- items ------------------------------------------------------------------------------
    @property
    def n_items(self) -> int:
        store = self._items
        return 0 if store is None else len(store)

    def set_items(self, texts: list[str]) -> None:
        """Tokenize the item texts once; :meth:`score` then takes item indices into this list."""
        texts = check_texts(texts, "items")
        store = self._encode_store(texts, self._room, self.show_progress_bar)
        with self._lock:
            self._items = store

    # -- scoring core -----------------------------------------------------------------------
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

    def _run_pairs(
        self,
        A: IdStore,
        ia: np.ndarray,
        B: IdStore,
        ib: np.ndarray,
        *,
        batch_size: int | None = None,
        apply_activation: bool = True,
        show_progress_bar: bool | None = None,
    ) -> np.ndarray:
        n = len(ia)
        shape = (n,) if self.num_labels == 1 else (n, self.num_labels)
        out = np.empty(shape, dtype=np.float32)
        if n == 0:
            return out
        bs = self.batch_size if batch_size is None else batch_size
        _check_positive("batch_size", bs)
        la, lb = A.lengths[ia], B.lengths[ib]
        ta, tb = longest_first(la, lb, self._room)
        n_cut = int(np.count_nonzero((ta < la) | (tb < lb)))
        if n_cut:
            self._warn_truncated(n_cut)
        batches = _batches(ta + tb + self._tpl.n_special, bs, self.max_batch_tokens)
        progress = self.show_progress_bar if show_progress_bar is None else show_progress_bar
        for idx in _progress(batches, progress, "CE", len(batches)):
            feeds = assemble_pairs(
                self._tpl, self._plan.pad_id, A, ia[idx], ta[idx], B, ib[idx], tb[idx]
            )
            res = self._s.run(feeds)
            if self._joint:
                out[idx] = res
            elif self.num_labels == 1:
                out[idx] = res[:, 0]
            else:
                out[idx] = res
        if apply_activation and self.activation == "sigmoid":
            out = (1.0 / (1.0 + np.exp(-out.astype(np.float64)))).astype(np.float32)
        return out

    # -- sentence-transformers style ----------------------------------------------------------
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
        """Scores of ``(query, document)`` string pairs, float32, in input order.

        The arguments are sentence-transformers' ``CrossEncoder.predict``'s, in its order and
        with its meaning: ``activation_fn`` a callable applied to the logits (a torch tensor of
        shape (n, num_labels) when torch is installed) instead of the model's own activation;
        ``apply_softmax`` a softmax over the labels of a multi-label model; ``convert_to_tensor``
        one torch tensor, ``convert_to_numpy=False`` a list of one tensor per pair; ``device``
        ``"cpu"`` or ``"cuda[:N]"``, which must be where this model runs (choose it when opening
        the model: ``crossknn.CrossEncoder(..., device=)`` or ``provider=``). Prompts are not
        supported (refused). ``apply_activation=False`` (crossknn's) returns raw logits. An
        empty list gives an empty array; one pair ``(query, document)`` gives its score alone.
        """
        _refuse_prompt(prompt_name, prompt)
        self._check_device(device)
        activate = _activation_choice(apply_activation, activation_fn)
        if isinstance(pairs, (str, bytes)):
            raise TypeError("pairs must be a list of (query, document) string pairs, got a string")
        single = (
            isinstance(pairs, (tuple, list))
            and len(pairs) == 2
            and isinstance(pairs[0], str)
            and isinstance(pairs[1], str)
        )
        pairs = [tuple(pairs)] if single else list(pairs)
        qs: dict[str, int] = {}
        ds: dict[str, int] = {}
        ia = np.empty(len(pairs), dtype=np.int64)
        ib = np.empty(len(pairs), dtype=np.int64)
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
        A = self._encode_store(list(qs), self._room)
        B = self._encode_store(list(ds), self._room)
        scores = self._run_pairs(
            A,
            ia,
            B,
            ib,
            batch_size=batch_size,
            apply_activation=activate,
            show_progress_bar=show_progress_bar,
        )
        scores = _st_activation(scores, activation_fn, apply_softmax, self.num_labels)
        out = _st_convert(scores, convert_to_numpy, convert_to_tensor)
        return out[0] if single else out

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
        """Documents sorted by score: ``[{"corpus_id": i, "score": s, ("id": doc_ids[i]),
        ("text": doc)}, ...]``.

        The arguments are sentence-transformers' ``CrossEncoder.rank``'s, in its order and with
        its meaning (see :meth:`predict`): the third is ``top_k`` (``None`` all, ``0`` none);
        ties keep the lower ``corpus_id`` first. ``doc_ids`` (crossknn's, keyword only: one per
        document) are passed through as ``id``.
        """
        _refuse_prompt(prompt_name, prompt)
        self._check_device(device)
        activate = _activation_choice(apply_activation, activation_fn)
        if not isinstance(query, str):
            raise TypeError(f"query must be a string; got {type(query).__name__}")
        if isinstance(top_k, (list, tuple, np.ndarray)):
            raise TypeError(
                "rank's third argument is top_k, an int, as in sentence-transformers' "
                "CrossEncoder.rank(query, documents, top_k, return_documents, ...); pass "
                f"document ids as doc_ids=[...]; got a {type(top_k).__name__}"
            )
        documents = check_texts(documents, "documents")
        if doc_ids is not None:
            doc_ids = list(doc_ids)
            if len(doc_ids) != len(documents):
                raise ValueError(
                    f"doc_ids and documents differ in length: {len(doc_ids)} vs {len(documents)}"
                )
        if top_k is not None and (
            isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer)) or top_k < 0
        ):
            raise ValueError(f"top_k must be None or an int >= 0; got {top_k!r}")
        if self.num_labels != 1:
            raise ValueError(f"rank needs a one-score model; this one has {self.num_labels} labels")
        if top_k == 0:
            return []
        B = self._encode_store(documents, self._room)
        scores = self._run_pairs(
            self._query_store(query),
            np.zeros(len(documents), dtype=np.int64),
            B,
            np.arange(len(documents), dtype=np.int64),
            batch_size=batch_size,
            apply_activation=activate,
            show_progress_bar=show_progress_bar,
        )
        scores = _st_activation(scores, activation_fn, False, self.num_labels)
        order = np.argsort(-scores, kind="stable")[:top_k]
        out = []
        for i in order:
            row: dict[str, Any] = {"corpus_id": int(i), "score": float(scores[i])}
            if doc_ids is not None:
                row["id"] = doc_ids[i]
            if return_documents:
                row["text"] = documents[i]
            out.append(row)
        return out

    def _check_device(self, device) -> None:
        """``device`` (sentence-transformers' meaning) must name where this model runs."""
        want = provider_of_device(device)
        if want is not None and _PROVIDERS[want] != self.provider:
            raise ValueError(
                f"device={device!r} asks for {_PROVIDERS[want]}, but this model runs on "
                f"{self.provider}; open it there: crossknn.CrossEncoder(..., device={device!r}) "
                f"or provider={want!r}"
            )

    # -- the scorer protocol of crossknn.search -------------------------------------------------
    def _item_indices(self, items, store: IdStore) -> np.ndarray:
        arr = np.asarray(items)
        if arr.size == 0:
            return np.zeros(0, dtype=np.int64)
        if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
            raise TypeError(
                f"items must be a 1-D integer array of item indices; got {arr.dtype} {arr.shape}"
            )
        arr = arr.astype(np.int64, copy=False)
        lo, hi = int(arr.min()), int(arr.max())
        if lo < 0 or hi >= len(store):
            bad = lo if lo < 0 else hi
            raise IndexError(f"item index {bad} out of range for {len(store)} items")
        return arr

    def _store(self) -> IdStore:
        store = self._items
        if store is None:
            raise ValueError("no items set: pass items=[...] or call set_items(texts) first")
        return store

    def score(self, query: str, items) -> np.ndarray:
        """CE scores of one query text against item indices (into the item texts), float32."""
        if not isinstance(query, str):
            raise TypeError(
                f"query must be a string (this is a text CE); got {type(query).__name__}"
            )
        store = self._store()
        idx = self._item_indices(items, store)
        return self._run_pairs(
            self._query_store(query), np.zeros(len(idx), dtype=np.int64), store, idx
        )

    def score_batch(self, queries: list[str], items: list) -> list[np.ndarray]:
        """Many queries, each against its own item indices, in one length-sorted batch run."""
        queries = check_texts(queries, "queries")
        items = list(items)
        if len(queries) != len(items):
            raise ValueError(f"queries and items differ in length: {len(queries)} vs {len(items)}")
        store = self._store()
        idx = [self._item_indices(x, store) for x in items]
        A = self._encode_store(queries, self._room)
        ia = np.repeat(np.arange(len(queries), dtype=np.int64), [len(x) for x in idx])
        ib = np.concatenate(idx) if idx else np.zeros(0, dtype=np.int64)
        flat = self._run_pairs(A, ia, store, ib)
        return list(np.split(flat, np.cumsum([len(x) for x in idx])[:-1])) if idx else []


class OnnxDualEncoder(_OnnxModel):
    """A dual encoder on ONNX Runtime: ``encode(texts)`` -> float32 (n, d), L2-normalized.

    Parameters: ``model_dir`` an exported model directory and the options of both scorers (see
    ``_OnnxModel``; ``batch_size`` texts, default 32; ``max_batch_tokens`` default 4096).
    """

    _kinds = ("dual-encoder",)
    _template = "single"
    _batch_size = 32
    _max_batch_tokens = 4096

    @property
    def dim(self) -> int:
        """Length of the embedding vectors."""
        return int(self._s.manifest["dim"])

    def __repr__(self) -> str:
        return (
            f"OnnxDualEncoder(model_id={self.model_id!r}, dim={self.dim}, "
            f"precision={self.precision!r}, provider={self.provider!r}, "
            f"max_length={self.max_length})"
        )

    def encode(
        self,
        texts: list[str],
        *,
        batch_size: int | None = None,
        show_progress_bar: bool | None = None,
    ) -> np.ndarray:
        texts = check_texts(texts, "texts")
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out
        bs = self.batch_size if batch_size is None else batch_size
        _check_positive("batch_size", bs)
        progress = self.show_progress_bar if show_progress_bar is None else show_progress_bar
        store = self._encode_store(texts, self._room, progress)
        kept = np.minimum(store.lengths, self._room)
        n_cut = int(np.count_nonzero(kept < store.lengths))
        if n_cut:
            self._warn_truncated(n_cut)
        lengths = kept + self._tpl.n_special
        batches = _batches(lengths, bs, self.max_batch_tokens)
        for idx in _progress(batches, progress, "encode", len(batches)):
            feeds = assemble_single(self._tpl, self._plan.pad_id, store, idx, kept[idx])
            out[idx] = self._s.run(feeds)
        return out
