"""Issue 29 at 1%: how ``auto``'s learned prior spends the index budget, on train rows only.

Pseudo splits of nfcorpus-minilm-gpu's 1,677 train rows (as ``bench/auto_onepct.py``: split s
holds out 300 train queries as pseudo-test rows, the index reads C = ``--dense-share`` (1%) x
1,377 x N entries of the other 1,377). Each build is ``crossknn.search.auto.build_auto_index``
with ``PARTIAL_SHARE`` (the share of C kept from the complete rows, which sets m) and ``items``
(the entries of a partial row) set; ``share = 0`` is the build before the learned prior
(partial_items 0). Each build with partial rows is then searched with each ``--priors`` way of
borrowing the fitted queries' corrections (field ``prior``):

- ``softmax:tau=T``: the softmax(T cos) average (``prior_ridge = 0``, the builds before the
  kernel ridge);
- ``kernel:tau=T,ridge=L``: the kernel ridge regression (``prior_ridge = L``,
  ``prior_kernel_tau = T``; the default build since it is ``kernel:tau=2,ridge=0.1``);
- variants measured here only (this file's ``_Variant``): ``top:P=P`` (uniform weights over the
  P fitted queries of highest cosine), ``topsoftmax:P=P`` (softmax(10 cos) over them),
  ``rowweight:w=W`` (softmax(10 cos) weights of the row queries' own corrections times W),
  ``scale:s=S`` (the softmax average times S), ``plusrow:alpha=A`` (the row prior, weight A,
  added on top of the softmax average) and ``residual:alpha=A`` (the row prior plus the softmax
  average of the corrections beyond each fitted query's own row prior).

Top-k-Recall@B, B in (50, 100, 200), k in (10, 50), DE first round, seed 0; the test rows are
never read. ``--append`` keeps the rows of the JSON already written (those with the same split,
build, budget and prior are replaced).

    .venv/bin/python bench/auto_partial.py [--splits 0 1 2] [--builds 0.04:100 ...]
        [--priors softmax:tau=10 kernel:tau=2,ridge=0.1 ...] [--dense-share 0.01] [--append]

About 20 s a build and 5 s a search of the three budgets on one core.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

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
# (0.08 gives the same 12 rows + 64 partial rows of 100 as 0.12)
BUILDS = [
    (0.0, 0),
    (0.04, 100),
    (0.04, 50),
    (0.04, 25),
    (0.08, 100),
    (0.12, 100),
    (0.2, 150),
    (0.27, 100),
]
PRIORS = ("softmax:tau=3", "softmax:tau=10", "kernel:tau=2,ridge=0.1")


def parse_prior(spec: str) -> tuple[str, dict]:
    """``"kind:a=1,b=2"`` -> ``("kind", {"a": 1.0, "b": 2.0})``."""
    kind, _, rest = spec.partition(":")
    known = ("softmax", "kernel", "top", "topsoftmax", "rowweight", "scale", "plusrow", "residual")
    if kind not in known:
        raise SystemExit(f"--priors: unknown kind {kind!r} in {spec!r}; expected one of {known}")
    try:
        kw = {k: float(v) for k, v in (p.split("=") for p in rest.split(",") if p)}
    except ValueError:
        raise SystemExit(f"--priors: expected KIND:NAME=NUMBER,...; got {spec!r}") from None
    return kind, kw


class _Variant(AUTO):
    """``auto`` over the same index and solve with a bench-only prior (see the docstring)."""

    def __init__(self, index, kind: str, kw: dict, **kwargs):
        super().__init__(index, **kwargs)
        W, _, C = index.prior_tables()
        self.kind, self.kw, self.W, self.C = kind, kw, W, C
        self.D = index.prior_deltas.astype(np.float64)
        d, m = index.dim, index.n_rows
        self.rv = np.asarray(index.row_vectors, np.float64)
        self.is_row = (W[:, None, :] == self.rv[None]).all(-1).any(1)
        if kind == "residual":  # each fitted query's correction beyond its own row prior
            for j in range(W.shape[0]):
                self.D[j, d : d + m] -= self._row_prior(W[j]) / self._spread(W[j])

    def _spread(self, v) -> float:
        return float(np.sqrt(max(float(v @ (self.C @ v)), 0.0)))

    @staticmethod
    def _cos(W, v):
        norms = np.maximum(np.linalg.norm(W, axis=1), 1e-12)
        return (W @ v) / (norms * max(np.linalg.norm(v), 1e-12))

    def _row_prior(self, v):
        c = self._cos(self.rv, v)
        w = np.exp(10.0 * (c - c.max()))
        return self.kw.get("alpha", 3.0) * self._spread(v) * w / w.sum()

    def _prior(self, v):
        d, m = self.index.dim, self.index.n_rows
        c = self._cos(self.W, v)
        w = np.exp(10.0 * (c - c.max()))
        if self.kind in ("top", "topsoftmax"):
            keep = np.argsort(-c)[: int(self.kw["P"])]
            mask = np.zeros_like(c)
            mask[keep] = 1.0
            w = mask if self.kind == "top" else w * mask
        elif self.kind == "rowweight":
            w = w * np.where(self.is_row, self.kw["w"], 1.0)
        p = self.kw.get("s", 1.0) * (self._spread(v) / w.sum()) * (w @ self.D)
        p[:d] += v
        if self.kind in ("plusrow", "residual"):
            p[d : d + m] += self._row_prior(v)
        return p

    def priors(self, queries):
        P = np.asarray(self.prior)
        return [self._prior(np.asarray(P[int(q)], np.float64)) for q in queries]


def search_with(idx, spec, DQ, de):
    kind, kw = parse_prior(spec)
    if kind == "softmax":
        return AUTO(replace(idx, prior_ridge=0.0, prior_tau=kw["tau"]), prior=DQ, first=de)
    if kind == "kernel":
        ix = replace(idx, prior_ridge=kw["ridge"], prior_kernel_tau=kw["tau"])
        return AUTO(ix, prior=DQ, first=de)
    return _Variant(replace(idx, prior_ridge=0.0, prior_tau=10.0), kind, kw, prior=DQ, first=de)


def _key(r) -> tuple:
    prior = r["prior"] if "prior" in r else f"softmax:tau={r['prior_tau']:g}"
    return (r["split"], r["partial_share"], r["partial_items"], r["index_calls_limit"], prior)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--matrix", default=str(MATRIX))
    ap.add_argument("--splits", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument(
        "--builds", nargs="+", default=[f"{s:g}:{i}" for s, i in BUILDS], help="SHARE:ITEMS ..."
    )
    ap.add_argument("--priors", nargs="+", default=list(PRIORS))
    ap.add_argument("--dense-share", type=float, default=0.01, help="C as a share of dense")
    ap.add_argument("--json", default=str(RESULTS / "auto_partial.json"))
    ap.add_argument("--append", action="store_true", help="keep the rows already in --json")
    args = ap.parse_args()
    try:
        builds = [(float(b.split(":")[0]), int(b.split(":")[1])) for b in args.builds]
    except (ValueError, IndexError):
        raise SystemExit(f"--builds: expected SHARE:ITEMS ...; got {args.builds}") from None
    for spec in args.priors:
        parse_prior(spec)
    mat = load_score_matrix(args.matrix)
    S, DQ, DI = mat.scores, mat.de_queries.astype(np.float32), mat.de_items.astype(np.float32)
    train, N = np.asarray(mat.train, np.int64), mat.n_items
    de = make_retriever("de", item_vectors=DI, query_vectors=DQ)
    rows = []
    print(f"{'split':<8} {'share':>5} {'items':>5} {'m':>3} {'P':>4} {'calls':>6} {'prior':<24}")
    for s in args.splits:
        perm = np.random.default_rng([s, 4242]).permutation(train)
        tr, te = np.sort(perm[300:]), np.sort(perm[:300])
        C = int(args.dense_share * tr.size * N)
        for share, items in builds:
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
            learned = idx.prior_deltas is not None
            for spec in args.priors if learned else [f"softmax:tau={auto_mod.PRIOR_TAU:g}"]:
                rec = recall(search_with(idx, spec, DQ, de), S, te)
                mean = float(np.mean(list(rec.values())))
                print(
                    f"pseudo{s:<2} {share:>5.2f} {items:>5} {idx.n_rows:>3} {idx.partial_rows:>4} "
                    f"{reader.calls:>6} {spec:<24} "
                    + " ".join(f"{rec[c]:.3f}" for c in CELLS)
                    + f"  mean={mean:.4f} [{time.perf_counter() - t0:.0f}s]",
                    flush=True,
                )
                kind, kw = parse_prior(spec)
                rows.append(
                    {
                        "split": f"pseudo{s}",
                        "partial_share": share,
                        "partial_items": items,
                        "rows": idx.n_rows,
                        "partial_rows": idx.partial_rows,
                        "prior": spec,
                        "prior_tau": kw.get("tau", 10.0) if kind == "softmax" else None,
                        "index_calls_limit": C,
                        "index_calls": int(reader.calls),
                        "recall": rec,
                        "mean": mean,
                    }
                )
    if args.append and Path(args.json).exists():
        new = {_key(r) for r in rows}
        kept = []
        for r in json.loads(Path(args.json).read_text())["rows"]:
            if "prior" not in r:  # rows before the field
                r["prior"] = f"softmax:tau={r['prior_tau']:g}"
            if _key(r) not in new:
                kept.append(r)
        rows = kept + rows
    write_rows(args.json, args.matrix, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
