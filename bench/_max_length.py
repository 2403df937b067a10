"""The embedded CE's default maximum length, chosen by measurement: ranking quality against speed.

For each corpus (``--datasets``, BEIR folders in ``../shared/data``) a seeded sample of
``--queries`` test queries (those with qrels; seed ``--seed``) and, for each, the embedded DE's top
``--depth`` items. The embedded CE (``minilm-l6-joint``, fp32, CPU) at each maximum length in
``--lengths`` reranks those items; against the qrels (ir_measures): nDCG@10 and R@10 of the CE's
order, and of the DE's own order as the reference. Beside them, for each length: the share of the
pairs cut (``longest_first``), the mean tokens per pair after the cut, and the CE's speed on this
CPU: pairs per second over the first ``--speed-pairs`` pairs of the sample, best of 3 passes.

The rule, fixed before the measurement: the default stays at 128 (the length of the shared score
matrices, and the fastest) unless a longer length raises nDCG@10 over all sampled queries of all
corpora by more than ``--tolerance`` (0.01) and by more than two standard errors of the paired
per-query difference; then the shortest such length. The JSON records the rule, every row
(with the per-query differences against 128) and the choice.

GPU: a GPU column is part of the table. The pairs/s there come only from result files of GPU
runs (``bench/results/gpu_bench.h200.json``), which measured the CE at max_length 128 only: the
other lengths read "not measured" (no GPU on the machine that ran this).

Resumable: each (corpus, length) score array is kept in ``--work`` and read back on a rerun.
Run it niced in the background (hours on a shared 2-core machine, most of it at the longer
lengths)::

    nice -n 10 .venv/bin/python bench/beir_bench.py max-length > /tmp/max_length.log 2>&1 &

Writes ``bench/results/max_length.json`` and prints the table.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from _common import REPO, RESULTS, SHARED, machine, utc_now, write_json

OUT = RESULTS / "max_length.json"
GPU_SOURCE = RESULTS / "gpu_bench.h200.json"
BASE = 128
RULE = (
    "128 unless a longer length raises nDCG@10 over all sampled queries by more than {tol} and "
    "by more than two standard errors of the paired per-query difference: then the shortest "
    "such length"
)


def _sample(beir, n: int, seed: int) -> tuple[list[str], list[str], dict]:
    qrels = beir.qrels["test"]
    ids = sorted(qrels)
    rng = np.random.default_rng(seed)
    pick = sorted(rng.choice(len(ids), size=min(n, len(ids)), replace=False).tolist())
    qids = [ids[i] for i in pick]
    return qids, beir.queries_in_order(qids), {q: qrels[q] for q in qids}


def _per_query(qids, item_ids, top, scores, qrels) -> np.ndarray:
    """nDCG@10 of each query's ranking (ir_measures), in ``qids`` order."""
    from crossknn.trec import parse_measures, run_metrics

    measures = parse_measures("nDCG@10")
    return np.array(
        [
            run_metrics(
                {q: {item_ids[int(i)]: float(s) for i, s in zip(ix, sc, strict=True)}},
                {q: qrels[q]},
                measures,
            )["nDCG@10"]
            for q, ix, sc in zip(qids, top, scores, strict=True)
        ]
    )


def _metrics(qids, item_ids, top, scores, qrels) -> dict[str, float]:
    from crossknn.trec import parse_measures, run_metrics

    run = {
        q: {item_ids[int(i)]: float(s) for i, s in zip(ix, sc, strict=True)}
        for q, ix, sc in zip(qids, top, scores, strict=True)
    }
    m = run_metrics(run, qrels, parse_measures("nDCG@10 R@10"))
    return {"nDCG@10": round(float(m["nDCG@10"]), 4), "R@10": round(float(m["R@10"]), 4)}


def _pair_lengths(tok, queries, texts, top) -> np.ndarray:
    """Tokens of each (query, item) pair without a cut: [CLS] q [SEP] d [SEP]."""
    tok.no_truncation()
    tok.no_padding()
    q_len = [len(e.ids) for e in tok.encode_batch(queries, add_special_tokens=False)]
    items = sorted({int(i) for row in top for i in row})
    d_len = dict(
        zip(
            items,
            (
                len(e.ids)
                for e in tok.encode_batch([texts[i] for i in items], add_special_tokens=False)
            ),
            strict=True,
        )
    )
    return np.array([[q_len[r] + d_len[int(i)] + 3 for i in row] for r, row in enumerate(top)])


