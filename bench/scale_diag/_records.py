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
