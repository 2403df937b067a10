"""Why IVF rounds lose recall at N = 1e7 (extra): the share of each step's exact answers in the
top-P lists by centroid inner product plus the lists of the items the query has already scored.

    nice -n 5 .venv/bin/python bench/scale_diag/scored_lists.py   # after quantizer.py
"""

import sys

sys.path.insert(0, "bench")
import faiss
import numpy as np

import scale_bench as sb
from scale_diag._records import coarse_centroids, load_records

records, exact = load_records(sb.CACHE / "records_10000000_128_5.npz")
index = faiss.read_index(str(sb.index_path(10_000_000, 128, "ivf")))
C = coarse_centroids(index)
inv = index.invlists
L = index.nlist
lst = np.full(10_000_000, -1, np.int32)
for li in range(L):
    lst[faiss.rev_swig_ptr(inv.get_ids(li), inv.list_size(li))] = li
for step, ((U, ex, _k), E) in enumerate(zip(records, exact, strict=False)):
    out = []
    for P in (8, 32):
        cov = []
        for qi in range(U.shape[0]):
            top = set(np.argsort(-(U[qi] @ C.T))[:P].tolist())
            seen = set(lst[ex[qi]].tolist())
            cov.append(np.mean([lst[i] in (top | seen) for i in E[qi]]))
        out.append(round(float(np.mean(cov)), 3))
    print(
        step,
        "top-P + scored lists coverage P8,P32:",
        out,
        "n scored lists",
        len(set(lst[ex[0]].tolist())),
    )
