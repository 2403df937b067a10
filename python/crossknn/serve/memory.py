"""Memory a retired index version leaves behind, handed back to the operating system.

When ``serve`` swaps in a new index version (:mod:`crossknn.serve.reload`), the old version's
objects are freed once its last request finishes: by reference counting, or by the cyclic
collector for the parts that refer to each other, which may not run for a long while. And what
is freed goes back to the C allocator, not to the system: glibc keeps one heap ("arena") per
thread that allocated, so the pages the old version used in the request threads stay in the
process (its RSS) until malloc reuses them. :func:`release_memory` does both steps at once: a
collection, then ``malloc_trim(0)``, which returns the free pages of every arena. Elsewhere (musl,
macOS) the second step is skipped.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import time

__all__ = ["release_memory"]

_TRIM = None  # malloc_trim, looked up once (False: not available here)


def _malloc_trim():
    global _TRIM
    if _TRIM is None:
        _TRIM = False
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            trim = libc.malloc_trim
        except (OSError, AttributeError):
            return _TRIM
        trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
        _TRIM = trim
    return _TRIM


def release_memory() -> dict:
    """Collects unreachable objects, then returns the C heap's free pages to the system;
    ``{"collected": objects, "trimmed": bool (False where there is no malloc_trim),
    "seconds": time taken}``."""
    t = time.perf_counter()
    collected = gc.collect()
    trim = _malloc_trim()
    trimmed = bool(trim) and bool(trim(0))
    return {
        "collected": int(collected),
        "trimmed": trimmed,
        "seconds": round(time.perf_counter() - t, 4),
    }
