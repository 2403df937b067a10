"""Search methods at scale on synthetic CE matrices (low rank + skewed noise), up to 10^6 items.

    .venv/bin/python bench/search_scale_bench.py [--items 10000 100000 1000000] [--test 16]

For each item count: a synthetic matrix with 100 train (anchor) rows and ``--test`` test rows,
the methods below at B=100, k=10, all test queries searched as one batch. Prints a table (recall,
milliseconds per query spent outside the CE, i.e. everything but the matrix lookups; offline
index seconds: Rᵀ features, plus ANNCUR's E) and writes bench/results/search_scale.json.
Timings are noisy on a shared machine: compare within one run only.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from _common import RESULTS, machine, utc_now, write_json
from crossknn.retrievers import DenseRetriever
from crossknn.score_map import ScoreMap
from crossknn.scorers import MatrixScorer, TimedScorer
from crossknn.search import ADACUR, ANNCUR, AXN, RNR, CurIndex
from crossknn.synthetic import synthetic_matrix
from crossknn.topk import topk_recall


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    ap.add_argument("--train", type=int, default=100)
    ap.add_argument("--test", type=int, default=16)
    ap.add_argument("--budget", type=int, default=100)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=str(RESULTS / "search_scale.json"))
    args = ap.parse_args()

    rows = []
    for n in args.items:
        t0 = time.perf_counter()
        S, dq, di = synthetic_matrix(
            args.train + args.test, n, rank=16, noise=0.5, skew=0.5, de_dim=32, seed=args.seed
        )
        gen_s = time.perf_counter() - t0
        train = np.arange(args.train)
        test = np.arange(args.train, args.train + args.test)
        t0 = time.perf_counter()
        index = CurIndex.from_matrix(S, train, test_rows=test)
        index.item_features()
        index_s = time.perf_counter() - t0
        de = DenseRetriever(di, query_vectors=dq)
        score_map = ScoreMap.fit(S[train], dq[train] @ di.T)
        methods = {
            "rnr (de)": RNR(de),
            "anncur": ANNCUR(index, split=0.5),
            "adacur R=5": ADACUR(index, rounds=5),
            "adacur-split R=5": ADACUR(index, rounds=5, split=0.5),
            "adacur (de) R=5": ADACUR(index, rounds=5, first=de),
            "axn (de) R=5": AXN(di, rounds=5, first=de, prior=dq, mix=0.5, score_map=score_map),
        }
        for name, method in methods.items():
            t0 = time.perf_counter()
            method.plan(args.budget)  # offline part: ANNCUR's E for its anchors
            offline = index_s + (time.perf_counter() - t0 if name == "anncur" else 0.0)
            scorer = TimedScorer(MatrixScorer(S))
            t0 = time.perf_counter()
            res = method.search(scorer, test.tolist(), budget=args.budget, k=args.k, seed=args.seed)
            total = time.perf_counter() - t0
            rec = float(topk_recall(S, test, res.indices, args.k).mean())
            row = {
                "n_items": n,
                "method": name,
                "budget": args.budget,
                "k": args.k,
                "recall": round(rec, 4),
                "ce_calls_max": int(res.ce_calls.max()),
                "ms_per_query": round(1e3 * (total - scorer.seconds) / len(test), 2),
                "index_s": round(offline, 2),
                "generate_s": round(gen_s, 1),
                "n_train": args.train,
                "n_test": args.test,
            }
            rows.append(row)
            print(
                f"{n:>9}  {name:<18}  recall {rec:5.3f}  calls {row['ce_calls_max']:>4}  "
                f"{row['ms_per_query']:8.2f} ms/query  (index {offline:.2f} s)",
                flush=True,
            )
        del S, dq, di, index, methods
    write_json(args.json, {"rows": rows, "machine": machine(), "date_utc": utc_now()})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