def _matrix_with_items(name: str, item_ids: list[str]) -> Path | None:
    """A shared score matrix of this corpus whose DE item vectors are in corpus order (they
    are the embedded DE's: shared/BENCHMARKS.md), else None (the vectors are computed here)."""
    for folder in sorted((SHARED / "matrices").glob(f"{name}-*")):
        ids = folder / "item_ids.json"
        if ids.is_file() and json.loads(ids.read_text(encoding="utf-8")) == item_ids:
            return folder
    return None


def _gpu_rows() -> dict[int, str]:
    """GPU pairs/s by length from the GPU bench's result file (the CE at 128 only)."""
    if not GPU_SOURCE.is_file():
        return {}
    doc = json.loads(GPU_SOURCE.read_text(encoding="utf-8"))
    best: dict[str, float] = {}
    for row in doc.get("ce", []):
        if row.get("provider") == "CUDAExecutionProvider":
            p = str(row["precision"])
            best[p] = max(best.get(p, 0.0), float(row["pairs_per_s"]))
    if not best:
        return {}
    device = str(doc.get("device", "GPU")).split(",")[0]
    text = ", ".join(f"{p} {v:,.0f}" for p, v in sorted(best.items()))
    return {128: f"{device}: {text} ({GPU_SOURCE.name}, SciFact pairs)"}


