"""CUDA graph capture for small batches: one captured graph per (rows, columns) bucket.

A search round scores a few dozen pairs; on a GPU its session run costs the launches of the
graph's kernels more than their arithmetic. onnxruntime can capture a session run as a CUDA graph
and replay it in one launch (CUDA provider option ``enable_cuda_graph``), under three conditions:
every node runs on the CUDA provider (the fused graph of :mod:`crossknn.ce.fuse` has no CPU
shape nodes left), inputs and outputs are bound to device buffers that never move (IO binding of
pre-allocated device memory, updated in place), and each captured graph sees one shape (run option
``gpu_graph_id`` selects the graph).

:class:`GraphRunner` pads a batch to its bucket (:func:`bucket`: rows to a multiple of 8 up to
64, then of 32 up to :data:`MAX_ROWS`; columns to a multiple of 32) and replays that
bucket's graph (captured on its first use). Padding never changes a real row's score: padded
columns carry attention mask 0 (and pool mask 0), padded rows repeat the batch's first row and
are dropped. Larger batches run without a graph (``gpu_graph_id`` -1), where launches are a
small share anyway.

onnxruntime keeps captured graphs per thread (its CUDA provider's per-thread context): a graph
captured in one thread is not replayed in another, which runs its own regular runs and capture
on its first batch of that shape. So a warm-up must run in the threads that will run the
batches (``crossknn serve``: each CE worker thread warms itself up before its first batch), and
:attr:`GraphRunner.lazy` False (:meth:`GraphRunner.pin`) keeps every other thread off graphs: it
runs its batches without one instead of capturing (the request threads that encode queries with
the DE would otherwise each capture their own graphs, holding every CE batch back meanwhile).

A capture records the CUDA stream of the capturing thread, and CUDA refuses (or silently spoils)
a capture while another thread of the process calls an unsafe CUDA API, e.g. the copies of another
session's run (on an H200, ``crossknn serve`` with a DE query encoded during a CE capture failed
with cudaErrorStreamCaptureUnsupported). So once a process has a graph runner, every CUDA session
run of the process, graph or not, CE or DE, goes through one lock (:func:`run_lock`); replays also
share their device buffers. The GPU runs one session at a time anyway.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading

import numpy as np

__all__ = [
    "MAX_ROWS",
    "GraphRunner",
    "all_buckets",
    "bucket",
    "dummy_feeds",
    "max_rows_default",
    "run_lock",
]

#: the largest batch (rows) run through a captured graph (``$CROSSKNN_CUDA_GRAPH_ROWS`` overrides)
MAX_ROWS = 256
_MIN_ROWS = 8
_FINE_ROWS = 64
_COARSE_STEP = 32
_COLUMN_STEP = 32

log = logging.getLogger("crossknn.ce")

_LOCK = threading.Lock()  # every CUDA session run, once a graph runner exists (see above)
_ACTIVE: list[bool] = []


def run_lock():
    """The process-wide lock of CUDA session runs once CUDA graphs are in use, else a no-op."""
    return _LOCK if _ACTIVE else contextlib.nullcontext()


def max_rows_default() -> int:
    """The most rows of a captured graph: ``$CROSSKNN_CUDA_GRAPH_ROWS`` (a multiple of 32, at
    least 64), else :data:`MAX_ROWS`."""
    env = os.environ.get("CROSSKNN_CUDA_GRAPH_ROWS", "").strip()
    if not env:
        return MAX_ROWS
    if not env.isdigit() or int(env) < _FINE_ROWS or int(env) % _COARSE_STEP:
        raise ValueError(
            f"CROSSKNN_CUDA_GRAPH_ROWS must be a multiple of {_COARSE_STEP} >= {_FINE_ROWS}; "
            f"got {env!r}"
        )
    return int(env)


def bucket(rows: int, columns: int, max_rows: int = MAX_ROWS) -> tuple[int, int] | None:
    """The (rows, columns) a batch is padded to, or ``None`` beyond ``max_rows``: rows to the
    next multiple of 8 up to 64 (a search round of B / rounds pairs pads little: 20 -> 24), then
    of 32 (a merged serve batch of 70 pairs: 96); columns to the next multiple of 32. At most
    14 row buckets (MAX_ROWS 256) x max_length / 32 column buckets are ever captured."""
    if rows > max_rows:
        return None
    step = _MIN_ROWS if rows <= _FINE_ROWS else _COARSE_STEP
    r = max(_MIN_ROWS, -(-rows // step) * step)
    c = -(-columns // _COLUMN_STEP) * _COLUMN_STEP
    return min(r, max_rows), c


def all_buckets(max_rows: int, max_columns: int) -> list[tuple[int, int]]:
    """Every (rows, columns) bucket a batch of at most ``max_rows`` pairs of at most
    ``max_columns`` tokens can fall in, in the order :meth:`GraphRunner.warm` makes them."""
    rows = sorted({bucket(r, 1, max_rows)[0] for r in range(1, max(max_rows, 0) + 1)})
    cols = range(_COLUMN_STEP, bucket(1, max(max_columns, 1))[1] + 1, _COLUMN_STEP)
    return [(r, c) for r in rows for c in cols]


def dummy_feeds(inputs: list[str], rows: int, columns: int) -> dict[str, np.ndarray]:
    """Inputs of a batch shape with no text in them (pad ids, every position attended): what a
    warm-up run needs, the values do not matter."""
    feeds = {name: np.zeros((rows, columns), dtype=np.int64) for name in inputs}
    if "attention_mask" in feeds:
        feeds["attention_mask"][:] = 1
    return feeds


class _Bucket:
    """The bound buffers of one captured graph: all int64 inputs in one device block (one
    host-to-device copy per call, not one per input), the output, the run options."""

    def __init__(self, ort, session, inputs, output, tail, rows, cols, graph_id, device) -> None:
        self.host = np.zeros((len(inputs), rows, cols), dtype=np.int64)
        self.block = ort.OrtValue.ortvalue_from_numpy(self.host, device, 0)
        self.out = ort.OrtValue.ortvalue_from_shape_and_type((rows, *tail), np.float32, device, 0)
        self.io = session.io_binding()
        base, step = self.block.data_ptr(), rows * cols * self.host.itemsize
        for i, name in enumerate(inputs):
            self.io.bind_input(name, device, 0, np.int64, [rows, cols], base + i * step)
        self.io.bind_ortvalue_output(output, self.out)
        self.options = ort.RunOptions()
        self.options.add_run_config_entry("gpu_graph_id", str(graph_id))
        self.runs = 0


class GraphRunner:
    """Runs ``session`` (opened with ``enable_cuda_graph``) through captured CUDA graphs.

    ``inputs``: the int64 input names; ``output``: the output name; ``tail``: the output's
    shape after the batch dimension (``()`` for one score per row). :meth:`run` returns the
    output rows of a batch, or ``None`` for a batch larger than :data:`MAX_ROWS` (run it with
    :attr:`skip_options`, the run options that skip capture). ``device`` "cpu" runs the same
    bucketing and padding on a CPU session (no capture there), which is how the tests check it.
    """

    def __init__(
        self,
        session,
        inputs: list[str],
        output: str,
        tail: tuple[int, ...],
        max_rows: int | None = None,
        device: str = "cuda",
    ) -> None:
        # onnxruntime: loaded only where a model runs (CPU or GPU wheel)
        import onnxruntime as ort

        self._ort = ort
        self.session = session
        self.inputs = list(inputs)
        self.output = output
        self.tail = tuple(int(t) for t in tail)
        self.max_rows = max_rows_default() if max_rows is None else int(max_rows)
        self.device = device
        self._buckets: dict[tuple[int, int], _Bucket] = {}
        # the buckets this thread has run (onnxruntime's graphs are per thread: see above)
        self._local = threading.local()
        # True: any thread captures a bucket on its first batch of that shape; False (pin()):
        # only the buckets a thread has warmed up replay in it, other batches run without a graph
        self.lazy = True
        if device == "cuda" and self.max_rows > 0 and not _ACTIVE:
            _ACTIVE.append(True)
        self.skip_options = ort.RunOptions()
        self.skip_options.add_run_config_entry("gpu_graph_id", "-1")
        self.replays = 0
        self.error: str | None = None

    @property
    def buckets(self) -> list[tuple[int, int]]:
        return sorted(self._buckets)

    def _mine(self) -> set[tuple[int, int]]:
        """The buckets the calling thread has run (captured, on a GPU)."""
        keys = getattr(self._local, "keys", None)
        if keys is None:
            keys = self._local.keys = set()
        return keys

    def warmed_here(self, key: tuple[int, int]) -> bool:
        return key in self._mine()

    def pin(self) -> None:
        """From now on only the threads that warmed a bucket up replay its graph; every other
        batch runs without a graph (no capture in threads that were not warmed up)."""
        self.lazy = False

    def warm(self, max_rows: int, max_columns: int, runs: int = 3) -> int:
        """Make (capture) every bucket up to ``max_rows`` x ``max_columns`` now, ``runs`` runs
        each (onnxruntime captures after its first runs), instead of on a request's first batch
        of that shape; the number of buckets made (0 once graphs are off)."""
        made = 0
        for key in all_buckets(min(max_rows, self.max_rows), max_columns):
            if self.max_rows == 0:  # a capture failed: graphs are off
                break
            if self.warmed_here(key):  # (per thread: another thread's capture is not ours)
                continue
            feeds = dummy_feeds(self.inputs, *key)
            for _ in range(runs):
                if self.run(feeds, warming=True) is None:
                    break
            made += self.warmed_here(key)
        return made

    def run(self, feeds: dict[str, np.ndarray], *, warming: bool = False) -> np.ndarray | None:
        first = feeds[self.inputs[0]]
        n, cols = first.shape
        key = bucket(n, cols, self.max_rows)
        if key is None:
            return None
        if not (self.lazy or warming or self.warmed_here(key)):
            return None  # pinned: this thread did not warm this bucket up; no graph here
        with _LOCK:
            b = self._buckets.get(key)
            try:
                if b is None:
                    b = _Bucket(
                        self._ort,
                        self.session,
                        self.inputs,
                        self.output,
                        self.tail,
                        *key,
                        graph_id=len(self._buckets) + 1,
                        device=self.device,
                    )
                    self._buckets[key] = b
                    log.info("crossknn.ce: CUDA graph for batches of %d x %d tokens", *key)
                host = b.host
                host[:] = 0
                for i, name in enumerate(self.inputs):
                    x = feeds[name]
                    host[i, :n, :cols] = x
                    host[i, n:, :cols] = x[0]
                b.block.update_inplace(host)
                self.session.run_with_iobinding(b.io, b.options)
            except Exception as exc:
                if b is not None and b.runs >= 2:  # captured and replayed before: a real failure
                    raise
                # the buffers or the capture failed (an operation CUDA graphs cannot hold): no
                # graphs from now on, this batch runs as before
                log.warning("crossknn.ce: CUDA graph capture failed, graphs off (%s)", exc)
                self.error = " ".join(str(exc).split())[:300]
                self.max_rows = 0
                self._buckets.clear()
                return None
            b.runs += 1
            self.replays += 1
            self._mine().add(key)
            return b.out.numpy()[:n].copy()
