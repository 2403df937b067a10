"""Which IVF lists serve least-squares round queries: at N = 1e6 (d = 128, the scale testbed), the
share of each round step's exact answers found within a number of scanned codes, for lists of
about 1,220 items (the 1e7 bench's old 8192 lists scaled down), 244 and 122 items, and with each
item spilled to a second list (SOAR-style: the list whose residual is most orthogonal to the
first residual, or simply the second-nearest). Lists are probed by centroid inner product.

    .venv/bin/python bench/scale_diag/list_size.py      # ~6 min on 2 cores; writes JSON
"""

import sys
import time

sys.path.insert(0, "bench")
import faiss
import numpy as np

import scale_bench as sb
from _common import RESULTS, machine, utc_now, write_json
from scale_diag._records import recorded_rounds

N, D, NDEV, CAND = 1_000_000, 128, 5, 16
OUT = RESULTS / "scale_list_size.json"


def spill(X, C, near, primary, lam):
    """Per item, among its CAND nearest lists but the first, the list minimising
    ||r'||^2 + lam (r' . r_hat)^2 (r, r': residuals to the first and the candidate centroid)."""
    R = X - C[primary]
    R /= np.maximum(np.linalg.norm(R, axis=1, keepdims=True), 1e-12)
    out = np.empty(X.shape[0], np.int64)
    for lo in range(0, X.shape[0], 50_000):
        hi = min(X.shape[0], lo + 50_000)
        cand = near[lo:hi, 1:]
        Rc = X[lo:hi, None, :] - C[cand]
        loss = (Rc**2).sum(-1) + lam * np.einsum("bmd,bd->bm", Rc, R[lo:hi]) ** 2
        out[lo:hi] = cand[np.arange(hi - lo), loss.argmin(1)]
    return out


def coverage(records, exact, C, assigns, budgets):
    """Mean over round steps of the share of exact answers whose (first probed) list is reached
    within each budget of scanned codes, lists probed by centroid inner product."""
    nlist = C.shape[0]
    sizes = sum(np.bincount(a, minlength=nlist) for a in assigns)
    per_budget = {b: [] for b in budgets}
    for (U, _ex, _n), E in zip(records, exact, strict=True):
        order = np.argsort(-(U @ C.T), axis=1)
        rank = np.empty_like(order)
        rank[np.arange(U.shape[0])[:, None], order] = np.arange(nlist)
        cum = np.cumsum(sizes[order], axis=1)
        for b in budgets:
            got = []
            for qi in range(U.shape[0]):
                r = np.min(np.stack([rank[qi, a[E[qi]]] for a in assigns]), axis=0)
                got.append(np.mean(cum[qi, r] <= b))
            per_budget[b].append(np.mean(got))
    return {str(b): round(float(np.mean(v)), 4) for b, v in per_budget.items()}


def main() -> None:
    faiss.omp_set_num_threads(2)
    sb.make_items(N, D)
    records, exact = recorded_rounds(N, D, NDEV, "float32")
    X = np.asarray(np.load(sb.items_path(N, D), mmap_mode="r"), np.float32)
    budgets = [2_000, 5_000, 10_000, 20_000, 50_000]
    rows = []
    for nlist in (820, 4096, 8192):
        t0 = time.perf_counter()
        km = faiss.Kmeans(D, nlist, niter=10, seed=0, spherical=True)
        sample = np.random.default_rng(0).choice(N, min(N, 30 * nlist), replace=False)
        km.train(X[np.sort(sample)])
        flat = faiss.IndexFlatIP(D)
        flat.add(km.centroids)
        near = flat.search(X, CAND)[1]
        setups = {"primary": [near[:, 0]], "second-nearest": [near[:, 0], near[:, 1]]}
        setups["soar lambda=1"] = [near[:, 0], spill(X, km.centroids, near, near[:, 0], 1.0)]
        for name, assigns in setups.items():
            row = {"nlist": nlist, "items_per_list": round(N / nlist), "assignment": name}
            row["answers_within_codes"] = coverage(records, exact, km.centroids, assigns, budgets)
            rows.append(row)
            print(row, f"({time.perf_counter() - t0:.0f} s)", flush=True)
    doc = {"benchmark": "scale_list_size", "date": utc_now(), "N": N, "d": D}
    doc.update(dev_queries=NDEV, round_steps=len(records), rows=rows)
    doc["machine"] = machine("numpy", "faiss-cpu")
    write_json(OUT, doc)


if __name__ == "__main__":
    main()
