"""CE backends side by side: ONNX Runtime fp32 vs PyTorch (``--backend torch``) on the same pairs.

The embedded ``minilm-l6-joint`` CE (max length 128), ``--pairs`` real SciFact (query, abstract)
pairs (seed 0; synthetic word pairs when ../shared is absent), both backends end to end through
``predict`` (tokenization, pair assembly, length-sorted batches of 16 pairs / 2,048 tokens, model
runs), ``--threads`` threads each, in one run: one warm-up pass each, then ``--repeats`` rounds
alternating the backends, the best time of each kept. Also the largest absolute score difference
from ONNX fp32. On a CUDA host the torch fp16 / bf16 rows run too.

    nice -n 5 .venv/bin/python bench/backend_bench.py [--pairs 500] [--threads 2]

Prints a table and writes bench/results/backend_bench.json (rows ``{backend, dtype, provider,
pairs, seconds, pairs_per_s, max_abs_diff}``).
"""

from __future__ import annotations

import argparse
import random
import time

import numpy as np

from _common import RESULTS, SHARED, machine, utc_now, write_json
from crossknn.ce.folders import open_cross_encoder


def pairs_of(n: int, seed: int) -> tuple[list[tuple[str, str]], str]:
    if (SHARED / "data" / "scifact").is_dir():
        from crossknn.data import load_beir

        data = load_beir(SHARED / "data" / "scifact")
        rng = random.Random(seed)
        return [
            (rng.choice(data.query_texts), rng.choice(data.item_texts)) for _ in range(n)
        ], "scifact"
    rng = np.random.default_rng(seed)
    words = "date parse time format zone search index query ranking paper model text".split()
    make = lambda k: " ".join(rng.choice(words, k))  # noqa: E731
    return [(make(6), make(120)) for _ in range(n)], "synthetic"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=500)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    import torch  # the torch rows need it (and its CUDA check)

    pairs, source = pairs_of(args.pairs, 0)
    configs = [("onnx", "fp32", "cpu"), ("torch", "fp32", "cpu")]
    if torch.cuda.is_available():
        configs += [("torch", d, "cuda") for d in ("fp32", "fp16", "bf16")]
    ces = {}
    for backend, dtype, provider in configs:
        opts = {"threads": args.threads, "provider": provider}
        if backend == "torch":
            opts["dtype"] = dtype
        ces[(backend, dtype, provider)] = open_cross_encoder(None, backend=backend, **opts)
    scores = {key: ce.predict(pairs) for key, ce in ces.items()}  # warm-up, and the scores
    best = dict.fromkeys(ces, float("inf"))
    for _ in range(args.repeats):
        for key, ce in ces.items():
            t0 = time.perf_counter()
            ce.predict(pairs)
            best[key] = min(best[key], time.perf_counter() - t0)
    ref = scores[("onnx", "fp32", "cpu")]
    rows = []
    print(f"{len(pairs)} {source} pairs, {args.threads} threads, best of {args.repeats}")
    print(f"{'backend':8} {'dtype':5} {'provider':22} {'pairs/s':>9} {'max|diff|':>10}")
    for key, ce in ces.items():
        backend, dtype, _ = key
        row = {
            "backend": backend,
            "dtype": dtype,
            "provider": ce.provider,
            "pairs": len(pairs),
            "seconds": round(best[key], 4),
            "pairs_per_s": round(len(pairs) / best[key], 1),
            "max_abs_diff": float(np.max(np.abs(scores[key] - ref))),
        }
        rows.append(row)
        print(
            f"{backend:8} {dtype:5} {row['provider']:22} {row['pairs_per_s']:9.1f} "
            f"{row['max_abs_diff']:10.2e}"
        )
    write_json(
        RESULTS / "backend_bench.json",
        {
            "when": utc_now(),
            "model": "minilm-l6-joint",
            "source": source,
            "threads": args.threads,
            "repeats": args.repeats,
            "machine": machine("onnxruntime", "torch", "transformers"),
            "rows": rows,
        },
    )


if __name__ == "__main__":
    main()
