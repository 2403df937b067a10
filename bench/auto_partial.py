"""Issue 29 at 1%: how ``auto``'s learned prior spends the index budget, on train rows only.

Pseudo splits of nfcorpus-minilm-gpu's 1,677 train rows (as ``bench/auto_onepct.py``: split s
holds out 300 train queries as pseudo-test rows, the index reads C = 1% x 1,377 x N entries of
the other 1,377). Each variant is a build by ``crossknn.search.auto.build_auto_index`` with
``PARTIAL_SHARE`` (the share of C kept from the complete rows, which sets m) and ``items`` (the
entries of a partial row) set, then searched with the learned prior's softmax sharpness ``tau``;
``share = 0`` is the build before the learned prior (partial_items 0). Top-k-Recall@B, B in
(50, 100, 200), k in (10, 50), DE first round, seed 0; the test rows are never read.

    .venv/bin/python bench/auto_partial.py [--splits 0 1 2] [--json OUT]

About 20 s a build and 5 s a search of the three budgets on one core.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

import numpy as np

from _common import RESULTS, SHARED, write_rows
from auto_rows import BUDGETS, KS, recall
from crossknn.matrix import load_score_matrix
from crossknn.retrievers import make_retriever
from crossknn.scorers import MatrixScorer
from crossknn.search import auto as auto_mod
from crossknn.search.auto import AUTO, IndexCallBudget, build_auto_index

MATRIX = SHARED / "matrices" / "nfcorpus-minilm-gpu"
CELLS = [f"k{k}B{b}" for k in KS for b in BUDGETS]
# (PARTIAL_SHARE, items): m = 13, 12, 11, 10 complete rows at the pseudo splits' C = 50,026
BUILDS = [(0.0, 0), (0.04, 100), (0.04, 50), (0.04, 25), (0.12, 100), (0.2, 150), (0.27, 100)]
TAUS = (3.0, 10.0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--matrix", default=str(MATRIX))
    ap.add_argument("--splits", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--json", default=str(RESULTS / "auto_partial.json"))
    args = ap.parse_args()
    mat = load_score_matrix(args.matrix)
    S, DQ, DI = mat.scores, mat.de_queries.astype(np.float32), mat.de_items.astype(np.float32)
    train, N = np.asarray(mat.train, np.int64), mat.n_items
    de = make_retriever("de", item_vectors=DI, query_vectors=DQ)
    rows = []
    print(f"{'split':<8} {'share':>5} {'items':>5} {'m':>3} {'P':>4} {'tau':>4} {'calls':>6}  ")
    for s in args.splits:
        perm = np.random.default_rng([s, 4242]).permutation(train)
        tr, te = np.sort(perm[300:]), np.sort(perm[:300])
        C = int(0.01 * tr.size * N)
        for share, items in BUILDS:
            old = auto_mod.PARTIAL_SHARE
            auto_mod.PARTIAL_SHARE = share
            t0 = time.perf_counter()
            try:
                reader = IndexCallBudget(MatrixScorer(S), tr.tolist(), C)
                idx = build_auto_index(
                    reader, tr.tolist(), DI, DQ[tr], index_calls=C, seed=0, partial_items=items
                )
            finally:
                auto_mod.PARTIAL_SHARE = old
            assert reader.calls <= C and not set(idx.row_ids) & set(te.tolist())
            for tau in TAUS if items else (auto_mod.PRIOR_TAU,):
                rec = recall(AUTO(replace(idx, prior_tau=tau), prior=DQ, first=de), S, te)
                mean = float(np.mean(list(rec.values())))
                print(
                    f"pseudo{s:<2} {share:>5.2f} {items:>5} {idx.n_rows:>3} {idx.partial_rows:>4} "
                    f"{tau:>4g} {reader.calls:>6}  "
                    + " ".join(f"{rec[c]:.3f}" for c in CELLS)
                    + f"  mean={mean:.4f} [{time.perf_counter() - t0:.0f}s]",
                    flush=True,
                )
                rows.append(
                    {
                        "split": f"pseudo{s}",
                        "partial_share": share,
                        "partial_items": items,
                        "rows": idx.n_rows,
                        "partial_rows": idx.partial_rows,
                        "prior_tau": tau,
                        "index_calls_limit": C,
                        "index_calls": int(reader.calls),
                        "recall": rec,
                        "mean": mean,
                    }
                )
    write_rows(args.json, args.matrix, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
