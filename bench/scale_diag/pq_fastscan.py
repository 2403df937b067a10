"""Would 4-bit PQ fast-scan codes make IVF round steps at N = 1e7 cheaper? The same 39,062 lists
as the cached SQ8 index (its coarse quantizer and list of every item), codes re-encoded as 4-bit
PQ (M sub-quantizers), converted to FAISS's fast-scan layout; per-round recall of the recorded
exact round queries (records_1e7 of widths/quantizer diagnostics) for several oversample factors,
and the FAISS search time per round query (SQ8 also on two threads, parallel over the probed lists).

    .venv/bin/python bench/scale_diag/pq_fastscan.py [M]     # after scale_bench.py; ~2 min
"""

import sys
import time

sys.path.insert(0, "bench")
import faiss
import numpy as np

import scale_bench as sb
from crossknn.search.round_index import IndexedFeatures, round_recall
from scale_diag._records import recorded_rounds

N, D, NDEV = 10_000_000, 128, 10


def fastscan_from_sq8(sq, base, m: int):
    """4-bit PQ fast-scan codes over the lists of the SQ8 index ``sq`` (no re-assignment)."""
    assign = np.empty(N, np.int64)
    for li in range(sq.nlist):
        size = sq.invlists.list_size(li)
        if size:
            assign[faiss.rev_swig_ptr(sq.invlists.get_ids(li), size)] = li
    pq = faiss.IndexIVFPQ(sq.quantizer, D, sq.nlist, m, 4, faiss.METRIC_INNER_PRODUCT)
    sample = np.sort(np.random.default_rng(0).choice(N, 200_000, replace=False))
    pq.train(base.rows(sample).astype(np.float32))  # the quantizer is trained: only the PQ
    codes = np.empty((N, pq.code_size), np.uint8)
    for lo in range(0, N, 1 << 20):
        hi = min(N, lo + (1 << 20))
        X = np.ascontiguousarray(base.rows(np.arange(lo, hi)), np.float32)
        a = np.ascontiguousarray(assign[lo:hi])
        pq.encode_vectors(
            hi - lo, faiss.swig_ptr(X), faiss.swig_ptr(a), faiss.swig_ptr(codes[lo:hi])
        )
    order = np.argsort(assign, kind="stable")
    bounds = np.searchsorted(assign[order], np.arange(sq.nlist + 1))
    for li in range(sq.nlist):
        sel = order[bounds[li] : bounds[li + 1]]
        if sel.size:
            ids, c = np.ascontiguousarray(sel), np.ascontiguousarray(codes[sel])
            pq.invlists.add_entries(li, sel.size, faiss.swig_ptr(ids), faiss.swig_ptr(c))
    pq.ntotal = N
    return faiss.IndexIVFPQFastScan(pq)


def main() -> None:
    m = int(sys.argv[1]) if len(sys.argv) > 1 else 64
    faiss.omp_set_num_threads(1)
    base = sb.open_items(N, D, "int8")
    recs, exact = recorded_rounds(N, D, NDEV, "int8")
    sq = faiss.read_index(str(sb.index_path(N, D, "ivf")))
    t0 = time.perf_counter()
    fs = fastscan_from_sq8(sq, base, m)
    print(f"PQ{m}x4 fast-scan codes in {time.perf_counter() - t0:.0f} s", flush=True)
    U = np.concatenate([r[0] for r in recs]).astype(np.float32)
    setups = [("sq8", sq, 1, 0), ("sq8", sq, 2, 1), (f"pq{m}x4fs", fs, 1, 0)]
    for name, index, threads, mode in setups:
        faiss.omp_set_num_threads(threads)
        index.parallel_mode = mode  # 1: one query's probed lists in parallel
        for nprobe in (64, 128, 192):
            qp = faiss.SearchParametersHNSW(efSearch=max(64, nprobe))
            p = faiss.SearchParametersIVF(nprobe=nprobe, quantizer_params=qp)
            t0 = time.perf_counter()
            for _ in range(3):
                for u in U:
                    index.search(u[None], 220, params=p)
            ms = 1000 * (time.perf_counter() - t0) / len(U) / 3
            line = f"{name} {threads} thread(s) nprobe {nprobe}: {ms:.2f} ms per round query"
            if threads == 1:
                line += "; per-round recall"
                for ov in (2, 4, 8):
                    f = IndexedFeatures(base, index, width=nprobe, oversample=ov)
                    line += f" {round_recall(f, recs, exact).mean():.3f} (oversample {ov})"
            print(line, flush=True)


if __name__ == "__main__":
    main()
