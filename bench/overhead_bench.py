"""Non-CE time per query of a search: the old Python round loop against the C++ loop, side by side.

    .venv/bin/python bench/overhead_bench.py [--matrix ../shared/matrices/nfcorpus-minilm-gpu]
        [--queries 100] [--budgets 100 500] [--rounds 5]

The product path is ``RoundMethod.search`` (what ``Searcher.search``, ``eval`` and ``serve`` call
for each group of queries) plus the result assembly ``Searcher.search`` does (ids, texts), one
query at a time, with a **null CE** (the matrix's own scores: no model) and the DE query vector
given (the DE first stage reads ``de_queries.npy``; DE encoding is not timed). ``loop=python`` is
the loop every search ran before (``tests/ref_rounds.py``: numpy solves for ``auto``), ``loop=cpp``
today's (``crossknn.search.engine.search_rounds`` -> ``_core.run_search``). For each query the two
loops run back to back (the machine is shared: same load for both).

Per query: ``other`` = wall time - time inside the null CE, split into ``loop`` (the round loop:
planning, solves, per-round top-k, final ranking and, for the C++ loop, the binding and the
per-round Python callback outside the CE) and ``assembly`` (turning the result into hits).
Methods: auto (index of 10% of |train| x N train CE entries, 5 rounds), axn (DE first round,
prior mix 0.5, CE score map), adacur (dense CUR index of every train row: 1,677 features on
nfcorpus, random first round), rnr (DE top-B). Writes bench/results/overhead_bench.json: rows
``{matrix, method, budget, rounds, loop, other_ms_p50, other_ms_p99, ...}``.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from _common import REPO, RESULTS, SHARED, machine, utc_now, write_json

sys.path.insert(0, str(REPO / "tests"))  # the reference loop lives with the tests

from crossknn.matrix import load_score_matrix  # noqa: E402
from crossknn.retrievers import make_retriever  # noqa: E402
from crossknn.score_map import ScoreMap  # noqa: E402
from crossknn.scorers import MatrixScorer  # noqa: E402
from crossknn.search import CurIndex, make_method  # noqa: E402
from crossknn.search.auto import AUTO, IndexCallBudget, build_auto_index  # noqa: E402
from ref_rounds import search as python_loop  # noqa: E402

GOALS_MS = {"auto": 1.0, "axn": 1.0, "adacur": 2.0}  # p50 at B = 100 (#32)


class NullCE:
    """The CE of the bench: the matrix's scores (no model), timing its own work."""

    def __init__(self, scores) -> None:
        self.inner = MatrixScorer(scores)
        self.n_items = self.inner.n_items
        self.seconds = 0.0

    def score_batch(self, queries, items):
        t0 = time.perf_counter()
        out = self.inner.score_batch(queries, items)
        self.seconds += time.perf_counter() - t0
        return out

    def score(self, query, items):
        return self.score_batch([query], [items])[0]


