"""Peak memory of opening an index's item matrix: the old copy vs the zero-copy views.

    python bench/open_bench.py [--n 1000000] [--d 384] [--dir /tmp]

Writes an N x d float32 ``.npy`` once, then opens it in a fresh subprocess per variant and
reports the growth of peak RSS (``resource.getrusage(...).ru_maxrss``, after the imports) and
the wall time. Variants:

- ``copy (before)``: ``np.load`` + the core's copying constructor (what ``ItemFeatures`` did for
  every input before issue 14): the matrix twice while both live;
- ``np.load + ItemFeatures``: the array is already float32 C-order, so ``ItemFeatures`` views it;
- ``mmap + ItemFeatures``: ``np.load(mmap_mode="r")`` viewed (file pages, read once by the
  NaN/inf check);
- ``ItemFeatures.from_npy``: the C++ reader maps the file (what a C++ service does);
- ``from_npy, no check``: the same without the NaN/inf pass (pages read only when searched).

Prints a table and writes ``bench/results/open_bench.cpu2.json``.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "results"

VARIANTS = {
    "copy (before)": "V = np.load(p); f = _core.Features(V, storage='float32')",
    "np.load + ItemFeatures": "V = np.load(p); f = ItemFeatures(V); assert f.is_view",
    "mmap + ItemFeatures": "V = np.load(p, mmap_mode='r'); f = ItemFeatures(V); assert f.is_view",
    "ItemFeatures.from_npy": "f = ItemFeatures.from_npy(p); assert f.is_view",
    "from_npy, no check": "f = _core.Features.open_npy(p, check_finite=False)",
}

CHILD = """
import resource, sys, time
import numpy as np
from crossknn import ItemFeatures, _core
p = sys.argv[1]
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t = time.perf_counter()
{stmt}
dt = time.perf_counter() - t
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(base * 1024, peak * 1024, dt)
"""


WRITER = """
import sys
import numpy as np
p, n, d = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = np.random.default_rng(0)
mm = np.lib.format.open_memmap(p, mode="w+", dtype=np.float32, shape=(n, d))
for lo in range(0, n, 65536):  # in blocks: the writer never holds the matrix in anonymous memory
    mm[lo:lo + 65536] = rng.standard_normal((min(65536, n - lo), d))
mm.flush()
"""


def run_variant(stmt: str, path: Path) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", CHILD.format(stmt=stmt), str(path)],
        capture_output=True,
        text=True,
        check=True,
    )
    base, peak, dt = out.stdout.split()
    return {
        "base_rss": int(base),
        "peak_rss": int(peak),
        "growth": int(peak) - int(base),
        "seconds": float(dt),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--d", type=int, default=384)
    ap.add_argument("--dir", default="/tmp")
    ap.add_argument("--out", default=str(RESULTS / "open_bench.cpu2.json"))
    args = ap.parse_args()

    path = Path(args.dir) / f"open_bench_{args.n}x{args.d}.npy"
    if not path.is_file() or path.stat().st_size < args.n * args.d * 4:
        # written in a subprocess: Linux keeps ru_maxrss across fork + exec, so this process
        # must stay small for the children's numbers to be their own
        subprocess.run(
            [sys.executable, "-c", WRITER, str(path), str(args.n), str(args.d)], check=True
        )
    matrix = args.n * args.d * 4
    rows = {}
    for name, stmt in VARIANTS.items():
        rows[name] = run_variant(stmt, path)
    before = rows["copy (before)"]["growth"]
    assert max(r["base_rss"] for r in rows.values()) < matrix / 4, "baseline RSS too high"
    print(
        f"opening a {args.n} x {args.d} float32 matrix ({matrix / 1e9:.2f} GB) from .npy; "
        "peak RSS growth per fresh process"
    )
    print(f"{'variant':<26} {'peak RSS growth':>16} {'x matrix':>9} {'vs before':>10} {'time':>8}")
    for name, r in rows.items():
        r["x_matrix"] = r["growth"] / matrix
        small = r["growth"] < matrix / 100  # nothing read yet: no meaningful ratio
        r["ratio_before_over_this"] = None if small else before / r["growth"]
        ratio = "-" if small else f"{r['ratio_before_over_this']:.2f}x"
        print(
            f"{name:<26} {r['growth'] / 1e9:>13.2f} GB {r['x_matrix']:>8.2f}x "
            f"{ratio:>10} {r['seconds']:>7.2f}s"
        )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(
        json.dumps(
            {
                "n": args.n,
                "d": args.d,
                "matrix_bytes": matrix,
                "machine": platform.machine(),
                "python": platform.python_version(),
                "time": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                "variants": rows,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
