"""A differential fuzz of the filter language (issue 64's goals ``mismatches`` and ``cases``),
and the memory a long string costs a filter.

    .venv/bin/python bench/filter_bench.py fuzz   # 10^5 cases (~1 min on 2 cores)
    .venv/bin/python bench/filter_bench.py fuzz --cases 2000 --no-before

``fuzz``: random (item table, filter) pairs from the grammar of docs/filters.md
(tests/filter_fuzz.py: every operator on every field kind and on ``id``, missing values, lists,
dates in every documented form with offsets, nesting, invalid filters and tables the docs refuse),
the engine's allow mask (``flatten``, ``ItemMetadata`` through the index arrays,
``parse_filter(...).mask(...)``: what ``Searcher.filter_mask`` computes) against the evaluator
written from the docs (tests/filter_oracle.py, no code shared with crossknn): a mismatch is a
different mask, a refusal on one side only, or any exception other than ``FilterError``.

``memory``: the peak Python-traced memory (tracemalloc, numpy's arrays included) of one mask of
a string ``$in`` of 2*10^4 values, one of them 2*10^4 characters (a 0.2 MB body), and of a
filter on a field whose stored dictionary holds one 200,000-character value; "before" runs the
former look-up (``np.searchsorted`` over the dictionary and the values as fixed-width ``<U``
arrays of the longest string), "after" the engine's.

Writes ``bench/results/filter_fuzz.json``: ``goals.mismatches`` and ``goals.cases`` (other keys
there, written by other benches, are kept), ``fuzz`` and ``memory`` with the machine and date.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))
from _common import machine, provenance, utc_now, write_json  # noqa: E402
from crossknn.filters import parse_filter  # noqa: E402
from crossknn.metadata import ItemMetadata  # noqa: E402
from filter_fuzz import run  # noqa: E402

OUT = HERE / "results" / "filter_fuzz.json"


def _peak_mb(fn) -> float:
    tracemalloc.start()
    try:
        fn()
        return round(tracemalloc.get_traced_memory()[1] / 2**20, 2)
    finally:
        tracemalloc.stop()


def _former_codes_of(dictionary: list[str], values: list[str]) -> np.ndarray:
    """The look-up before issue 64: both sides as '<U' arrays of their longest string."""
    idx = np.searchsorted(dictionary, values) if dictionary else np.zeros(len(values), np.int64)
    return np.asarray(
        [
            int(i)
            for i, v in zip(idx, values, strict=True)
            if i < len(dictionary) and dictionary[i] == v
        ]
    )


def _former(spec, meta, col, values):
    """The filter's parse and the former look-up of its codes, then the column's mask."""
    parse_filter(spec, meta.fields)
    return np.isin(np.asarray(col.arrays["codes"]), _former_codes_of(col.dictionary, values))


def memory(before: bool) -> list[dict]:
    """Peak MB of the two long-string cases, the former look-up and the engine's."""
    rows = []
    n = 20_000
    meta = ItemMetadata.from_records([{"tenant": f"t{i % 50}"} for i in range(1000)])
    ids = [str(i) for i in range(1000)]
    values = [f"v{i}" for i in range(n - 1)] + ["x" * n]
    body = len(json.dumps({"filter": {"tenant": {"$in": values}}})) / 2**20
    spec = {"tenant": {"$in": values}}
    col = meta.columns["tenant"]
    col.dictionary  # noqa: B018 (decoded once per index, as a Searcher keeps it)
    rows.append(
        {
            "case": f"$in of {n} values, one of {n} chars ({body:.2f} MB body)",
            "before_mb": _peak_mb(lambda: _former(spec, meta, col, values)) if before else None,
            "after_mb": _peak_mb(lambda: parse_filter(spec, meta.fields).mask(meta, ids)),
        }
    )
    long = "y" * 200_000
    recs = [{"lang": f"l{i % 300}"} for i in range(2000)] + [{"lang": long}]
    meta = ItemMetadata.from_records(recs)
    ids = [str(i) for i in range(len(recs))]
    spec = {"lang": {"$in": ["l1", "l7", "zz"]}}
    col = meta.columns["lang"]
    assert len(col.dictionary) == 301  # decoded once per index, as a Searcher keeps it
    rows.append(
        {
            "case": "a filter on a field whose dictionary holds a 200,000-char value (301 values)",
            "before_mb": _peak_mb(lambda: _former(spec, meta, col, ["l1", "l7", "zz"]))
            if before
            else None,
            "after_mb": _peak_mb(lambda: parse_filter(spec, meta.fields).mask(meta, ids)),
        }
    )
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=64)
    ap.add_argument("--no-before", action="store_true", help="skip the former look-up (1.6 GB)")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)

    t0 = time.perf_counter()
    stats = run(args.cases, args.seed)
    seconds = time.perf_counter() - t0
    mismatches = int(stats.get("mismatches", 0))
    print(f"fuzz: {stats['cases']} cases over {stats['tables']} tables, seed {args.seed}, "
          f"{seconds:.1f} s")  # fmt: skip
    print("| what | count |\n| --- | ---: |")
    for key in ("cases", "mismatches", "refused", "some_but_not_all", "tables", "tables_refused"):
        print(f"| {key} | {int(stats.get(key, 0))} |")
    ops = {k: v for k, v in sorted(stats.items()) if " " in k or k.startswith("$")}
    print("| operator | valid filters using it |\n| --- | ---: |")
    for key, value in ops.items():
        print(f"| `{key}` | {value} |")
    for m in stats["first_mismatches"]:
        print("MISMATCH", m)

    mem = memory(not args.no_before)
    print("| long strings | peak MB before | peak MB after |\n| --- | ---: | ---: |")
    for r in mem:
        print(f"| {r['case']} | {r['before_mb']} | {r['after_mb']} |")

    # read-modify-write: other benches write other goals (and sections) into this file
    result = json.loads(args.out.read_text()) if args.out.is_file() else {}
    goals = result.setdefault("goals", {})
    goals["mismatches"] = mismatches
    goals["cases"] = int(stats["cases"])
    result["fuzz"] = {
        "seed": args.seed,
        "seconds": round(seconds, 1),
        "date": utc_now(),
        "machine": machine(),
        "provenance": provenance(),
        "counts": {k: v for k, v in stats.items() if k != "first_mismatches"},
        "first_mismatches": stats["first_mismatches"],
    }
    result["memory"] = {"date": utc_now(), "rows": mem}
    write_json(args.out, {**result, "provenance": result.get("provenance") or provenance()})
    return 0 if mismatches == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
