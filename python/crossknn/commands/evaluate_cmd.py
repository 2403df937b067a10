"""``crossknn evaluate RUN.trec --qrels QRELS``: the metrics of any TREC run (ir_measures)."""

from __future__ import annotations

import argparse
import json
import sys

HELP = "metrics (nDCG@10, RR@10, R@100) of TREC run file(s) against qrels, by ir_measures"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "runs", nargs="+", metavar="RUN", help="TREC run file(s): qid Q0 docid rank score tag"
    )
    p.add_argument(
        "--qrels", required=True, metavar="FILE", help="BEIR qrels .tsv or TREC qrels file"
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


def run(args: argparse.Namespace) -> int:
    from crossknn.data import read_qrels
    from crossknn.trec import read_run, run_metrics

    qrels = read_qrels(args.qrels)
    rows = {path: run_metrics(read_run(path), qrels) for path in args.runs}
    if args.json:
        json.dump({"qrels": args.qrels, "runs": rows}, sys.stdout, indent=1)
        print()
        return 0
    names = [m for m in ("nDCG@10", "RR@10", "R@100") if any(m in r for r in rows.values())]
    width = max(len(p) for p in rows)
    print(f"{'run':<{width}}  " + "  ".join(f"{n:>8}" for n in names) + "  queries")
    for path, r in rows.items():
        cells = "  ".join(f"{r[n]:8.4f}" if n in r else f"{'-':>8}" for n in names)
        print(f"{path:<{width}}  {cells}  {r['n_queries']:>7}")
    return 0
