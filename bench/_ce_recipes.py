"""The int8 recipe table of ``bench/ce_bench.py --recipes``: speed and fidelity to fp32.

Candidates are what a reranker actually sees: for each of ``--queries`` SciFact / NFCorpus test
queries (with qrels), its **pool** = the dual encoder's top ``--pool`` items over the *whole*
corpus (the DE vectors of a corpus are cached, :func:`crossknn.train.negatives.item_vectors`),
plus ``--random`` random corpus items outside the pool. Every precision scores exactly these
pairs (same feeds: pairs assembled as the runtime does, length-sorted batches of 16), so:

- fidelity, per query against fp32: top-10 agreement and Spearman on (a) the random items and
  (b) the pool (the fp32 ranking of the DE top-100: the CE's own top candidates among what a
  search sees, whose scores lie in a narrow band); a paired comparison of every recipe with
  ``int8-dynamic`` (mean per-query difference of the pool agreement, its standard error, and a
  paired bootstrap 95% interval);
- speed: pairs/s of each precision on the same ``--speed-pairs`` pool pairs (prebuilt feeds, the
  session runs only: tokenization is excluded, so the ratios are the model's), interleaved rounds
  in one run, best of each, relative to fp32;
- end to end: per query, RNR and AXN search (DE first stage / item features over the pool) with
  a budget of ``--budget`` CE calls answered from the precision's scores, Top-10-Recall against
  the **fp32** top-10 of the pool, next to the same search run on the fp32 scores.

Bench-only variants of ``int8-mixed`` with another fp32 share (``int8-mixed@0.12``) reuse the
export's recorded sensitivity ranking (no second sensitivity pass). Scores are cached per
(dataset, length, queries, file hash) under ``bench/results/cache`` (gitignored), so a rerun or a
run cut off redoes only what is missing; cells run in the given order, results merged into the
JSON as each cell ends.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import time
from functools import partial
from pathlib import Path

import numpy as np

from _common import RESULTS, SHARED, best_of, machine, utc_now, write_json
from crossknn.data import load_beir

CACHE = RESULTS / "cache" / "ce_recipes"


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


def pools(dataset: str, n_queries: int, pool: int, n_random: int, seed: int, threads: int):
    """Query texts, item texts, per-query candidate columns (pool then random), DE vectors.

    The queries are a fixed seeded permutation of the test queries with qrels, cut to
    ``n_queries`` (fewer queries = a prefix of more).
    """
    from crossknn.ce import default_dual_encoder
    from crossknn.topk import topk_by_vectors
    from crossknn.train.negatives import item_vectors

    data = load_beir(SHARED / "data" / dataset)
    test = data.qrels.get("test", {})
    rel = sorted(q for q in data.query_ids if test.get(q))
    random.Random(seed).shuffle(rel)
    qids = rel[:n_queries]
    queries = data.queries_in_order(qids)
    texts = list(data.item_texts)
    de = default_dual_encoder(threads=threads)
    V = item_vectors(de, texts)
    dq = de.encode(queries)
    top = topk_by_vectors(dq, V, pool)
    rng = np.random.default_rng(seed)
    rand = []
    for row in top:
        out = np.setdiff1d(np.arange(len(texts)), row)
        rand.append(rng.choice(out, n_random, replace=False))
    cols = np.concatenate([top, np.stack(rand)], axis=1)
    return queries, texts, cols, dq, V


def feeds_for(tokenizer: Path, queries, texts, cols, max_length: int):
    from crossknn.ce.fidelity import pair_feeds

    uniq = np.unique(cols)
    items = [texts[i] for i in uniq]
    qi = np.repeat(np.arange(len(queries)), cols.shape[1])
    ii = np.searchsorted(uniq, cols.ravel())
    return pair_feeds(tokenizer, queries, items, qi, ii, max_length=max_length)


def variant_files(model_dir: Path, recipes: list[str]) -> dict[str, Path]:
    """ONNX file of each precision; ``int8-mixed@S`` is built from the recorded sensitivity."""
    from crossknn.ce.fidelity import fidelity_record
    from crossknn.ce.quantize import (
        _dynamic,
        _weight_sizes,
        choose_fp32,
        node_groups,
        variant_file,
        weight_matmuls,
    )

    src = model_dir / "model.onnx"
    out = {"fp32": src}
    for p in recipes:
        if "@" not in p:
            out[p] = model_dir / variant_file(p)
            continue
        base, share = p.split("@")
        dst = CACHE / f"{model_dir.name}-{base}-{share}.onnx"
        if not dst.is_file():
            sens = fidelity_record(model_dir, base)["sensitivity"]
            groups = node_groups(weight_matmuls(src))
            rows = [{"group": r["group"], "nodes": groups[r["group"]]} for r in sens]
            keep = choose_fp32(rows, _weight_sizes(src), float(share))
            nodes = [n for g in keep for n in groups[g]]
            tmp = dst.with_name(dst.name + ".tmp.onnx")
            _dynamic(src, tmp, exclude=nodes)
            os.replace(tmp, dst)
            dst.with_suffix(".json").write_text(json.dumps({"fp32_groups": keep}))
        out[p] = dst
    return out


def _score(path: Path, feeds, order, shape, threads: int) -> np.ndarray:
    from crossknn.ce.fidelity import score_feeds

    return score_feeds(path, feeds, order, threads=threads).reshape(shape)


def _file_key(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:12]


def _agree(a: np.ndarray, b: np.ndarray, k: int = 10) -> float:
    k = min(k, len(a))
    return len(set(np.argsort(-a, kind="stable")[:k]) & set(np.argsort(-b, kind="stable")[:k])) / k


def fidelity(ref: np.ndarray, got: np.ndarray, pool: int) -> dict:
    """Per-query agreement / Spearman on the random items and on the pool."""
    from scipy.stats import spearmanr

    out = {}
    for name, sl in (("random", slice(pool, None)), ("pool", slice(0, pool))):
        ag = [_agree(r[sl], g[sl]) for r, g in zip(ref, got, strict=True)]
        rho = [float(spearmanr(r[sl], g[sl]).statistic) for r, g in zip(ref, got, strict=True)]
        out[name] = {
            "top10_agreement": float(np.mean(ag)),
            "spearman": float(np.mean(rho)),
            "per_query_agreement": [round(a, 2) for a in ag],
        }
    out["max_abs_diff"] = float(np.max(np.abs(ref - got)))
    return out


def paired(a: list[float], b: list[float], seed: int = 0, n_boot: int = 10000) -> dict:
    """mean(a - b) per query, its standard error and a paired bootstrap 95% interval."""
    d = np.asarray(a) - np.asarray(b)
    rng = np.random.default_rng(seed)
    boots = d[rng.integers(0, len(d), (n_boot, len(d)))].mean(axis=1)
    lo, hi = np.percentile(boots, [2.5, 97.5])
    return {
        "mean_diff": float(d.mean()),
        "se": float(d.std(ddof=1) / np.sqrt(len(d))) if len(d) > 1 else float("nan"),
        "ci95": [float(lo), float(hi)],
        "queries_better_same_worse": [int((d > 0).sum()), int((d == 0).sum()), int((d < 0).sum())],
    }


def search_recall(scores, ref, dq, V, cols, pool: int, budget: int, seed: int = 0) -> dict:
    """Per-query RNR / AXN search over the query's pool; recall against the fp32 pool top-10."""
    from crossknn.retrievers import DenseRetriever
    from crossknn.scorers import MatrixScorer
    from crossknn.search.factory import make_method

    out = {"rnr": [], "axn": []}
    for r in range(scores.shape[0]):
        items = V[cols[r, :pool]]
        exact = set(np.argsort(-ref[r, :pool], kind="stable")[:10])
        first = DenseRetriever(items, query_vectors=dq[r : r + 1])
        scorer = MatrixScorer(scores[r : r + 1, :pool])
        for name in out:
            kw = {"item_vectors": items, "prior": dq[r : r + 1]} if name == "axn" else {}
            m = make_method(name, first=first, n_items=pool, **kw)
            res = m.search(scorer, [0], budget=budget, k=10, seed=seed)
            out[name].append(len(set(res.indices[0]) & exact) / 10)
    return {k: float(np.mean(v)) for k, v in out.items()}


