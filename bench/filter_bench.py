"""Filtered search (issue 53): recall and cost of searches within a subset of the items.

    .venv/bin/python bench/filter_bench.py                  # every part (~30 min on 2 cores)
    .venv/bin/python bench/filter_bench.py --part matrices  # cisi + nfcorpus filters, tombstones
    .venv/bin/python bench/filter_bench.py --part scale     # 10^6 items, IVF rounds (~15 min)
    .venv/bin/python bench/filter_bench.py fuzz     # the filter language against an oracle
    .venv/bin/python bench/filter_bench.py tenant   # one tenant's request never hurts another

``matrices``: on each shared score matrix (``cisi-minilm``, ``nfcorpus-minilm-gpu``) a corpus
index is built the way ``crossknn build --train-queries`` builds one (the default index budget's
rows of train queries, the default method ``auto``), with the CE and DE standing in by the
matrix: every CE score is the matrix's exact score of the embedded CE, every DE vector its stored
one. Each item gets two metadata fields: ``r``, a uniform random number (seeded), and
``cluster``, its k-means cluster of the DE item vectors (200 clusters). Each test query is
searched (B = 100, k = 10, through ``Searcher.search(filter=...)``: the filter language, the
masks, the engine) with filters of three kinds at selectivity 50%, 10%, 1% and 0.1%:

- ``random``: ``{"r": {"$lt": s}}``;
- ``correlated``: ``{"cluster": {"$in": [...]}}``, the query's nearest clusters (by the DE query
  vector and the cluster centroids) until they hold s N items: the query's own cluster allowed;
- ``anti``: the farthest clusters until they hold s N items: the query's nearest excluded.

Recall is Top-10-Recall@100 against the exact top-10 within the allowed items; the unfiltered
recall of the same queries beside it. ``leaks``: disallowed items sent to the CE or returned.
``exact_when_small``: queries whose filter allows at most B items that got the exact top-k with
one CE call per allowed item. ``overhead``: non-CE time per query (``Hits.seconds_other``: the
filter's evaluation and the search, one query at a time) at 10% against unfiltered, the two
searches of each query back to back, best of three passes. ``tombstones``: 75% of the items
removed (no compaction), the test queries searched at k = 10 with B = 30 and 100, and k = 50 with
B = 100: answers shorter than min(k, live items), CE calls on removed items.

``scale``: the scale bench's synthetic set (``crossknn.synthetic.EmbeddingTestbed``, 10^6 x 128),
an IVF round index (4,096 lists), AXN rounds (B = 100, 10 rounds, as ``bench/scale_bench.py``),
test queries with a random 1% filter: exact rounds within the filter against the IVF round
features, both ways an IVF round index can take a mask (exact rounds over the allowed rows, and
the index searched with a selector and 1 / selectivity its width), beside the unfiltered IVF
rounds; engine ms per query (search time less the CE's) and recall against the exact top-10
within the filter. Also at 3%, 5%, 10% and 50% to place the switch between the two ways.

Writes ``bench/results/filter_bench.json`` (``goals``: the issue's keys) and prints tables.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, SHARED, StealMeter, machine, write_json  # noqa: E402

OUT = REPO / "bench" / "results" / "filter_bench.json"
WORK = REPO / "build" / "filter_bench"
MATRICES = {"cisi": "cisi-minilm", "nfcorpus": "nfcorpus-minilm-gpu"}
SELECTIVITIES = (0.5, 0.1, 0.01, 0.001)
KINDS = ("random", "correlated", "anti")
N_CLUSTERS = 200
K, B = 10, 100
GOAL_KEYS = (
    "leaks",
    "recall_drop_worst",
    "exact_when_small",
    "overhead_ratio_10",
    "scale_1e6_recall_drop_1",
    "scale_1e6_ms_1",
    "tombstone_short_answers",
    "tombstone_ce_calls",
)


class MatrixCE:
    """The CE as the score matrix knows it: the exact score of (query text, item), the query a
    row of the matrix (train or test), the items the index's (columns in their order). Records
    every (row, column) pair it is asked for."""

    model_id, model_hash, max_length, precision = "minilm-l6-joint@matrix", "matrix", 128, "fp32"

    def __init__(self, S, qrow: dict[str, int], cols_of_text: dict[str, list[int]]) -> None:
        self.S, self.qrow, self.cols_of_text = S, qrow, cols_of_text
        self.cols = np.empty(0, np.int64)
        self.pairs: list[tuple[int, np.ndarray]] = []
        self.record = False

    @property
    def n_items(self) -> int:
        return int(self.cols.size)

    def set_items(self, texts) -> None:
        # a text the matrix holds twice (CISI has one) is its columns in order
        seen: dict[str, int] = {}
        cols = []
        for t in texts:
            occ = self.cols_of_text[t]
            cols.append(occ[min(seen.get(t, 0), len(occ) - 1)])
            seen[t] = seen.get(t, 0) + 1
        self.cols = np.array(cols, np.int64)

    def score(self, query, items):
        return self.score_batch([query], [items])[0]

    def score_batch(self, queries, items):
        out = []
        for q, it in zip(queries, items, strict=True):
            r = self.qrow[q]
            c = self.cols[np.asarray(it, np.int64).ravel()]
            if self.record:
                self.pairs.append((r, c))
            out.append(self.S[r, c].astype(np.float32))
        return out


class MatrixDE:
    """The DE vectors the matrix stores, by text (items and queries)."""

    model_id, model_hash, max_length, precision = "minilm-l6-de@matrix", "matrix-de", 128, "fp32"

    def __init__(self, m, qtexts, itexts) -> None:
        self.vec: dict[str, np.ndarray] = {}
        for t, v in zip(itexts, m.de_items, strict=True):
            self.vec.setdefault(t, v)
        for t, v in zip(qtexts, m.de_queries, strict=True):
            self.vec.setdefault(t, v)
        self.dim = int(m.de_items.shape[1])

    def encode(self, texts, **_):
        return np.stack([self.vec[t] for t in texts]).astype(np.float32)


def _clusters(V: np.ndarray, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    # scikit-learn: only this bench part needs it
    from sklearn.cluster import KMeans

    X = V / np.linalg.norm(V, axis=1, keepdims=True)
    km = KMeans(N_CLUSTERS, n_init=1, random_state=seed).fit(X)
    return km.labels_.astype(np.int64), km.cluster_centers_


def setup(name: str):
    """The corpus index of a matrix (built once under build/filter_bench), its models, the test
    queries and what the filters need."""
    from crossknn.corpus.build import build_corpus_index
    from crossknn.data import Corpus, load_beir
    from crossknn.index.auto import default_index_rows
    from crossknn.matrix import load_score_matrix

    m = load_score_matrix(SHARED / "matrices" / MATRICES[name], mmap=True)
    beir = load_beir(m.corpus_dir())
    itexts = beir.items_in_order(m.item_ids)
    qtexts = beir.queries_in_order(m.query_ids)
    S = np.asarray(m.scores, np.float32)
    cols_of_text: dict[str, list[int]] = {}
    for j, t in enumerate(itexts):
        cols_of_text.setdefault(t, []).append(j)
    qrow: dict[str, int] = {}
    for r, t in enumerate(qtexts):
        qrow.setdefault(t, r)
    train = [qtexts[r] for r in m.train if qrow[qtexts[r]] == r]
    test_rows = [int(r) for r in m.test if qrow[qtexts[r]] == r]
    labels, centers = _clusters(np.asarray(m.de_items, np.float32))
    rng = np.random.default_rng(7)
    r_attr = rng.random(m.n_items)
    meta = [{"r": float(r_attr[j]), "cluster": int(labels[j])} for j in range(m.n_items)]
    ce, de = MatrixCE(S, qrow, cols_of_text), MatrixDE(m, qtexts, itexts)
    out = WORK / name
    if not (out / "index.json").is_file():
        rows = default_index_rows(m.n_items, None, n_train=len(train))
        corpus = Corpus(list(m.item_ids), list(itexts), f"{name} (matrix)", meta)
        build_corpus_index(
            corpus,
            out,
            ce=ce,
            de=de,
            train_queries=train,
            progress=False,
            index_calls=rows * m.n_items,
        )
    return {
        "name": name,
        "m": m,
        "S": S,
        "ce": ce,
        "de": de,
        "index": out,
        "test": test_rows,
        "qtexts": qtexts,
        "labels": labels,
        "centers": centers,
        "r": r_attr,
        "N": m.n_items,
    }


def _filters(ctx, kind: str, s: float) -> tuple[list[dict], list[np.ndarray]]:
    """Each test query's filter and the mask it should give (computed here independently)."""
    N, labels = ctx["N"], ctx["labels"]
    if kind == "random":
        mask = ctx["r"] < s
        return [{"r": {"$lt": s}}] * len(ctx["test"]), [mask] * len(ctx["test"])
    sizes = np.bincount(labels, minlength=N_CLUSTERS)
    C = ctx["centers"]
    specs, masks = [], []
    for row in ctx["test"]:
        q = np.asarray(ctx["m"].de_queries[row], np.float64)
        order = np.argsort(-(C @ q), kind="stable")  # nearest first
        if kind == "anti":
            order = order[::-1]
        cum = np.cumsum(sizes[order])
        take = order[: int(np.searchsorted(cum, s * N)) + 1]
        take = [int(c) for c in take if sizes[c]]
        specs.append({"cluster": {"$in": take}})
        masks.append(np.isin(labels, take))
    return specs, masks


