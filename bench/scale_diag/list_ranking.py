"""Why IVF rounds lose recall at N = 1e7 (3/3): list orders (centroid, list mean, mean + z sigma
isotropic / along 2 or 8 principal axes) by the share of exact answers in the first P lists and
at an equal number of codes scanned. The per-list statistics take ~30 min (cached).

    nice -n 5 .venv/bin/python bench/scale_diag/list_ranking.py   # after quantizer.py
"""

import sys
import time

sys.path.insert(0, "bench")
import faiss
import numpy as np

import scale_bench as sb
from scale_diag._records import coarse_centroids, load_records

n, d, ndev = 10_000_000, 128, 5
records, exact = load_records(sb.CACHE / f"records_{n}_{d}_{ndev}.npz")
base = sb.open_items(n, d, "int8")
index = faiss.read_index(str(sb.index_path(n, d, "ivf")))
C = coarse_centroids(index)
inv = index.invlists
L = index.nlist
stats = sb.CACHE / "liststats_1e7.npz"
if stats.is_file():
    z = np.load(stats)
    mu, var, sizes, E, lam = z["mu"], z["var"], z["sizes"], z["E"], z["lam"]
else:
    t0 = time.time()
    mu = np.zeros((L, d), np.float32)
    var = np.zeros(L)
    sizes = np.zeros(L, np.int64)
    R = 8
    E = np.zeros((L, R, d), np.float32)
    lam = np.zeros((L, R + 1), np.float32)
    for li in range(L):
        ids = np.sort(faiss.rev_swig_ptr(inv.get_ids(li), inv.list_size(li)).copy())
        sizes[li] = ids.size
        if ids.size == 0:
            continue
        X = base.rows(ids).astype(np.float64)
        m = X.mean(0)
        Xc = X - m
        mu[li] = m
        var[li] = (Xc**2).sum() / ids.size / d
        S = Xc.T @ Xc / ids.size
        w, v = np.linalg.eigh(S)
        E[li] = v[:, ::-1][:, :R].T
        lam[li, :R] = w[::-1][:R]
        lam[li, R] = max(0, (w.sum() - w[::-1][:R].sum()) / (d - R))
        if li % 1000 == 0:
            print(li, f"{time.time() - t0:.0f}s", flush=True)
    np.savez(stats, mu=mu, var=var, sizes=sizes, E=E, lam=lam)
print("sizes pct", np.percentile(sizes, [1, 50, 99]))
lst = np.full(n, -1, np.int32)
for li in range(L):
    lst[faiss.rev_swig_ptr(inv.get_ids(li), inv.list_size(li))] = li
zl = np.sqrt(2 * np.log(np.maximum(sizes, 2)))


def variants(Uh):
    out = {"centroid": Uh @ C.T, "mean": Uh @ mu.T}
    out["iso z"] = Uh @ mu.T + zl * np.sqrt(var)
    P = np.einsum("qd,lrd->qlr", Uh, E)  # (q, L, R)
    dirvar = (P**2 * lam[None, :, :8]).sum(-1) + lam[None, :, 8] * (1 - (P**2).sum(-1))
    out["dir8 z"] = Uh @ mu.T + zl * np.sqrt(np.maximum(dirvar, 0))
    P2 = P[:, :, :2]
    dv2 = (P2**2 * lam[None, :, :2]).sum(-1) + lam[None, :, 8] * (1 - (P2**2).sum(-1))
    out["dir2 z"] = Uh @ mu.T + zl * np.sqrt(np.maximum(dv2, 0))
    return out


res = {}
for (U, _ex, _k), Ex in zip(records, exact, strict=False):
    Uh = U / np.linalg.norm(U, axis=1, keepdims=True)
    for name, S in variants(Uh).items():
        order = np.argsort(-S, axis=1)
        for qi in range(U.shape[0]):
            rank = np.empty(L, np.int64)
            rank[order[qi]] = np.arange(L)
            r = rank[lst[Ex[qi]]]
            csum = np.cumsum(sizes[order[qi]])
            res.setdefault(name, []).append((r, csum))
for name, rows in res.items():
    line = []
    for P in (8, 16, 32, 64, 128, 256):
        cov = np.mean([(r < P).mean() for r, _ in rows])
        codes = np.mean([c[P - 1] for _, c in rows])
        line.append(f"P{P}:{cov:.3f}/{codes / 1e3:.0f}k")
    # coverage at equal codes scanned
    for budget in (50e3, 100e3, 200e3):
        cov = np.mean([(r < np.searchsorted(c, budget) + 1).mean() for r, c in rows])
        line.append(f"@{budget / 1e3:.0f}k:{cov:.3f}")
    print(f"{name:9s}", " ".join(line), flush=True)