def speed(files: dict[str, Path], feeds, n_pairs: int, rounds: int, threads: int) -> dict:
    """pairs/s of each file on the first batches (>= n_pairs pairs), interleaved rounds."""
    import onnxruntime as ort

    batch, n = [], 0
    for f in feeds:
        if n >= n_pairs:
            break
        batch.append(f)
        n += f["input_ids"].shape[0]
    sessions = {}
    for p, path in files.items():
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.intra_op_num_threads = threads
        so.log_severity_level = 3
        s = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        names = {i.name for i in s.get_inputs()}
        fs = [{k: v for k, v in f.items() if k in names} for f in batch]
        s.run(None, fs[0])  # warm-up
        sessions[p] = (s, fs)

    def go(p):
        s, fs = sessions[p]
        for f in fs:
            s.run(None, f)

    best = {p: float("inf") for p in sessions}
    for r in range(rounds):
        order = list(sessions) if r % 2 == 0 else list(reversed(sessions))
        for p in order:
            best[p] = min(best[p], best_of(lambda p=p: go(p)))
    return {p: n / t for p, t in best.items()}


def model_dir(cache_dir: Path | None) -> Path:
    """One export of the embedded CE with fp32 and every recipe (one calibration set)."""
    from crossknn.ce.export import EXPORT_RECIPE, export_cross_encoder
    from crossknn.ce.manifest import read_manifest
    from crossknn.ce.models import minilm_checkpoint_dir
    from crossknn.ce.quantize import MIXED_FP32_SHARE, RECIPES, STATIC_METHOD

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
    return out


