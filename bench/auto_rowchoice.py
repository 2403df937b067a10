"""Issue 29 item 3: which complete rows the 1% build should read, and what an oracle could gain.

On pseudo splits of nfcorpus-minilm-gpu's **train** rows (split s holds out 300 train queries as
pseudo-test rows; the index may read C = 1% of the other 1,377 x 3,633 entries), the default
build (``crossknn.search.auto.build_auto_index``: medoid rows, partial rows, learned prior) with
its complete rows chosen in other ways. Variants:

- ``medoids``: the default build; ``random:SEED``: ``row_choice="random"`` with that seed.
- ``oracle-greedy`` (not a candidate: it reads every pseudo-train row to choose): the rows
  chosen greedily to explain the most variance of all pseudo-train rows (z-scored per row),
  after the top 32 principal directions of the DE item vectors and the constant are removed.
- ``oracle-mean`` (not a candidate): the default rows plus one extra free row, the mean
  z-scored row of all pseudo-train queries (the population-mean CE row), with the mean DE query
  vector as its row vector.
- ``sketch:T:S`` (within C): T random pseudo-train queries scored on S shared random items; the
  rows chosen greedily as in ``oracle-greedy`` on that sketch (its residual after the 32 DE
  directions restricted to the S items); the sketch's entries are reused by the rows and as
  partial rows of the learned prior (then no other partial row).

Top-k-Recall@B, B in (50, 100, 200), k in (10, 50), DE first round, seed 0; mean of the six
cells. About 5 s a build and search here.

    .venv/bin/python bench/auto_rowchoice.py --pseudo 0 1 2
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

import numpy as np

from _common import RESULTS, SHARED, write_rows
from auto_rows import BUDGETS, KS
from crossknn.matrix import load_score_matrix
from crossknn.retrievers import make_retriever
from crossknn.scorers import MatrixScorer
from crossknn.search import auto as au
from crossknn.topk import topk_recall

MATRIX = SHARED / "matrices" / "nfcorpus-minilm-gpu"
CELLS = [f"k{k}B{b}" for k in KS for b in BUDGETS]
PSEUDO_TEST = 300
ITEM_DIRS = 32
VARIANTS = (
    "medoids",
    "random:0",
    "random:1",
    "random:2",
    "oracle-greedy",
    "oracle-mean",
    "sketch:60:100",
)


def greedy_rows(E: np.ndarray, m: int, cand: np.ndarray) -> np.ndarray:
    """Positions of ``m`` rows among ``cand``, each explaining the most of what the rows chosen
    before leave of all rows of ``E`` (sum of squared projections)."""
    E = np.array(E, np.float64)
    pos: list[int] = []
    for _ in range(m):
        G = E[cand] @ E.T
        gain = (G**2).sum(1) / np.maximum((E[cand] ** 2).sum(1), 1e-12)
        gain[np.isin(cand, pos)] = -1.0
        j = int(cand[np.argmax(gain)])
        pos.append(j)
        u = E[j] / max(np.linalg.norm(E[j]), 1e-12)
        E -= np.outer(E @ u, u)
    return np.sort(np.array(pos, np.int64))


def residual(Y: np.ndarray, U: np.ndarray) -> np.ndarray:
    """The z-scored rows of ``Y`` minus their part in span(U, 1)."""
    B, _ = np.linalg.qr(np.hstack([U, np.ones((U.shape[0], 1))]))
    Z = au.zrows(Y)
    return Z - (Z @ B) @ B.T


def search(idx, S, DQ, DI, te) -> dict:
    m = au.AUTO(idx, prior=DQ, first=make_retriever("de", item_vectors=DI, query_vectors=DQ))
    rec = {}
    for b in BUDGETS:
        res = m.search(MatrixScorer(S), te.tolist(), budget=b, k=max(KS))
        for k in KS:
            rec[f"k{k}B{b}"] = float(topk_recall(S, te, res.indices, k).mean())
    return rec


def sketch_build(S, DQ, DI, tr, C, T, s, U, seed):
    """The ``sketch:T:S`` build (see the module text)."""
    N, n = S.shape[1], tr.size
    rng = np.random.default_rng([seed, 31])
    reader = au.IndexCallBudget(MatrixScorer(S), tr.tolist(), C)
    sub = np.sort(rng.choice(n, T, replace=False))
    items = np.sort(rng.choice(N, s, replace=False))
    Y = np.stack(reader.score_batch([int(tr[p]) for p in sub], [items] * T)).astype(np.float64)
    E = np.zeros((n, s))
    E[sub] = residual(Y, U[items])
    m = (C - T * s) // (N - s)
    pos = greedy_rows(E, int(m), sub)
    R = np.stack(reader.score_batch([int(tr[p]) for p in pos], [np.arange(N)] * len(pos)))
    rho_d, rho_r, rounds, first = au.FEW_ROWS
    Q = DQ[tr]
    idx = au.AutoIndex(
        DI, R, rho_d=rho_d, rho_r=rho_r, rounds=rounds, first_share=first,
        index_calls=reader.calls, row_vectors=Q[pos], prior_alpha=au.PRIOR_ALPHA,
        row_ids=[int(tr[p]) for p in pos], query_dirs=au.query_directions(Q, au.QUERY_DIRS),
    )  # fmt: skip
    # the learned prior's fitted queries: the row queries (their own search, no new entry) and
    # the other sketch queries on their sketch entries
    rec = au._Recorder(reader, tr.tolist())
    meth = au.AUTO(idx, prior=Q, first=make_retriever("de", item_vectors=DI, query_vectors=Q))
    meth.search(rec, pos.tolist(), budget=au.PARTIAL_ITEMS, k=10, seed=0)
    X, pen = idx.features().astype(np.float64), idx.penalties()
    others = [int(p) for p in sub if p not in set(pos.tolist())]
    vecs, deltas = [], []
    for q, p0 in zip(pos.tolist() + others, meth.priors(pos.tolist() + others), strict=True):
        if q in rec.seen:
            its, first_ = np.unique(np.concatenate(rec.seen[q][0]), return_index=True)
            sc = np.concatenate(rec.seen[q][1])[first_]
        else:
            its, sc = items, Y[list(sub).index(q)]
        v = np.asarray(Q[q], np.float64)
        delta = au.prior_correction(idx, X, pen, v, p0, its, sc)
        if delta is not None:
            vecs.append(v)
            deltas.append(delta)
    return replace(
        idx, prior_vectors=np.array(vecs, np.float32), prior_deltas=np.array(deltas, np.float32),
        partial_rows=len(others), index_calls=reader.calls, prior_ridge=au.PRIOR_RIDGE,
        prior_kernel_tau=au.PRIOR_KERNEL_TAU,
    )  # fmt: skip


def build(variant, S, DQ, DI, tr, C, U):
    """(index, scores the search reads, DE query vectors) of one variant."""
    if variant == "medoids" or variant.startswith("random:"):
        how, seed = (variant, 0) if variant == "medoids" else ("random", int(variant[7:]))
        reader = au.IndexCallBudget(MatrixScorer(S), tr.tolist(), C)
        idx = au.build_auto_index(
            reader, tr.tolist(), DI, DQ[tr], index_calls=C, seed=seed, row_choice=how
        )
        return idx, S, DQ
    if variant.startswith("sketch:"):
        T, s = (int(x) for x in variant.split(":")[1:])
        return sketch_build(S, DQ, DI, tr, C, T, s, U, seed=0), S, DQ
    choose = au.choose_rows
    try:
        if variant == "oracle-greedy":
            E = residual(S[tr].astype(np.float64), U)
            au.choose_rows = lambda Q, m, **kw: greedy_rows(E, m, np.arange(tr.size))
            Sx, DQx, trx, Cx = S, DQ, tr, C
        elif variant == "oracle-mean":
            mean = au.zrows(S[tr]).mean(0, keepdims=True).astype(np.float32)
            Sx = np.vstack([S, mean])
            DQx = np.vstack([DQ, DQ[tr].mean(0, keepdims=True)])
            trx, Cx = np.r_[tr, S.shape[0]], C + S.shape[1]  # the extra row is free
            au.choose_rows = lambda Q, m, **kw: np.r_[choose(Q[: tr.size], m - 1), tr.size]
        else:
            raise ValueError(f"unknown variant {variant!r}; expected one of {VARIANTS}")
        reader = au.IndexCallBudget(MatrixScorer(Sx), trx.tolist(), Cx)
        idx = au.build_auto_index(reader, trx.tolist(), DI, DQx[trx], index_calls=Cx, seed=0)
        return idx, Sx, DQx
    finally:
        au.choose_rows = choose


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--matrix", default=str(MATRIX))
    ap.add_argument("--pseudo", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--share", type=float, default=0.01, help="C / dense")
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS))
    ap.add_argument("--json", default=str(RESULTS / "auto_rowchoice.json"))
    args = ap.parse_args()
    mat = load_score_matrix(args.matrix)
    S, train = mat.scores.astype(np.float32), mat.train
    DQ, DI = mat.de_queries.astype(np.float32), mat.de_items.astype(np.float32)
    V = DI.astype(np.float64)
    U = np.linalg.svd(V - V.mean(0), full_matrices=False)[0][:, :ITEM_DIRS]
    rows = []
    print(f"{'split':<8} {'variant':>14} {'rows':>4} {'calls':>6}  " + " ".join(CELLS) + "   mean")
    for s in args.pseudo:
        perm = np.random.default_rng([s, 4242]).permutation(train)
        tr, te = np.sort(perm[PSEUDO_TEST:]), np.sort(perm[:PSEUDO_TEST])
        C = int(args.share * tr.size * S.shape[1])
        for v in args.variants:
            t0 = time.time()
            idx, Sx, DQx = build(v, S, DQ, DI, tr, C, U)
            rec = search(idx, Sx, DQx, DI, te)
            mean = float(np.mean([rec[c] for c in CELLS]))
            calls = int(idx.index_calls) - (S.shape[1] if v == "oracle-mean" else 0)
            row = {"split": f"pseudo{s}", "variant": v, "rows": int(idx.n_rows), "C": C,
                   "index_calls": calls, **rec, "mean": mean,
                   "seconds": round(time.time() - t0, 1)}  # fmt: skip
            rows.append(row)
            print(
                f"{row['split']:<8} {v:>14} {idx.n_rows:>4} {calls:>6}  "
                + " ".join(f"{rec[c]:>6.3f}" for c in CELLS)
                + f"  {mean:.4f}",
                flush=True,
            )
    write_rows(args.json, args.matrix, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
