"""The int8 recipe table of ``bench/ce_bench.py --recipes``: speed and fidelity to fp32.

For each recipe of :mod:`crossknn.ce.quantize`, on SciFact and NFCorpus at 128 and 256 tokens:

- speed: pairs/s of ``OnnxCrossEncoder.predict`` relative to fp32, on the same real pairs, in the
  same run (interleaved rounds, best of each);
- fidelity: top-10 agreement and mean per-query Spearman against fp32 on (a) 100 random
  candidates per query and (b) each query's fp32 top-100;
- end to end: Top-10-Recall@100 of RNR and AXN search run with the recipe's CE, against the
  **fp32** CE's exact top-10, next to the same search run with the fp32 CE.

CPU is scarce, so everything runs on a sub-corpus: ``--queries`` test queries (with qrels) and
``--items`` items = the union of each query's top-``--de-top`` items by TF-IDF over the whole
corpus, filled up with random corpus items. Each precision scores the whole
queries x sub-corpus matrix once; the matrices are cached (``bench/results/cache``, gitignored)
so a rerun, or a run cut off, redoes only what is missing. The search runs on these matrices
(``MatrixScorer``): a dynamically quantized graph scales activations per batch, so its scores
inside a search differ from the matrix's by the batch composition (that noise is part of what
the agreement measures).
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import numpy as np

from _common import RESULTS, SHARED, best_of, machine, utc_now, write_json
from crossknn.data import load_beir

CACHE = RESULTS / "cache" / "ce_recipes"
DATASETS = ("scifact", "nfcorpus")
LENGTHS = (128, 256)


def _save(path: Path, arr: np.ndarray) -> None:
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp.npy")
    np.save(tmp, arr)
    os.replace(tmp, path)


def _cached(path: Path, fn):
    if path.is_file():
        return np.load(path)
    arr = fn()
    path.parent.mkdir(parents=True, exist_ok=True)
    _save(path, arr)
    return arr


def sub_corpus(dataset: str, n_queries: int, n_items: int, de_top: int, seed: int, threads: int):
    """Query texts, item texts, DE query/item vectors of the sub-corpus (cached by name).

    The sub-corpus: each query's top ``de_top`` items by TF-IDF over the whole corpus (encoding
    a whole corpus with the dual encoder costs more CPU than this machine has to spare), filled
    up with random items; the DE vectors (AXN's item features and first stage) are computed for
    the sub-corpus only.
    """
    from crossknn.ce import default_dual_encoder
    from crossknn.retrievers import TfidfRetriever

    data = load_beir(SHARED / "data" / dataset)
    test = data.qrels.get("test", {})
    rel = [q for q in data.query_ids if test.get(q)]
    rng = random.Random(seed)
    qids = sorted(rng.sample(rel, min(n_queries, len(rel))))
    queries = data.queries_in_order(qids)
    texts = data.item_texts
    sims = TfidfRetriever(texts).scores(queries)  # the whole corpus, cheaply
    chosen: list[int] = []
    for row in sims:
        for i in np.argsort(-row, kind="stable")[:de_top]:
            if int(i) not in chosen:
                chosen.append(int(i))
    rest = [i for i in range(len(texts)) if i not in set(chosen)]
    chosen += random.Random(seed + 1).sample(rest, max(0, n_items - len(chosen)))
    chosen = chosen[:n_items] if len(chosen) > n_items else chosen
    items = [texts[i] for i in chosen]
    key = f"{dataset}-q{len(qids)}-s{seed}-n{len(chosen)}-t{de_top}"
    de = default_dual_encoder(threads=threads)
    dq = _cached(CACHE / f"{key}-de-queries.npy", lambda: de.encode(queries))
    di = _cached(CACHE / f"{key}-de-items.npy", lambda: de.encode(items))
    return queries, items, dq, di, key


def model_dirs(recipes, cache_dir: Path | None) -> dict[str, Path]:
    """One export of the embedded CE with fp32 and every recipe (one calibration set)."""
    from crossknn.ce.export import EXPORT_RECIPE, export_cross_encoder
    from crossknn.ce.manifest import read_manifest
    from crossknn.ce.models import minilm_checkpoint_dir
    from crossknn.ce.quantize import MIXED_FP32_SHARE, RECIPES, STATIC_METHOD

    # every recipe, always (one calibration set, one sensitivity pass); the run uses `recipes`
    everything = tuple(r for r in RECIPES if r != "int8")
    tag = f"r{EXPORT_RECIPE}-{MIXED_FP32_SHARE}-{STATIC_METHOD}"
    out = (cache_dir or CACHE) / f"minilm-l6-joint-{tag}"
    try:
        read_manifest(out)
    except (FileNotFoundError, ValueError):
        t0 = time.perf_counter()
        print(f"exporting {out.name} (fp32 + {', '.join(everything)}) ...", flush=True)
        export_cross_encoder(
            minilm_checkpoint_dir(),
            out,
            kind="joint",
            max_length=128,
            model_id="minilm-l6-joint",
            quantize=everything,
            overwrite=True,
        )
        print(f"exported in {time.perf_counter() - t0:.0f} s", flush=True)
    return {p: out for p in ("fp32", *recipes)}


def score_matrix(model_dir: Path, precision: str, queries, items, max_length: int, threads: int):
    from crossknn.ce import OnnxCrossEncoder

    ce = OnnxCrossEncoder(
        model_dir, precision=precision, max_length=max_length, threads=threads, items=items
    )
    out = ce.score_batch(queries, [np.arange(len(items))] * len(queries))
    return np.stack(out)


def topk_agreement(a: np.ndarray, b: np.ndarray, k: int = 10) -> float:
    ta = set(np.argsort(-a, kind="stable")[:k])
    tb = set(np.argsort(-b, kind="stable")[:k])
    return len(ta & tb) / k


def fidelity(ref: np.ndarray, got: np.ndarray, seed: int) -> dict:
    """Agreement and Spearman on random-100 and fp32-top-100 candidates per query."""
    from scipy.stats import spearmanr

    rng = np.random.default_rng(seed)
    out = {}
    for name in ("random", "top100"):
        agree, rho = [], []
        for r in range(ref.shape[0]):
            if name == "random":
                cand = rng.choice(ref.shape[1], min(100, ref.shape[1]), replace=False)
            else:
                cand = np.argsort(-ref[r], kind="stable")[:100]
            a, b = ref[r, cand], got[r, cand]
            agree.append(topk_agreement(a, b))
            rho.append(float(spearmanr(a, b).statistic))
        out[name] = {"top10_agreement": float(np.mean(agree)), "spearman": float(np.mean(rho))}
    out["max_abs_diff"] = float(np.max(np.abs(ref - got)))
    return out


def search_recall(matrix, exact_top10, dq, di, budget: int = 100, seed: int = 0) -> dict:
    """Top-10-Recall@budget of RNR and AXN (DE first stage) against the given exact top-10."""
    from crossknn.retrievers import DenseRetriever
    from crossknn.scorers import MatrixScorer
    from crossknn.search.factory import make_method

    first = DenseRetriever(di, query_vectors=dq)
    scorer = MatrixScorer(matrix)
    rows = list(range(matrix.shape[0]))
    out = {}
    for name in ("rnr", "axn"):
        kw = {"item_vectors": di, "prior": dq} if name == "axn" else {}
        method = make_method(name, first=first, n_items=matrix.shape[1], **kw)
        res = method.search(scorer, rows, budget=budget, k=10, seed=seed)
        rec = [len(set(res.indices[r]) & set(exact_top10[r])) / 10 for r in rows]
        out[name] = float(np.mean(rec))
    return out


def speed(model_dirs, recipes, queries, items, max_length, threads, n_pairs, rounds, seed):
    """pairs/s of each precision on the same ``n_pairs`` real pairs, interleaved rounds."""
    from crossknn.ce import OnnxCrossEncoder

    rng = random.Random(seed)
    pairs = [(rng.choice(queries), rng.choice(items)) for _ in range(n_pairs)]
    ces = {
        p: OnnxCrossEncoder(model_dirs[p], precision=p, max_length=max_length, threads=threads)
        for p in ("fp32", *recipes)
    }
    for ce in ces.values():
        ce.predict(pairs[:16])  # warm-up
    best = {p: float("inf") for p in ces}
    for r in range(rounds):
        names = list(ces) if r % 2 == 0 else list(reversed(ces))
        for p in names:
            best[p] = min(best[p], best_of(lambda ce=ces[p]: ce.predict(pairs)))
    return {p: n_pairs / t for p, t in best.items()}


def run(args, recipes) -> dict:
    """One (dataset, max length) cell per call, results merged into the JSON as they come."""
    import logging

    logging.getLogger("crossknn.ce").setLevel(logging.ERROR)
    out_path = args.out
    import json

    done = json.loads(out_path.read_text()) if out_path.is_file() else {"cells": {}}
    dirs = model_dirs(recipes, args.cache_dir)
    for dataset in args.datasets:
        queries, items, dq, di, key = sub_corpus(
            dataset, args.queries, args.items, args.de_top, args.seed, args.threads
        )
        for max_len in args.lengths:
            cell = f"{dataset}-{max_len}"
            t0 = time.perf_counter()
            mats = {}
            for p in ("fp32", *recipes):
                # fp32: the traced checkpoint (deterministic); a recipe: its file's hash
                fkey = "fp32" if p == "fp32" else _file_key(dirs[p], p)
                path = CACHE / f"{key}-L{max_len}-{p}-{fkey}.npy"
                print(f"[{cell}] {p}: {'cached' if path.is_file() else 'scoring'}", flush=True)
                mats[p] = _cached(
                    path,
                    lambda p=p, q=queries, it=items, n=max_len: score_matrix(
                        dirs[p], p, q, it, n, args.threads
                    ),
                )
            ref = mats["fp32"].astype(np.float64)
            exact = np.argsort(-ref, axis=1, kind="stable")[:, :10]
            pps = speed(
                dirs,
                recipes,
                queries,
                items,
                max_len,
                args.threads,
                args.speed_pairs,
                args.rounds,
                args.seed,
            )
            rows = {}
            for p in ("fp32", *recipes):
                got = mats[p].astype(np.float64)
                rows[p] = {
                    "pairs_per_s": round(pps[p], 1),
                    "speed_vs_fp32": round(pps[p] / pps["fp32"], 2),
                    **({} if p == "fp32" else fidelity(ref, got, args.seed)),
                    "recall_vs_fp32_top10": search_recall(got, exact, dq, di, seed=args.seed),
                }
            done["cells"][cell] = {
                "dataset": dataset,
                "max_length": max_len,
                "queries": len(queries),
                "sub_corpus_items": len(items),
                "de_top": args.de_top,
                "speed_pairs": args.speed_pairs,
                "rows": rows,
                "seconds": round(time.perf_counter() - t0, 1),
                "load_average": [round(x, 2) for x in os.getloadavg()],
                "date_utc": utc_now(),
            }
            done["machine"] = machine("onnxruntime")
            done["recipes"] = {p: _recipe_of(dirs[p], p) for p in recipes}
            write_json(out_path, done)
            print_cell(done["cells"][cell])
    return done


def _file_key(model_dir: Path, precision: str) -> str:
    import json

    m = json.loads((model_dir / "crossknn_model.json").read_text())
    return m["files"][m["variants"][precision]]["sha256"][:12]


def _recipe_of(model_dir: Path, precision: str) -> dict:
    from crossknn.ce import fidelity_record

    rec = fidelity_record(model_dir, precision)
    return {k: v for k, v in rec.items() if k != "sensitivity"} | (
        {"sensitivity": rec["sensitivity"]} if "sensitivity" in rec else {}
    )


def print_cell(cell: dict) -> None:
    print(
        f"\n{cell['dataset']} @ {cell['max_length']} tokens: {cell['queries']} queries x "
        f"{cell['sub_corpus_items']} items"
    )
    head = (
        f"{'precision':<13} {'x fp32':>6} {'rand agr':>8} {'rand rho':>8} {'top agr':>8} "
        f"{'top rho':>8} {'max diff':>8} {'RNR rec':>8} {'AXN rec':>8}"
    )
    print(head)
    print("-" * len(head))
    for p, r in cell["rows"].items():
        f = (
            f"{r['random']['top10_agreement']:>8.3f} {r['random']['spearman']:>8.3f} "
            f"{r['top100']['top10_agreement']:>8.3f} {r['top100']['spearman']:>8.3f} "
            f"{r['max_abs_diff']:>8.4f}"
            if "random" in r
            else f"{'':>8} {'':>8} {'':>8} {'':>8} {'':>8}"
        )
        rec = r["recall_vs_fp32_top10"]
        print(f"{p:<13} {r['speed_vs_fp32']:>6.2f} {f} {rec['rnr']:>8.3f} {rec['axn']:>8.3f}")
