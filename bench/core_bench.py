"""Benchmark of the C++ round engine (crossknn.core); prints a table, writes JSON.

    .venv/bin/python bench/core_bench.py            # full run (N up to 1e6, a few minutes)
    .venv/bin/python bench/core_bench.py --quick    # N up to 1e5

Measured in one run, for N in {1e4, 1e5, 1e6} and d in {128, 500}:
- per-query cost of B=100 CE calls spread over 10 rounds (10 items a round, the first round
  random): the engine (incremental least squares + streaming top-k, float32) vs a reference round
  written the way the paper code does it (numpy pinv of V[A] + full V @ u + argpartition), timed
  with OpenBLAS's default threads and with 1 BLAS thread; the faster of the two is the reference;
  The same loop with int8 storage is timed too (column "int8 x"), and the solver alone
  (incremental least squares vs pinv, column "solver x");
- streaming top-k time and achieved read bandwidth per storage type, vs the memory-copy bandwidth
  measured right before it (numpy copy of an array as large as V, at most 1 GiB; read + write
  bytes per second);
- the batch form: Q=64 queries in one call vs 64 single-query calls.
Timings are the minimum over repeats (the machine is shared); compare ratios within one run.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits
from tqdm import tqdm

from _common import best_of, machine, result_path, utc_now, write_json
from crossknn.core import ItemFeatures, RoundState, kernel_name

OUT = result_path("core_bench")
B, ROUNDS, Q_BATCH = 100, 10, 64


def copy_bandwidth(nbytes: int = 1 << 30, reps: int = 5) -> float:
    """GB/s of numpy copy (read + write bytes per second) of an nbytes array."""
    src = np.ones(nbytes, np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    t = best_of(lambda: np.copyto(dst, src), reps)
    return 2 * nbytes / t / 1e9


def reference_query(V: np.ndarray, u_true: np.ndarray, first: np.ndarray, times=None):
    """One query, the paper way: each round pinv(V[A]) @ a, full V @ u, argpartition.

    With a dict ``times``, adds the seconds spent in pinv (the solver) to times["pinv"].
    """
    per = B // ROUNDS
    A = first.copy()
    a = V[A] @ u_true
    for _ in range(ROUNDS - 1):
        t0 = time.perf_counter()
        u = np.linalg.pinv(V[A]) @ a
        if times is not None:
            times["pinv"] = times.get("pinv", 0.0) + time.perf_counter() - t0
        s = V @ u
        s[A] = -np.inf
        new = np.argpartition(-s, per)[:per]
        A = np.concatenate([A, new])
        a = np.concatenate([a, V[new] @ u_true])
    return A


def engine_query(f: ItemFeatures, V: np.ndarray, u_true: np.ndarray, first: np.ndarray):
    """The same loop on the engine; returns (items, seconds in solve, seconds in top-k)."""
    per = B // ROUNDS
    state = RoundState(f)
    new = first
    t_solve = t_topk = 0.0
    for r in range(ROUNDS):
        t0 = time.perf_counter()
        state.append(new, V[new] @ u_true)
        if r == ROUNDS - 1:
            break
        u = state.solve()
        t1 = time.perf_counter()
        _, new = f.top_k(u, per, exclude=state.items)
        t2 = time.perf_counter()
        t_solve += t1 - t0
        t_topk += t2 - t1
    return state.items, t_solve, t_topk


def bench_case(N: int, d: int, rng: np.random.Generator, reps: int) -> dict:
    V = rng.standard_normal((N, d), dtype=np.float32)
    V /= np.sqrt(d, dtype=np.float32)
    u_true = rng.standard_normal(d).astype(np.float32)
    first = rng.choice(N, B // ROUNDS, replace=False)
    row: dict = {"N": N, "d": d}

    # per-query rounds: reference vs engine (float32)
    ref_reps = max(1, reps if N * d <= 5e7 else reps // 2)
    row["ref_query_default_blas_s"] = best_of(lambda: reference_query(V, u_true, first), ref_reps)
    with threadpool_limits(limits=1, user_api="blas"):
        row["ref_query_1blas_s"] = best_of(lambda: reference_query(V, u_true, first), ref_reps)
    # the faster of the two (OpenBLAS threads spin and suffer most on a busy machine)
    row["ref_query_s"] = min(row["ref_query_default_blas_s"], row["ref_query_1blas_s"])
    f = ItemFeatures(V, storage="float32")
    times = [engine_query(f, V, u_true, first) for _ in range(reps)]
    totals = [ts + tk for _, ts, tk in times]
    i = int(np.argmin(totals))
    row["engine_query_s"] = totals[i]
    row["engine_solve_s"] = times[i][1]
    row["engine_topk_s"] = times[i][2]
    row["speedup_vs_ref"] = row["ref_query_s"] / row["engine_query_s"]
    g8 = ItemFeatures(V, storage="int8")
    row["engine_int8_query_s"] = min(
        ts + tk for _, ts, tk in (engine_query(g8, V, u_true, first) for _ in range(reps))
    )
    row["speedup_int8_vs_ref"] = row["ref_query_s"] / row["engine_int8_query_s"]
    del g8
    with threadpool_limits(limits=1, user_api="blas"):
        tp: dict = {}
        ref_items = reference_query(V, u_true, first, tp)
    row["ref_pinv_1blas_s"] = tp["pinv"]
    row["solver_speedup"] = row["ref_pinv_1blas_s"] / row["engine_solve_s"]
    row["same_items_as_ref"] = float(np.isin(times[i][0], ref_items).mean())

    # streaming top-k per storage (k=10, 100 excluded)
    u = rng.standard_normal(d).astype(np.float32)
    ex = rng.choice(N, B, replace=False)
    for storage in ("float32", "float16", "int8"):
        g = f if storage == "float32" else ItemFeatures(V, storage=storage)
        g.top_k(u, 10, exclude=ex)
        if storage == "float32":
            # memory-copy bandwidth measured right before, side by side (the machine is shared)
            row["copy_GBps_local"] = copy_bandwidth(min(1 << 30, max(1 << 26, g.nbytes)), 3)
        t = best_of(lambda g=g: g.top_k(u, 10, exclude=ex), reps + 2)
        row[f"topk_{storage}_s"] = t
        row[f"topk_{storage}_GBps"] = g.nbytes / t / 1e9
        if storage == "float32":
            row["topk_float32_vs_copy"] = row["topk_float32_GBps"] / row["copy_GBps_local"]
            g.threads = 1
            row["topk_float32_1thread_s"] = best_of(lambda g=g: g.top_k(u, 10, exclude=ex), reps)
            g.threads = 0
        del g
    row["int8_speedup"] = row["topk_float32_s"] / row["topk_int8_s"]
    row["float16_speedup"] = row["topk_float32_s"] / row["topk_float16_s"]

    # batch form: Q=64 in one call vs 64 single calls (float32, k=10, 100 excluded each)
    U = rng.standard_normal((Q_BATCH, d)).astype(np.float32)
    exs = [rng.choice(N, B, replace=False) for _ in range(Q_BATCH)]
    row["batch64_s"] = best_of(lambda: f.top_k(U, 10, exclude=exs), max(1, reps // 2))
    row["single64_s"] = best_of(
        lambda: [f.top_k(U[q], 10, exclude=exs[q]) for q in range(Q_BATCH)], max(1, reps // 2)
    )
    row["batch_speedup"] = row["single64_s"] / row["batch64_s"]
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="N up to 1e5 only")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    Ns = [10_000, 100_000] if args.quick else [10_000, 100_000, 1_000_000]
    cases = [(N, d) for N in Ns for d in (128, 500)]

    copy_gbps = copy_bandwidth()
    rows = []
    for N, d in tqdm(cases, desc="core_bench"):
        rows.append(bench_case(N, d, rng, args.reps))
    copy_after = copy_bandwidth()
    copy_gbps = max(copy_gbps, copy_after)

    hdr = (
        f"{'N':>8} {'d':>4} | {'ref/query':>9} {'eng/query':>9} {'speedup':>7} {'int8 x':>6} "
        f"{'solver x':>8} | "
        f"{'f32 top-k':>9} {'GB/s':>5} {'%copy':>5} | {'f16':>7} {'int8':>7} {'i8 x':>5} | "
        f"{'Q64 batch':>9} {'64 single':>9} {'x':>5}"
    )
    print(
        f"\nkernels={kernel_name()} cores={os.cpu_count()} copy bandwidth={copy_gbps:.1f} GB/s "
        f"(read+write, best of the run; %copy uses the one measured next to each case); "
        f"B={B} over {ROUNDS} rounds, k=10 per round"
    )
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        print(
            f"{r['N']:>8} {r['d']:>4} | {r['ref_query_s'] * 1e3:>7.1f}ms "
            f"{r['engine_query_s'] * 1e3:>7.1f}ms "
            f"{r['speedup_vs_ref']:>6.1f}x {r['speedup_int8_vs_ref']:>5.1f}x "
            f"{r['solver_speedup']:>7.0f}x | "
            f"{r['topk_float32_s'] * 1e3:>7.2f}ms "
            f"{r['topk_float32_GBps']:>5.1f} {100 * r['topk_float32_vs_copy']:>4.0f}% | "
            f"{r['topk_float16_s'] * 1e3:>5.2f}ms {r['topk_int8_s'] * 1e3:>5.2f}ms "
            f"{r['int8_speedup']:>4.1f}x | {r['batch64_s'] * 1e3:>7.1f}ms "
            f"{r['single64_s'] * 1e3:>7.1f}ms {r['batch_speedup']:>4.1f}x"
        )
    result = {
        "command": "python bench/core_bench.py" + (" --quick" if args.quick else ""),
        "date_utc": utc_now(),
        "machine": machine(kernels=kernel_name()),
        "config": {
            "B": B,
            "rounds": ROUNDS,
            "k_per_round": B // ROUNDS,
            "Q_batch": Q_BATCH,
            "reps": args.reps,
            "seed": args.seed,
        },
        "copy_GBps_read_plus_write": copy_gbps,
        "rows": rows,
    }
    write_json(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