def bench_dataset(name: str, args, ce_dir: Path, de) -> dict:
    from tokenizers import Tokenizer

    from crossknn.ce import OnnxCrossEncoder
    from crossknn.data import load_beir
    from crossknn.topk import top_k_rows

    beir = load_beir(SHARED / "data" / name)
    qids, qtexts, qrels = _sample(beir, args.queries, args.seed)
    texts, item_ids = list(beir.item_texts), list(beir.item_ids)
    work = Path(args.work) / name
    work.mkdir(parents=True, exist_ok=True)
    vec_file = work / "de_items.npy"
    matrix = _matrix_with_items(name, item_ids)
    if matrix is not None:  # the embedded DE's item vectors, computed with the matrix
        V = np.load(matrix / "de_items.npy").astype(np.float32)
    elif vec_file.is_file():
        V = np.load(vec_file)
    else:
        t = time.perf_counter()
        V = np.asarray(de.encode(texts), np.float32)
        np.save(vec_file, V)
        print(f"{name}: DE vectors of {len(texts)} items, {time.perf_counter() - t:.0f} s")
    S = np.asarray(de.encode(qtexts), np.float32) @ V.T
    top = top_k_rows(S, args.depth)
    de_scores = np.take_along_axis(S, top, axis=1)
    lengths = _pair_lengths(Tokenizer.from_file(str(ce_dir / "tokenizer.json")), qtexts, texts, top)
    out = {
        "dataset": name,
        "de_items": f"{matrix.relative_to(SHARED)}/de_items.npy" if matrix else "computed here",
        "n_items": len(texts),
        "queries": len(qids),
        "query_ids": qids,
        "de": _metrics(qids, item_ids, top, de_scores, qrels),
        "pair_tokens_median": int(np.median(lengths)),
        "rows": [],
    }
    for L in args.lengths:
        ce = OnnxCrossEncoder(ce_dir, max_length=L, threads=args.threads)
        ce.set_items(texts)
        f = work / f"ce_L{L}.npy"
        if f.is_file():
            scores = np.load(f)
        else:
            t = time.perf_counter()
            scores = np.stack(
                [s for lo in range(0, len(qtexts), 8) for s in ce.score_batch(
                    qtexts[lo : lo + 8], list(top[lo : lo + 8])
                )]
            ).astype(np.float32)  # fmt: skip
            np.save(f, scores)
            print(f"{name} L={L}: {scores.size} pairs scored, {time.perf_counter() - t:.0f} s")
        order = np.argsort(-scores, axis=1, kind="stable")
        rerank = np.take_along_axis(top, order, axis=1)
        # speed: the first speed-pairs pairs of the sample (whole queries), best of 3
        n_q = min(len(qtexts), max(1, args.speed_pairs // args.depth))
        pairs = n_q * args.depth
        best = float("inf")
        for _ in range(3):
            t = time.perf_counter()
            ce.score_batch(qtexts[:n_q], list(top[:n_q]))
            best = min(best, time.perf_counter() - t)
        cut = np.minimum(lengths, L)
        ranked = np.take_along_axis(scores, order, axis=1)
        row = {
            "max_length": L,
            **_metrics(qids, item_ids, rerank, ranked, qrels),
            "per_query_nDCG@10": [
                round(float(x), 4) for x in _per_query(qids, item_ids, rerank, ranked, qrels)
            ],
            "truncated_share": round(float((lengths > L).mean()), 4),
            "mean_tokens": round(float(cut.mean()), 1),
            "cpu_pairs_per_s": round(pairs / best, 1),
            "speed_pairs": pairs,
            "load_average_1min": round(os.getloadavg()[0], 2),
        }
        out["rows"].append(row)
        print(name, json.dumps(row), flush=True)
    return out


def _choose(results: list[dict], lengths: list[int], tol: float) -> dict:
    """The rule (:data:`RULE`) over the per-query nDCG@10 of every corpus, paired by query."""

    def per_query(L: int) -> np.ndarray:
        return np.concatenate(
            [
                np.asarray(next(r for r in d["rows"] if r["max_length"] == L)["per_query_nDCG@10"])
                for d in results
            ]
        )

    base = per_query(BASE)
    diffs = {}
    for L in lengths:
        d = per_query(L) - base
        se = float(d.std(ddof=1) / np.sqrt(d.size)) if d.size > 1 else float("inf")
        diffs[L] = {"mean_diff_vs_128": round(float(d.mean()), 4), "se": round(se, 4)}
    better = [
        L
        for L in lengths
        if L > BASE
        and diffs[L]["mean_diff_vs_128"] > tol
        and diffs[L]["mean_diff_vs_128"] > 2 * diffs[L]["se"]
    ]
    return {
        "max_length": int(min(better) if better else BASE),
        "queries": int(base.size),
        "nDCG@10_vs_128": {str(L): v for L, v in diffs.items()},
    }


def print_table(doc: dict) -> None:
    names = [d["dataset"] for d in doc["results"]]
    head = "| max_length | " + " | ".join(f"{n} nDCG@10 / R@10 (cut)" for n in names)
    print(head + " | nDCG@10 vs 128 (± se) | CPU pairs/s (mean) | GPU pairs/s |")
    de = " | ".join(f"{d['de']['nDCG@10']:.3f} / {d['de']['R@10']:.3f}" for d in doc["results"])
    print(f"| DE alone | {de} | | | |")
    diff = doc["choice"]["nDCG@10_vs_128"]
    for L in doc["settings"]["lengths"]:
        cells, speed = [], []
        for d in doc["results"]:
            r = next(r for r in d["rows"] if r["max_length"] == L)
            cells.append(f"{r['nDCG@10']:.3f} / {r['R@10']:.3f} ({r['truncated_share']:.0%})")
            speed.append(r["cpu_pairs_per_s"])
        gpu = doc["gpu"].get(str(L), "not measured")
        dl = diff[str(L)]
        print(
            f"| {L} | " + " | ".join(cells) + f" | {dl['mean_diff_vs_128']:+.3f} ± {dl['se']:.3f} "
            f"| {np.mean(speed):.0f} | {gpu} |"
        )
    print(f"choice: max_length {doc['choice']['max_length']} ({doc['rule']})")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--datasets", nargs="+", default=["scifact", "nfcorpus", "cisi"])
    p.add_argument("--lengths", nargs="+", type=int, default=[128, 192, 256, 384])
    p.add_argument("--queries", type=int, default=50)
    p.add_argument("--depth", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--speed-pairs", type=int, default=240)
    p.add_argument("--tolerance", type=float, default=0.01)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--work", default=str(REPO / "cache" / "max_length_bench"))
    args = p.parse_args(argv)

    from crossknn.ce import default_dual_encoder, ensure_model

    ce_dir = ensure_model("minilm-l6-joint")
    de = default_dual_encoder(threads=args.threads, show_progress_bar=False)
    started = utc_now()
    results = [bench_dataset(name, args, ce_dir, de) for name in args.datasets]
    doc = {
        "bench": "beir_bench max-length",
        "started": started,
        "finished": utc_now(),
        "machine": machine("onnxruntime"),
        "settings": {
            "datasets": args.datasets,
            "lengths": args.lengths,
            "queries": f"{args.queries} test queries with qrels per corpus, seed {args.seed}",
            "candidates": f"the embedded DE's top {args.depth} (fp32), reranked by the CE",
            "ce": "minilm-l6-joint fp32, ONNX Runtime CPU",
            "speed": f"{args.speed_pairs} pairs of the sample, best of 3",
        },
        "rule": RULE.format(tol=args.tolerance),
        "gpu": {str(k): v for k, v in _gpu_rows().items()},
        "gpu_note": "no GPU on the machine that ran this bench: the GPU column holds only the "
        "CE's pairs/s at max_length 128 from an earlier GPU run's result file; the other "
        "lengths were not measured on a GPU",
        "results": results,
        "choice": _choose(results, args.lengths, args.tolerance),
    }
    write_json(OUT, doc)
    print_table(doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
