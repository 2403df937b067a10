"""What the embedded CE scores on real BEIR corpora: nDCG@10 against the qrels (ir_measures).

For NFCorpus and SciFact (``../shared/data``), on the first ``--queries`` test queries (in the
order of ``qrels/test.tsv``): the DE alone (its top-100), the embedded CE reranking the DE's
top-100 exactly (100 CE calls per query; this is also what RNR at B=100 does, so RNR is reported
from the same scores), and AXN at B=100 (the default search). The models are the embedded ones
(``minilm-l6-joint`` CE at ``--ce-precision``, default int8: what a CPU user runs for speed;
``minilm-l6-de`` DE at ``--de-precision``, default fp32).

CE scores are cached per (query, item) in ``--work`` and the finished parts are kept in the result
file, so a rerun after an interruption does only what is missing. Run niced in the background::

    nice -n 5 .venv/bin/python bench/beir_bench.py > /tmp/beir_bench.log 2>&1 &

Writes ``bench/results/beir_ndcg.json`` and prints the table.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from _common import REPO, RESULTS, SHARED, machine, utc_now, write_json
from crossknn.trec import parse_measures, run_metrics

OUT = RESULTS / "beir_ndcg.json"
BUDGET = 100
DEPTH = 100


class CachedCE:
    """The CE with its (query, item) scores kept on disk: AXN and RNR reuse the rerank's pairs.

    ``calls_run`` counts the pairs the CE really scored (not the cached ones)."""

    def __init__(self, ce, path: Path) -> None:
        self.ce, self.path = ce, path
        self.model_id, self.model_hash = ce.model_id, ce.model_hash
        self.precision, self.max_length = ce.precision, ce.max_length
        self.cache: dict[str, dict[int, float]] = {}
        if path.is_file():
            raw = json.loads(path.read_text())
            self.cache = {q: {int(i): s for i, s in row.items()} for q, row in raw.items()}
        self.calls_run = 0

    def set_items(self, texts) -> None:
        self.ce.set_items(texts)

    @property
    def n_items(self) -> int:
        return self.ce.n_items

    def save(self) -> None:
        from crossknn.fileio import atomic_write_bytes

        atomic_write_bytes(self.path, json.dumps(self.cache).encode())

    def score_batch(self, queries, items) -> list[np.ndarray]:
        todo_q, todo_i = [], []
        for q, it in zip(queries, items, strict=True):
            row = self.cache.setdefault(q, {})
            new = [int(i) for i in np.asarray(it).tolist() if int(i) not in row]
            if new:
                todo_q.append(q)
                todo_i.append(np.array(sorted(set(new)), np.int64))
        if todo_q:
            for q, it, s in zip(todo_q, todo_i, self.ce.score_batch(todo_q, todo_i), strict=True):
                self.cache[q].update(zip(it.tolist(), map(float, s), strict=True))
                self.calls_run += len(it)
        return [
            np.array([self.cache[q][int(i)] for i in np.asarray(it).tolist()], np.float32)
            for q, it in zip(queries, items, strict=True)
        ]

    def score(self, query, items) -> np.ndarray:
        return self.score_batch([query], [items])[0]


def _test_queries(beir, n: int) -> tuple[list[str], list[str], dict]:
    qrels = beir.qrels["test"]
    ids = list(qrels)[:n]
    return ids, beir.queries_in_order(ids), {q: qrels[q] for q in ids}


def _metrics(run: dict[str, dict[str, float]], qrels: dict) -> dict[str, float]:
    m = run_metrics(run, qrels, parse_measures("nDCG@10 RR@10"))
    return {"nDCG@10": m["nDCG@10"], "RR@10": m["RR@10"]}


def _run_of(qids, item_ids, indices, scores) -> dict[str, dict[str, float]]:
    return {
        q: {item_ids[int(i)]: float(s) for i, s in zip(ix, sc, strict=True)}
        for q, ix, sc in zip(qids, indices, scores, strict=True)
    }


def bench_dataset(name: str, args, done: dict) -> dict:
    import crossknn
    from crossknn.ce import default_cross_encoder, default_dual_encoder
    from crossknn.data import Corpus, load_beir
    from crossknn.topk import top_k_rows

    folder = SHARED / "data" / name
    beir = load_beir(folder)
    qids, qtexts, qrels = _test_queries(beir, args.queries)
    work = Path(args.work) / f"{name}-{args.de_precision}"
    work.mkdir(parents=True, exist_ok=True)
    de = default_dual_encoder(precision=args.de_precision, threads=args.threads)
    ce = CachedCE(
        default_cross_encoder(precision=args.ce_precision, threads=args.threads),
        work / f"ce_scores_{args.ce_precision}.json",
    )
    index_dir = work / f"index-ce{args.ce_precision}"
    t0 = time.perf_counter()
    if (index_dir / "index.json").is_file():
        index = crossknn.open_index(index_dir)
    else:
        corpus = Corpus(beir.item_ids, beir.item_texts, str(folder))
        index = crossknn.build_corpus_index(corpus, index_dir, ce=ce, de=de)
    ce.save()
    print(f"{name}: index ready ({time.perf_counter() - t0:.0f} s)", flush=True)
    item_ids = index.corpus.ids
    V = np.asarray(index["de_items"], np.float32)
    Q = np.asarray(de.encode(qtexts), np.float32)
    de_top = top_k_rows(Q @ V.T, DEPTH)
    de_scores = np.take_along_axis(Q @ V.T, de_top, axis=1)
    rows = dict(done.get("rows", {}))
    rows["DE alone (top-100 by DE score)"] = {
        **_metrics(_run_of(qids, item_ids, de_top, de_scores), qrels),
        "ce_calls_per_query": 0.0,
    }

    # the exact rerank of the DE top-100, in chunks of 10 queries saved as they finish
    ce.set_items(index.corpus.texts)
    for lo in range(0, len(qids), 10):
        t = time.perf_counter()
        before = ce.calls_run
        ce.score_batch(qtexts[lo : lo + 10], list(de_top[lo : lo + 10]))
        ce.save()
        n = ce.calls_run - before
        dt = time.perf_counter() - t
        print(f"{name}: rerank queries {lo}-{lo + 9}: {n} pairs, {n / max(dt, 1e-9):.1f} pairs/s")
    ce_top = [ce.score(q, it) for q, it in zip(qtexts, de_top, strict=True)]
    run = {
        q: {item_ids[int(i)]: float(s) for i, s in zip(it, sc, strict=True)}
        for q, it, sc in zip(qids, de_top, ce_top, strict=True)
    }
    rows["CE exact rerank of the DE top-100"] = {
        **_metrics(run, qrels),
        "ce_calls_per_query": float(DEPTH),
    }

    searcher = crossknn.Searcher(index, ce=ce, de=de)
    for method in ("rnr", "axn"):
        label = f"{method.upper()} at B={BUDGET} (top-10)"
        t = time.perf_counter()
        before = ce.calls_run
        hits = searcher.search(qtexts, k=10, budget=BUDGET, method=method)
        ce.save()
        run = {
            q: dict(zip(h.ids, map(float, h.scores), strict=True))
            for q, h in zip(qids, hits, strict=True)
        }
        rows[label] = {
            **_metrics(run, qrels),
            "ce_calls_per_query": float(np.mean([h.ce_calls for h in hits])),
        }
        print(
            f"{name}: {method} done, {ce.calls_run - before} new pairs, "
            f"{time.perf_counter() - t:.0f} s",
            flush=True,
        )
    return {
        "dataset": name,
        "n_items": len(item_ids),
        "n_test_queries_total": len(beir.qrels["test"]),
        "queries": f"the first {len(qids)} test queries in qrels/test.tsv order",
        "query_ids": qids,
        "rows": rows,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--datasets", nargs="+", default=["nfcorpus", "scifact"])
    p.add_argument("--queries", type=int, default=30, help="first N test queries (default 30)")
    p.add_argument("--ce-precision", choices=("fp32", "int8"), default="int8")
    p.add_argument("--de-precision", choices=("fp32", "int8"), default="fp32")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--work", default=str(REPO / "cache" / "beir_bench"))
    args = p.parse_args()
    old = json.loads(OUT.read_text()) if OUT.is_file() else {}
    key = {"queries": args.queries, "ce": args.ce_precision, "de": args.de_precision}
    results = old.get("results", {}) if old.get("settings") == key else {}
    for name in args.datasets:
        if name in results:
            print(f"{name}: done in {OUT}, skipped")
            continue
        results[name] = bench_dataset(name, args, results.get(name, {}))
        # another run (e.g. the other dataset in parallel) may have written meanwhile: merge
        now = json.loads(OUT.read_text()) if OUT.is_file() else {}
        if now.get("settings") == key:
            results = {**now.get("results", {}), **results}
        write_json(
            OUT,
            {
                "what": "nDCG@10 / RR@10 (ir_measures) of the embedded CE vs the DE on BEIR test "
                "queries",
                "models": {
                    "ce": f"minilm-l6-joint (embedded), {args.ce_precision}",
                    "de": f"minilm-l6-de (embedded), {args.de_precision}",
                },
                "settings": key,
                "date": utc_now(),
                "results": results,
                "machine": machine("onnxruntime", "ir-measures"),
            },
        )
    print(f"\n{'dataset':<10} {'system':<36} {'nDCG@10':>8} {'RR@10':>7} {'CE calls/q':>10}")
    for name, res in results.items():
        for label, row in res["rows"].items():
            print(
                f"{name:<10} {label:<36} {row['nDCG@10']:8.3f} {row['RR@10']:7.3f} "
                f"{row['ce_calls_per_query']:10.1f}"
            )


if __name__ == "__main__":
    if sys.argv[1:2] == ["max-length"]:  # the CE's maximum length: bench/_max_length.py
        from _max_length import main as max_length

        sys.exit(max_length(sys.argv[2:]))
    main()