def _exact(S, row: int, mask: np.ndarray | None, k: int = K) -> np.ndarray:
    from crossknn.topk import exact_top_k

    s = S[row].astype(np.float64)
    if mask is not None:
        s = np.where(mask, s, -np.inf)
        k = min(k, int(mask.sum()))
    return exact_top_k(s, k).astype(np.int64)


def run_matrix(name: str) -> dict:
    from crossknn.corpus_folder import open_index
    from crossknn.searcher import Searcher

    ctx = setup(name)
    S, ce, N = ctx["S"], ctx["ce"], ctx["N"]
    searcher = Searcher(open_index(ctx["index"]), ce=ce, de=ctx["de"])
    assert searcher.method == "auto", searcher.method
    texts = [ctx["qtexts"][r] for r in ctx["test"]]
    col = {iid: j for j, iid in enumerate(searcher.corpus.ids)}
    base = searcher.search(texts, k=K, budget=B, query_batch=16)
    base_rec = np.array(
        [
            len({col[i] for i in h.ids} & set(_exact(S, r, None).tolist())) / K
            for h, r in zip(base, ctx["test"], strict=True)
        ]
    )
    rows, small_ok, small_n, leaks = [], 0, 0, 0
    for kind in KINDS:
        for s in SELECTIVITIES:
            specs, masks = _filters(ctx, kind, s)
            ce.pairs.clear()
            ce.record = True
            hits = searcher.search(texts, k=K, budget=B, query_batch=16, filter=specs)
            ce.record = False
            leak = 0
            for r, c in ce.pairs:  # every pair the CE was asked for, against its query's mask
                j = ctx["test"].index(r)
                leak += int((~masks[j][c]).sum())
            rec, ce_calls, n_small, ok_small = [], [], 0, 0
            for j, (h, row) in enumerate(zip(hits, ctx["test"], strict=True)):
                got = np.array([col[i] for i in h.ids], np.int64)
                leak += int((~masks[j][got]).sum())
                if h.allowed != int(masks[j].sum()):
                    raise AssertionError(
                        f"{kind} {s}: the filter allowed {h.allowed} items; "
                        f"the bench's own mask {int(masks[j].sum())}"
                    )
                ex = _exact(S, row, masks[j])
                if ex.size == 0:
                    rec.append(1.0 if got.size == 0 else 0.0)
                else:
                    rec.append(len(set(got.tolist()) & set(ex.tolist())) / ex.size)
                ce_calls.append(h.ce_calls)
                if h.allowed <= B:
                    n_small += 1
                    ok_small += int(np.array_equal(got, ex) and h.ce_calls == h.allowed)
            rec = np.asarray(rec)
            sel = float(np.mean([m.mean() for m in masks]))
            rows.append(
                {
                    "matrix": name,
                    "kind": kind,
                    "selectivity": s,
                    "selectivity_measured": round(sel, 5),
                    "n_queries": len(texts),
                    "recall": round(float(rec.mean()), 4),
                    "recall_unfiltered": round(float(base_rec.mean()), 4),
                    "recall_drop": round(float(rec.mean() - base_rec.mean()), 4),
                    "ce_calls_mean": round(float(np.mean(ce_calls)), 1),
                    "queries_allowed_le_B": n_small,
                    "exact_when_small": ok_small,
                    "leaks": leak,
                }
            )
            small_n += n_small
            small_ok += ok_small
            leaks += leak
            print(_row_line(rows[-1]), flush=True)
    return {
        "rows": rows,
        "leaks": leaks,
        "small": [small_ok, small_n],
        "overhead": overhead(ctx, searcher, texts),
        "tombstones": tombstones(ctx),
        "n_items": N,
        "index_rows": int(searcher.index.params["auto"]["rows"]),
    }