def methods(m, rounds: int):
    de = make_retriever("de", item_vectors=m.de_items, query_vectors=m.de_queries)
    out = {}
    t0 = time.perf_counter()
    reader = IndexCallBudget(
        MatrixScorer(m.scores), m.train.tolist(), int(0.1 * m.train.size * m.n_items)
    )
    idx = build_auto_index(
        reader, m.train.tolist(), m.de_items, m.de_queries[m.train], index_calls=reader.limit
    )
    print(f"auto index: {idx.meta()} in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    out["auto"] = AUTO(idx, prior=m.de_queries, first=de, rounds=rounds)
    smap = ScoreMap.fit(m.scores[m.train], m.de_queries[m.train] @ m.de_items.T)
    out["axn"] = make_method(
        "axn",
        item_vectors=m.de_items,
        first=de,
        prior=m.de_queries,
        mix=0.5,
        score_map=smap,
        rounds=rounds,
    )
    cur = CurIndex.from_matrix(m.scores, m.train, test_rows=m.test)
    out["adacur"] = make_method("adacur", cur=cur, rounds=rounds)
    out["rnr"] = make_method("rnr", first=de, n_items=m.n_items)
    return out


def assemble(res, item_ids):
    """What Searcher.search does with a result: hits with ids (and scores) per query."""
    hits = []
    for i in range(res.indices.shape[0]):
        keep = res.indices[i] >= 0
        idx = res.indices[i][keep]
        hits.append(([item_ids[j] for j in idx], res.scores[i][keep], int(res.ce_calls[i])))
    return hits


def one(loop: str, method, ce: NullCE, q: int, budget: int, item_ids) -> dict:
    ce.seconds = 0.0
    t0 = time.perf_counter()
    if loop == "cpp":
        res = method.search(ce, [q], budget=budget, k=10, seed=0)
    else:
        res = python_loop(method, ce, [q], budget=budget, k=10, seed=0)
    t1 = time.perf_counter()
    assemble(res, item_ids)
    t2 = time.perf_counter()
    total = t2 - t0
    return {
        "other": (total - ce.seconds) * 1e3,
        "loop": (t1 - t0 - ce.seconds) * 1e3,
        "assembly": (t2 - t1) * 1e3,
        "ce": ce.seconds * 1e3,
        "items": res.scored_items[0],
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--matrix", default=str(SHARED / "matrices" / "nfcorpus-minilm-gpu"))
    ap.add_argument("--queries", type=int, default=100, help="test queries timed (default 100)")
    ap.add_argument("--budgets", type=int, nargs="+", default=[100, 500])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--methods", nargs="+", default=["auto", "axn", "adacur", "rnr"])
    ap.add_argument("--out", default=str(RESULTS / "overhead_bench.json"))
    args = ap.parse_args(argv)

    m = load_score_matrix(args.matrix)
    name = m.path.name
    item_ids = list(m.item_ids)
    ms = methods(m, args.rounds)
    queries = m.test[: args.queries].tolist()
    ce = NullCE(m.scores)
    rows = []
    for meth in args.methods:
        method = ms[meth]
        for budget in args.budgets:
            # warm-up (features, caches) for both loops
            for loop in ("python", "cpp"):
                one(loop, method, ce, queries[0], budget, item_ids)
            rec = {"python": [], "cpp": []}
            same = 0
            for q in queries:
                a = one("python", method, ce, q, budget, item_ids)
                b = one("cpp", method, ce, q, budget, item_ids)
                rec["python"].append(a)
                rec["cpp"].append(b)
                same += int(np.array_equal(a["items"], b["items"]))
            for loop in ("python", "cpp"):
                r = rec[loop]

                def pct(key, p, r=r):
                    return round(float(np.percentile([x[key] for x in r], p)), 3)

                rows.append(
                    {
                        "matrix": name,
                        "method": meth,
                        "budget": budget,
                        "rounds": getattr(method, "rounds", 1),
                        "loop": loop,
                        "other_ms_p50": pct("other", 50),
                        "other_ms_p99": pct("other", 99),
                        "loop_ms_p50": pct("loop", 50),
                        "assembly_ms_p50": pct("assembly", 50),
                        "ce_ms_p50": pct("ce", 50),
                        "n_queries": len(queries),
                        "same_items_as_python": same,
                    }
                )
            py, cp = rows[-2], rows[-1]
            print(
                f"{name} {meth:7s} B={budget:4d}  other p50/p99 ms: python "
                f"{py['other_ms_p50']:7.3f}/{py['other_ms_p99']:7.3f}  cpp "
                f"{cp['other_ms_p50']:7.3f}/{cp['other_ms_p99']:7.3f}  ratio "
                f"{cp['other_ms_p50'] / max(py['other_ms_p50'], 1e-9):.2f}  "
                f"(assembly {cp['assembly_ms_p50']:.3f} ms; same items {same}/{len(queries)})",
                flush=True,
            )
    goals = []
    for r in rows:
        if r["loop"] != "cpp":
            continue
        old = next(
            x
            for x in rows
            if x["loop"] == "python" and (x["method"], x["budget"]) == (r["method"], r["budget"])
        )
        g = {"method": r["method"], "budget": r["budget"], "ratio_p50": None}
        g["ratio_p50"] = round(r["other_ms_p50"] / max(old["other_ms_p50"], 1e-9), 3)
        if r["budget"] == 100 and r["method"] in GOALS_MS:
            g["goal_ms"] = GOALS_MS[r["method"]]
            g["met"] = r["other_ms_p50"] <= GOALS_MS[r["method"]]
        if r["budget"] == 500:
            g["goal_ratio"] = 1 / 3
            g["met_ratio"] = g["ratio_p50"] <= 1 / 3
        goals.append(g)
    write_json(
        args.out,
        {
            "meta": machine(
                when=utc_now(),
                command=" ".join(["python", "bench/overhead_bench.py", *(argv or sys.argv[1:])]),
                note="other = wall - null-CE time per query, one query at a time; loop=python is "
                "the reference loop of tests/ref_rounds.py (today's code before the C++ loop), "
                "loop=cpp the product path; both back to back per query",
            ),
            "rows": rows,
            "goals": goals,
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