def run(args, recipes: list[str]) -> dict:
    """Cells ``dataset:length[:queries]`` in order; each merged into the JSON when it ends."""
    import logging

    logging.getLogger("crossknn.ce").setLevel(logging.ERROR)
    out_path = args.out
    done = json.loads(out_path.read_text()) if out_path.is_file() else {}
    done.setdefault("cells", {})
    mdir = model_dir(args.cache_dir)
    files = variant_files(mdir, recipes)
    keys = {p: "fp32" if p == "fp32" else _file_key(f) for p, f in files.items()}
    for spec in args.cells:
        dataset, length, *nq = spec.split(":")
        max_len, n_q = int(length), int(nq[0]) if nq else args.queries
        cell = f"{dataset}-{max_len}"
        t0 = time.perf_counter()
        queries, texts, cols, dq, V = pools(
            dataset, n_q, args.pool, args.random, args.seed, args.threads
        )
        feeds, order = feeds_for(mdir / "tokenizer.json", queries, texts, cols, max_len)
        pps = speed(files, feeds, args.speed_pairs, args.rounds, args.threads)
        print(
            f"[{cell}] x fp32: " + ", ".join(f"{p} {v / pps['fp32']:.2f}" for p, v in pps.items())
        )
        base = f"{dataset}-q{n_q}-p{args.pool}-r{args.random}-s{args.seed}-L{max_len}"
        mats = {}
        for p, f in files.items():
            path = CACHE / f"{base}-{p}-{keys[p]}.npy"
            print(f"[{cell}] {p}: {'cached' if path.is_file() else 'scoring'}", flush=True)
            t1 = time.perf_counter()
            mats[p] = _cached(path, partial(_score, f, feeds, order, cols.shape, args.threads))
            print(f"[{cell}] {p}: {time.perf_counter() - t1:.0f} s", flush=True)
        ref = mats["fp32"]
        rows = {}
        for p in files:
            rows[p] = {
                "pairs_per_s": round(pps[p], 2),
                "speed_vs_fp32": round(pps[p] / pps["fp32"], 2),
                **({} if p == "fp32" else fidelity(ref, mats[p], args.pool)),
                "recall_vs_fp32_top10": search_recall(
                    mats[p], ref, dq, V, cols, args.pool, args.budget, args.seed
                ),
            }
        if "int8-dynamic" in rows:
            dyn = rows["int8-dynamic"]["pool"]["per_query_agreement"]
            for p in rows:
                if p not in ("fp32", "int8-dynamic"):
                    rows[p]["pool_vs_dynamic"] = paired(rows[p]["pool"]["per_query_agreement"], dyn)
        done["cells"][cell] = {
            "dataset": dataset,
            "max_length": max_len,
            "queries": n_q,
            "pool": f"DE top-{args.pool} of the whole corpus per query",
            "random_items_per_query": args.random,
            "search_budget": args.budget,
            "speed_pairs": args.speed_pairs,
            "rows": rows,
            "seconds": round(time.perf_counter() - t0, 1),
            "load_average": [round(x, 2) for x in os.getloadavg()],
            "date_utc": utc_now(),
        }
        done["machine"] = machine("onnxruntime")
        done.setdefault("recipes", {}).update({p: _recipe_of(mdir, files[p], p) for p in recipes})
        done["summary"] = summary(done["cells"], args.seed)
        write_json(out_path, done)
        print_cell(done["cells"][cell])
    print_summary(done["summary"])
    return done


#: the goal of the recipes (issue 18): pool top-10 agreement and speed vs fp32
GOAL_AGREEMENT, GOAL_SPEED, FALLBACK_SPEED = 0.95, 1.5, 1.3