def _row_line(r: dict) -> str:
    sel, got = r["selectivity"], r["selectivity_measured"]
    rec = f"recall {r['recall']:.3f} vs {r['recall_unfiltered']:.3f} ({r['recall_drop']:+.3f})"
    small = f"<=B {r['queries_allowed_le_B']:>3} exact {r['exact_when_small']:>3}"
    return (
        f"{r['matrix']:<9} {r['kind']:<10} {sel:>6.1%} (measured {got:>7.2%})  {rec}  "
        f"CE calls {r['ce_calls_mean']:>5.1f}  {small}  leaks {r['leaks']}"
    )


def overhead(ctx, searcher, texts) -> dict:
    """Non-CE seconds per query at 10% (random: one filter, its mask kept; correlated: each
    query its own filter) against unfiltered, back to back per query, best of three passes."""
    out = {}
    for kind in ("random", "correlated"):
        specs, _ = _filters(ctx, kind, 0.1)
        best_f, best_u = np.inf, np.inf
        steal = StealMeter()
        for _ in range(3):
            searcher._masks.clear()
            t_u = t_f = 0.0
            for q, f in zip(texts, specs, strict=True):
                t_u += searcher.search(q, k=K, budget=B).seconds_other
                t_f += searcher.search(q, k=K, budget=B, filter=f).seconds_other
            best_u, best_f = min(best_u, t_u), min(best_f, t_f)
        out[kind] = {
            "unfiltered_ms": round(1000 * best_u / len(texts), 3),
            "filtered_ms": round(1000 * best_f / len(texts), 3),
            "ratio": round(best_f / best_u, 3),
            "cpu_steal_pct": steal.read(),
        }
        print(f"{ctx['name']:<9} overhead at 10% ({kind}): {out[kind]}", flush=True)
    return out


