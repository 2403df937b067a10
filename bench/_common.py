"""What the bench scripts share: paths, timers, machine metadata, result files.

Imported as ``from _common import ...`` (the scripts run as ``python bench/NAME.py``, so this
folder is on ``sys.path``). The benchmarks' data live in ``../shared`` next to the repository; only
the benchmarks know that place, the library never does.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
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


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


class StealMeter:
    """The share of CPU time the hypervisor gave to other guests (``steal`` in /proc/stat)
    since the last :meth:`read`, in percent; None where /proc/stat has no steal column. On a
    shared VM a restart or a minute of a soak can be slow because the CPU was not ours: the
    rows say so."""

    def __init__(self) -> None:
        self._last = self._sample()

    @staticmethod
    def _sample() -> tuple[int, int] | None:
        try:
            with open("/proc/stat", encoding="ascii") as f:
                v = [int(x) for x in f.readline().split()[1:]]
        except (OSError, ValueError):
            return None
        return (v[7], sum(v[:8])) if len(v) >= 8 else None

    def read(self) -> float | None:
        now, last = self._sample(), self._last
        self._last = now
        if now is None or last is None or now[1] <= last[1]:
            return None
        return round(100.0 * (now[0] - last[0]) / (now[1] - last[1]), 1)


def _gpu_name() -> str | None:
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return out.splitlines()[0].strip() if out.strip() else None


def machine_tag(gpu: bool = False) -> str:
    """The "where" of a result file's name: ``h100`` / ``h200`` (``gpu=True`` on a GPU host),
    else the CPU family and its core count: ``xeon2``, ``epyc2``, ``cpu16``."""
    if gpu and (name := _gpu_name()):
        for model in ("H100", "H200", "A100", "L40S", "L4", "A10", "T4"):
            if model in name:
                return model.lower()
        return "gpu"
    model = _cpu_model()
    family = "xeon" if "Xeon" in model else "epyc" if "EPYC" in model else "cpu"
    return f"{family}{os.cpu_count()}"


def result_path(name: str, gpu: bool = False) -> Path:
    """``bench/results/NAME.WHERE.json``: a result file named by what and where it was measured."""
    return RESULTS / f"{name}.{machine_tag(gpu)}.json"


def _commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short=12", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        dirty = subprocess.run(
            [
                "git",
                "-C",
                str(REPO),
                "status",
                "--porcelain",
                "--untracked-files=no",
                "--",
                "python",
                "cpp",
                "src",
                "bench",
            ],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    commit = out.stdout.strip() or None
    return f"{commit}+local-changes" if commit and dirty else commit


def provenance() -> dict:
    """Where, when and how a result was measured: machine tag, CPU model, GPU, UTC date, the git
    commit (``+local-changes`` when python/, cpp/, src/ or bench/ differ from it) and the
    command line."""
    return {
        "machine": machine_tag(gpu=True),
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "gpu": _gpu_name(),
        "date": utc_now(),
        "commit": _commit(),
        "command": shlex.join([Path(sys.executable).name, *sys.argv]),
    }


def write_json(path: str | os.PathLike, obj) -> Path:
    """Writes a result file atomically (indent 1, keys in insertion order) and says so. A dict
    gets a ``provenance`` entry (:func:`provenance`) unless it has one."""
    path = Path(path)
    if isinstance(obj, dict) and "provenance" not in obj:
        obj = {**obj, "provenance": provenance()}
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, (json.dumps(obj, indent=1) + "\n").encode("utf-8"))
    print(f"wrote {path}")
    return path


def write_rows(path: str | os.PathLike, matrix, rows: list) -> Path:
    """A bench's result rows over one score matrix, with when and where they were measured."""
    return write_json(
        path, {"when": utc_now(), "machine": machine("numpy"), "matrix": str(matrix), "rows": rows}
    )
