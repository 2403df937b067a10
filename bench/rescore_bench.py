"""What ``--rescore fp32 N`` buys an int8 search: Top-k agreement with the fp32 search.

On SciFact test queries over a small index (their judged documents plus the head of the corpus),
the embedded CE int8 and fp32, the same DE and the same budget B: each query's int8 top-k is
compared with the fp32 search's top-k (|overlap| / k), without rescore and with the int8 search's
top N rescored by the fp32 CE (N = k and 2k). CE calls per query are reported (the N rescore
calls come on top of B).

    python bench/rescore_bench.py [--queries 25] [--items 600] [--budget 50] [--k 10]

Writes bench/results/rescore_bench.json and prints a table.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

import crossknn
from _common import RESULTS, SHARED, machine, utc_now, write_json
from crossknn.ce import default_cross_encoder, default_dual_encoder
from crossknn.data import Corpus, load_beir
from crossknn.searcher import Searcher


def _data(n_queries: int, n_items: int):
    beir = load_beir(SHARED / "data" / "scifact")
    qrels = beir.qrels["test"]
    queries = dict(zip(beir.query_ids, beir.query_texts, strict=True))
    qids = [q for q in qrels if q in queries][:n_queries]
    pos = {d: i for i, d in enumerate(beir.item_ids)}
    keep = {pos[d] for q in qids for d in qrels[q] if d in pos}  # the judged documents
    for i in range(len(beir.item_ids)):  # and the head of the corpus
        if len(keep) >= n_items:
            break
        keep.add(i)
    keep = sorted(keep)
    corpus = Corpus(
        [beir.item_ids[i] for i in keep], [beir.item_texts[i] for i in keep], "scifact-head"
    )
    return corpus, qids, [queries[q] for q in qids]


def _agreement(a, b, k: int) -> np.ndarray:
    return np.array([len(set(x.ids[:k]) & set(y.ids[:k])) / k for x, y in zip(a, b, strict=True)])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--queries", type=int, default=25)
    p.add_argument("--items", type=int, default=600)
    p.add_argument("--budget", type=int, default=50)
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--out", default=str(RESULTS / "rescore_bench.json"))
    args = p.parse_args()
    k, B = args.k, args.budget
    corpus, qids, texts = _data(args.queries, args.items)
    de = default_dual_encoder()
    rows, hits = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        searchers = {}
        for prec in ("fp32", "int8"):
            ce = default_cross_encoder(precision=prec)
            t0 = time.perf_counter()
            idx = crossknn.build_corpus_index(
                corpus, Path(tmp) / prec, ce=ce, de=de, calibration_queries=8, progress=True
            )
            print(f"{prec} index: {len(idx)} items in {time.perf_counter() - t0:.0f} s")
            rescore = ("fp32", 2 * k) if prec == "int8" else None
            searchers[prec] = Searcher(idx, ce=ce, de=de, rescore=rescore)
        s32, s8 = searchers["fp32"], searchers["int8"]
        runs = [("fp32 search", s32, None), ("int8 search", s8, 0)]
        runs += [(f"int8 + rescore fp32 N={n}", s8, n) for n in (k, 2 * k)]
        for name, s, n in runs:
            t0 = time.perf_counter()
            extra = {} if n is None else {"rescore_top": n}
            hits[name] = s.search(texts, k=k, budget=B, query_ids=qids, progress=True, **extra)
            secs = time.perf_counter() - t0
            agree = _agreement(hits[name], hits["fp32 search"], k)
            rows.append(
                {
                    "run": name,
                    "rescore_n": n or 0,
                    f"top{k}_agreement_with_fp32": round(float(agree.mean()), 4),
                    "min_agreement": round(float(agree.min()), 2),
                    "ce_calls_per_query": float(np.mean([h.ce_calls for h in hits[name]])),
                    "rescore_calls_per_query": float(
                        np.mean([h.rescore_calls or 0 for h in hits[name]])
                    ),
                    "seconds": round(secs, 1),
                }
            )
    print(f"\nSciFact test, {len(qids)} queries, {len(corpus)} items, k={k}, B={B}")
    key = f"top{k}_agreement_with_fp32"
    print(f"{'run':<28} {'agree':>6} {'min':>5} {'CE calls/q':>10} {'rescore/q':>9} {'s':>6}")
    for r in rows:
        print(
            f"{r['run']:<28} {r[key]:>6.3f} {r['min_agreement']:>5.2f} "
            f"{r['ce_calls_per_query']:>10.1f} {r['rescore_calls_per_query']:>9.1f} "
            f"{r['seconds']:>6.1f}"
        )
    write_json(
        args.out,
        {
            "what": "Top-k agreement of the int8 search with the fp32 search (same DE, same "
            "budget), without and with --rescore fp32 N",
            "dataset": "scifact test",
            "n_queries": len(qids),
            "n_items": len(corpus),
            "k": k,
            "budget": B,
            "models": {"ce": "embedded CE int8 / fp32", "de": "embedded DE fp32"},
            "rows": rows,
            "command": "nice -n 5 python bench/rescore_bench.py",
            "machine": machine("onnxruntime", "numpy"),
            "date": utc_now(),
        },
    )


if __name__ == "__main__":
    main()
