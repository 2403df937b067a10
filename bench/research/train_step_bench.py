"""Seconds per training step of ``crossknn train-ce``, float32 vs ``--bf16``: ``train_step.json``.

One step as ``train-ce`` takes it (defaults: 4 queries x 8 pairs, 128 tokens, length-sorted
chunks, AdamW): SciFact queries and items from ``../shared/data`` drawn at random, the embedded
all-MiniLM-L6-v2 weights, both kinds. The settings alternate inside one process (float32, bf16,
float32, ...) so that a busy machine slows both alike; the median step of each is reported, and the
ratio of the two. Example::

    .venv/bin/python bench/train_step_bench.py --threads 1 2 --steps 8
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: _common

from _common import SHARED, machine, result_path, utc_now, write_json  # noqa: E402


def _step_timer(kind: str, threads: int, enc, base: Path):
    import torch

    from crossknn.train.losses import group_loss
    from crossknn.train.scorer import TrainableCE

    torch.manual_seed(0)
    model = TrainableCE(base, kind, loss="listwise")
    model.train()
    opt = torch.optim.AdamW(model.param_groups(3e-5, 1e-3), lr=3e-5)
    rng = np.random.default_rng(0)
    nq, ni = len(enc.queries.lengths), len(enc.items.lengths)

    def step(bf16: bool) -> float:
        torch.set_num_threads(threads)
        qi = np.repeat(rng.integers(0, nq, 4), 8)
        ii = rng.integers(0, ni, 32)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            scores = enc.score(model, qi, ii, torch.device("cpu"), 4096)
        logits = model.logits(scores.float()).view(4, 8)
        loss = group_loss("listwise", logits)
        loss.backward()
        opt.step()
        return time.perf_counter() - t0

    return step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--kinds", nargs="+", default=["emb", "cls"], choices=["emb", "cls"])
    ap.add_argument("--steps", type=int, default=8, help="timed steps per setting (after 2 warm)")
    ap.add_argument("--out", default=str(result_path("train_step")))
    args = ap.parse_args()

    import torch

    from crossknn.ce.export import write_tokenizer
    from crossknn.ce.models import minilm_checkpoint_dir
    from crossknn.data import load_beir
    from crossknn.train.scorer import PairEncoder

    if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        raise SystemExit("this CPU has no bfloat16 support: nothing to compare")
    beir = load_beir(SHARED / "data" / "scifact")
    base = minilm_checkpoint_dir()
    tok = Path(tempfile.mkdtemp(prefix="train-step-"))
    write_tokenizer(base, tok)
    enc = PairEncoder(
        tok / "tokenizer.json",
        128,
        beir.queries_in_order(beir.query_ids[:300]),
        beir.item_texts[:3000],
    )
    rows = []
    for kind in args.kinds:
        for threads in args.threads:
            step = _step_timer(kind, threads, enc, base)
            for _ in range(2):  # warm-up: allocator, oneDNN kernels of both precisions
                step(False), step(True)
            t = {False: [], True: []}
            for _ in range(args.steps):
                for bf16 in (False, True):
                    t[bf16].append(step(bf16))
            f32, b16 = float(np.median(t[False])), float(np.median(t[True]))
            rows.append(
                {
                    "kind": kind,
                    "threads": threads,
                    "pairs_per_step": 32,
                    "max_length": 128,
                    "fp32_s_per_step": round(f32, 3),
                    "bf16_s_per_step": round(b16, 3),
                    "speedup": round(f32 / b16, 2),
                }
            )
            print(
                f"{kind:4} threads {threads}: float32 {f32:.3f} s/step, bf16 {b16:.3f} s/step "
                f"-> {f32 / b16:.2f}x",
                flush=True,
            )
    write_json(
        args.out,
        {
            "benchmark": "train_step",
            "date": utc_now(),
            "settings": vars(args) | {"out": None},
            "machine": machine("torch"),
            "rows": rows,
        },
    )


if __name__ == "__main__":
    main()
