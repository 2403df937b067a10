"""Which train rows ``auto`` reads: k-means medoids of the DE query vectors vs uniform random.

Train rows only (the test rows are never read): each pseudo split holds out 20 of cisi's 62 train
rows as pseudo-test rows; ``auto``'s index reads m complete rows of the other 42, chosen by
``crossknn.search.auto.choose_rows`` (medoids or random, row-choice seeds 0..2). Penalties and
rounds are fixed (rho_D = 0.1, rho_R = 0.3, 10 rounds, first round B / rounds) so that only the
row choice differs. Top-k-Recall@B on the pseudo-test rows, B in (50, 100, 200), k in (10, 50).

    .venv/bin/python bench/auto_rows.py [--splits 8] [--ms 2 3 4 6 8]

Writes bench/results/auto_rows.json; takes about 3 minutes on one core.
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from _common import CISI_MATRIX, RESULTS, machine, utc_now, write_json
from crossknn.retrievers import make_retriever
from crossknn.scorers import MatrixScorer
from crossknn.search.auto import AUTO, AutoIndex, choose_rows
from crossknn.topk import topk_recall

BUDGETS = (50, 100, 200)
KS = (10, 50)
CELLS = [f"k{k}B{b}" for k in KS for b in BUDGETS]


def recall(method, S, rows) -> dict[str, float]:
    out = {}
    for b in BUDGETS:
        res = method.search(MatrixScorer(S), rows.tolist(), budget=b, k=max(KS))
        assert int(res.ce_calls.max()) <= b
        for k in KS:
            out[f"k{k}B{b}"] = float(topk_recall(S, rows, res.indices, k).mean())
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--matrix", default=str(CISI_MATRIX))
    ap.add_argument("--splits", type=int, default=8, help="pseudo splits of the train rows")
    ap.add_argument("--ms", type=int, nargs="+", default=[2, 3, 4, 6, 8], help="rows read")
    ap.add_argument("--seeds", type=int, default=3, help="row-choice seeds per split")
    args = ap.parse_args()
    d = args.matrix.rstrip("/") + "/"
    S = np.load(d + "scores.npy").astype(np.float32)
    DQ = np.load(d + "de_queries.npy").astype(np.float32)
    DI = np.load(d + "de_items.npy").astype(np.float32)
    train = np.array(json.load(open(d + "splits.json"))["train"], np.int64)
    de = make_retriever("de", item_vectors=DI, query_vectors=DQ)
    runs = []
    for split in range(args.splits):
        perm = np.random.default_rng([split, 99]).permutation(train)
        ptest, ptrain = np.sort(perm[:20]), np.sort(perm[20:])
        for m in args.ms:
            for how in ("random", "medoids"):
                for seed in range(args.seeds):
                    pos = choose_rows(DQ[ptrain], m, how=how, seed=seed)
                    idx = AutoIndex(
                        DI, S[ptrain[pos]], rho_d=0.1, rho_r=0.3, rounds=10, first_share=None
                    )
                    t = recall(AUTO(idx, prior=DQ, first=de), S, ptest)
                    runs.append({"split": split, "m": m, "rows": how, "seed": seed, "recall": t})
        print(f"split {split} done", flush=True)
    print(f"\n{'rows':<14}" + " ".join(f"{c:>8}" for c in CELLS) + "     mean  medoids>random")
    summary = []
    for m in args.ms:
        mean = {}
        for how in ("random", "medoids"):
            rs = [r["recall"] for r in runs if r["m"] == m and r["rows"] == how]
            mean[how] = {c: float(np.mean([r[c] for r in rs])) for c in CELLS}
        pairs = [
            (np.mean(list(a["recall"].values())), np.mean(list(b["recall"].values())))
            for a in runs
            if a["m"] == m and a["rows"] == "random"
            for b in runs
            if b["m"] == m
            and b["rows"] == "medoids"
            and (b["split"], b["seed"]) == (a["split"], a["seed"])
        ]
        wins = float(np.mean([b > a for a, b in pairs]))
        for how in ("random", "medoids"):
            cells = " ".join(f"{mean[how][c]:8.3f}" for c in CELLS)
            tail = f"  {wins:.2f}" if how == "medoids" else ""
            print(f"m={m} {how:<9}{cells} {np.mean(list(mean[how].values())):8.4f}{tail}")
            summary.append(
                {
                    "m": m,
                    "rows": how,
                    "recall": mean[how],
                    "mean": float(np.mean(list(mean[how].values()))),
                }
            )
        summary[-1]["wins_over_random"] = wins
    write_json(
        RESULTS / "auto_rows.json",
        {
            "when": utc_now(),
            "machine": machine("numpy", "scikit-learn"),
            "summary": summary,
            "runs": runs,
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