def summary(cells: dict, seed: int = 0) -> dict:
    """Per recipe over the measured cells: mean speed, mean pool agreement, worst recall loss
    against the fp32 search; and the choice by the rule stated before the run (docs/ce.md):

    1. recipes meeting the goal (agreement >= 0.95, speed >= 1.5x): the fastest;
    2. else among recipes with speed >= 1.5x (none: >= 1.3x) the most faithful, unless the paired
       bootstrap 95% interval of its per-query agreement difference to the fastest of them (all
       cells' queries pooled) contains 0: then the fastest.
    """
    names = [p for c in cells.values() for p in c["rows"] if p != "fp32"]
    names = list(dict.fromkeys(names))
    per = {}
    for p in names:
        got = [c for c in cells.values() if p in c["rows"]]
        rows = [c["rows"][p] for c in got]
        loss = [
            c["rows"]["fp32"]["recall_vs_fp32_top10"][m] - c["rows"][p]["recall_vs_fp32_top10"][m]
            for c in got
            for m in ("rnr", "axn")
        ]
        per[p] = {
            "cells": len(rows),
            "speed_vs_fp32": float(np.mean([r["speed_vs_fp32"] for r in rows])),
            "pool_agreement": float(np.mean([r["pool"]["top10_agreement"] for r in rows])),
            "random_agreement": float(np.mean([r["random"]["top10_agreement"] for r in rows])),
            "worst_recall_loss": float(max(loss)),
            "per_query": [a for r in rows for a in r["pool"]["per_query_agreement"]],
        }
    full = [p for p in names if per[p]["cells"] == len(cells)]
    meet = [p for p in full if per[p]["pool_agreement"] >= GOAL_AGREEMENT]
    meet = [p for p in meet if per[p]["speed_vs_fp32"] >= GOAL_SPEED]
    if meet:
        choice, why = max(meet, key=lambda p: per[p]["speed_vs_fp32"]), "meets the goal, fastest"
    else:
        floor = GOAL_SPEED
        fast = [p for p in full if per[p]["speed_vs_fp32"] >= floor]
        if not fast:
            floor = FALLBACK_SPEED
            fast = [p for p in full if per[p]["speed_vs_fp32"] >= floor]
        if not fast:
            return {"recipes": per, "choice": None, "why": "no recipe reaches 1.3x"}
        fastest = max(fast, key=lambda p: per[p]["speed_vs_fp32"])
        best = max(fast, key=lambda p: per[p]["pool_agreement"])
        if best == fastest:
            choice, why = fastest, f"most faithful of those >= {floor}x, and the fastest"
        else:
            c = paired(per[best]["per_query"], per[fastest]["per_query"], seed)
            if c["ci95"][0] > 0:
                choice, why = best, f"most faithful of those >= {floor}x; vs {fastest}: {c}"
            else:
                choice, why = fastest, f"{best} not separated from {fastest} (paired: {c})"
    for p in per:
        per[p].pop("per_query")
    return {"recipes": per, "choice": choice, "why": why}


def print_summary(s: dict) -> None:
    print("\nover the measured cells: recipe, cells, x fp32, pool agreement, worst recall loss")
    for p, r in s["recipes"].items():
        print(
            f"  {p:<17} {r['cells']} {r['speed_vs_fp32']:.2f} {r['pool_agreement']:.3f} "
            f"{r['worst_recall_loss']:+.3f}"
        )
    print(f"choice: {s['choice']} ({s['why']})")


def _recipe_of(mdir: Path, path: Path, precision: str) -> dict:
    from crossknn.ce import fidelity_record

    if "@" in precision:
        return {
            "bench_variant_of": precision.split("@")[0],
            **json.loads(path.with_suffix(".json").read_text()),
        }
    rec = fidelity_record(mdir, precision)
    return {k: v for k, v in rec.items() if k not in ("sensitivity", "fp32_nodes")}


def print_cell(cell: dict) -> None:
    print(
        f"\n{cell['dataset']} @ {cell['max_length']} tokens: {cell['queries']} queries, "
        f"{cell['pool']} + {cell['random_items_per_query']} random; search budget "
        f"{cell['search_budget']}"
    )
    head = (
        f"{'precision':<17} {'x fp32':>6} {'rand agr':>8} {'rand rho':>8} {'pool agr':>8} "
        f"{'pool rho':>8} {'max diff':>8} {'RNR rec':>8} {'AXN rec':>8}"
    )
    print(head)
    print("-" * len(head))
    for p, r in cell["rows"].items():
        f = (
            f"{r['random']['top10_agreement']:>8.3f} {r['random']['spearman']:>8.3f} "
            f"{r['pool']['top10_agreement']:>8.3f} {r['pool']['spearman']:>8.3f} "
            f"{r['max_abs_diff']:>8.4f}"
            if "random" in r
            else f"{'':>8} {'':>8} {'':>8} {'':>8} {'':>8}"
        )
        rec = r["recall_vs_fp32_top10"]
        print(f"{p:<17} {r['speed_vs_fp32']:>6.2f} {f} {rec['rnr']:>8.3f} {rec['axn']:>8.3f}")
    for p, r in cell["rows"].items():
        if "pool_vs_dynamic" in r:
            c = r["pool_vs_dynamic"]
            print(
                f"  {p} - int8-dynamic, pool agreement: {c['mean_diff']:+.3f} "
                f"(se {c['se']:.3f}, 95% CI {c['ci95'][0]:+.3f}..{c['ci95'][1]:+.3f}, "
                f"queries better/same/worse {c['queries_better_same_worse']})"
            )