def tombstones(ctx) -> dict:
    """75% of the items removed (no compaction): short answers and CE calls on removed items."""
    from crossknn.corpus.edit import remove_items
    from crossknn.corpus_folder import open_index
    from crossknn.searcher import Searcher

    src, dst = ctx["index"], WORK / f"{ctx['name']}_removed"
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(".lock", ".build", "work"))
    N = ctx["N"]
    ids = open_index(dst).corpus.ids
    rng = np.random.default_rng(3)
    dead = np.zeros(N, bool)
    dead[rng.choice(N, int(0.75 * N), replace=False)] = True
    remove_items(dst, [ids[j] for j in np.flatnonzero(dead)], compact_at=1.0)
    ce = ctx["ce"]
    s = Searcher(open_index(dst), ce=ce, de=ctx["de"])
    live = int((~dead).sum())
    texts = [ctx["qtexts"][r] for r in ctx["test"]]
    short = calls_dead = searches = 0
    col = {iid: j for j, iid in enumerate(ids)}
    for k, b in ((10, 30), (10, 100), (50, 100)):
        ce.pairs.clear()
        ce.record = True
        hits = s.search(texts, k=k, budget=b, query_batch=16)
        ce.record = False
        calls_dead += sum(int(dead[c].sum()) for _, c in ce.pairs)
        short += sum(len(h.ids) < min(k, live) for h in hits)
        calls_dead += sum(int(dead[[col[i] for i in h.ids]].sum()) for h in hits)  # returned
        searches += len(hits)
    print(
        f"{ctx['name']:<9} tombstones: {searches} searches, {short} short, "
        f"{calls_dead} CE calls on / answers of removed items",
        flush=True,
    )
    return {
        "removed": int(dead.sum()),
        "live": live,
        "searches": searches,
        "short_answers": short,
        "removed_ce_calls_or_answers": calls_dead,
    }


