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
per-round Python callback outside the CE) and ``assembly`` (turning the result into hits). For
the C++ loop the core's own timers (``CROSSKNN_PROFILE=1``, ``_core.search_profile``) split the
loop further, per query: ``cpp_solve_ms`` (solves), ``cpp_topk_ms`` (per-round top-k /
sampling), ``cpp_update_ms`` (solver updates with the new scores, score checks),
``callback_ms`` (the per-step Python callback outside the CE), ``cpp_other_ms`` (first items:
the DE first stage's top-k runs in the loop; budget checks, final ranking) and ``python_ms``
(everything outside the core's phases: ``search_rounds`` — the plan, the first stage's query
vectors, the priors — and the binding). ``loop=cpp-noprefilter`` is the C++ loop with the exact
top-k prefilter of the item matrices turned off (``Features.prefilter``), run next to the others
for every query: what the prefilter alone saves; ``loop=cpp-nocache`` the same with the item Gram
caches unused (``Features.gram``): what they save. ``loop=cpp-consecutive`` is the product
path again, after those, over all the queries one after another, as a service runs searches: in
the loops above the reference loop and the variants run between two product queries and leave
the product's data (the int8 copies, the prior's tables) out of the core's L2 cache every time.
Before timing, each method's caches are built
as ``serve``'s warm-up builds them (``method.prepare(budget)``; ``--no-prepare``: not).
Methods: auto (index of 10% of |train| x N train CE entries, 5 rounds), axn (DE first round,
prior mix 0.5, CE score map), adacur (dense CUR index of every train row: 1,677 features on
nfcorpus, random first round), rnr (DE top-B). Writes bench/results/overhead_bench.json: rows
``{matrix, method, budget, rounds, loop, other_ms_p50, other_ms_p99, ...}``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

from _common import REPO, RESULTS, SHARED, machine, utc_now, write_json

sys.path.insert(0, str(REPO / "tests"))  # the reference loop lives with the tests
os.environ.setdefault("CROSSKNN_PROFILE", "1")  # the core's phase timers (read at its first search)

from crossknn import _core  # noqa: E402
from crossknn.matrix import load_score_matrix  # noqa: E402
from crossknn.retrievers import make_retriever  # noqa: E402
from crossknn.score_map import ScoreMap  # noqa: E402
from crossknn.scorers import MatrixScorer  # noqa: E402
from crossknn.search import CurIndex, make_method  # noqa: E402
from crossknn.search.auto import AUTO, IndexCallBudget, build_auto_index  # noqa: E402
from ref_rounds import search as python_loop  # noqa: E402

GOALS_MS = {"auto": 1.0, "axn": 1.0, "adacur": 2.0}  # p50 at B = 100 (#32)
# "today's" of #32's B = 500 goal: the product path before #32 (the Python round loop), measured
# by this bench on 2026-11-26 04:30 UTC at load 0.5 (docs/engine.md, "before: python")
PRE32_B500_MS = {"auto": 46.09, "axn": 22.70, "adacur": 86.92, "rnr": 1.08}


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


def methods(m, rounds: int, wanted=("auto", "axn", "adacur", "rnr")):
    de = make_retriever("de", item_vectors=m.de_items, query_vectors=m.de_queries)
    out = {}
    if "auto" in wanted:
        out["auto"] = auto_method(m, de, rounds)
    out.update(other_methods(m, de, rounds))
    return out


