"""Why IVF rounds lose recall at N = 1e7 (1/3): records the exact round queries of 5 dev queries
(cached), then per-step recall at nprobe 8/32/128 through the stored HNSW coarse quantizer and
through an exact (flat) one over the same centroids. Needs bench/scale_bench.py's 1e7 cache.

    nice -n 5 .venv/bin/python bench/scale_diag/quantizer.py 5
"""

import sys
import time

sys.path.insert(0, "bench")
import faiss
import numpy as np

import scale_bench as sb
from crossknn.search.round_index import (
    IndexedFeatures,
    _exact_answers,
    record_round_queries,
    round_recall,
)
from scale_diag._records import coarse_centroids, load_records, save_records

n, d, ndev = 10_000_000, 128, int(sys.argv[1]) if len(sys.argv) > 1 else 5
faiss.omp_set_num_threads(1)
rec_path = sb.CACHE / f"records_{n}_{d}_{ndev}.npz"
bed, W, Y = sb.queries(n, d, 10 + 30)
base = sb.open_items(n, d, "int8")
if rec_path.is_file():
    records, exact = load_records(rec_path)
else:
    t0 = time.time()
    scorer = sb.TestbedScorer(bed, W, Y, base)
    records = record_round_queries(
        lambda f: sb.method_for(f, W, bed.beta),
        base,
        scorer,
        list(range(ndev)),
        budget=sb.B,
        k=sb.K,
    )
    idx0 = IndexedFeatures(base, faiss.read_index(str(sb.index_path(n, d, "ivf"))), oversample=2.0)
    exact = _exact_answers(idx0, records)
    save_records(rec_path, records, exact)
    print("recorded", time.time() - t0, flush=True)
index = faiss.read_index(str(sb.index_path(n, d, "ivf")))
q = faiss.downcast_index(index.quantizer)
print(type(q).__name__, index.nlist, index.ntotal, flush=True)
f = IndexedFeatures(base, index, oversample=2.0)


def run(tag):
    for w in [8, 32, 128]:
        f.width = w
        t0 = time.time()
        r = round_recall(f, records, exact)
        print(
            tag,
            w,
            round(float(r.mean()), 4),
            np.round(r.reshape(ndev, -1).mean(0), 3).tolist() if r.size % ndev == 0 else "",
            f"{time.time() - t0:.1f}s",
            flush=True,
        )


run("hnsw-q")
C = coarse_centroids(index)
flat = faiss.IndexFlatIP(d)
flat.add(C)
index.quantizer = flat
index.own_fields = False
print("centroid norms", np.percentile(np.linalg.norm(C, axis=1), [0, 50, 100]))
run("flat-q")
