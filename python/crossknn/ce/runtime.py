"""ONNX Runtime scorers: :class:`OnnxCrossEncoder` and :class:`OnnxDualEncoder`.

Both load a directory written by :mod:`crossknn.ce.export` (``crossknn_model.json``,
``tokenizer.json``, ``model.onnx`` / ``model.int8.onnx``) and need only numpy, onnxruntime and
tokenizers at run time. The one exception is ``precision="fp16"`` (or ``fp16=True``) on the CUDA
provider: the fp32 graph is converted to fp16 once, when a session first needs it, and kept beside
the model (or in the crossknn cache when that folder is read-only) under its hash; the conversion
needs ``onnx`` (the ``export`` extra; without it an ImportError says so). TensorRT runs fp16
without a conversion.

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

import contextlib
import ctypes
import logging
import os
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from crossknn.ce.cuda_graph import GraphRunner, dummy_feeds, run_lock
from crossknn.ce.feeds import pair_feeds, single_feeds
from crossknn.ce.fuse import fused_graph
from crossknn.ce.manifest import read_manifest
from crossknn.ce.model_base import (
    CrossEncoderBase,
    DualEncoderBase,
    check_positive,
)
from crossknn.ce.rewrite import fp16_graph
from crossknn.ce.spinning import set_spinning

__all__ = [
    "FP16",
    "PROVIDERS",
    "OnnxCrossEncoder",
    "OnnxDualEncoder",
    "ProviderUnavailableError",
    "available_providers",
    "check_precision",
    "open_first",
    "provider_candidates",
    "tensorrt_loads",
]

log = logging.getLogger("crossknn.ce")

_PROVIDERS = {
    "cpu": "CPUExecutionProvider",
    "cuda": "CUDAExecutionProvider",
    "tensorrt": "TensorrtExecutionProvider",
}
_CPU = _PROVIDERS["cpu"]
#: the ``provider`` names every entry point accepts ("auto": the first one whose session opens)
PROVIDERS = ("auto", *_PROVIDERS)
#: the run precision that is no file of its own: the fp32 graph in half precision on a GPU
FP16 = "fp16"
# batch defaults on a GPU provider: one session run per round call (and per merged serve batch)
# up to this many pairs / padded tokens (512 pairs of 128 tokens; a few hundred MB of
# activations for a MiniLM-sized CE in fp16, a few GB for a large one at 512 tokens)
_GPU_BATCH_SIZE = 512
_GPU_MAX_BATCH_TOKENS = 65536
_NO_LOCK = contextlib.nullcontext()
#: CUDA graph capture for batches up to crossknn.ce.cuda_graph.MAX_ROWS pairs, by default (an H200:
#: a 20-pair fp16 round call 1.05 -> 0.90 ms; bench/results/gpu_bench.json "round" rows)
CUDA_GRAPH = True
_TRT_LIBS = ("libnvinfer.so.10", "libnvinfer.so.8", "libnvinfer.so")


class ProviderUnavailableError(RuntimeError, ValueError):
    """An execution provider was asked for that this onnxruntime does not offer (a user error:
    the CLI prints it as one line)."""


def available_providers() -> list[str]:
    """Execution providers this onnxruntime build offers (e.g. ``CPUExecutionProvider``)."""
    # onnxruntime: loaded only where a model runs (CPU or GPU wheel)
    import onnxruntime as ort

    return list(ort.get_available_providers())


def tensorrt_loads() -> bool:
    """Whether TensorRT's runtime library can be loaded (onnxruntime-gpu lists the TensorRT
    provider even where TensorRT is not installed; ``auto`` tries it only when this is true)."""
    for name in _TRT_LIBS:
        try:
            ctypes.CDLL(name)
        except OSError:
            continue
        return True
    return False


def check_precision(precision: str, provider: str, name: str) -> None:
    """Refuse a precision the provider cannot run, in one line naming both: fp16 needs a GPU
    provider, the int8 graphs (QDQ / integer ops tuned for CPUs) run on the CPU provider only."""
    if precision == FP16 and name == _CPU:
        raise ValueError(
            f"precision 'fp16' needs a GPU provider (cuda or tensorrt), but provider "
            f"{provider!r} runs {name}: use precision fp32 (or an int8 one) on the CPU"
        )
    if precision not in ("fp32", FP16) and name != _CPU:
        raise ValueError(
            f"precision {precision!r} is an int8 graph for the CPU provider, but provider "
            f"{provider!r} runs {name}: use precision fp32 or fp16 on a GPU, or provider 'cpu'"
        )


def provider_candidates(
    provider: str, precision: str = "fp32", available: list[str] | None = None
) -> list[str]:
    """The onnxruntime providers to try, in order, for ``provider`` and ``precision``.

    ``auto``: TensorRT (only when :func:`tensorrt_loads`), CUDA, CPU, those this onnxruntime
    offers; fp16 keeps only the GPU ones, int8 only the CPU. An explicit provider is the one
    candidate: not offered is a :class:`ProviderUnavailableError`, a precision it cannot run a
    ValueError (both one line).
    """
    avail = available_providers() if available is None else list(available)
    if provider == "auto":
        keys = ["tensorrt", "cuda", "cpu"]
        if precision == FP16:
            keys = ["tensorrt", "cuda"]
        elif precision != "fp32":
            keys = ["cpu"]
        names = [_PROVIDERS[k] for k in keys if _PROVIDERS[k] in avail]
        if _PROVIDERS["tensorrt"] in names and not tensorrt_loads():
            names.remove(_PROVIDERS["tensorrt"])
        if not names:
            if precision == FP16:
                raise ProviderUnavailableError(
                    f"precision 'fp16' needs a GPU provider (cuda or tensorrt), but this "
                    f"onnxruntime offers only {avail}: install onnxruntime-gpu (pip install "
                    "'crossknn[gpu]'), or use precision fp32"
                )
            raise ProviderUnavailableError(f"onnxruntime offers no usable provider (has {avail})")
        return names
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
    check_precision(precision, provider, name)
    return [name]


def open_first(candidates: list[str], open_one) -> tuple[Any, str, list[str]]:
    """``(session, provider, skipped)``: the first candidate whose session opens and runs that
    provider first (``open_one(name)`` opens one). With one candidate (an explicit provider)
    its failure is raised as it is (strict); otherwise a candidate that fails is skipped with a
    reason and the next one tried; none left: a ProviderUnavailableError listing the reasons."""
    skipped: list[str] = []
    for name in candidates:
        try:
            session = open_one(name)
        except Exception as exc:
            if len(candidates) == 1:
                raise
            skipped.append(f"{name}: {' '.join(str(exc).split())[:200]}")
            continue
        running = list(session.get_providers())
        if running and running[0] == name:
            return session, name, skipped
        if len(candidates) == 1:
            raise RuntimeError(f"requested {name} but onnxruntime runs {running}")
        skipped.append(f"{name}: onnxruntime ran {running} instead")
    raise ProviderUnavailableError(
        "no execution provider could open the model (" + "; ".join(skipped) + ")"
    )


_preloaded: list[bool] = []


def _preload_gpu_libraries() -> None:
    """Let onnxruntime find the CUDA/cuDNN libraries that pip packages (PyTorch's nvidia-*)
    ship (``onnxruntime.preload_dlls``, onnxruntime >= 1.21); a no-op where that fails."""
    # onnxruntime: loaded only where a model runs (CPU or GPU wheel)
    import onnxruntime as ort

    preload = getattr(ort, "preload_dlls", None)
    if preload is None or _preloaded:
        return
    _preloaded.append(True)

    try:
        with contextlib.redirect_stdout(sys.stderr):  # it prints; stdout may carry --json
            preload()
    except Exception as exc:  # the system's libraries may still be found
        log.debug("crossknn.ce: onnxruntime.preload_dlls failed: %s", exc)


def cuda_graph_default() -> bool:
    """Whether CUDA sessions capture graphs when the caller does not say
    (``$CROSSKNN_CUDA_GRAPH`` 1 or 0, else :data:`CUDA_GRAPH`)."""
    env = os.environ.get("CROSSKNN_CUDA_GRAPH", "").strip()
    if env not in ("", "0", "1"):
        raise ValueError(f"CROSSKNN_CUDA_GRAPH must be 0 or 1; got {env!r}")
    return CUDA_GRAPH if env == "" else env == "1"


class _Session:
    """One ONNX Runtime session over one variant of an exported model directory.

    ``precision`` is a variant of the folder ("fp32", an int8 recipe) or "fp16": the fp32 graph
    in half precision (TensorRT: its fp16 flag). The CUDA provider runs the fused graph
    (:func:`crossknn.ce.fuse.fused_graph`, fp32 or fp16, made and checked once, cached by hash;
    ``fuse=False``: the exported graph, fp16 converted by :func:`crossknn.ce.rewrite.fp16_graph`)
    and, with ``cuda_graph`` (default :func:`cuda_graph_default`), replays captured CUDA graphs
    for batches up to :data:`crossknn.ce.cuda_graph.MAX_ROWS` pairs (:attr:`cuda_graph_error`
    says why not where the session could not be opened that way). ``io_binding``: inputs and
    outputs bound explicitly, the device output buffers kept per thread and batch shape (off by
    default; force it on or off, e.g. to test it on the CPU provider).
    """

    def __init__(
        self,
        model_dir: str | os.PathLike,
        *,
        precision: str,
        threads: int | None,
        provider: str,
        fp16: bool,
        io_binding: bool | None = None,
        fuse: bool = True,
        cuda_graph: bool | None = None,
    ) -> None:
        # onnxruntime: loaded only where a model runs (CPU or GPU wheel)
        import onnxruntime as ort

        self.model_dir = Path(model_dir)
        self.manifest = read_manifest(self.model_dir)
        variants = self.manifest["variants"]
        if fp16:
            if precision not in ("fp32", FP16):
                raise ValueError(
                    f"fp16=True runs the fp32 graph in half precision; it cannot be combined "
                    f"with precision {precision!r}"
                )
            precision = FP16
        variant = "fp32" if precision == FP16 else precision
        if variant not in variants:
            raise ValueError(
                f"{self.model_dir} has no {variant!r} variant (has {sorted(variants)}); "
                "export with quantize=True for int8"
            )
        self.precision = precision
        self.variant = variant
        self.file = variants[variant]
        self.model_hash = self.manifest["files"][self.file]["sha256"]
        check_positive("threads", threads, allow_none=True)
        candidates = provider_candidates(provider, precision)
        if any(c != _CPU for c in candidates):
            _preload_gpu_libraries()
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.intra_op_num_threads = int(threads or 0)  # 0: one per physical core
        so.inter_op_num_threads = 1
        so.log_severity_level = 3
        set_spinning(so)  # CROSSKNN_ORT_SPINNING
        avail = available_providers()
        src = self.model_dir / self.file

        want_graph = cuda_graph_default() if cuda_graph is None else bool(cuda_graph)
        self.fused = False
        self._cuda_graph_error: str | None = None
        with_graph: set[str] = set()  # providers whose session opened with graph capture

        def open_one(name: str):
            model: Any = str(src)
            options: dict[str, Any] = {}
            if name == _PROVIDERS["tensorrt"]:
                options = {"trt_fp16_enable": precision == FP16}
            elif name == _PROVIDERS["cuda"]:
                # the fused graph (crossknn.ce.fuse), fp32 or fp16, made and checked once and
                # cached by hash; where fusion does not apply, the exported graph (fp16: converted)
                fused = fused_graph(src, self.model_hash, fp16=precision == FP16) if fuse else None
                self.fused = fused is not None
                if fused is not None:
                    model = str(fused)
                elif precision == FP16:
                    model = str(fp16_graph(src, self.model_hash))
            providers: list[Any] = [(name, options)]
            if name == _PROVIDERS["tensorrt"] and _PROVIDERS["cuda"] in avail:
                providers.append(_PROVIDERS["cuda"])  # for subgraphs TensorRT does not take
            if name != _CPU:
                providers.append(_CPU)  # for nodes the GPU providers do not take
            if name == _PROVIDERS["cuda"] and want_graph:
                graph = [(name, {**options, "enable_cuda_graph": "1"}), _CPU]
                try:
                    session = ort.InferenceSession(model, so, providers=graph)
                    with_graph.add(name)
                    return session
                except Exception as exc:  # e.g. nodes the CUDA provider does not take
                    self._cuda_graph_error = " ".join(str(exc).split())[:300]
                    log.info("crossknn.ce: no CUDA graph capture (%s)", self._cuda_graph_error)
            return ort.InferenceSession(model, so, providers=providers)

        self.session, self.provider, self.skipped = open_first(candidates, open_one)
        self.requested = provider
        gpu = self.provider != _CPU
        self.fp16 = precision == FP16
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.output = self.manifest["output"]
        self._gpu = gpu
        # off by default: on an H200 a 20-pair round call took 1.94 ms with it, 1.81 without
        # (bench/results/gpu_bench.json, "round" rows); io_binding=True turns it on
        self.io_binding = False if io_binding is None else bool(io_binding)
        self._device = "cuda" if gpu else "cpu"
        self._local = threading.local()  # per thread: {output shape: device OrtValue}
        self.run_seconds = 0.0  # inside run(): the session (device) call and its copies
        self.graph = self._graph_runner() if self.provider in with_graph else None
        self._run_options = None if self.graph is None else self.graph.skip_options
        for why in self.skipped:
            log.info("crossknn.ce: provider auto skipped %s", why)
        log.info("crossknn.ce: %s (%s) runs on %s", self.model_dir.name, precision, self.provider)

    @property
    def cuda_graph_error(self) -> str | None:
        """Why CUDA graphs are not in use (None: in use, or never asked for)."""
        if self.graph is not None and self.graph.error:
            return self.graph.error
        return self._cuda_graph_error

    def _graph_runner(self) -> GraphRunner | None:
        """Captured graphs need int64 inputs and an output of fixed shape after the batch."""
        ins = self.session.get_inputs()
        out = next(o for o in self.session.get_outputs() if o.name == self.output)
        tail = out.shape[1:]
        if any(i.type != "tensor(int64)" for i in ins) or out.type != "tensor(float)":
            self._cuda_graph_error = "inputs are not all int64 or the output is not float32"
        elif not all(isinstance(t, int) for t in tail):
            self._cuda_graph_error = f"output shape {out.shape} is not fixed after the batch"
        else:
            return GraphRunner(self.session, self.input_names, self.output, tuple(tail))
        # opened with capture on: every run must still say which graph (none: -1)
        runner = GraphRunner(self.session, self.input_names, self.output, (), max_rows=0)
        return runner

    def run(self, feeds: dict[str, np.ndarray]) -> np.ndarray:
        t = time.perf_counter()
        try:
            return self._run(feeds)
        finally:
            self.run_seconds += time.perf_counter() - t

    def _run(self, feeds: dict[str, np.ndarray]) -> np.ndarray:
        feeds = {k: v for k, v in feeds.items() if k in self.input_names}
        if self.graph is not None:
            got = self.graph.run(feeds)  # None: larger than the captured buckets
            if got is not None:
                return got
        if not self.io_binding:
            with run_lock() if self._gpu else _NO_LOCK:
                return self.session.run([self.output], feeds, self._run_options)[0]
        # bind inputs and outputs explicitly: one copy each way; the device output buffer of
        # this batch shape is kept (per thread) and reused by the next call of that shape
        io = self.session.io_binding()
        for name, arr in feeds.items():
            io.bind_cpu_input(name, arr)
        n = len(next(iter(feeds.values())))
        buffers = getattr(self._local, "buffers", None)
        if buffers is None:
            buffers = self._local.buffers = OrderedDict()
        out = buffers.get(n)
        if out is not None:
            io.bind_ortvalue_output(self.output, out)
            buffers.move_to_end(n)
        else:
            io.bind_output(self.output, self._device)
        with run_lock() if self._gpu else _NO_LOCK:
            self.session.run_with_iobinding(io, self._run_options)
        if out is None:
            buffers[n] = io.get_outputs()[0]
            while len(buffers) > 64:  # batch sizes seen lately
                buffers.popitem(last=False)
        return io.copy_outputs_to_cpu()[0]

    def warmup(self, max_rows: int, max_columns: int) -> dict[str, Any]:
        """On a GPU provider, pay the first-use costs of batch shapes now, not in a request:
        every CUDA graph bucket up to ``max_rows`` x ``max_columns`` captured, and one run of the
        largest batch (the device memory arena grown to it). The CPU provider: nothing."""
        if not self._gpu:
            return {"buckets": 0, "seconds": 0.0}
        t = time.perf_counter()
        made = 0 if self.graph is None else self.graph.warm(max_rows, max_columns)
        self.run(dummy_feeds(self.input_names, max_rows, max_columns))
        seconds = time.perf_counter() - t
        log.info(
            "crossknn.ce: warmed up %d CUDA graph buckets and a %d x %d batch in %.2f s",
            made,
            max_rows,
            max_columns,
            seconds,
        )
        return {"buckets": made, "seconds": round(seconds, 3)}

    def pin_graphs(self) -> None:
        """Only the threads that warmed up (:meth:`warmup`) replay CUDA graphs from now on; other
        threads run their batches without one (:meth:`crossknn.ce.cuda_graph.GraphRunner.pin`).
        A no-op without graphs."""
        if self.graph is not None:
            self.graph.pin()

    @property
    def source(self) -> str | None:
        """The Hugging Face folder the model was exported from (per its manifest), if known."""
        return (self.manifest.get("source") or {}).get("path")

    def close(self) -> None:
        self.session = None


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
        # torch: optional (export extra), about 1 s to import
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
    # torch: optional (export extra), about 1 s to import
    import torch

    t = torch.from_numpy(np.ascontiguousarray(scores))
    return t if convert_to_tensor else list(t)


class _OnnxModel:
    """The ONNX Runtime session under both scorers (the rest: crossknn.ce.model_base).

    Options (keywords of both classes): ``precision`` "fp32" or "int8" (a variant in the
    directory); ``max_length`` in tokens (default: the export's); ``threads`` intra-op threads
    (default: one per physical core); ``batch_size`` the most texts or pairs per batch and
    ``max_batch_tokens`` the most (padded) tokens per batch (defaults: per class on the CPU
    provider; on a GPU provider 512 pairs / 65,536 tokens, one session run per round call);
    ``provider`` "auto" (the first whose session opens: TensorRT where its libraries load, then
    CUDA, then CPU; :attr:`provider` says which), "cpu", "cuda" or "tensorrt" (an error if not
    available, never a silent fallback); ``precision`` "fp16" (or ``fp16=True``): the fp32
    graph in half precision on a GPU provider; ``show_progress_bar`` tqdm bars for long runs;
    ``fuse`` (CUDA: run the fused graph, default True) and ``cuda_graph`` (CUDA graph capture for
    small batches; default ``$CROSSKNN_CUDA_GRAPH``, else on): see :class:`_Session`.
    """

    backend = "onnx"  # its name in crossknn.ce.backends
    _names = ("OnnxDualEncoder", "OnnxCrossEncoder")
    # the batch inputs from cached ids, in bulk (crossknn.ce.feeds; the row-by-row reference
    # crossknn.ce.tokenize.assemble_* builds the same arrays: tests/test_providers.py)
    _pair_feeds = staticmethod(pair_feeds)
    _single_feeds = staticmethod(single_feeds)

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
        io_binding: bool | None = None,
        fuse: bool = True,
        cuda_graph: bool | None = None,
    ) -> None:
        check_positive("batch_size", batch_size, allow_none=True)
        check_positive("max_batch_tokens", max_batch_tokens, allow_none=True)
        self._s = _Session(
            model_dir,
            precision=precision,
            threads=threads,
            provider=provider,
            fp16=fp16,
            io_binding=io_binding,
            fuse=fuse,
            cuda_graph=cuda_graph,
        )
        gpu = self._s.provider != _CPU
        self._setup(
            max_length=max_length,
            batch_size=(_GPU_BATCH_SIZE if gpu else self._batch_size)
            if batch_size is None
            else batch_size,
            max_batch_tokens=(_GPU_MAX_BATCH_TOKENS if gpu else self._max_batch_tokens)
            if max_batch_tokens is None
            else max_batch_tokens,
            show_progress_bar=show_progress_bar,
        )

    @property
    def variant(self) -> str:
        """The model folder's variant that runs (``precision``, but "fp32" for fp16): what an
        index records, so an index built with fp16 reopens the fp32 graph on the CPU."""
        return self._s.variant

    @property
    def session_seconds(self) -> float:
        """Seconds spent inside session runs so far (the device call, its launches and copies;
        what a call spends beyond it is host work)."""
        return self._s.run_seconds


class OnnxCrossEncoder(_OnnxModel, CrossEncoderBase):
    """A cross-encoder (classic [CLS]-CE or joint [EMB]-CE) on ONNX Runtime.

    Parameters: ``model_dir`` an exported model directory; ``items`` texts to score against by
    index (:meth:`score`, :meth:`score_batch`; also :meth:`set_items`); ``query_cache_size`` how
    many tokenized queries to keep; ``options`` those of both scorers (see ``_OnnxModel``:
    ``precision``, ``max_length`` of a pair, ``threads``, ``batch_size`` pairs (default 16),
    ``max_batch_tokens`` (default 2048), ``provider``, ``fp16``, ``show_progress_bar``).
    """

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
            f"OnnxCrossEncoder(model_id={self.model_id!r}, kind={self.kind!r}, "
            f"precision={self.precision!r}, provider={self.provider!r}, "
            f"max_length={self.max_length}, n_items={self.n_items})"
        )

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
        scores, single = self._score_pairs(
            pairs,
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
        return self._rank(
            query,
            documents,
            top_k,
            doc_ids,
            return_documents,
            then=lambda s: _st_activation(s, activation_fn, False, self.num_labels),
            batch_size=batch_size,
            apply_activation=activate,
            show_progress_bar=show_progress_bar,
        )

    def _check_device(self, device) -> None:
        """``device`` (sentence-transformers' meaning) must name where this model runs."""
        want = provider_of_device(device)
        if want is not None and _PROVIDERS[want] != self.provider:
            raise ValueError(
                f"device={device!r} asks for {_PROVIDERS[want]}, but this model runs on "
                f"{self.provider}; open it there: crossknn.CrossEncoder(..., device={device!r}) "
                f"or provider={want!r}"
            )


class OnnxDualEncoder(_OnnxModel, DualEncoderBase):
    """A dual encoder on ONNX Runtime: ``encode(texts)`` -> float32 (n, d), L2-normalized.

    Parameters: ``model_dir`` an exported model directory and the options of both scorers (see
    ``_OnnxModel``; ``batch_size`` texts, default 32; ``max_batch_tokens`` default 4096).
    """

    def __repr__(self) -> str:
        return (
            f"OnnxDualEncoder(model_id={self.model_id!r}, dim={self.dim}, "
            f"precision={self.precision!r}, provider={self.provider!r}, "
            f"max_length={self.max_length})"
        )