# ---- 10^6 items, IVF round index ----------------------------------------------------------


def run_scale(n: int, d: int, n_test: int) -> dict:
    import faiss

    import scale_bench as sb
    from crossknn.search.round_index import IndexedFeatures

    sb.CACHE.mkdir(parents=True, exist_ok=True)
    sb.make_items(n, d)
    if not sb.index_path(n, d, "ivf").is_file():
        print("building the IVF round index (once)...", flush=True)
        sb.build_worker(n, d, "ivf")
    faiss.omp_set_num_threads(2)
    bed, W, Y = sb.queries(n, d, n_test)
    base = sb.open_items(n, d, "float32")
    sb.prefault(base)
    scorer = sb.TestbedScorer(bed, W, Y, base)
    ivf = IndexedFeatures(base, faiss.read_index(str(sb.index_path(n, d, "ivf"))), oversample=2.0)
    exact_m, ivf_m = sb.method_for(base, W, bed.beta), sb.method_for(ivf, W, bed.beta)
    rng = np.random.default_rng(11)
    attr = rng.random(n)
    queries = list(range(n_test))
    out = {
        "N": n,
        "d": d,
        "n_test_queries": n_test,
        "nlist": int(ivf.index.nlist),
        "nprobe": ivf.width,
        "rows": [],
    }

    def filtered_top(q, mask):
        ids = np.flatnonzero(mask)
        s = bed.score(q, W[q], Y[q], base.rows(ids), ids)
        return ids[np.lexsort((ids, -s))[:K]]

    def recall(truth, found):
        return float(
            np.mean([np.intersect1d(t, f).size / K for t, f in zip(truth, found, strict=True)])
        )

    def search(method, q, allow):
        scorer.seconds = 0.0
        t0 = time.perf_counter()
        res = method.search(scorer, [q], budget=B, k=K, allow=allow)
        return 1000 * (time.perf_counter() - t0 - scorer.seconds), res.indices[0]

    exact_m.search(scorer, queries[:1], budget=B, k=K)  # warm-up
    ivf_m.search(scorer, queries[:1], budget=B, k=K)
    default_below = ivf.exact_below
    # every configuration of a query back to back (the machine is shared: side by side, one
    # run), the best of two passes per configuration and query
    ways = ("unfiltered", "exact", "exact_over_allowed", "selector", "default")
    for s in (0.01, 0.03, 0.05, 0.1, 0.5):
        mask = attr < s
        truth = [filtered_top(q, mask) for q in queries]
        ms = {w: np.full(len(queries), np.inf) for w in ways}
        found: dict[str, list] = {w: [None] * len(queries) for w in ways}
        for _ in range(2):
            for j, q in enumerate(queries):
                for w in ways:
                    ivf.exact_below = {"exact_over_allowed": 1.0, "selector": 0.0}.get(
                        w, default_below
                    )
                    method = exact_m if w == "exact" else ivf_m
                    t, got = search(method, q, None if w == "unfiltered" else mask)
                    ms[w][j] = min(ms[w][j], t)
                    found[w][j] = got
        ivf.exact_below = default_below
        row = {"selectivity": s, "unfiltered_ivf_ms": round(float(ms["unfiltered"].mean()), 3)}
        for w, name in (
            ("exact", "exact_rounds"),
            ("exact_over_allowed", "ivf_exact_over_allowed"),
            ("selector", "ivf_selector"),
            ("default", "ivf_default"),
        ):
            row[f"{name}_ms"] = round(float(ms[w].mean()), 3)
            row[f"{name}_recall"] = round(recall(truth, found[w]), 4)
        row["ivf_default_path"] = "exact over allowed" if s <= default_below else "selector"
        row["ivf_default_vs_unfiltered"] = round(
            row["ivf_default_ms"] / row["unfiltered_ivf_ms"], 3
        )
        out["rows"].append(row)
        print(f"N={n} at {s:.0%}: {row}", flush=True)
    out["unfiltered_ivf_ms"] = out["rows"][0]["unfiltered_ivf_ms"]
    return out