def auto_method(m, de, rounds: int):
    t0 = time.perf_counter()
    reader = IndexCallBudget(
        MatrixScorer(m.scores), m.train.tolist(), int(0.1 * m.train.size * m.n_items)
    )
    idx = build_auto_index(
        reader, m.train.tolist(), m.de_items, m.de_queries[m.train], index_calls=reader.limit
    )
    print(f"auto index: {idx.meta()} in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return AUTO(idx, prior=m.de_queries, first=de, rounds=rounds)


def other_methods(m, de, rounds: int):
    out = {}
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


def core_features(method, budget: int) -> list:
    """The core Features objects a search of ``method`` reads (rounds and a dense first stage)."""
    out = []
    for f in (method.features_for(budget), getattr(method.first, "features", None)):
        if f is not None and hasattr(f, "_f"):
            out.append(f._f)
    return out


PHASES = ("solve", "select", "append", "score", "first", "check", "final")


def one(loop: str, method, ce: NullCE, q: int, budget: int, item_ids) -> dict:
    feats = core_features(method, budget) if loop != "python" else []
    for f in feats:
        f.prefilter = loop != "cpp-noprefilter"
        f.gram = loop != "cpp-nocache"
    ce.seconds = 0.0
    _core.search_profile(True)
    t0 = time.perf_counter()
    if loop != "python":
        res = method.search(ce, [q], budget=budget, k=10, seed=0)
    else:
        res = python_loop(method, ce, [q], budget=budget, k=10, seed=0)
    t1 = time.perf_counter()
    prof = _core.search_profile(True)
    assemble(res, item_ids)
    t2 = time.perf_counter()
    for f in feats:
        f.prefilter = True
        f.gram = True
    total = t2 - t0
    ph = {k: prof[k] * 1e3 for k in PHASES}
    core = sum(ph.values())
    return {
        "other": (total - ce.seconds) * 1e3,
        "loop": (t1 - t0 - ce.seconds) * 1e3,
        "assembly": (t2 - t1) * 1e3,
        "ce": ce.seconds * 1e3,
        "cpp_solve": ph["solve"],
        "cpp_topk": ph["select"],
        "cpp_update": ph["append"],
        "callback": max(0.0, ph["score"] - ce.seconds * 1e3),
        "cpp_other": ph["first"] + ph["check"] + ph["final"],
        "python": (t1 - t0) * 1e3 - core,
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
    ap.add_argument(
        "--no-prepare",
        action="store_true",
        help="do not build the engine's caches first (the item Gram caches: Searcher.prepare, "
        "what serve's warm-up does); they are then built, or not, as a search goes",
    )
    args = ap.parse_args(argv)

    m = load_score_matrix(args.matrix)
    name = m.path.name
    item_ids = list(m.item_ids)
    ms = methods(m, args.rounds, args.methods)
    queries = m.test[: args.queries].tolist()
    ce = NullCE(m.scores)
    rows = []
    loops = ("python", "cpp", "cpp-noprefilter", "cpp-nocache")
    load_before = [round(x, 2) for x in os.getloadavg()]
    for meth in args.methods:
        method = ms[meth]
        for budget in args.budgets:
            prepared = [] if args.no_prepare else method.prepare(budget)
            # warm-up (features, the prefilter's copies, caches) for every loop
            for loop in loops:
                for _ in range(2):
                    one(loop, method, ce, queries[0], budget, item_ids)
            rec = {loop: [] for loop in loops}
            same = dict.fromkeys(loops, 0)
            for q in queries:  # the loops back to back for each query: the same load for all
                for loop in loops:
                    rec[loop].append(one(loop, method, ce, q, budget, item_ids))
                    same[loop] += int(
                        np.array_equal(rec["python"][-1]["items"], rec[loop][-1]["items"])
                    )
            # the product path alone, one query after another (as a service runs searches): the
            # loop above runs the reference loop and the variants between two product queries,
            # which leaves the product's data out of the core's L2 cache for every query
            rec["cpp-consecutive"] = [
                one("cpp", method, ce, q, budget, item_ids) for q in [queries[0], *queries]
            ][1:]
            same["cpp-consecutive"] = sum(
                int(np.array_equal(a["items"], b["items"]))
                for a, b in zip(rec["python"], rec["cpp-consecutive"], strict=True)
            )
            for loop in (*loops, "cpp-consecutive"):
                r = rec[loop]

                def pct(key, p, r=r):
                    return round(float(np.percentile([x[key] for x in r], p)), 3)

                row = {
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
                    "same_items_as_python": same[loop],
                    "caches_prepared": prepared,
                }
                if loop != "python":
                    for key in ("cpp_solve", "cpp_topk", "cpp_update", "callback", "cpp_other"):
                        row[f"{key}_ms_p50"] = pct(key, 50)
                    row["python_ms_p50"] = pct("python", 50)
                rows.append(row)
            py, cp, nf, nc, cc = rows[-5], rows[-4], rows[-3], rows[-2], rows[-1]
            print(
                f"{name} {meth:7s} B={budget:4d}  other p50/p99 ms: python "
                f"{py['other_ms_p50']:7.3f}/{py['other_ms_p99']:7.3f}  cpp "
                f"{cp['other_ms_p50']:7.3f}/{cp['other_ms_p99']:7.3f}  consecutive "
                f"{cc['other_ms_p50']:7.3f}/{cc['other_ms_p99']:7.3f}  ratio "
                f"{cp['other_ms_p50'] / max(py['other_ms_p50'], 1e-9):.2f}  "
                f"(no prefilter {nf['other_ms_p50']:.3f}; no cache {nc['other_ms_p50']:.3f}; "
                f"solve {cp['cpp_solve_ms_p50']:.3f} "
                f"top-k {cp['cpp_topk_ms_p50']:.3f} update {cp['cpp_update_ms_p50']:.3f} "
                f"callback {cp['callback_ms_p50']:.3f} python {cp['python_ms_p50']:.3f} "
                f"assembly {cp['assembly_ms_p50']:.3f}; same items {same['cpp']}/"
                f"{same['cpp-nocache']} of {len(queries)}; caches {prepared})",
                flush=True,
            )
    goals = []
    for r in rows:
        if r["loop"] not in ("cpp", "cpp-consecutive"):
            continue
        old = next(
            x
            for x in rows
            if x["loop"] == "python" and (x["method"], x["budget"]) == (r["method"], r["budget"])
        )
        g = {"method": r["method"], "budget": r["budget"], "loop": r["loop"], "ratio_p50": None}
        g["ratio_p50"] = round(r["other_ms_p50"] / max(old["other_ms_p50"], 1e-9), 3)
        if r["budget"] == 100 and r["method"] in GOALS_MS:
            g["goal_ms"] = GOALS_MS[r["method"]]
            g["met"] = r["other_ms_p50"] <= GOALS_MS[r["method"]]
        if r["budget"] == 500:
            g["goal_ratio"] = 1 / 3
            g["met_ratio"] = g["ratio_p50"] <= 1 / 3  # against the reference loop of this run
            if r["method"] in PRE32_B500_MS:  # against the product path before #32
                base = PRE32_B500_MS[r["method"]]
                g["pre32_ms"] = base
                g["ratio_vs_pre32"] = round(r["other_ms_p50"] / base, 3)
                g["met_vs_pre32"] = r["other_ms_p50"] <= base / 3
        goals.append(g)
    write_json(
        args.out,
        {
            "meta": machine(
                when=utc_now(),
                command=" ".join(["python", "bench/overhead_bench.py", *(argv or sys.argv[1:])]),
                note="other = wall - null-CE time per query, one query at a time; loop=python is "
                "the reference loop of tests/ref_rounds.py (the code before the C++ loop), "
                "loop=cpp the product path, loop=cpp-noprefilter the product path with the top-k "
                "prefilter off, loop=cpp-nocache with the item Gram caches off (their use, not "
                "their memory); caches_prepared: what method.prepare(budget) built first (as "
                "serve's warm-up); all back to back per query; *_ms_p50 phase columns from the "
                "core's CROSSKNN_PROFILE timers; loop=cpp-consecutive: the product path over all "
                "the queries one after another, after the interleaved loops",
                load_average_before=load_before,
            ),
            "rows": rows,
            "goals": goals,
        },
    )
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["cpp-index"]:  # the C++ searcher of an index folder (bench/_cpp_index.py)
        from _cpp_index import main as cpp_index

        raise SystemExit(cpp_index(sys.argv[2:]))
    if sys.argv[1:2] == ["frameworks"]:  # what a framework adapter adds (bench/_frameworks.py)
        from _frameworks import main as frameworks

        raise SystemExit(frameworks(sys.argv[2:]))
    raise SystemExit(main())
