"""The DE in one thread of its own: on a GPU, ``crossknn serve`` encodes every query there.

A search encodes its queries with the DE in the request thread that leads it, and a server has
up to ``max_queue`` request threads. onnxruntime's CUDA provider keeps a context per thread that
runs a session (its cuBLAS and cuDNN handles, made on the thread's first run; PyTorch keeps
per-thread cuBLAS handles the same way). So every request thread's first query paid for making
them, holding the process's session-run lock (:func:`crossknn.ce.cuda_graph.run_lock`) while the
CE batches waited: a cost that lands on the first requests at each concurrency the server has not
seen before, and device memory for up to ``max_queue`` sets of handles.

:class:`DEThread` runs every ``encode`` in one thread: one context, made at load by the search
that measures the service time (``SearchService._measure_service_time``), before the first
request. The request thread waits for its vectors (a thread hop, well under a
millisecond; on a GPU the session runs are serialized by the run lock anyway).
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

__all__ = ["DEThread"]


class DEThread:
    """A DE whose ``encode`` runs in one thread of its own; everything else is the DE's."""

    def __init__(self, de: Any, *, name: str = "crossknn-de") -> None:
        self.de = de
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self._thread: threading.Thread | None = None

    def encode(self, texts, **kwargs):
        """The DE's ``encode(texts, **kwargs)``, run in the DE thread (its errors raised here)."""
        return self._pool.submit(self._encode, texts, kwargs).result()

    def _encode(self, texts, kwargs: dict):
        self._thread = threading.current_thread()
        return self.de.encode(texts, **kwargs)

    @property
    def thread_name(self) -> str | None:
        """The name of the thread that ran the encodes (None before the first)."""
        return self._thread.name if self._thread is not None else None

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    def __getattr__(self, name: str) -> Any:  # model_id, dim, provider, ...: the DE's own
        if name == "de":  # not set yet (during unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.de, name)