def goals(res: dict) -> dict:
    mats = res.get("matrices", {})
    g: dict = {}
    if mats:
        g["leaks"] = int(sum(v["leaks"] for v in mats.values()))
        drops = [
            r["recall_drop"] for v in mats.values() for r in v["rows"] if r["selectivity"] >= 0.01
        ]
        g["recall_drop_worst"] = round(min(drops), 4)
        ok = sum(v["small"][0] for v in mats.values())
        n = sum(v["small"][1] for v in mats.values())
        g["exact_when_small"] = round(ok / n, 4) if n else None
        g["overhead_ratio_10"] = max(
            o["ratio"] for v in mats.values() for o in v["overhead"].values()
        )
        g["tombstone_short_answers"] = int(
            sum(v["tombstones"]["short_answers"] for v in mats.values())
        )
        g["tombstone_ce_calls"] = int(
            sum(v["tombstones"]["removed_ce_calls_or_answers"] for v in mats.values())
        )
    sc = res.get("scale")
    if sc:
        one = next(r for r in sc["rows"] if r["selectivity"] == 0.01)
        g["scale_1e6_recall_drop_1"] = round(
            one["ivf_default_recall"] - one["exact_rounds_recall"], 4
        )
        g["scale_1e6_ms_1"] = one["ivf_default_ms"]
        g["scale_1e6_ms_1_vs_unfiltered"] = round(
            one["ivf_default_ms"] / sc["unfiltered_ivf_ms"], 3
        )
    return {k: g.get(k) for k in GOAL_KEYS} | {k: v for k, v in g.items() if k not in GOAL_KEYS}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--part", choices=("all", "matrices", "scale"), default="all")
    ap.add_argument("--matrices", default="cisi,nfcorpus")
    ap.add_argument("--scale-n", type=float, default=1e6)
    ap.add_argument("--scale-d", type=int, default=128)
    ap.add_argument("--scale-queries", type=int, default=30)
    args = ap.parse_args(argv)
    res = json.loads(OUT.read_text()) if OUT.is_file() else {}
    res.pop("provenance", None)
    if args.part in ("all", "matrices"):
        res["matrices"] = res.get("matrices", {})
        for name in args.matrices.split(","):
            if not (SHARED / "matrices" / MATRICES[name]).is_dir():
                print(f"skipping {name}: ../shared/matrices/{MATRICES[name]} is missing")
                continue
            res["matrices"][name] = run_matrix(name)
            res["machine"] = machine("faiss-cpu")
    if args.part in ("all", "scale"):
        res["scale"] = run_scale(int(args.scale_n), args.scale_d, args.scale_queries)
        res["scale_machine"] = machine("faiss-cpu")
    res["goals"] = goals(res)
    print(json.dumps(res["goals"], indent=1))
    write_json(OUT, res)
    return 0


if __name__ == "__main__":
    # the filter language's differential fuzz (bench/_filter_fuzz.py) and one tenant's request
    # against the others on a real server (bench/_tenant.py): each with its own arguments
    if sys.argv[1:2] == ["fuzz"]:
        from _filter_fuzz import main as fuzz

        sys.exit(fuzz(sys.argv[2:]))
    if sys.argv[1:2] == ["tenant"]:
        from _tenant import main as tenant

        sys.exit(tenant(sys.argv[2:]))
    sys.exit(main())
