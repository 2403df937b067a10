"""Issue 29, item 2: ``auto``'s index from pseudo-query rows vs train rows, at equal index calls.

On a score matrix with train and test rows (``../shared/matrices/nfcorpus-minilm-gpu``), the
index may read C = ``--share`` x |train| x N CE entries (default 10% of dense ADACUR's). Its rows
come from

- ``train``: the train queries' rows (what ``crossknn eval --method auto`` builds);
- ``pseudo:NAME``: the rows of pseudo-queries (``bench/pseudo_rows.py`` output: NAME.npy, the
  queries x all items CE scores, and NAME.de.npy, their DE vectors);
- ``mix``: half of the rows from the train queries, half from the pseudo-queries (each half the
  medoids of its own pool; all pseudo kinds pooled);

each through ``build_auto_index`` (cross-validation over the rows read, never a test row). The
same test rows are then searched (DE first round, Top-k-Recall@B, B in 50/100/200, k in 10/50)
beside dense ADACUR (5 rounds, DE first) and AXN over DE.

``--stand-in K``: no pseudo rows yet; K train rows (seeded, excluded from the train pool of the
other variants) play the pseudo rows, to check the plumbing.

    python bench/pseudo_eval.py --pseudo .gpu-data/pseudo_first.npy .gpu-data/pseudo_sentence.npy

Writes bench/results/pseudo_rows.json (``--json``).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from _common import RESULTS, SHARED, machine, utc_now, write_json
from crossknn.retrievers import make_retriever
from crossknn.scorers import MatrixScorer
from crossknn.search.auto import AUTO, build_auto_index, choose_rows
from crossknn.topk import topk_recall

BUDGETS = (50, 100, 200)
KS = (10, 50)
CELLS = [f"k{k}B{b}" for k in KS for b in BUDGETS]


def recall(method, S, rows, seed) -> dict[str, float]:
    out = {}
    for b in BUDGETS:
        res = method.search(MatrixScorer(S), rows.tolist(), budget=b, k=max(KS), seed=seed)
        assert int(res.ce_calls.max()) <= b
        for k in KS:
            out[f"k{k}B{b}"] = float(topk_recall(S, rows, res.indices, k).mean())
    return {c: out[c] for c in CELLS}


def load_pseudo(path: Path, n_items: int) -> tuple[np.ndarray, np.ndarray]:
    P = np.load(path).astype(np.float32)
    de = Path(f"{path.with_suffix('')}.de.npy")
    if not de.is_file():
        raise FileNotFoundError(f"{de} (the pseudo-queries' DE vectors, pseudo_rows.py --de)")
    Q = np.load(de).astype(np.float32)
    if P.ndim != 2 or P.shape[1] != n_items or Q.shape[0] != P.shape[0]:
        raise ValueError(
            f"{path}: expected (n x {n_items}) scores and n DE vectors; got {P.shape}, {Q.shape}"
        )
    return P, Q


def auto_from_rows(R, Q, DI, C, seed):
    """build_auto_index over a pool of complete rows R (their DE vectors Q), at most C calls."""
    pool = list(range(R.shape[0]))
    return build_auto_index(MatrixScorer(R), pool, DI, Q, index_calls=C, seed=seed)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--matrix", default=str(SHARED / "matrices" / "nfcorpus-minilm-gpu"))
    ap.add_argument("--pseudo", type=Path, nargs="*", default=[], help="pseudo_rows.py outputs")
    ap.add_argument("--stand-in", type=int, default=0, metavar="K", help="K train rows as pseudo")
    ap.add_argument("--share", type=float, default=0.10, help="C as a share of |train| x N")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-baselines", action="store_true", help="skip dense ADACUR and AXN")
    ap.add_argument("--json", type=Path, default=RESULTS / "pseudo_rows.json")
    args = ap.parse_args(argv)
    if not args.pseudo and not args.stand_in:
        ap.error("give --pseudo NAME.npy ... or --stand-in K")

    d = Path(args.matrix)
    S = np.load(d / "scores.npy").astype(np.float32)
    DQ = np.load(d / "de_queries.npy").astype(np.float32)
    DI = np.load(d / "de_items.npy").astype(np.float32)
    sp = json.loads((d / "splits.json").read_text())
    train, test = np.array(sp["train"], np.int64), np.array(sp["test"], np.int64)
    N = S.shape[1]
    C = int(args.share * train.size * N)
    pools: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    if args.stand_in:
        rng = np.random.default_rng([args.seed, 2929])
        stand = np.sort(rng.choice(train, args.stand_in, replace=False))
        pools["stand-in"] = (S[stand], DQ[stand])
        train_pool = np.setdiff1d(train, stand)
    else:
        train_pool = train
    for p in args.pseudo:
        pools[p.stem] = load_pseudo(p, N)
    de = make_retriever("de", item_vectors=DI, query_vectors=DQ)
    runs = []
    adacur: dict[str, float] = {}

    def run(name, idx, t0):
        t = recall(AUTO(idx, prior=DQ, first=de), S, test, args.seed)
        row = {"rows_from": name, "recall": t, **idx.meta()}
        row["seconds"] = round(time.perf_counter() - t0, 1)
        runs.append(row)
        cells = " ".join(f"{t[c]:.3f}" for c in CELLS)
        gap = ""
        if adacur:  # issue 29's pseudo-row goal: >= ADACUR - 0.03 in all six cells
            row["worst_vs_adacur"] = min(t[c] - adacur[c] for c in CELLS)
            gap = f"  worst vs ADACUR {row['worst_vs_adacur']:+.3f}"
        print(f"{name:<28} {idx.index_calls:>9,} {idx.n_rows:>4}  {cells}{gap}", flush=True)

    print(f"C = {C:,} ({args.share:.0%} of {train.size} x {N}); {test.size} test rows")
    print(f"{'rows':<28} {'calls':>9} {'m':>4}  " + " ".join(f"{c:>5}" for c in CELLS))
    if not args.no_baselines:
        from crossknn.score_map import ScoreMap
        from crossknn.search import ADACUR, AXN, CurIndex

        t0 = time.perf_counter()
        t = recall(ADACUR(CurIndex.from_matrix(S, train, test_rows=test), first=de), S, test, 0)
        adacur.update(t)
        runs.append({"rows_from": "adacur-dense", "index_calls": int(train.size * N), "recall": t})
        print(f"{'ADACUR dense':<28} {train.size * N:>9,} {train.size:>4}  ", end="")
        print(" ".join(f"{t[c]:.3f}" for c in CELLS), flush=True)
        smap = ScoreMap.fit(S[train], DQ[train] @ DI.T)
        t = recall(AXN(DI, first=de, prior=DQ, mix=0.5, score_map=smap), S, test, 0)
        runs.append({"rows_from": "axn-de", "index_calls": 0, "recall": t})
        print(f"{'AXN over DE':<28} {0:>9,} {0:>4}  " + " ".join(f"{t[c]:.3f}" for c in CELLS))
    t0 = time.perf_counter()
    run("train", auto_from_rows(S[train_pool], DQ[train_pool], DI, C, args.seed), t0)
    for name, (P, Q) in pools.items():
        t0 = time.perf_counter()
        run(f"pseudo:{name}", auto_from_rows(P, Q, DI, C, args.seed), t0)
    # mix: half the rows from the train pool, half from the pooled pseudo rows, medoids of each
    P = np.vstack([p for p, _ in pools.values()])
    Q = np.vstack([q for _, q in pools.values()])
    m = C // N
    mt, mp = m - m // 2, min(m // 2, P.shape[0])
    t0 = time.perf_counter()
    pt = choose_rows(DQ[train_pool], mt, seed=args.seed)
    pp = choose_rows(Q, mp, seed=args.seed)
    R = np.vstack([S[train_pool[pt]], P[pp]])
    run(
        f"mix ({mt} train + {mp} pseudo)",
        auto_from_rows(R, np.vstack([DQ[train_pool[pt]], Q[pp]]), DI, C, args.seed),
        t0,
    )
    write_json(
        args.json,
        {
            "when": utc_now(),
            "machine": machine("numpy"),
            "matrix": str(d),
            "index_calls_limit": C,
            "share_of_dense": args.share,
            "seed": args.seed,
            "pseudo": [str(p) for p in args.pseudo],
            "stand_in": args.stand_in,
            "runs": runs,
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
