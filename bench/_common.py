"""What the bench scripts share: paths, timers, machine metadata, result files.

Imported as ``from _common import ...`` (the scripts run as ``python bench/NAME.py``, so this
folder is on ``sys.path``). The benchmarks' data live in ``../shared`` next to the repository; only
the benchmarks know that place, the library never does.
"""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

from crossknn.fileio import atomic_write_bytes

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"  # datasets and score matrices (shared/BENCHMARKS.md)
CISI_MATRIX = SHARED / "matrices" / "cisi-minilm"
RESULTS = REPO / "bench" / "results"


def best_of(fn: Callable[[], object], repeats: int = 1) -> float:
    """The shortest wall-clock time (seconds) of ``repeats`` calls of ``fn`` (the machine is
    shared: the minimum is the least disturbed run)."""
    best = float("inf")
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def machine(*packages: str, **extra) -> dict:
    """Where a benchmark ran: CPU, cores, load average (now), Python, OS, and the versions of
    crossknn, numpy and ``packages`` (distribution names); ``extra`` entries are added as given."""
    return {
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
        "platform": platform.platform(),
        "versions": {p: _version(p) for p in ("crossknn", "numpy", *packages)},
        **extra,
    }


def utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def write_json(path: str | os.PathLike, obj) -> Path:
    """Writes a result file atomically (indent 1, keys in insertion order) and says so."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, (json.dumps(obj, indent=1) + "\n").encode("utf-8"))
    print(f"wrote {path}")
    return path


def write_rows(path: str | os.PathLike, matrix, rows: list) -> Path:
    """A bench's result rows over one score matrix, with when and where they were measured."""
    return write_json(
        path, {"when": utc_now(), "machine": machine("numpy"), "matrix": str(matrix), "rows": rows}
    )
