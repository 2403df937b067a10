"""A cheaper coarse search for the 10^7 IVF rounds: the 39,062 list centroids found through a
small IVF over them (S super-lists, nprobe_q of them scanned exactly) instead of the HNSW graph.
Same lists and codes (the cached index); per-round recall of the recorded exact round queries and
the FAISS search time per round query, graph and two-level quantizer interleaved in one run.

    .venv/bin/python bench/scale_diag/coarse.py      # after scale_bench.py; ~3 min
"""

import sys
import time

sys.path.insert(0, "bench")
import faiss
import numpy as np

import scale_bench as sb
from crossknn.search.round_index import IndexedFeatures, round_recall
from scale_diag._records import coarse_centroids, recorded_rounds

N, D, NDEV = 10_000_000, 128, 10


class TwoLevel(IndexedFeatures):
    """IndexedFeatures whose IVF coarse search goes through an IVF-flat quantizer."""

    def __init__(self, *a, nprobe_q: int, **kw):
        super().__init__(*a, **kw)
        self.nprobe_q = nprobe_q

    def _params(self, scored: int = 0):
        qp = faiss.SearchParametersIVF(nprobe=self.nprobe_q)
        return faiss.SearchParametersIVF(nprobe=self.width, quantizer_params=qp)


def main() -> None:
    faiss.omp_set_num_threads(2)
    base = sb.open_items(N, D, "int8")
    recs, exact = recorded_rounds(N, D, NDEV, "int8")
    hnsw_index = faiss.read_index(str(sb.index_path(N, D, "ivf")))
    C = coarse_centroids(hnsw_index)
    two = faiss.read_index(str(sb.index_path(N, D, "ivf")))
    S = 256
    top = faiss.IndexFlatIP(D)
    q2 = faiss.IndexIVFFlat(top, D, S, faiss.METRIC_INNER_PRODUCT)
    q2.cp.seed = 0
    q2.train(C)
    q2.add(C)
    two.quantizer = q2
    two.own_fields = False
    U = np.concatenate([r[0] for r in recs]).astype(np.float32)
    for nprobe in (128, 192):
        g = IndexedFeatures(base, hnsw_index, width=nprobe, oversample=2)
        line = [f"nprobe {nprobe}: graph recall {round_recall(g, recs, exact).mean():.3f}"]
        for nq in (8, 16, 32):
            t = TwoLevel(base, two, width=nprobe, oversample=2, nprobe_q=nq)
            line.append(f"two-level({S}, {nq}) {round_recall(t, recs, exact).mean():.3f}")
        print(", ".join(line), flush=True)
        timings = {}
        for _rep in range(3):
            for name, idx, params in (
                ("graph", hnsw_index, g._params()),
                *[
                    (
                        f"two-level {nq}",
                        two,
                        TwoLevel(base, two, width=nprobe, nprobe_q=nq)._params(),
                    )
                    for nq in (8, 16, 32)
                ],
            ):
                idx.parallel_mode = 1
                t0 = time.perf_counter()
                for u in U:
                    idx.search(u[None], 220, params=params)
                timings.setdefault(name, []).append(1000 * (time.perf_counter() - t0) / len(U))
        print(
            f"nprobe {nprobe} ms per round query (min of 3): "
            + ", ".join(f"{k} {min(v):.2f}" for k, v in timings.items()),
            flush=True,
        )


if __name__ == "__main__":
    main()
