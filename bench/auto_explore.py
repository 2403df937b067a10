"""Issue 17 exploration: the library's ``auto`` (crossknn.search.auto) against dense ADACUR, AXN
over DE and RNR on cisi-minilm, Top-k-Recall@B for B in (50, 100, 200), k in (10, 50).

``auto``'s index reads at most C train entries (C = frac x |train| x N) through the counting
IndexCallBudget; its choices come from cross-validation over those train rows only. Variants of
the choice grids are passed on the command line (``--grid-rounds 20 10 5``) to measure them.

Usage: python bench/auto_explore.py [--seeds 0 1 2] [--fracs 0 0.1] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from crossknn.retrievers import make_retriever
from crossknn.score_map import ScoreMap
from crossknn.scorers import MatrixScorer
from crossknn.search import ADACUR, AXN, RNR, CurIndex
from crossknn.search import auto as auto_mod
from crossknn.search.auto import AUTO, AutoIndex, IndexCallBudget, build_auto_index
from crossknn.topk import topk_recall

D = Path(__file__).resolve().parents[1].parent / "shared" / "matrices" / "cisi-minilm"
BUDGETS = (50, 100, 200)
KS = (10, 50)


def load():
    S = np.load(D / "scores.npy").astype(np.float32)
    DQ = np.load(D / "de_queries.npy").astype(np.float32)
    DI = np.load(D / "de_items.npy").astype(np.float32)
    sp = json.loads((D / "splits.json").read_text())
    return S, DQ, DI, np.array(sp["train"], np.int64), np.array(sp["test"], np.int64)


def evaluate(method, S, rows, seed=0):
    sc = MatrixScorer(S)
    out = {}
    for B in BUDGETS:
        res = method.search(sc, [int(r) for r in rows], budget=B, k=max(KS), seed=seed)
        assert int(res.ce_calls.max()) <= B
        for k in KS:
            out[(B, k)] = float(topk_recall(S, rows, res.indices, k).mean())
    return out


def fmt(name, t):
    cells = " ".join(f"{t[(B, k)]:.3f}" for k in KS for B in BUDGETS)
    return f"{name:<44} {cells}  mean={np.mean(list(t.values())):.4f}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--fracs", type=float, nargs="*", default=[0, 0.01, 0.05, 0.10, 1.0])
    ap.add_argument("--grid-rounds", type=int, nargs="+")
    ap.add_argument("--grid-d", type=float, nargs="+")
    ap.add_argument("--grid-r", type=float, nargs="+")
    ap.add_argument("--grid-decay", type=float, nargs="+")
    ap.add_argument(
        "--pseudo",
        action="store_true",
        help="train rows only: 20 random train rows play the test rows, the other 42 the train "
        "rows (for choosing what to try without looking at test rows)",
    )
    ap.add_argument(
        "--defaults-grid",
        action="store_true",
        help="C = 0: every (rho_D, rounds, decay) of the grids (the candidates for DEFAULTS)",
    )
    ap.add_argument("--pseudo-seed", type=int, default=17, help="seed of the --pseudo split")
    ap.add_argument("--grid-first", type=float, nargs="+", help="first-round shares (0: B/rounds)")
    ap.add_argument(
        "--row-choice", choices=auto_mod.ROW_CHOICES, default="medoids", help="which rows to read"
    )
    ap.add_argument("--no-baselines", action="store_true")
    ap.add_argument("--json", default=str(Path(__file__).parent / "results" / "auto_explore.json"))
    args = ap.parse_args()
    for flag, name in (
        ("grid_rounds", "GRID_ROUNDS"),
        ("grid_d", "GRID_D"),
        ("grid_r", "GRID_R"),
        ("grid_decay", "GRID_DECAY"),
    ):
        if getattr(args, flag):
            setattr(auto_mod, name, tuple(getattr(args, flag)))
    S, DQ, DI, train, test = load()
    if args.pseudo:
        perm = np.random.default_rng(args.pseudo_seed).permutation(train)
        test, train = np.sort(perm[:20]), np.sort(perm[20:])
    N = S.shape[1]
    de = make_retriever("de", item_vectors=DI, query_vectors=DQ)
    dense = len(train) * N
    rows = []
    print(f"{'method':<44} " + " ".join(f"k{k}B{B}" for k in KS for B in BUDGETS))
    if not args.no_baselines:
        t = evaluate(ADACUR(CurIndex.from_matrix(S, train, test_rows=test), first=de), S, test)
        print(fmt("ADACUR dense (DE first, R=5)", t))
        rows.append(("adacur", dense, t, {}))
        smap = ScoreMap.fit(S[train], DQ[train] @ DI.T)
        t = evaluate(AXN(DI, first=de, prior=DQ, mix=0.5, score_map=smap), S, test)
        print(fmt("AXN over DE (lambda 0.5)", t))
        rows.append(("axn-de", dense, t, {}))
        t = evaluate(RNR(de, n_items=N), S, test)
        print(fmt("RNR DE", t))
        rows.append(("rnr-de", 0, t, {}))
    if args.defaults_grid:
        for g in auto_mod.GRID_DECAY:
            for n in auto_mod.GRID_ROUNDS:
                for d in auto_mod.GRID_D:
                    idx = AutoIndex(DI, np.empty((0, N)), rho_d=d, rounds=n, decay=g)
                    t = evaluate(AUTO(idx, prior=DQ, first=de), S, test)
                    print(fmt(f"C=0 rho_D={d} R={n} g={g}", t))
                    sys.stdout.flush()
                    rows.append(("auto-c0", 0, t, {"rho_d": d, "rounds": n, "decay": g}))
    if args.grid_first:
        auto_mod.GRID_FIRST = tuple(f or None for f in args.grid_first)
    for frac in args.fracs:
        C = int(frac * dense)
        for seed in args.seeds if C >= 2 * N else args.seeds[:1]:
            t0 = time.time()
            reader = IndexCallBudget(MatrixScorer(S), train.tolist(), C)
            index = build_auto_index(
                reader,
                train.tolist(),
                DI,
                DQ[train],
                index_calls=C,
                seed=seed,
                row_choice=args.row_choice,
            )
            t = evaluate(AUTO(index, prior=DQ, first=de), S, test)
            info = index.meta()
            name = f"auto C={C} m={index.n_rows} s{seed} rho=({index.rho_d},{index.rho_r}) "
            print(
                fmt(name + f"R={index.rounds} f={index.first_share}", t),
                f"[{time.time() - t0:.0f}s]",
            )
            sys.stdout.flush()
            rows.append(("auto", C, t, {"seed": seed, **info}))
    doc = [
        {
            "method": r[0],
            "C": r[1],
            "recall": {f"k{k}B{B}": v for (B, k), v in r[2].items()},
            **r[3],
        }
        for r in rows
    ]
    Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
