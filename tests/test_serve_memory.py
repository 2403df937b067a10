"""crossknn.serve.memory: what a retired index version leaves in the C heap goes back to the
system (malloc_trim on glibc), so serve's RSS returns to its steady state after a swap."""

from __future__ import annotations

import threading

import pytest

from crossknn.serve.memory import _malloc_trim, release_memory


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    raise RuntimeError("no VmRSS in /proc/self/status")


def test_release_memory_reports_what_it_did():
    out = release_memory()
    assert set(out) == {"collected", "trimmed", "seconds"}
    assert out["collected"] >= 0 and out["seconds"] >= 0
    assert isinstance(out["trimmed"], bool)


def test_freed_heap_pages_of_a_request_thread_go_back_to_the_system():
    """~120 MB of 2 KB objects made in another thread (its own malloc arena, as a request
    thread's), every 50th kept (the heap cannot shrink from its top): after they are freed the
    process still holds them, after release_memory() it does not."""
    if not _malloc_trim():
        pytest.skip("no malloc_trim here (not glibc)")
    keep: list[bytes] = []

    def work() -> None:
        blobs = [b"x" * 2000 + bytes([i % 256]) for i in range(60_000)]
        keep.extend(blobs[::50])

    before = _rss_mb()
    t = threading.Thread(target=work)
    t.start()
    t.join()
    freed = _rss_mb()
    assert freed - before > 60, f"the allocation did not show in RSS: {before:.0f} -> {freed:.0f}"
    out = release_memory()
    after = _rss_mb()
    assert out["trimmed"] is True
    assert after - before < 0.5 * (freed - before), (
        f"RSS {before:.0f} MB, {freed:.0f} MB with the objects freed, {after:.0f} MB after the "
        "release: expected most of it back"
    )
    assert len(keep) == 1200
