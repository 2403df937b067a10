"""Rounds that do not read every item: exact f32 / exact int8 / FAISS IVF-SQ8 / FAISS HNSW rounds
on a synthetic embedding testbed with N = 1e5 .. 1e7 items; prints a table, writes JSON.

    .venv/bin/python bench/scale_bench.py                       # all sizes (long: run niced)
    .venv/bin/python bench/scale_bench.py --sizes 1e5:128 --queries 10   # quick look

Testbed (``crossknn.synthetic.EmbeddingTestbed``): clustered, anisotropic unit item vectors and a
CE-like score ``softplus(beta (v.w_q - c)) + (P y_q).v + noise`` (nonlinear in the DE similarity,
a low-rank part the DE does not know, counter-based noise). Search: AXN, B = 100 CE calls in 10
rounds, k = 10; the first round is the DE top-10 (through the same round features), then 9 rounds
of least squares mixed with the DE query vector. Each query is searched alone (latency, not batch
throughput). ``engine_ms_per_query``: wall time of the search minus the time inside the CE scorer.

Per (N, d) and round index, in its own process (so ``peak_rss_mb`` is that configuration's peak
RSS, the memory-mapped item matrix included: its pages are touched before timing): the FAISS
width (nprobe / efSearch) of every round step is tuned on dev queries (their recorded exact round
queries, target per-round recall ``--target``: ``tune_round_widths``), then the test queries are
searched. ``recall_vs_exact``: the search's mean
Top-10-Recall@100 minus that of exact float32 rounds on the same test queries (at N = 1e7 the
items exist only as int8, and the reference is exact int8 rounds). FAISS indexes, items and exact
top-10 are cached under ``cache/scale_bench`` (gitignored), with the index build time and peak
RSS measured when it was built (``build_s``, ``build_rss_mb``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from _common import REPO, machine, result_path, utc_now, write_json
from crossknn.core import ItemFeatures
from crossknn.search import AXN
from crossknn.search.round_index import TUNE_CANDIDATES
from crossknn.synthetic import NOISE_CLIP, EmbeddingTestbed, pair_noise

OUT = result_path("scale_bench")
CACHE = REPO / "cache" / "scale_bench"
B, ROUNDS, K, MIX = 100, 10, 10, 0.5
INT8_ONLY_FROM = 5_000_000  # items stored as int8 only (f32 would not fit beside the others)
WIDTHS = TUNE_CANDIDATES
NLIST = {100_000: 1024, 1_000_000: 4096}  # 1e7: the default (N / 256 items per list)
# widths tuned per round step (tune_round_widths; rows measured before 2026-11-25 13:00 used one
# width for every step, tune_width: their rows have no "round_widths")
TUNING = "per_round"


def peak_rss_mb() -> float:
    """This process's peak RSS: ``VmHWM`` of its own address space. (``ru_maxrss`` starts, after
    fork + exec, at the parent's peak: a worker started after the parent had read large items
    reported the parent's 3 GB; rows before 2026-11-25 13:00 may carry that.)"""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def bed_for(n: int, d: int) -> EmbeddingTestbed:
    return EmbeddingTestbed(n, d, n_clusters=max(100, n // 1000), seed=d)


def items_path(n: int, d: int) -> Path:
    return CACHE / f"items_{n}_{d}_{'int8' if n >= INT8_ONLY_FROM else 'f32'}.npy"


def make_items(n: int, d: int) -> Path:
    """The testbed's items as a cached .npy (float32, or int8 with row scales from 5e6 on)."""
    path = items_path(n, d)
    if path.is_file():
        return path
    from tqdm import tqdm

    CACHE.mkdir(parents=True, exist_ok=True)
    bed = bed_for(n, d)
    int8 = n >= INT8_ONLY_FROM
    tmp = path.with_suffix(".partial.npy")
    X = np.lib.format.open_memmap(tmp, "w+", np.int8 if int8 else np.float32, (n, d))
    scales = np.empty(n, np.float32)
    for lo in tqdm(range(0, n, bed.block), desc=f"items {n}x{d}", unit="block"):
        hi = min(n, lo + bed.block)
        V = bed.items(lo, hi)
        if int8:
            s = np.abs(V).max(axis=1) / 127.0
            X[lo:hi] = np.rint(V / s[:, None]).astype(np.int8)
            scales[lo:hi] = s
        else:
            X[lo:hi] = V
    X.flush()
    del X
    if int8:
        np.save(path.with_suffix(".scales.npy"), scales)
    os.replace(tmp, path)
    return path


def open_items(n: int, d: int, storage: str) -> ItemFeatures:
    path = items_path(n, d)
    if storage == "float32" or path.name.endswith("int8.npy"):
        return ItemFeatures.from_npy(path)  # memory-mapped, no copy
    V = np.load(path, mmap_mode="r")
    return ItemFeatures(V, storage=storage)  # exact int8 from the float32 items


def queries(n: int, d: int, nq: int):
    bed = bed_for(n, d)
    W, Y = bed.queries(nq, seed=1)
    return bed, W, Y


class TestbedScorer:
    """The CE-like score of the testbed, on the stored item rows; times itself."""

    def __init__(self, bed, W, Y, truth: ItemFeatures) -> None:
        self.bed, self.W, self.Y, self.truth = bed, W, Y, truth
        self.n_items = truth.n_items
        self.seconds = 0.0

    def score_batch(self, qs, items):
        t0 = time.perf_counter()
        out = [
            self.bed.score(int(q), self.W[q], self.Y[q], self.truth.rows(it), it).astype(np.float32)
            for q, it in zip(qs, items, strict=True)
        ]
        self.seconds += time.perf_counter() - t0
        return out

    def score(self, q, items):
        return self.score_batch([q], [np.asarray(items, np.int64)])[0]


def exact_top(n: int, d: int, nq: int) -> np.ndarray:
    """The exact top-10 items of every query by the testbed score (cached)."""
    path = CACHE / f"top_{n}_{d}_{nq}.npy"
    if path.is_file():
        return np.load(path)
    from tqdm import tqdm

    bed, W, Y = queries(n, d, nq)
    truth = open_items(n, d, "float32")
    best_s = np.full((nq, K), -np.inf)
    best_i = np.zeros((nq, K), np.int64)
    for lo in tqdm(range(0, n, bed.block), desc=f"exact top-{K} {n}x{d}", unit="block"):
        hi = min(n, lo + bed.block)
        ids = np.arange(lo, hi)
        X = truth.rows(ids)
        S0 = bed.noiseless(W, Y, X)
        for q in range(nq):
            # the noise is within +-NOISE_CLIP * noise: items far below the 10th best are out
            keep = S0[:, q] >= best_s[q, -1] - 2 * NOISE_CLIP * bed.noise
            s = S0[keep, q] + bed.noise * pair_noise(q, ids[keep], bed.seed)
            cs, ci = np.concatenate([best_s[q], s]), np.concatenate([best_i[q], ids[keep]])
            o = np.lexsort((ci, -cs))[:K]
            best_s[q], best_i[q] = cs[o], ci[o]
    np.save(path, best_i)
    return best_i


class RoundRetriever:
    """The first round: the DE top-n through the same round features (exact or FAISS)."""

    def __init__(self, features, W) -> None:
        self.features, self.W, self.n_items = features, W, features.n_items

    def retrieve(self, qs, n, *, allow=None):
        return self.features.top_k(self.W[list(qs)], n, allow=allow)[1]


def method_for(features, W, beta):
    return AXN(
        features, rounds=ROUNDS, first=RoundRetriever(features, W), prior=W * beta / 2, mix=MIX
    )


def index_path(n: int, d: int, kind: str) -> Path:
    return CACHE / f"{kind}_{n}_{d}.faiss"


def build_worker(n: int, d: int, kind: str) -> dict:
    """Builds and caches the FAISS index (own process: its peak RSS is the build's)."""
    import faiss

    from crossknn.search.round_index import build_round_index

    feats = open_items(n, d, "float32")
    t0 = time.perf_counter()
    index = build_round_index(feats, kind, nlist=NLIST.get(n), hnsw_m=32, ef_construction=64)
    build_s = time.perf_counter() - t0
    path = index_path(n, d, kind)
    faiss.write_index(index, str(path) + ".partial")
    os.replace(str(path) + ".partial", path)
    meta = {
        "build_s": build_s,
        "build_rss_mb": peak_rss_mb(),
        "index_mb": path.stat().st_size / 2**20,
    }
    (CACHE / f"{kind}_{n}_{d}.json").write_text(json.dumps(meta))
    return meta


def tuned_path(n: int, d: int, kind: str, n_dev: int, target: float) -> Path:
    return CACHE / f"{kind}_{n}_{d}_tuned_{TUNING}_{n_dev}_{target}.json"


def tune_worker(n: int, d: int, kind: str, storage: str, n_dev: int, n_test: int, target: float):
    """The width on the dev queries' recorded exact round queries (own process: the exact dev
    rounds read all of V, which must not count in the search's peak RSS)."""
    import faiss

    from crossknn.search.round_index import (
        IndexedFeatures,
        record_round_queries,
        round_recall,
        round_widths_meta,
        tune_round_widths,
    )

    faiss.omp_set_num_threads(1)
    bed, W, Y = queries(n, d, n_dev + n_test)
    base = open_items(n, d, storage)
    scorer = TestbedScorer(bed, W, Y, base)
    features = IndexedFeatures(base, faiss.read_index(str(index_path(n, d, kind))), oversample=2.0)
    t0 = time.perf_counter()
    records = record_round_queries(
        lambda f: method_for(f, W, bed.beta), base, scorer, list(range(n_dev)), budget=B, k=K
    )
    schedule, tables = tune_round_widths(features, records, candidates=WIDTHS[kind], target=target)
    per_round = round_recall(features, records)
    out = {
        "width": features.width,  # the widest of the schedule: for steps beyond it
        "round_widths": round_widths_meta(schedule),
        "width_name": "nprobe" if kind == "ivf" else "efSearch",
        "tuning": TUNING,
        "dev_round_recall": {str(k): t for k, t in tables.items()},
        "dev_round_recall_per_step": [round(float(x), 4) for x in per_round],
        "tune_s": time.perf_counter() - t0,
    }
    tuned_path(n, d, kind, n_dev, target).write_text(json.dumps(out))
    return out


def prefault(features: ItemFeatures, block: int = 1 << 16) -> bool:
    """Touches every page of the item matrix through the core's own mapping (``from_npy`` maps
    the file again for the C++ core), as a ``Searcher`` does when it loads (its scan for max|V|
    reads every page of the one mapping it shares with the core): a round index's candidates are
    random rows, and without this the timed queries pay the first-touch faults of their pages
    (exact rounds touch every page in their first query). Peak RSS then counts every page."""
    itemsize = {"int8": 1, "float16": 2}.get(features.storage, 4)
    per_page = max(1, 4096 // (features.dim * itemsize))
    for lo in range(0, features.n_items, block * per_page):
        hi = min(features.n_items, lo + block * per_page)
        features.rows(np.arange(lo, hi, per_page))
    return True


def search_worker(n: int, d: int, kind: str, storage: str, n_dev: int, n_test: int, target: float):
    """One configuration's search: tune the width on dev queries, search the test queries."""
    from crossknn.search.round_index import IndexedFeatures

    bed, W, Y = queries(n, d, n_dev + n_test)
    base = open_items(n, d, storage)
    truth = base if storage == "float32" or n >= INT8_ONLY_FROM else open_items(n, d, "float32")
    scorer = TestbedScorer(bed, W, Y, truth)
    row = {"N": n, "d": d, "storage": storage, "round_index": kind}
    test = list(range(n_dev, n_dev + n_test))
    features = base
    if kind != "exact":
        import faiss

        # as many threads as the exact kernel uses (all cores): one query's IVF round step is
        # searched in parallel over its probed lists (before 2026-11-25: 1 thread, see JSON)
        faiss.omp_set_num_threads(os.cpu_count() or 1)
        row["faiss_threads"] = faiss.omp_get_max_threads()
        index = faiss.read_index(str(index_path(n, d, kind)))
        features = IndexedFeatures(base, index, oversample=2.0)
        row.update(json.loads((CACHE / f"{kind}_{n}_{d}.json").read_text()))
        row.update(json.loads(tuned_path(n, d, kind, n_dev, target).read_text()))
        features.width = row["width"]
        features.round_widths = {int(k): int(v) for k, v in row["round_widths"].items()}
    method = method_for(features, W, bed.beta)
    row["items_prefaulted"] = prefault(base)
    method.search(scorer, test[:1], budget=B, k=K)  # warm-up
    scorer.seconds = 0.0
    found = []
    t0 = time.perf_counter()
    for q in test:
        found.append(method.search(scorer, [q], budget=B, k=K).indices[0])
    wall = time.perf_counter() - t0
    top = exact_top(n, d, n_dev + n_test)[test]
    rec = [np.intersect1d(t, f).size / K for t, f in zip(top, found, strict=True)]
    row.update(
        engine_ms_per_query=1000 * (wall - scorer.seconds) / len(test),
        ce_ms_per_query=1000 * scorer.seconds / len(test),
        recall=float(np.mean(rec)),
        per_query_recall=rec,
        peak_rss_mb=peak_rss_mb(),
        n_test_queries=len(test),
        exact_fallbacks=getattr(features, "exact_fallbacks", 0),
    )
    if kind != "exact":  # the same queries again, exact and indexed interleaved: one-run ratio
        ref = open_items(n, d, "int8" if n >= INT8_ONLY_FROM else "float32")
        ref_method = method_for(ref, W, bed.beta)
        ref_method.search(scorer, test[:1], budget=B, k=K)
        t_ref = t_idx = 0.0
        for q in test:
            for m, is_ref in ((ref_method, True), (method, False)):
                scorer.seconds = 0.0
                t0 = time.perf_counter()
                m.search(scorer, [q], budget=B, k=K)
                dt = time.perf_counter() - t0 - scorer.seconds
                t_ref, t_idx = (t_ref + dt, t_idx) if is_ref else (t_ref, t_idx + dt)
        row.update(
            side_by_side_exact_ms=1000 * t_ref / len(test),
            side_by_side_index_ms=1000 * t_idx / len(test),
            side_by_side_ratio=t_idx / t_ref,
        )
    return row


def cisi_rows(target: float) -> list[dict]:
    """The real-data check: AXN rounds on the shared CISI matrix (exact CE scores, DE item
    vectors), exact vs IVF vs HNSW; widths tuned on the train rows, recall on the test rows."""
    from _common import CISI_MATRIX
    from crossknn.matrix import load_score_matrix
    from crossknn.score_map import ScoreMap
    from crossknn.scorers import MatrixScorer
    from crossknn.search.round_index import (
        IndexedFeatures,
        build_round_index,
        record_round_queries,
        round_widths_meta,
        tune_round_widths,
    )
    from crossknn.topk import topk_recall

    m = load_score_matrix(CISI_MATRIX)
    V = np.ascontiguousarray(m.de_items, np.float32)
    Wq = np.asarray(m.de_queries, np.float64)
    base = ItemFeatures(V)
    train = m.train.tolist()
    tr_de = np.concatenate([V @ Wq[r] for r in train])
    smap = ScoreMap.fit(np.concatenate([m.scores[r] for r in train]), tr_de)
    scorer = MatrixScorer(m.scores)

    def make(f):
        return AXN(f, rounds=ROUNDS, first=RoundRetriever(f, Wq), prior=Wq, mix=MIX, score_map=smap)

    rows, ref = [], None
    for kind in ("exact", "ivf", "hnsw"):
        f, row = base, {"dataset": "cisi-minilm", "N": m.n_items, "d": V.shape[1]}
        if kind != "exact":
            index = build_round_index(base, kind, progress=False)
            f = IndexedFeatures(base, index, oversample=2.0)
            rec = record_round_queries(make, base, scorer, train, budget=B, k=K)
            schedule, _ = tune_round_widths(f, rec, candidates=WIDTHS[kind], target=target)
            row.update(width=f.width, round_widths=round_widths_meta(schedule))
        res = make(f).search(scorer, m.test.tolist(), budget=B, k=K)
        recall = float(topk_recall(m.scores, m.test, res.indices, K).mean())
        ref = recall if kind == "exact" else ref
        row.update(round_index=kind, recall=recall, recall_vs_exact=recall - ref)
        rows.append(row)
    return rows


def run_child(args: list[str]) -> dict:
    cmd = [sys.executable, __file__, *args]
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="1e5:128,1e5:384,1e6:128,1e6:384,1e7:128")
    ap.add_argument("--kinds", default="exact,ivf,hnsw")
    ap.add_argument("--hnsw-max", type=float, default=1e6, help="largest N to build HNSW for")
    ap.add_argument("--dev-queries", type=int, default=10)
    ap.add_argument("--queries", type=int, default=30, help="test queries per configuration")
    ap.add_argument("--target", type=float, default=0.995, help="dev per-round recall target")
    ap.add_argument("--cisi", action="store_true", help="only the real-data check on CISI")
    ap.add_argument("--redo", action="store_true", help="measure the rows of --sizes/--kinds again")
    ap.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        what, n, d, kind = args.worker[0], int(args.worker[1]), int(args.worker[2]), args.worker[3]
        if what == "build":
            print(json.dumps(build_worker(n, d, kind)))
        elif what == "tune":
            ta = (args.worker[4], args.dev_queries, args.queries, args.target)
            print(json.dumps(tune_worker(n, d, kind, *ta)))
        else:
            storage = args.worker[4]
            row = search_worker(n, d, kind, storage, args.dev_queries, args.queries, args.target)
            print(json.dumps(row))
        return
    if args.cisi:
        doc = json.loads(OUT.read_text()) if OUT.is_file() else {"rows": [], "skipped": []}
        doc["real_data"] = cisi_rows(args.target)
        for r in doc["real_data"]:
            print(r)
        finish(doc)
        return
    sizes = [(int(float(a)), int(b)) for a, b in (s.split(":") for s in args.sizes.split(","))]
    kinds = args.kinds.split(",")
    doc = json.loads(OUT.read_text()) if OUT.is_file() else {"rows": [], "skipped": []}
    if args.redo:
        doc["rows"] = [
            r
            for r in doc["rows"]
            if (int(r["N"]), int(r["d"])) not in sizes or r["round_index"] not in kinds
        ]
    done = {(r["N"], r["d"], r["storage"], r["round_index"]) for r in doc["rows"]}
    nq = args.dev_queries + args.queries
    search_args = ["--dev-queries", str(args.dev_queries), "--queries", str(args.queries)]
    search_args += ["--target", str(args.target)]
    for n, d in sizes:
        make_items(n, d)
        exact_top(n, d, nq)
        configs = [] if n >= INT8_ONLY_FROM else [("exact", "float32")]
        configs += [("exact", "int8")] + [(k, None) for k in ("ivf", "hnsw") if k in kinds]
        for kind, storage in configs:
            if kind == "exact" and kind not in kinds:
                continue
            if storage is None:  # a FAISS index: build it (cached) unless skipped
                storage = "int8" if n >= INT8_ONLY_FROM else "float32"
                skipped = [
                    s for s in doc["skipped"] if (s["N"], s["d"], s["round_index"]) != (n, d, kind)
                ]
                if kind == "hnsw" and n > args.hnsw_max:
                    reason = (
                        f"HNSW not built above N = {args.hnsw_max:.0e} "
                        "(build time on 2 shared cores)"
                    )
                    doc["skipped"] = skipped + [
                        {"N": n, "d": d, "round_index": kind, "reason": reason}
                    ]
                    continue
                doc["skipped"] = skipped
                if not index_path(n, d, kind).is_file():
                    print(f"building {kind} for N={n} d={d} ...", file=sys.stderr, flush=True)
                    run_child(["--worker", "build", str(n), str(d), kind])
            if (n, d, storage, kind) in done:
                continue
            if (
                kind != "exact"
                and not tuned_path(n, d, kind, args.dev_queries, args.target).is_file()
            ):
                print(f"tuning {kind} for N={n} d={d} ...", file=sys.stderr, flush=True)
                run_child(["--worker", "tune", str(n), str(d), kind, storage, *search_args])
            print(f"searching N={n} d={d} {kind} {storage} ...", file=sys.stderr, flush=True)
            row = run_child(["--worker", "search", str(n), str(d), kind, storage, *search_args])
            doc["rows"].append(row)
            done.add((n, d, storage, kind))
            finish(doc)
    finish(doc)
    print_table(doc)


def finish(doc: dict) -> None:
    """recall_vs_exact against exact float32 (or int8 where only int8 exists) rounds, and save
    (keeping the real-data rows another run wrote)."""
    if "real_data" not in doc and OUT.is_file():
        old = json.loads(OUT.read_text())
        if "real_data" in old:
            doc["real_data"] = old["real_data"]
    for r in doc["rows"]:
        ref_storage = "int8" if r["N"] >= INT8_ONLY_FROM else "float32"
        ref = [
            x
            for x in doc["rows"]
            if (x["N"], x["d"], x["storage"], x["round_index"])
            == (r["N"], r["d"], ref_storage, "exact")
        ]
        if ref:
            r["recall_vs_exact"] = r["recall"] - ref[0]["recall"]
            r["engine_ratio_vs_exact"] = r["engine_ms_per_query"] / ref[0]["engine_ms_per_query"]
            r["reference"] = f"exact {ref_storage}"
        r.setdefault("build_s", None)
    doc.update(
        benchmark="scale_bench",
        date=utc_now(),
        machine=machine("numpy", "faiss-cpu"),
        settings={
            "B": B,
            "rounds": ROUNDS,
            "k": K,
            "mix": MIX,
            "method": "axn",
            "first": "DE top-10 through the round features",
            "oversample": 2.0,
            "queries": "one at a time",
        },
    )
    doc["rows"].sort(
        key=lambda r: (r["N"], r["d"], r["round_index"] != "exact", r["round_index"], r["storage"])
    )
    write_json(OUT, doc)


def _width_cell(r: dict) -> str:
    """The width, or ``a-b`` for per-round widths from a to b."""
    if r.get("round_widths"):
        w = sorted(r["round_widths"].values())
        return f"{w[0]}-{w[-1]}"
    return str(r.get("width", ""))


def print_table(doc: dict) -> None:
    cols = ["N", "d", "storage", "index", "width", "engine ms/q", "x exact", "recall"]
    cols += ["vs exact", "RSS MB", "build s"]
    widths = [9, 4, 8, 6, 6, 11, 8, 7, 9, 8, 8]
    print(" ".join(f"{c:>{w}}" for c, w in zip(cols, widths, strict=True)))
    nan = float("nan")
    for r in doc["rows"]:
        b = r.get("build_s")
        cells = [
            r["N"],
            r["d"],
            r["storage"],
            r["round_index"],
            _width_cell(r),
            f"{r['engine_ms_per_query']:.2f}",
            f"{r.get('engine_ratio_vs_exact', nan):.3f}",
            f"{r['recall']:.3f}",
            f"{r.get('recall_vs_exact', nan):+.3f}",
            f"{r['peak_rss_mb']:.0f}",
            "" if b is None else f"{b:.0f}",
        ]
        print(" ".join(f"{c!s:>{w}}" for c, w in zip(cells, widths, strict=True)))
    for s in doc.get("skipped", []):
        print(f"skipped N={s['N']} d={s['d']} {s['round_index']}: {s['reason']}")


if __name__ == "__main__":
    main()
