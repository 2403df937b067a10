"""``crossknn evaluate RUN.trec --qrels QRELS [--metrics "nDCG@10 RR@10"]``: the metrics of any
TREC run (ir_measures).

A run is refused, naming its file and line, where trec_eval or ir_measures would score it
silently: a score that is not finite, the same docid twice for one query, bytes that are not
text. Equal scores are ranked by docid descending for every measure (:mod:`crossknn.trec`).
"""

from __future__ import annotations

import argparse
import json
import sys

from crossknn.data import read_qrels
from crossknn.trec import parse_measures, read_run, run_metrics


def run(args: argparse.Namespace) -> int:
    measures = parse_measures(args.metrics) if args.metrics is not None else None
    qrels = read_qrels(args.qrels)
    rows = {path: run_metrics(read_run(path), qrels, measures) for path in args.runs}
    if args.json:
        json.dump({"qrels": args.qrels, "runs": rows}, sys.stdout, indent=1)
        print()
        return 0
    if measures is None:
        names = [m for m in ("nDCG@10", "RR@10", "R@100") if any(m in r for r in rows.values())]
    else:
        names = list(dict.fromkeys(str(m) for m in measures))
    width = max(len(p) for p in rows)
    cols = [max(8, len(n)) for n in names]
    print(
        f"{'run':<{width}}  "
        + "  ".join(f"{n:>{c}}" for n, c in zip(names, cols, strict=True))
        + "  queries"
    )
    for path, r in rows.items():
        cells = "  ".join(
            f"{r[n]:{c}.4f}" if n in r else f"{'-':>{c}}" for n, c in zip(names, cols, strict=True)
        )
        print(f"{path:<{width}}  {cells}  {r['n_queries']:>7}")
    return 0
