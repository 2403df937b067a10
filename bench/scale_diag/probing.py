"""Why IVF rounds lose recall at N = 1e7 (2/3): the rank (by centroid inner product) of the lists
that hold each step's exact answers, and per-step recall for oversample 2/8/32 at nprobe 32/128.

    nice -n 5 .venv/bin/python bench/scale_diag/probing.py      # after quantizer.py
"""

import sys
import time

sys.path.insert(0, "bench")
import faiss
import numpy as np

import scale_bench as sb
from crossknn.search.round_index import IndexedFeatures, round_recall
from scale_diag._records import coarse_centroids, load_records

n, d, ndev = 10_000_000, 128, 5
faiss.omp_set_num_threads(1)
records, exact = load_records(sb.CACHE / f"records_{n}_{d}_{ndev}.npz")
print("n per record", [r[2] for r in records], "scored", [len(r[1][0]) for r in records])
base = sb.open_items(n, d, "int8")
index = faiss.read_index(str(sb.index_path(n, d, "ivf")))
C = coarse_centroids(index)
flat = faiss.IndexFlatIP(d)
flat.add(C)
index.quantizer = flat
index.own_fields = False
# list of each exact answer item
inv = index.invlists
want = np.unique(np.concatenate([e.ravel() for e in exact]))
lst = {}
t0 = time.time()
wset = set(want.tolist())
for li in range(index.nlist):
    ids = faiss.rev_swig_ptr(inv.get_ids(li), inv.list_size(li)).copy()
    for i in ids[np.isin(ids, want)]:
        lst[int(i)] = li
print(
    "mapped",
    len(lst),
    "of",
    want.size,
    f"{time.time() - t0:.1f}s",
    "list sizes",
    np.percentile([inv.list_size(li) for li in range(index.nlist)], [0, 50, 99, 100]),
)
for step, ((U, _ex, k), E) in enumerate(zip(records, exact, strict=False)):
    order = np.argsort(-(U @ C.T), axis=1)
    rank = np.empty_like(order)
    rows = np.arange(U.shape[0])[:, None]
    rank[rows, order] = np.arange(index.nlist)[None, :]
    rk = np.array([[rank[qi, lst[int(i)]] for i in E[qi]] for qi in range(U.shape[0])])
    print(
        step,
        "k",
        k,
        "list rank of exact answers: pct<=8,32,128,256",
        [round(float((rk < p).mean()), 3) for p in (8, 32, 128, 256)],
        "max",
        int(rk.max()),
        "unorm",
        np.round(np.linalg.norm(U, axis=1)[:2], 2),
    )
f = IndexedFeatures(base, index)
for ov in (2, 8, 32):
    f.oversample = ov
    for w in (32, 128):
        f.width = w
        r = round_recall(f, records, exact)
        print(
            "oversample",
            ov,
            "nprobe",
            w,
            round(float(r.mean()), 4),
            np.round(r, 3).tolist(),
            flush=True,
        )
