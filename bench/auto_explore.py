"""Issue 17: `auto` = hybrid-feature rounds (DE item vectors + z-scored CE rows of m anchor train
queries) with a per-query prior-centred block ridge and a free per-query slope on the DE prior.

Offline (train rows only, through a counting TrainReader that refuses more than C entries):
  m = min(C // N, n_train) full train rows, chosen uniformly at random (seed) among the train rows;
  features X = [DE items (N x d) | zrows(R_m)^T (N x m) | 1];
  hyper-parameters (rho_D, rho_R) chosen on the m full rows by K-fold cross-validation (rows of a
  fold are searched with features from the other rows only; their exact top-k is known because the
  rows are fully read), objective = mean Top-k-Recall over B in (50,100,200), k in (10,50);
  ties -> the earlier candidate in the grid order (rounds 10 before 5, rho 0.3 first).
  m == 0 or 1: defaults (rho_D = 0.1, rho_R = 0.1).
Online (per query, through MatrixScorer/BudgetedScorer as in the harness):
  first round = DE top B/5, then 4 TopK rounds over X u, R = 5 rounds, final = all scored items;
  u = c * p0 + w, p0 = [DE query, 0, 0], (w, c) = ridge LS of the scored CE scores on
  [X_A, X_A p0] with penalties rho (rho_D on the DE block, rho_R on the anchor block, 1e-6 on the
  intercept and on c).

Exploration for issue 17 (open): not yet a library method. The per-query prior below relies on
run_rounds calling ``query_embedding`` over the states in query order each step; the library
version needs a per-query prior hook in the round loop instead.

Usage: python bench/auto_explore.py [--seeds 0 1 2] [--fracs 0 0.1] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from crossknn.core import ItemFeatures
from crossknn.retrievers import make_retriever
from crossknn.score_map import ScoreMap
from crossknn.scorers import MatrixScorer
from crossknn.search import ADACUR, AXN, RNR, CurIndex, Step, split_sizes
from crossknn.search.methods import RoundMethod, _round_plan
from crossknn.topk import topk_recall

D = str(Path(__file__).resolve().parents[1].parent / "shared" / "matrices" / "cisi-minilm") + "/"
BUDGETS = (50, 100, 200)
KS = (10, 50)


def load():
    S = np.load(D + "scores.npy").astype(np.float32)
    DQ = np.load(D + "de_queries.npy").astype(np.float32)
    DI = np.load(D + "de_items.npy").astype(np.float32)
    sp = json.loads(Path(D + "splits.json").read_text())
    return S, DQ, DI, np.array(sp["train"], np.int64), np.array(sp["test"], np.int64)


class TrainReader:
    """Counting reader over train rows: each distinct (row, item) costs one call; > C refused."""

    def __init__(self, S, train_rows, C):
        self.S, self.train, self.C = S, set(int(r) for r in train_rows), int(C)
        self.seen: dict[tuple[int, int], float] = {}

    def read(self, row, items):
        row = int(row)
        if row not in self.train:
            raise PermissionError(f"row {row} is not a train row")
        items = np.asarray(items, np.int64).ravel()
        new = [i for i in items.tolist() if (row, i) not in self.seen]
        if len(self.seen) + len(new) > self.C:
            raise RuntimeError(f"train budget C={self.C} exceeded ({len(self.seen)}+{len(new)})")
        for i in new:
            self.seen[(row, i)] = float(self.S[row, i])
        return np.array([self.seen[(row, i)] for i in items.tolist()], np.float32)

    @property
    def calls(self):
        return len(self.seen)


class PriorRidge(RoundMethod):
    """Rounds over item features X (N x d); the query embedding is the prior-centred block ridge

        u = p + argmin_w ||X_A w - (a - X_A p)||^2 + sum_j rho_j w_j^2

    (rho per feature; p = the query's prior embedding).  Targets are raw CE scores.
    Ranking of candidates: X u (ItemFeatures.top_k over X).
    """

    name = "prior-ridge"

    def __init__(self, X, rho, priors, *, rounds=5, first="random", first_frac=None):
        X = np.ascontiguousarray(X, np.float32)
        super().__init__(first=first, n_items=X.shape[0])
        self.features = ItemFeatures(X)
        self.X64 = X.astype(np.float64)
        self.rho = np.asarray(rho, np.float64)
        self.P = priors  # callable q -> (d,) or array indexed by row
        self.rounds = rounds
        self.first_frac = first_frac
        self._q = None

    def plan(self, budget):
        if self.first_frac is None:
            return _round_plan(budget, self.rounds, 0)
        n1 = max(1, int(round(self.first_frac * budget)))
        rest = split_sizes(budget - n1, self.rounds - 1)
        return [Step("first", n1)] + [Step("round", s) for s in rest]

    def priors(self, queries):
        self._q = list(queries)
        return [None] * len(queries)

    def search(self, scorer, queries, **kw):
        self._prior_of = {}
        for q in queries:
            self._prior_of[int(q)] = np.asarray(
                self.P(q) if callable(self.P) else self.P[int(q)], np.float64
            )
        self._order = list(queries)
        self._i = 0
        return super().search(scorer, queries, **kw)

    def query_embedding(self, state):
        # run_rounds calls query_embedding over states in query order each step
        q = self._order[self._i % len(self._order)]
        self._i += 1
        p = self._prior_of[int(q)]
        A = state.items
        if A.size == 0:
            return p
        XA = self.X64[A]
        r = state.targets - XA @ p
        # Woodbury: w = L^-1 X^T (X L^-1 X^T + I)^-1 r
        Li = 1.0 / self.rho
        XL = XA * Li
        G = XL @ XA.T + np.eye(A.size)
        w = XL.T @ np.linalg.solve(G, r)
        return p + w


def evaluate(method, S, rows, budgets=BUDGETS, ks=KS, seed=0):
    sc = MatrixScorer(S)
    out = {}
    for B in budgets:
        res = method.search(sc, [int(r) for r in rows], budget=B, k=max(ks), seed=seed)
        assert int(res.ce_calls.max()) <= B
        for k in ks:
            out[(B, k)] = float(topk_recall(S, rows, res.indices, k).mean())
    return out


def fmt(name, t, budgets=BUDGETS, ks=KS):
    cells = " ".join(f"{t[(B, k)]:.3f}" for k in ks for B in budgets)
    return f"{name:<40} {cells}  mean={np.mean(list(t.values())):.4f}"


HEAD = f"{'method':<40} " + " ".join(f"k{k}B{B}" for k in KS for B in BUDGETS)


class FreeSlope(PriorRidge):
    """PriorRidge where the prior is c * p0 with a per-query free scale c (penalty rho_c, centred at
    c0): the design gets the extra column X_A p0; u = c p0 + w. No global CE->DE affine needed."""

    def __init__(self, X, rho, priors, *, c0=0.0, rho_c=1e-6, **kw):
        super().__init__(X, rho, priors, **kw)
        self.c0, self.rho_c = float(c0), float(rho_c)

    def query_embedding(self, state):
        q = self._order[self._i % len(self._order)]
        self._i += 1
        p0 = self._prior_of[int(q)]
        A = state.items
        if A.size == 0:
            return self.c0 * p0
        XA = self.X64[A]
        s = XA @ p0  # prior scores of the scored items
        r = state.targets - self.c0 * s
        Z = np.hstack([XA, s[:, None]])
        Li = np.concatenate([1.0 / self.rho, [1.0 / self.rho_c]])
        ZL = Z * Li
        G = ZL @ Z.T + np.eye(A.size)
        w = ZL.T @ np.linalg.solve(G, r)
        return w[:-1] + (self.c0 + w[-1]) * p0


GRID_D = (0.3, 0.1, 0.03)
GRID_R = (0.3, 0.1, 1.0)
GRID_ROUNDS = (10, 5)
# used when fewer than 2 full rows can be read (no CV possible); chosen on a train-only pseudo
# split of cisi (explore6.py: 42 pseudo-train / 20 pseudo-test train rows)
DEFAULT = (0.3, 0.3, 10)


def zrows(R):
    R = np.asarray(R, np.float64)
    sd = R.std(1, keepdims=True)
    return (R - R.mean(1, keepdims=True)) / np.where(sd > 0, sd, 1.0)


def make_auto(DI, DQ, R_anchor, rhoD, rhoR, first, rounds=5):
    N, d = DI.shape
    m = 0 if R_anchor is None else R_anchor.shape[0]
    blocks = [DI] + ([zrows(R_anchor).T] if m else []) + [np.ones((N, 1))]
    X = np.hstack(blocks).astype(np.float32)
    rho = np.r_[np.full(d, rhoD), np.full(m, rhoR), 1e-6]
    P0 = np.hstack([DQ, np.zeros((DQ.shape[0], m + 1))])
    return FreeSlope(X, rho, P0, c0=0.0, rho_c=1e-6, first=first, rounds=rounds)


def cv_choose(S_rows_full, rows, DI, DQ, first, *, n_folds=6, seed=0, max_dev=30):
    """(rhoD, rhoR), table: K-fold CV over the fully read anchor rows (train rows only)."""
    m = len(rows)
    rng = np.random.default_rng([seed, 17])
    order = rng.permutation(m)[:max_dev] if m > max_dev else rng.permutation(m)
    folds = np.array_split(order, min(n_folds, len(order)))
    # dev scorer: a matrix holding only the anchor rows (their positions are the query ids)
    table = {}
    for nr in GRID_ROUNDS:
        for rD in GRID_D:
            for rR in GRID_R:
                recs = []
                for f in folds:
                    keep = np.setdiff1d(np.arange(m), f)
                    meth = make_auto(
                        DI, DQ[rows], S_rows_full[keep], rD, rR, first_dev(first, rows), rounds=nr
                    )
                    t = evaluate(meth, S_rows_full, f)
                    recs.append((len(f), np.mean(list(t.values()))))
                table[(rD, rR, nr)] = sum(n * r for n, r in recs) / sum(n for n, _ in recs)
    best = max(table, key=lambda v: (round(table[v], 9), -list(table).index(v)))
    return best, table


class first_dev:
    """The DE retriever for dev queries addressed by their position among the anchor rows."""

    def __init__(self, de, rows):
        self.de, self.rows = de, np.asarray(rows)
        self.n_items = de.n_items if hasattr(de, "n_items") else None

    def retrieve(self, queries, n):
        return self.de.retrieve([int(self.rows[int(q)]) for q in queries], n)


def build_auto(S, train, DI, DQ, C, de, *, seed=0, log=print):
    """Reads at most C train entries through a counting reader; returns (method, info)."""
    reader = TrainReader(S, train, C)
    N = DI.shape[0]
    m = int(min(C // N, len(train)))
    rng = np.random.default_rng([seed, 1717])
    rows = np.sort(rng.choice(train, m, replace=False)) if m else np.empty(0, np.int64)
    R = np.stack([reader.read(r, np.arange(N)) for r in rows]) if m else None
    if m >= 2:
        (rD, rR, nr), table = cv_choose(R, rows, DI, DQ, de, seed=seed)
    else:
        (rD, rR, nr), table = DEFAULT, None
    info = {
        "C": C,
        "m": m,
        "calls": reader.calls,
        "rhoD": rD,
        "rhoR": rR,
        "rounds": nr,
        "cv": None
        if table is None
        else {",".join(map(str, k)): round(v, 4) for k, v in table.items()},
    }
    return make_auto(DI, DQ, R, rD, rR, de, rounds=nr), info


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--fracs", type=float, nargs="+", default=[0, 0.01, 0.05, 0.10, 1.0])
    ap.add_argument("--json", default=str(Path(__file__).parent / "results" / "auto_explore.json"))
    args = ap.parse_args()
    S, DQ, DI, train, test = load()
    N = S.shape[1]
    de = make_retriever("de", item_vectors=DI, query_vectors=DQ)
    dense = len(train) * N
    out = {"rows": []}
    print(HEAD)
    t = evaluate(ADACUR(CurIndex.from_matrix(S, train, test_rows=test), first=de), S, test)
    print(fmt("ADACUR dense (DE first, R=5)", t))
    out["rows"].append(("adacur", dense, t))
    smap = ScoreMap.fit(S[train], DQ[train] @ DI.T)
    t = evaluate(AXN(DI, first=de, prior=DQ, mix=0.5, score_map=smap), S, test)
    print(fmt("AXN over DE (lambda 0.5)", t))
    out["rows"].append(("axn-de", dense, t))
    t = evaluate(RNR(de, n_items=N), S, test)
    print(fmt("RNR DE", t))
    out["rows"].append(("rnr-de", 0, t))
    sys.stdout.flush()
    for frac in args.fracs:
        C = int(round(frac * dense))
        for seed in args.seeds if C >= 2 * N else args.seeds[:1]:
            t0 = time.time()
            meth, info = build_auto(S, train, DI, DQ, C, de, seed=seed)
            t = evaluate(meth, S, test)
            print(
                fmt(
                    f"auto C={C} m={info['m']} s{seed} "
                    f"rho=({info['rhoD']},{info['rhoR']}) R={info['rounds']}",
                    t,
                ),
                f"[{time.time() - t0:.0f}s, {info['calls']} calls]",
            )
            sys.stdout.flush()
            out["rows"].append(("auto", C, t, seed, info))
    ser = [
        {
            "method": r[0],
            "C": r[1],
            "recall": {f"k{k}B{B}": v for (B, k), v in r[2].items()},
            **({"seed": r[3], "info": r[4]} if len(r) > 3 else {}),
        }
        for r in out["rows"]
    ]
    Path(args.json).write_text(json.dumps(ser, indent=1) + "\n")


if __name__ == "__main__":
    main()
