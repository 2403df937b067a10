"""The recorded exact round queries of the 10^7 testbed's dev queries, cached as one .npz."""

from __future__ import annotations

import numpy as np


def save_records(path, records, exact) -> None:
    arrays = {"n_records": np.array(len(records))}
    for i, ((U, ex, k), E) in enumerate(zip(records, exact, strict=True)):
        arrays[f"U{i}"], arrays[f"k{i}"], arrays[f"E{i}"] = U, np.array(k), np.asarray(E)
        arrays[f"ex{i}"] = np.concatenate(ex) if ex else np.empty(0, np.int64)
        arrays[f"off{i}"] = np.cumsum([0] + [e.size for e in ex])
    np.savez(path, **arrays)


def recorded_rounds(n: int, d: int, n_dev: int, storage: str):
    """The exact round queries of the bench's first ``n_dev`` queries (AXN as scale_bench searches)
    and their exact answers, cached as ``records_{n}_{d}_{n_dev}.npz``."""
    import scale_bench as sb
    from crossknn.search.round_index import record_round_queries

    path = sb.CACHE / f"records_{n}_{d}_{n_dev}.npz"
    if path.is_file():
        return load_records(path)
    bed, W, Y = sb.queries(n, d, n_dev)
    base = sb.open_items(n, d, storage)
    scorer = sb.TestbedScorer(bed, W, Y, base)
    dev = list(range(n_dev))
    records = record_round_queries(
        lambda f: sb.method_for(f, W, bed.beta), base, scorer, dev, budget=sb.B, k=sb.K
    )
    exact = [base.top_k(U, k, exclude=ex)[1] for U, ex, k in records]
    save_records(path, records, exact)
    return records, exact


def load_records(path):
    z = np.load(path)
    records, exact = [], []
    for i in range(int(z["n_records"])):
        ex, off = z[f"ex{i}"], z[f"off{i}"]
        exs = [ex[off[j] : off[j + 1]] for j in range(off.size - 1)]
        records.append((z[f"U{i}"], exs, int(z[f"k{i}"])))
        exact.append(z[f"E{i}"])
    return records, exact


def coarse_centroids(index) -> np.ndarray:
    """The (nlist, d) float32 centroids of an IVF index's coarse quantizer (HNSW or flat)."""
    import faiss

    q = faiss.downcast_index(index.quantizer)
    storage = faiss.downcast_index(q.storage) if hasattr(q, "storage") else q
    codes = faiss.vector_to_array(storage.codes)
    return codes.view(np.float32).reshape(index.nlist, index.d)
