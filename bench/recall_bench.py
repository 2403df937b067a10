"""Recall-vs-cost on cisi-minilm: every `crossknn eval` run behind docs/search.md, and its figure.

    .venv/bin/python bench/recall_bench.py [--matrix ../shared/matrices/cisi-minilm]

Writes bench/results/eval_cisi*.json (one file per run below; each also prints its table) and
docs/img/cisi_recall.png (the headline curves). Uses the precomputed score matrix only (no model
runs); takes a few minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import time

from _common import CISI_MATRIX, REPO, RESULTS
from crossknn.cli import main as crossknn


def repeat(flag: str, *values) -> list[str]:
    """``repeat("--k", 1, 10)`` -> ``["--k", "1", "--k", "10"]``."""
    return [a for v in values for a in (flag, str(v))]


GRID = repeat("--budget", 50, 100, 200, 500) + repeat("--k", 1, 10, 50, 100)


def methods(*names):
    return repeat("--method", *names)


RUNS = {
    # retrieve-and-rerank baselines with every first stage
    "eval_cisi_rnr": methods("rnr") + repeat("--first", "de", "tfidf", "bm25", "random"),
    # the headline: CUR methods with a random first round, 5 rounds
    "eval_cisi": methods("anncur", "adacur", "adacur-split", "adacur-softmax", "axn"),
    # number of rounds
    "eval_cisi_rounds": methods("adacur", "adacur-split", "adacur-softmax", "adacur-random", "axn")
    + repeat("--rounds", 1, 2, 3, 5, 10, 20),
    # first round / anchors from the dual encoder
    "eval_cisi_de": methods("anncur", "adacur", "adacur-split", "axn") + ["--first", "de"],
    # the papers' final ranking (split methods rerank only the retrieved items)
    "eval_cisi_paper": methods("anncur", "adacur-split") + ["--paper"],
    # the papers as published: plain pseudo-inverse (no ridge) and their final ranking
    "eval_cisi_pinv": methods("anncur", "adacur", "adacur-split") + ["--ridge", "0", "--paper"],
    # SoftMax at fixed temperatures (in units of a query's CE score spread) instead of dev-chosen
    "eval_cisi_softmax_t1": methods("adacur-softmax") + ["--temperature", "1"],
    "eval_cisi_softmax_t0.1": methods("adacur-softmax") + ["--temperature", "0.1"],
}

FIGURE_SERIES = [  # (run, method, first, rounds)
    ("eval_cisi_rnr", "rnr", "de", 1),
    ("eval_cisi_rnr", "rnr", "tfidf", 1),
    ("eval_cisi_rnr", "rnr", "bm25", 1),
    ("eval_cisi", "anncur", "random", 1),
    ("eval_cisi", "adacur", "random", 5),
    ("eval_cisi", "adacur-split", "random", 5),
    ("eval_cisi", "adacur-softmax", "random", 5),
    ("eval_cisi", "axn", "random", 5),
    ("eval_cisi_de", "adacur", "de", 5),
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--matrix", default=str(CISI_MATRIX))
    ap.add_argument("--only", action="append", help="run only these runs (names above)")
    args = ap.parse_args()
    timings = {}
    for name, argv in RUNS.items():
        if args.only and name not in args.only:
            continue
        print(f"\n== {name}: crossknn eval MATRIX {' '.join(argv + GRID)}")
        t0 = time.perf_counter()
        rc = crossknn(
            [
                "eval",
                args.matrix,
                *argv,
                *GRID,
                "--json",
                str(RESULTS / f"{name}.json"),
                "--no-plot",
                "--quiet",
            ]
        )
        if rc:
            return rc
        timings[name] = round(time.perf_counter() - t0, 1)
    print("\nseconds per run:", json.dumps(timings))

    from crossknn.eval import plot_curves

    rows = []
    for run, method, first, rounds in FIGURE_SERIES:
        path = RESULTS / f"{run}.json"
        if not path.is_file():
            continue
        rows += [
            r
            for r in json.loads(path.read_text())["rows"]
            if (r["method"], r["first"], r["rounds"]) == (method, first, rounds)
        ]
    if rows:
        png = REPO / "docs" / "img" / "cisi_recall.png"
        plot_curves(
            rows,
            png,
            title="cisi-minilm: Top-k-Recall vs CE calls (50 test queries, "
            "1,460 items, 62 train queries)",
        )
        print(f"wrote {png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
