"""Issue 29 item 3: ``auto`` at 1% (and 10%) of dense ADACUR's index calls on nfcorpus-minilm-gpu,
with and without the query-subspace block (``crossknn.search.auto.query_directions``).

Two kinds of runs, the same build as ``crossknn eval --method auto --index-calls C`` (medoid rows,
row prior), in variants ``DIRS:CV_MIN_ROWS`` (the query block's directions, 0 for none; the rows
from which penalties and rounds are cross-validated, ``FEW_ROWS`` below): ``0:2`` is the build
before issue 29 item 3, ``32:64`` the default now.

- ``--pseudo S``: the choice, on train rows only. Split s holds out 300 train queries as
  pseudo-test rows; the index reads C = share x 1,377 x N entries of the other 1,377.
- ``--test``: the report. C = share x 1,677 x N entries of the train rows; the 323 test queries.

Top-k-Recall@B, B in (50, 100, 200), k in (10, 50), DE first round, seed 0.

    .venv/bin/python bench/auto_onepct.py --pseudo 0 1 2 --variants 0:2 0:64 32:2 32:64
    .venv/bin/python bench/auto_onepct.py --test --shares 0.01 0.1 --json OUT.json

Each (split, share, variant) prints one line; the JSON rows carry ``index_calls`` (entries read).
About 1.5 minutes per build at 1% and 4 at 10% on one core.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from _common import RESULTS, SHARED, write_rows
from auto_rows import BUDGETS, KS, recall  # the same six cells, one definition
from crossknn.retrievers import make_retriever
from crossknn.scorers import MatrixScorer
from crossknn.search import auto as auto_mod
from crossknn.search.auto import (
    AUTO,
    CV_MIN_ROWS,
    PARTIAL_ITEMS,
    QUERY_DIRS,
    IndexCallBudget,
    build_auto_index,
)

MATRIX = SHARED / "matrices" / "nfcorpus-minilm-gpu"
CELLS = [f"k{k}B{b}" for k in KS for b in BUDGETS]
PSEUDO_TEST = 300


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--matrix", default=str(MATRIX))
    ap.add_argument("--pseudo", type=int, nargs="*", default=[], help="pseudo splits to run")
    ap.add_argument("--test", action="store_true", help="the test queries (the report)")
    ap.add_argument("--shares", type=float, nargs="+", default=[0.01], help="C / dense")
    ap.add_argument(
        "--variants",
        nargs="+",
        default=[f"{QUERY_DIRS}:{CV_MIN_ROWS}:0", f"{QUERY_DIRS}:{CV_MIN_ROWS}:{PARTIAL_ITEMS}"],
        help="DIRS:CV_MIN_ROWS[:PARTIAL_ITEMS] (partial items 0 or left out: no learned prior); "
        "0:2 is the build before issue 29 item 3 (no query block, cross-validation from two "
        "rows), 32:64:0 the build before the learned prior, 32:64:100 the default now",
    )
    ap.add_argument("--json", default=str(RESULTS / "auto_onepct.json"))
    args = ap.parse_args()
    d = args.matrix.rstrip("/") + "/"
    S = np.load(d + "scores.npy").astype(np.float32)
    DQ = np.load(d + "de_queries.npy").astype(np.float32)
    DI = np.load(d + "de_items.npy").astype(np.float32)
    sp = json.load(open(d + "splits.json"))
    train, test = np.array(sp["train"], np.int64), np.array(sp["test"], np.int64)
    N = S.shape[1]
    de = make_retriever("de", item_vectors=DI, query_vectors=DQ)
    runs = [("test", train, test)] if args.test else []
    for s in args.pseudo:
        perm = np.random.default_rng([s, 4242]).permutation(train)
        runs.append((f"pseudo{s}", np.sort(perm[PSEUDO_TEST:]), np.sort(perm[:PSEUDO_TEST])))
    rows = []
    head = f"{'split':<8} {'share':>5} {'variant':>10} {'rows':>4} {'calls':>7}  "
    print(head + " ".join(CELLS))
    for name, tr, te in runs:
        for share in args.shares:
            C = int(share * tr.size * N)
            for variant in args.variants:
                r, cv_min, *rest = (int(x) for x in variant.split(":"))
                part = rest[0] if rest else 0
                auto_mod.CV_MIN_ROWS = cv_min
                t0 = time.perf_counter()
                reader = IndexCallBudget(MatrixScorer(S), tr.tolist(), C)
                idx = build_auto_index(
                    reader,
                    tr.tolist(),
                    DI,
                    DQ[tr],
                    index_calls=C,
                    seed=0,
                    query_dirs=r,
                    partial_items=part,
                )
                assert reader.calls <= C and not set(idx.row_ids) & set(te.tolist())
                rec = recall(AUTO(idx, prior=DQ, first=de), S, te)
                mean = float(np.mean(list(rec.values())))
                print(
                    f"{name:<8} {share:>5.3f} {variant:>10} {idx.n_rows:>4} {reader.calls:>7}  "
                    + " ".join(f"{rec[c]:.3f}" for c in CELLS)
                    + f"  mean={mean:.4f} rho=({idx.rho_d},{idx.rho_r}) R={idx.rounds}"
                    + f" [{time.perf_counter() - t0:.0f}s]",
                    flush=True,
                )
                rows.append(
                    {
                        "split": name,
                        "share": share,
                        "index_calls_limit": C,
                        "index_calls": int(reader.calls),
                        "variant": variant,
                        "cv_min_rows": cv_min,
                        "partial_items": part,
                        "cross_validated": idx.cv is not None,
                        "recall": rec,
                        "mean": mean,
                        **{k: v for k, v in idx.meta().items() if k != "index_calls"},
                    }
                )
    write_rows(args.json, args.matrix, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
