"""End-to-end recall and engine time of IVF rounds per nprobe at N = 1e7 (d = 128, int8 items):
the 30 test queries of scale_bench searched one at a time with exact int8 rounds (the reference)
and with the cached IVF index at each width; prints a table and writes JSON.

    .venv/bin/python bench/scale_diag/widths.py 8 16 32 64 128 192 256   # after scale_bench.py

FAISS threads: all cores (``FAISS_THREADS`` to change), as the exact kernel uses.
"""

import os
import sys
import time

sys.path.insert(0, "bench")
import faiss
import numpy as np

import scale_bench as sb
from _common import RESULTS, machine, utc_now, write_json
from crossknn.search.round_index import IndexedFeatures

N, D, NDEV, NTEST = 10_000_000, 128, 10, 30
OUT = RESULTS / "scale_widths_1e7.json"


def recall(want, got) -> float:
    hits = [np.intersect1d(a, b).size / sb.K for a, b in zip(want, got, strict=True)]
    return float(np.mean(hits))


def main() -> None:
    widths = [int(w) for w in sys.argv[1:]] or [8, 16, 32, 64, 128, 192, 256]
    threads = int(os.environ.get("FAISS_THREADS", os.cpu_count() or 1))
    faiss.omp_set_num_threads(threads)  # one query's IVF step: parallel over its probed lists
    bed, W, Y = sb.queries(N, D, NDEV + NTEST)
    base = sb.open_items(N, D, "int8")
    scorer = sb.TestbedScorer(bed, W, Y, base)
    test = list(range(NDEV, NDEV + NTEST))
    top = sb.exact_top(N, D, NDEV + NTEST)[test]
    feats = IndexedFeatures(base, faiss.read_index(str(sb.index_path(N, D, "ivf"))), oversample=2)
    method, ref = sb.method_for(feats, W, bed.beta), sb.method_for(base, W, bed.beta)
    for m in (method, ref):  # warm-up: the pages of the memory-mapped items
        for q in test:
            m.search(scorer, [q], budget=sb.B, k=sb.K)

    def run(m):
        scorer.seconds, found = 0.0, []
        t0 = time.perf_counter()
        for q in test:
            found.append(m.search(scorer, [q], budget=sb.B, k=sb.K).indices[0])
        return found, 1000 * (time.perf_counter() - t0 - scorer.seconds) / NTEST

    ref_found, ref_ms = run(ref)
    ref_recall = recall(top, ref_found)
    rows = [{"round_index": "exact", "storage": "int8", "engine_ms_per_query": ref_ms}]
    rows[0].update(recall=ref_recall, recall_vs_exact=0.0, agreement_with_exact=1.0)
    print(f"exact int8: {ref_ms:.1f} ms/query, Top-10-Recall@100 {ref_recall:.4f}", flush=True)
    for w in widths:
        feats.width = w
        found, ms = run(method)
        r = recall(top, found)
        row = {"round_index": "ivf", "nprobe": w, "engine_ms_per_query": ms, "recall": r}
        row.update(recall_vs_exact=r - ref_recall, agreement_with_exact=recall(ref_found, found))
        rows.append(row)
        print(
            f"nprobe {w:4d}: {ms:6.1f} ms/query, recall {r:.4f} ({r - ref_recall:+.4f}), "
            f"same top-10 as exact rounds {row['agreement_with_exact']:.4f}",
            flush=True,
        )
    doc = {"benchmark": "scale_widths", "date": utc_now(), "N": N, "d": D, "queries": NTEST}
    doc.update(nlist=int(feats.index.nlist), faiss_threads=threads, rows=rows)
    doc["machine"] = machine("numpy", "faiss-cpu")
    write_json(OUT, doc)


if __name__ == "__main__":
    main()
