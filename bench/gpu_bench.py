"""The GPU path in one script: CE throughput, torch-eager baseline, serial search and serve.

Sections, in this order, each in its own try/except (an error is recorded and the next section
runs), all under one global deadline (``--max-seconds``; a section that cannot start in time is
recorded as skipped):

1. ``ce``: ``OnnxCrossEncoder.predict`` on the DE top-``--candidates`` of ``--ce-queries`` test
   queries (real pairs), per precision (fp32, fp16 on a GPU) and batch size (one session run of
   that many pairs): ``{device, provider, precision, batch, pairs_per_s,
   top10_agreement_vs_fp32}`` (the top-10 of each query's candidates against fp32 on the same
   provider), also ``score_pairs_per_s`` (the same pairs through the item token cache,
   ``score_batch``), ``one_pass_pairs_per_s`` (``predict`` with the documents tokenized in one
   pass before the device runs, not overlapping it: ``overlap_tokenize=False``) and
   ``max_abs_diff_vs_fp32``; ``round`` rows: one search round's 20-pair
   call (``score``) at the provider's default batching, median ms, IO binding on and off.
2. ``torch``: the same model in PyTorch eager mode (``crossknn.ce.graphs.JointCE`` over the
   transformers checkpoint: what a user would otherwise write), length-sorted batches of 256,
   fp32 and fp16 on CUDA: the same row fields, ``provider: "torch-eager"``.
3. ``search``: an index built over the ``--data`` BEIR corpus (embedded CE and DE, fp32), then
   ``crossknn.Searcher.search`` one query at a time (AXN, budget 100, k 10) for each precision:
   ``{device, provider, precision, budget, concurrency: 1, queries_per_s, p50_ms, p99_ms,
   ce_ms, other_ms}`` (latency per query end to end; ce/other: medians of the searcher's own
   split).
4. ``serve``: ``crossknn serve`` on that index (a subprocess on loopback, stopped by its PID),
   closed-loop clients at concurrency 1/8/32/64, each level bounded in requests and seconds
   (each client's first request is not counted, and the clients start together at a barrier):
   the search row fields plus ``errors`` (status -> count) and ``http_5xx``, ``warmup`` (what the
   server's load-time warm-up did; None: ``--no-warmup``), ``p99_ms_second_half`` and
   ``slow_by_tenth`` (where in the level the slow requests fell), and from the server's
   /metrics where a request's time went (``lock_wait_ms``, ``engine_ms``, ``ce_queue_ms``,
   ``ce_run_ms``, ``ce_wake_ms``; per batch ``session_ms_per_batch``). On a GPU, one server per
   ``--serve-variants`` entry (``variant`` in the row: the default server, ``group1+any``
   (every request searched alone, a plain engine lock: the server before query groups),
   ``bp256`` (merged batches capped at the CUDA graph limit), ``w4`` (``--workers 4``), ``cold``
   (``--no-warmup``)...); ``--py-spy``: dumps of the server's threads at concurrency 32 (they
   pause the server: not for the rows a table reports). Skipped with
   the reason when fastapi/uvicorn are missing.

Every finished row is written to the JSON at once (atomically), with the device (nvidia-smi),
the versions and the commands run, so a run cut short keeps what it measured.

    python bench/gpu_bench.py --max-seconds 270                  # on a GPU host (auto provider)
    python bench/gpu_bench.py --provider cpu --quick             # a smoke run on a CPU (< 2 min)

Writes bench/results/gpu_bench.json (``--provider cpu``: gpu_bench_cpu.json) and prints a table.
"""

from __future__ import annotations

import argparse
import http.client
import json
import logging
import os
import platform
import queue
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from pathlib import Path

import numpy as np

from _common import SHARED, machine, provenance, result_path, utc_now

K = 10
STANDIN = Path(__file__).with_name("_standin_device.py")
SINGULAR = {"errors": "error", "skipped": "skipped"}


class Report:
    """The result document, saved after every change (a timeout loses nothing)."""

    def __init__(self, path: Path, doc: dict) -> None:
        self.path, self.doc = path, doc
        self.save()

    def save(self) -> None:
        from crossknn.fileio import atomic_write_bytes

        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(self.path, (json.dumps(self.doc, indent=1) + "\n").encode("utf-8"))

    def row(self, section: str, row: dict) -> None:
        self.doc.setdefault(section, []).append(row)
        self.save()
        print(f"[{section}] " + json.dumps(row), flush=True)

    def note(self, key: str, section: str, what: str) -> None:
        self.doc.setdefault(key, []).append({"section": section, "what": what})
        self.save()
        print(f"[{section}] {SINGULAR[key]}: {what}", flush=True)


class Deadline:
    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()


def gpu_name(query: str = "name,memory.total,driver_version") -> str | None:
    """``nvidia-smi``'s answer for the first GPU (None: no GPU or no nvidia-smi)."""
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip().splitlines()[0] if out.stdout.strip() else None


# -- data ------------------------------------------------------------------------------------
def load_data(folder: Path, max_items: int | None, max_queries: int):
    """(item ids, item texts, query texts) of a BEIR folder: the test queries (or all)."""
    from crossknn.data import load_beir

    b = load_beir(folder)
    ids, texts = b.item_ids, b.item_texts
    if max_items is not None:
        ids, texts = ids[:max_items], texts[:max_items]
    test = b.qrels.get("test")
    pos = {q: i for i, q in enumerate(b.query_ids)}
    order = [pos[q] for q in test if q in pos] if test else range(len(b.query_ids))
    queries = [b.query_texts[i] for i in order][:max_queries]
    return ids, texts, queries


def top_candidates(de, texts: list[str], queries: list[str], n: int) -> np.ndarray:
    V = de.encode(texts)
    Q = de.encode(queries)
    S = Q @ V.T
    n = min(n, len(texts))
    top = np.argpartition(-S, n - 1, axis=1)[:, :n]
    rows = np.arange(len(queries))[:, None]
    return top[rows, np.argsort(-S[rows, top], axis=1, kind="stable")]


def top10_agreement(a: np.ndarray, b: np.ndarray, per: int) -> float:
    a, b = a.reshape(-1, per), b.reshape(-1, per)
    k = min(10, per)
    got = [
        len(set(np.argsort(-x, kind="stable")[:k]) & set(np.argsort(-y, kind="stable")[:k])) / k
        for x, y in zip(a, b, strict=True)
    ]
    return round(float(np.mean(got)), 4)


def fidelity(got: np.ndarray, base: np.ndarray | None, per: int) -> dict:
    """The rows' agreement with the fp32 reference (None without one)."""
    if base is None:
        return {"top10_agreement_vs_fp32": None, "max_abs_diff_vs_fp32": None}
    return {
        "top10_agreement_vs_fp32": top10_agreement(got, base, per),
        "max_abs_diff_vs_fp32": round(float(np.abs(got - base).max()), 8),
    }


# -- 1. CE -----------------------------------------------------------------------------------
def open_ce(precision: str, provider: str, threads: int | None, items=None, **options):
    from crossknn.ce.folders import open_cross_encoder

    return open_cross_encoder(
        None, precision=precision, provider=provider, threads=threads, items=items, **options
    )


def ce_section(rep: Report, dl: Deadline, ctx: dict, args) -> None:
    queries, cand, texts = ctx["ce_queries"], ctx["cand"], ctx["texts"]
    pairs = [(q, texts[j]) for q, row in zip(queries, cand, strict=True) for j in row]
    per = cand.shape[1]
    ref: dict[str, np.ndarray] = {}
    for precision in ctx["precisions"]:
        if dl.left() < 15:
            rep.note("skipped", "ce", f"{precision}: deadline")
            continue
        try:
            ce = open_ce(precision, args.provider, args.threads, items=texts)
        except Exception as exc:
            rep.note("errors", "ce", f"{precision}: {type(exc).__name__}: {exc}")
            continue
        ctx["default_batch"] = (ce.batch_size, ce.max_batch_tokens)
        ce.predict(pairs[: min(len(pairs), 64)])  # warm up: first run, kernels, the fp16 file
        for batch in ctx["batches"]:
            if dl.left() < 10:
                rep.note("skipped", "ce", f"{precision} batch {batch}: deadline")
                continue
            ce.batch_size, ce.max_batch_tokens = batch, batch * ce.max_length
            ce.predict(pairs[: min(len(pairs), batch)])
            t = time.perf_counter()
            got = ce.predict(pairs)
            dt = time.perf_counter() - t
            ts = time.perf_counter()
            ce.score_batch(queries, list(cand))
            dts = time.perf_counter() - ts
            # the same predict with the documents tokenized in one pass before the device runs
            # (the CPU's way; a GPU overlaps the tokenizing with the device: docs/ce.md)
            ce.overlap_tokenize = False
            try:
                to = time.perf_counter()
                ce.predict(pairs)
                dto = time.perf_counter() - to
            finally:
                ce.overlap_tokenize = None
            if precision == "fp32" and "fp32" not in ref:
                ref["fp32"] = got
            base = ref.get("fp32")
            rep.row(
                "ce",
                {
                    "device": ctx["device"],
                    "provider": ce.provider,
                    "precision": ce.precision,
                    "batch": batch,
                    "pairs_per_s": round(len(pairs) / dt, 1),
                    **fidelity(got, base, per),
                    "score_pairs_per_s": round(len(pairs) / dts, 1),
                    "one_pass_pairs_per_s": round(len(pairs) / dto, 1),
                    "pairs": len(pairs),
                    "graph": "fused" if getattr(ce._s, "fused", False) else "exported",
                },
            )
        if precision == "fp32":
            ctx["ce_ref"] = ref.get("fp32")
        if dl.left() > 15:
            round_rows(rep, ctx, ce, queries, cand, args)
        else:
            rep.note("skipped", "round", f"{precision}: deadline")
        del ce


def round_rows(rep: Report, ctx: dict, ce, queries, cand, args) -> None:
    """One search round's CE call (20 pairs of one query, the default batching of the
    provider): median latency over 100 calls (quick: 3). On a GPU for three graphs: the
    exported one, the fused one (crossknn.ce.fuse, the default), the fused one replayed as
    captured CUDA graphs (crossknn.ce.cuda_graph), and crossknn's torch backend (eager)."""
    calls, warm = (3, 1) if args.quick else (100, 5)
    variants = [("fused", False)]
    if ctx["gpu"]:
        variants = [("exported", False), ("fused", False), ("fused", True), ("torch", False)]
    for graph, cuda_graph in variants:
        if graph == "torch":
            opts = {"backend": "torch", "dtype": ce.precision}
        else:
            opts = {"fuse": graph == "fused", "cuda_graph": cuda_graph}
        try:
            run_ce = open_ce(
                "fp32" if graph == "torch" else ce.precision,
                "cuda" if graph == "torch" else args.provider,
                args.threads,
                items=ctx["texts"],
                **opts,
            )
        except Exception as exc:
            rep.note("errors", "round", f"{ce.precision} {graph} {cuda_graph}: {exc}")
            continue
        times = []
        for i in range(calls + warm):
            q, row = queries[i % len(queries)], cand[i % len(queries)]
            items = row[(i * 20) % len(row) :][:20]
            t = time.perf_counter()
            run_ce.score(q, items)
            if i >= warm:  # the first calls warm up (and capture the graphs)
                times.append((time.perf_counter() - t) * 1e3)
        s = run_ce._s
        runner = getattr(s, "graph", None)
        rep.row(
            "round",
            {
                "device": ctx["device"],
                "provider": run_ce.provider,
                "precision": ce.precision,
                "pairs": 20,
                "io_binding": bool(getattr(s, "io_binding", False)),
                "graph": "torch eager (--backend torch)"
                if graph == "torch"
                else "fused"
                if s.fused
                else "exported",
                "cuda_graph": runner is not None and bool(runner.replays),
                "cuda_graph_error": getattr(s, "cuda_graph_error", None),
                "call_ms_p50": pct(times, 50),
                "call_ms_p90": pct(times, 90),
                "calls": len(times),
            },
        )
        del run_ce


# -- 2. torch eager --------------------------------------------------------------------------
def torch_section(rep: Report, dl: Deadline, ctx: dict, args) -> None:
    import torch

    from crossknn.ce.feeds import pair_feeds
    from crossknn.ce.graphs import JointCE, load_model
    from crossknn.ce.model_base import length_batches
    from crossknn.ce.models import minilm_checkpoint_dir
    from crossknn.ce.tokenize import IdStore, longest_first

    gpu = ctx["gpu"] and torch.cuda.is_available()
    device = "cuda" if gpu else "cpu"
    if not gpu and args.threads:
        torch.set_num_threads(args.threads)
    queries, cand, texts = ctx["ce_queries"], ctx["cand"], ctx["texts"]
    per = cand.shape[1]
    # the same inputs as the ONNX runtime builds: cached ids, longest_first, length-sorted
    plan = ctx["plan"]
    room = 128 - plan.pair.n_special
    A = IdStore(plan.encode(queries), room)
    B = IdStore(plan.encode(texts), room)
    ia = np.repeat(np.arange(len(queries)), per)
    ib = cand.reshape(-1)
    ta, tb = longest_first(A.lengths[ia], B.lengths[ib], room)
    batch = 256
    batches = length_batches(ta + tb + plan.pair.n_special, batch, 1 << 30)
    feeds = [pair_feeds(plan.pair, plan.pad_id, A, ia[i], ta[i], B, ib[i], tb[i]) for i in batches]
    model = JointCE(load_model(minilm_checkpoint_dir(), classifier=False), normalize=True).eval()
    model.to(device)
    precisions = ["fp32", "fp16"] if gpu else ["fp32"]
    if not gpu:
        rep.note("skipped", "torch", "fp16: torch eager fp16 is measured on CUDA only")
    for precision in precisions:
        if dl.left() < 15:
            rep.note("skipped", "torch", f"{precision}: deadline")
            continue
        if precision == "fp16":
            model.half()
        tensors = [{k: torch.from_numpy(v).to(device) for k, v in f.items()} for f in feeds]
        out = np.empty(len(ia), dtype=np.float32)

        def run_all(tensors=tensors, out=out):
            with torch.inference_mode():
                res = [
                    model(f["input_ids"], f["attention_mask"], f["token_type_ids"], f["pool_mask"])
                    for f in tensors
                ]
                if gpu:
                    torch.cuda.synchronize()
            for idx, r in zip(batches, res, strict=True):
                out[idx] = r.float().cpu().numpy()

        run_all()  # warm up
        t = time.perf_counter()
        run_all()
        dt = time.perf_counter() - t
        base = ctx.get("ce_ref")
        rep.row(
            "torch",
            {
                "device": ctx["device"],
                "provider": "torch-eager",
                "precision": precision,
                "batch": batch,
                "pairs_per_s": round(len(ia) / dt, 1),
                **fidelity(out, base, per),
                "pairs": int(len(ia)),
                "torch": torch.__version__,
                "note": "inputs built outside the timer; the reference is ONNX Runtime fp32",
            },
        )


# -- 3. serial search ------------------------------------------------------------------------
def build_index(ctx: dict, args, folder: Path) -> Path:
    from crossknn.ce.folders import open_dual_encoder
    from crossknn.corpus.build import build_corpus_index
    from crossknn.data import Corpus

    ce = open_ce("fp32", args.provider, args.threads)
    de = open_dual_encoder(None, precision="fp32", provider=args.provider, threads=args.threads)
    corpus = Corpus(ids=list(ctx["ids"]), texts=list(ctx["texts"]), source=str(args.data))
    t = time.perf_counter()
    # the default path: crossknn build with no flags (the default index budget of auto rows of
    # pseudo-queries); a quick run caps its minutes (a CPU scores a row in tens of seconds)
    quick = {"calibration_queries": 2, "calibration_items": 8} if args.quick else {}
    if args.quick:
        quick["index_minutes"] = 0.5
    build_corpus_index(corpus, folder, ce=ce, de=de, progress=False, **quick)
    ctx["build_s"] = round(time.perf_counter() - t, 1)
    auto = crossknn_open_index(folder).params.get("auto") or {}
    ctx["index_auto"] = {
        k: auto.get(k) for k in ("rows", "index_calls", "rounds", "rounds_curve", "default_rule")
    }
    print(
        f"[search] index of {len(corpus)} items built in {ctx['build_s']} s "
        f"(auto rows: {auto.get('rows', 0)})",
        flush=True,
    )
    return folder


def crossknn_open_index(folder):
    from crossknn.corpus_folder import open_index

    return open_index(folder)


def exact_top10(ctx: dict, args, index, ce, de) -> dict[str, list[str]]:
    """The CE's exact top-10 of the first ``--exact-queries`` search queries (every item scored
    once, kept under the index folder: a rerun reads them), by query text."""
    import crossknn

    if "exact" not in ctx:
        qs = list(dict.fromkeys(ctx["search_queries"]))[: args.exact_queries]
        s = crossknn.Searcher(index, ce=ce, de=de, method="rnr")
        t = time.perf_counter()
        hits = s.search(qs, k=K, budget=K, exact=True, exact_cache=Path(ctx["index"]) / "exact")
        ctx["exact"] = {h.query: list(h.exact_ids) for h in hits}
        ctx["exact_s"] = round(time.perf_counter() - t, 1)
        print(f"[search] exact top-{K} of {len(qs)} queries in {ctx['exact_s']} s", flush=True)
    return ctx["exact"]


def recall_vs_exact(exact: dict, pairs) -> float | None:
    """Mean Top-10-Recall of ``(query, returned ids)`` pairs against ``exact`` (queries without
    an exact top-10 left out); None when none has one."""
    got = [len(set(ids[:K]) & set(exact[q])) / K for q, ids in pairs if q in exact]
    return round(float(np.mean(got)), 4) if got else None


def pct(values, q):
    return round(float(np.percentile(values, q)), 2) if len(values) else None


def search_section(rep: Report, dl: Deadline, ctx: dict, args) -> None:
    import crossknn
    from crossknn.ce.folders import open_index_models

    index = crossknn.open_index(ctx["index"])
    queries = ctx["search_queries"]
    plans = [(p, False) for p in ctx["precisions"]]
    if ctx["gpu"]:
        plans += [(p, True) for p in ctx["precisions"]]
    for precision, cuda_graph in plans:
        if dl.left() < 20:
            rep.note("skipped", "search", f"{precision} cuda_graph={cuda_graph}: deadline")
            continue
        ce, de = open_index_models(
            index,
            precision=precision,
            provider=args.provider,
            threads=args.threads,
            cuda_graph=cuda_graph,
        )
        # the default path first (no method flag), then on the headline plan the references
        last = (precision, cuda_graph) == plans[-1]
        exact = exact_top10(ctx, args, index, ce, de) if last or not ctx["gpu"] else None
        for method in (None, "axn", "rnr") if last else (None,):
            s = crossknn.Searcher(index, ce=ce, de=de, method=method)
            row = serial_row(s, queries, dl, args, exact)
            rep.row(
                "search",
                {
                    "device": ctx["device"],
                    "provider": ce.provider,
                    "precision": ce.precision,
                    "budget": args.budget,
                    "concurrency": 1,
                    **row,
                    "items": len(index),
                    "default_path": method is None,
                    "mode": "serial Searcher.search",
                    "graph": "fused" if getattr(ce._s, "fused", False) else "exported",
                    "cuda_graph": cuda_graph,
                },
            )
        if (precision, cuda_graph) == plans[-1] and dl.left() > 20:
            rep.doc["search_profile"] = profile_search(s, queries[3:63], args.budget)
        del s, ce, de


def serial_row(s, queries: list[str], dl, args, exact: dict | None) -> dict:
    """One query at a time (after three uncounted): latency percentiles, the CE and other
    time, what ran (method, rounds, plan) and the Top-10-Recall against the exact CE."""
    for q in queries[:3]:  # warm up (not counted): sessions, caches, query vectors
        s.search([q], k=K, budget=args.budget)
    lat, ce_ms, other_ms, got = [], [], [], []
    stop = time.monotonic() + min(args.search_seconds, max(dl.left() - 10, 1))
    t0 = time.perf_counter()
    for q in queries[3:]:
        if time.monotonic() > stop:
            break
        t = time.perf_counter()
        h = s.search([q], k=K, budget=args.budget)[0]
        lat.append((time.perf_counter() - t) * 1e3)
        ce_ms.append(h.seconds_ce * 1e3)
        other_ms.append(h.seconds_other * 1e3)
        got.append((q, h.ids))
    wall = time.perf_counter() - t0
    plan = s.plan_info(budget=args.budget)
    return {
        "queries_per_s": round(len(lat) / wall, 2) if lat else None,
        "p50_ms": pct(lat, 50),
        "p99_ms": pct(lat, 99),
        "ce_ms": pct(ce_ms, 50),
        "other_ms": pct(other_ms, 50),
        "queries": len(lat),
        "method": plan["method"],
        "rounds": plan["rounds"],
        "plan": plan,
        "top10_recall_vs_exact": None if exact is None else recall_vs_exact(exact, got),
        "recall_queries": None if exact is None else sum(q in exact for q, _ in got),
        "round_cost_ms": None if s._round_cost is None else s._round_cost.to_dict(),
    }


def profile_search(s, queries: list[str], budget: int, top: int = 30) -> dict:
    """cProfile of serial searches: where a query's time goes (functions by own time)."""
    import cProfile
    import io
    import pstats

    prof = cProfile.Profile()
    t = time.perf_counter()
    prof.enable()
    for q in queries:
        s.search([q], k=K, budget=budget)
    prof.disable()
    wall = time.perf_counter() - t
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(top)
    lines = [ln.rstrip() for ln in buf.getvalue().splitlines() if ln.strip()]
    return {
        "queries": len(queries),
        "ms_per_query_profiled": round(1e3 * wall / len(queries), 2),
        "by_own_time": lines[-top - 1 :],
    }


# -- 4. serve --------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def get_json(port: int, path: str, timeout: float = 5.0):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read() or b"null")
    finally:
        conn.close()


_COUNTERS = ("crossknn_ce_batches_total", "crossknn_ce_pairs_total", "crossknn_ce_seconds_total")
# where a request's time went (per request, from /metrics; see docs/serve.md)
_SPLIT = {
    "lock_wait_ms": "crossknn_engine_lock_wait_seconds_total",
    "engine_ms": "crossknn_engine_seconds_total",
    "ce_queue_ms": "crossknn_ce_queue_seconds_total",
    "ce_run_ms": "crossknn_ce_run_seconds_total",
    "ce_wake_ms": "crossknn_ce_wake_seconds_total",
}
_SESSION = "crossknn_ce_session_seconds"
_DE_SESSION = "crossknn_de_session_seconds"
_QUERIES = "crossknn_queries_total"


def ce_counters(port: int) -> dict[str, float]:
    """The service's counters from /metrics (Prometheus text): the CE worker's batches, pairs
    and busy seconds, the seconds inside session runs, queries, and the request time split."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5.0)
    try:
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
    finally:
        conn.close()
    wanted = {*_COUNTERS, *_SPLIT.values(), _SESSION, _DE_SESSION, _QUERIES, *_LATENCY.values()}
    out = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in wanted:
            out[name] = float(value)
    return out


# the server's own request latency histogram: requests at most 150 / 250 ms, and all of them
_LATENCY = {
    "le150": 'crossknn_request_latency_seconds_bucket{le="0.15"}',
    "le250": 'crossknn_request_latency_seconds_bucket{le="0.25"}',
    "all": "crossknn_request_latency_seconds_count",
}


def batch_stats(before: dict, after: dict, wall: float) -> dict:
    """What the CE worker did during one level: mean pairs per merged batch, mean seconds per
    batch (``session_ms_per_batch`` of it inside the session run: the device call), the share of
    the wall time it was busy (near 1: the CE worker is the limit); and per request, mean ms
    waiting for the engine lock (or a query group), in engine steps, CE pairs queued, their
    batch running, and waking up after it."""
    d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in {*before, *after}}
    batches = d.get("crossknn_ce_batches_total", 0.0)
    out = {
        "ce_batches": int(batches),
        "pairs_per_batch": round(d["crossknn_ce_pairs_total"] / batches, 1) if batches else None,
        "ms_per_batch": round(1e3 * d["crossknn_ce_seconds_total"] / batches, 2)
        if batches
        else None,
        "session_ms_per_batch": round(1e3 * d[_SESSION] / batches, 2)
        if batches and _SESSION in d
        else None,
        "ce_busy": round(d["crossknn_ce_seconds_total"] / wall, 3) if wall > 0 else None,
    }
    queries = d.get(_QUERIES, 0.0)
    for key, name in _SPLIT.items():
        out[key] = round(1e3 * d[name] / queries, 2) if queries and name in d else None
    if _LATENCY["all"] in d:  # as the server timed them (the clients' uncounted first ones too)
        n = d[_LATENCY["all"]]
        out["server_over_150ms"] = int(n - d.get(_LATENCY["le150"], n))
        out["server_over_250ms"] = int(n - d.get(_LATENCY["le250"], n))
    return out


class CeSeries:
    """The CE worker's counters sampled every ``step`` s for the first ``seconds`` of a level
    (a thread polling /metrics): per interval its batches, pairs, busy ms, and the ms the CE and
    the DE spent in session runs, so that the start of a level can be told from its steady
    state (the first wave of requests: docs/serve.md)."""

    def __init__(self, port: int, seconds: float = 5.0, step: float = 0.1) -> None:
        self.port, self.seconds, self.step = port, seconds, step
        self.samples: list[tuple[float, dict]] = []
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < self.seconds:
            try:
                self.samples.append((time.perf_counter() - t0, ce_counters(self.port)))
            except OSError:
                return
            time.sleep(self.step)

    def rows(self) -> list[dict]:
        self._thread.join(self.seconds + 5)
        out = []
        for (_, a), (t1, b) in zip(self.samples, self.samples[1:], strict=False):
            d = {k: b.get(k, 0.0) - a.get(k, 0.0) for k in b}
            out.append(
                {
                    "t_s": round(t1, 2),
                    "batches": int(d.get("crossknn_ce_batches_total", 0)),
                    "pairs": int(d.get("crossknn_ce_pairs_total", 0)),
                    "ce_busy_ms": round(1e3 * d.get("crossknn_ce_seconds_total", 0.0), 1),
                    "ce_session_ms": round(1e3 * d.get(_SESSION, 0.0), 1),
                    "de_session_ms": round(1e3 * d.get(_DE_SESSION, 0.0), 1),
                }
            )
        return out


def py_spy_dump(pid: int, path: Path, delay: float, times: int = 2) -> threading.Thread | None:
    """With py-spy on PATH: ``times`` dumps of every thread of the server, ``delay`` s into a
    level, 1 s apart, appended to ``path`` (where the threads stand under load)."""
    import shutil

    exe = shutil.which("py-spy")
    if exe is None:
        return None

    def run() -> None:
        time.sleep(delay)
        with open(path, "a") as f:
            for _ in range(times):
                r = subprocess.run(
                    [exe, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=20
                )
                f.write(f"== py-spy dump (exit {r.returncode})\n{r.stdout}{r.stderr}\n")
                time.sleep(1.0)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


class Server:
    def __init__(
        self,
        index: Path,
        port: int,
        extra: list[str],
        log: Path,
        env: dict | None = None,
        standin: str | None = None,
    ) -> None:
        self.port = port
        # the stand-in device (bench/_standin_device.py): the same CLI behind its patch
        cli = ["-m", "crossknn.cli"] if standin is None else [str(STANDIN), standin]
        self.cmd = [sys.executable, *cli, "serve", str(index), "--port", str(port)]
        self.cmd += ["--log-level", "warning", *extra]
        self.log_path = log
        self.log = open(log, "w")  # noqa: SIM115
        self.env = dict(env or {})
        self.proc = subprocess.Popen(
            self.cmd, stdout=self.log, stderr=subprocess.STDOUT, env={**os.environ, **self.env}
        )

    def wait_ready(self, seconds: float, streak: int = 1) -> dict:
        """Until /readyz answered 200 ``streak`` times in a row (workers: each may be asked)."""
        end = time.monotonic() + seconds
        ok = 0
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"serve exited with {self.proc.returncode}: {self.tail()}")
            try:
                status, _ = get_json(self.port, "/readyz", 2.0)
                ok = ok + 1 if status == 200 else 0
                if ok >= streak:
                    return get_json(self.port, "/info")[1]
                if status == 200:
                    continue
            except (OSError, http.client.HTTPException, ValueError):
                ok = 0
            time.sleep(0.5)
        raise TimeoutError(f"serve not ready after {seconds:.0f} s: {self.tail()}")

    def tail(self) -> str:
        try:
            return " | ".join(self.log_path.read_text(errors="replace").strip().splitlines()[-4:])
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(30)
        self.log.close()


def server_timing(value: str | None) -> dict[str, float]:
    """``{name: ms}`` from a ``Server-Timing`` header (crossknn serve's time split)."""
    out: dict[str, float] = {}
    for part in (value or "").split(","):
        name, _, dur = part.strip().partition(";dur=")
        try:
            out[name] = float(dur)
        except ValueError:
            continue
    return out


def _split(rows: list) -> dict[str, float] | None:
    """Mean server time split (ms) of these requests (their ``Server-Timing``)."""
    timed = [r[5] for r in rows if r[5]]
    if not timed:
        return None
    return {k: round(float(np.mean([t.get(k, 0.0) for t in timed])), 2) for k in timed[0]}


def _clients(port, workers, queries, n, seconds, budget, out, ready) -> None:
    """Closed-loop clients ``workers`` (threads of this process) sharing ``n`` requests for at
    most ``seconds``; their results go to ``out`` (a queue: this runs in a client process).
    Each thread first connects and sends one request that is not counted, then waits at
    ``ready`` (a barrier of every client of the level): a client's first request, which pays
    its own start (a forked process touching memory, a new connection), is not measured."""
    lock = threading.Lock()
    state = {"next": 0}
    results: list[tuple[int, float, float | None, float | None, float]] = []
    body0 = json.dumps({"query": queries[0], "k": K, "budget": budget})

    def worker(w: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        try:
            try:
                conn.request("POST", "/search", body0, {"Content-Type": "application/json"})
                conn.getresponse().read()
            except (OSError, http.client.HTTPException):
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
            try:
                ready.wait(120)
            except threading.BrokenBarrierError:
                return
            stop_at = time.monotonic() + seconds
            while time.monotonic() < stop_at:
                with lock:
                    i = state["next"]
                    if i >= n:
                        return
                    state["next"] += 1
                q_text = queries[(i * 7 + w) % len(queries)]
                body = json.dumps({"query": q_text, "k": K, "budget": budget})
                t = time.perf_counter()
                started = time.time()  # comparable across the client processes
                ce = other = None
                ids: list[str] = []
                timing: dict[str, float] = {}
                try:
                    conn.request("POST", "/search", body, {"Content-Type": "application/json"})
                    resp = conn.getresponse()
                    data = resp.read()
                    code = resp.status
                    if code == 200:
                        h = json.loads(data)["hits"][0]
                        ids = [r["id"] for r in h.get("results", [])]
                        ce = h.get("ce_s", h.get("seconds_ce"))
                        other = h.get("other_s", h.get("seconds_other"))
                        timing = server_timing(resp.getheader("Server-Timing"))
                except (OSError, http.client.HTTPException, ValueError):
                    code = -1
                    conn.close()
                    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
                lat = time.perf_counter() - t
                with lock:
                    results.append((code, lat, ce, other, started, timing, (q_text, ids)))
                if code in (429, 503):
                    time.sleep(0.05)
        finally:
            conn.close()

    threads = [threading.Thread(target=worker, args=(w,)) for w in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out.put(results)


def closed_loop(
    port: int,
    conc: int,
    queries: list[str],
    n: int,
    seconds: float,
    budget: int,
    exact: dict | None = None,
) -> dict:
    """``conc`` clients, each sending its next request when its last is answered, until ``n``
    requests are done or ``seconds`` passed (a 429/503 client waits 50 ms), after one uncounted
    request each and a barrier (see :func:`_clients`). The clients are threads of up to 8
    processes, so that the load generator's own interpreter lock does not add to the latencies
    it measures. The processes are fresh interpreters (spawned, not forked: a child forked from
    this process, with PyTorch, CUDA and the models in it, pays copy-on-write faults and GC
    passes over the parent's objects in its first requests, which the clients would time as the
    server's). The wall time runs from the first measured request's start to the last one's
    end."""
    import multiprocessing

    mp = multiprocessing.get_context("spawn")
    procs = min(conc, 8)
    out = mp.Queue()
    ready = mp.Barrier(conc)
    ps = []
    for p in range(procs):
        workers = list(range(p, conc, procs))
        share = n // procs + (1 if p < n % procs else 0)
        ps.append(
            mp.Process(
                target=_clients, args=(port, workers, queries, share, seconds, budget, out, ready)
            )
        )
    for proc in ps:
        proc.start()
    results: list = []
    give_up = time.monotonic() + seconds + 300
    got = 0
    while got < len(ps):
        try:
            results.extend(out.get(timeout=1.0))
            got += 1
        except queue.Empty:
            # a client process that died without answering (e.g. it could not start) fails the
            # level now instead of at the timeout
            dead = [p.exitcode for p in ps if p.exitcode not in (None, 0)]
            if dead or time.monotonic() > give_up:
                for proc in ps:
                    proc.kill()
                why = f"exit codes {dead}" if dead else "timeout"
                raise RuntimeError(f"load clients failed ({why}) at concurrency {conc}") from None
    for proc in ps:
        proc.join(30)
    wall = max(r[4] + r[1] for r in results) - min(r[4] for r in results) if results else 0.0
    ok = [r for r in results if r[0] == 200]
    lat = np.array([r[1] for r in ok]) * 1e3
    ce = [r[2] * 1e3 for r in ok if r[2] is not None]
    other = [r[3] * 1e3 for r in ok if r[3] is not None]
    errors = Counter(str(r[0]) for r in results if r[0] != 200)
    # where the tail lies in time: p99 of the requests started in the level's second half, and
    # per tenth of the level the requests slower than 2 x p50 (early: first uses; spread: not)
    t0_wall = min((r[4] for r in ok), default=0.0)
    span = max((r[4] for r in ok), default=0.0) - t0_wall
    late = [r[1] * 1e3 for r in ok if r[4] - t0_wall >= span / 2]
    over = {ms: sum(r[1] * 1e3 > ms for r in ok) for ms in (150, 250)}
    slow = [0] * 10
    p50 = pct(lat, 50)
    for r in ok:
        if p50 is not None and r[1] * 1e3 > 2 * p50:
            slow[min(9, int(10 * (r[4] - t0_wall) / span)) if span > 0 else 0] += 1
    return {
        "queries_per_s": round(len(ok) / wall, 2) if wall > 0 else 0.0,
        "p50_ms": pct(lat, 50),
        "p99_ms": pct(lat, 99),
        "ce_ms": pct(ce, 50),
        "other_ms": pct(other, 50),
        "requests": len(results),
        "ok": len(ok),
        "errors": dict(sorted(errors.items())),
        "http_5xx": sum(v for c, v in errors.items() if c.startswith("5")),
        "top10_recall_vs_exact": None
        if exact is None
        else recall_vs_exact(exact, [r[6] for r in ok]),
        "wall_s": round(wall, 2),
        "p99_ms_second_half": pct(np.array(late), 99) if late else None,
        "slow_by_tenth": slow,
        "client_over_150ms": over[150],
        "client_over_250ms": over[250],
        # where the time of a request went on the server: all, the slowest 1%, and the first
        # `conc` requests (the clients start together at the barrier)
        "split_ms": _split(ok),
        "split_ms_slowest_1pct": _split(sorted(ok, key=lambda r: -r[1])[: max(1, len(ok) // 100)]),
        "split_ms_first_wave": _split(sorted(ok, key=lambda r: r[4])[:conc]),
    }


def serve_section(rep: Report, dl: Deadline, ctx: dict, args) -> None:
    import importlib.util

    missing = [m for m in ("fastapi", "uvicorn") if importlib.util.find_spec(m) is None]
    if missing:
        rep.note(
            "skipped",
            "serve",
            f"{' and '.join(missing)} not installed (pip install 'crossknn[serve]')",
        )
        return
    queries = ctx["search_queries"]
    log_dir = Path(ctx["work"])
    if "exact" not in ctx:  # the serve rows' recall: the exact CE top-10, once
        import crossknn
        from crossknn.ce.folders import open_index_models

        index = crossknn.open_index(ctx["index"])
        ce, de = open_index_models(
            index, precision=ctx["precisions"][-1], provider=args.provider, threads=args.threads
        )
        exact_top10(ctx, args, index, ce, de)
        del ce, de
    # on a CPU one server; on a GPU, most important first (the deadline skips the last): the
    # default server, concurrent requests searched in lockstep (--group-queries), the engine
    # lock by request age (--engine-order oldest), more processes, no load-time warm-up
    real_gpu = ctx["gpu"] and not args.standin_device
    names = args.serve_variants or (GPU_SERVE_VARIANTS if real_gpu else "default")
    variants = [Variant(v) for v in names.split(",") if v.strip()]
    for v in variants:
        for precision in reversed(ctx["precisions"]):
            if serve_rows(rep, dl, ctx, args, queries, log_dir, precision, v):
                break


# cold: no warm-up, the CE workers capture each shape's graph on its first batch (what a
# warm-up in the loading thread amounts to: onnxruntime keeps graphs per thread); bp2048+cew1:
# the older GPU batching defaults (2,048 pairs, one CE worker); group1+any: requests searched
# alone under a plain lock; de0: the DE's queries encoded in the request threads instead of the
# DE thread (docs/serving.md, docs/design/notes.md)
GPU_SERVE_VARIANTS = "default,cold,de0,bp2048+cew1,group1+any,w4"


class Variant:
    """A server setting by name: ``default``, ``groupN`` (--group-queries N), ``oldest``
    (--engine-order oldest; ``any``: a plain lock, with ``group1``), ``wN``
    (--workers N), ``bpN`` (--max-batch-pairs N), ``cewN`` (--ce-workers N), ``grN`` (CUDA
    graphs up to N rows: ``$CROSSKNN_CUDA_GRAPH_ROWS``), ``cold`` (--no-warmup), ``de0`` /
    ``de1`` (--no-de-thread / --de-thread: the DE's queries in the request threads or in one
    thread of their own), ``nograph``
    (CUDA graphs off), ``ltMS`` (--latency-target-ms MS; ``lt0``: auto's index rounds),
    ``m-NAME`` (--method NAME: a reference method), joined by ``+`` (``group1+any``)."""

    def __init__(self, name: str) -> None:
        self.name = name.strip()
        self.extra: list[str] = []
        self.graph, self.workers, self.warm = "1", 1, True
        self.env: dict[str, str] = {}
        for part in self.name.split("+"):
            if part == "default":
                continue
            if part.startswith("group") and part[5:].isdigit():
                self.extra += ["--group-queries", part[5:]]
            elif part.startswith("bp") and part[2:].isdigit():
                self.extra += ["--max-batch-pairs", part[2:]]
            elif part.startswith("cew") and part[3:].isdigit():
                self.extra += ["--ce-workers", part[3:]]
            elif part.startswith("gr") and part[2:].isdigit():
                self.env["CROSSKNN_CUDA_GRAPH_ROWS"] = part[2:]
            elif part in ("oldest", "any"):
                self.extra += ["--engine-order", part]
            elif part.startswith("w") and part[1:].isdigit():
                self.workers = int(part[1:])
            elif part == "cold":
                self.warm = False
            elif part in ("de0", "de1"):
                self.extra += ["--de-thread" if part == "de1" else "--no-de-thread"]
            elif part == "nograph":
                self.graph = "0"
            elif part.startswith("lt") and part[2:].replace(".", "", 1).isdigit():
                self.extra += ["--latency-target-ms", part[2:]]  # lt0: the index's rounds
            elif part.startswith("m-") and part[2:]:
                self.extra += ["--method", part[2:]]  # m-axn, m-rnr: reference methods
            else:
                raise ValueError(f"unknown serve variant {part!r} in {self.name!r}")


def serve_rows(rep, dl, ctx, args, queries, log_dir, precision: str, v: Variant) -> bool:
    """One server, the closed loop at each concurrency level; False where it failed."""
    if dl.left() < 40:
        rep.note("skipped", "serve", f"{precision} {v.name}: deadline")
        return True
    extra = ["--provider", args.provider] + (
        ["--precision", precision] if precision != "fp32" else []
    )
    if v.workers > 1:
        extra += ["--workers", str(v.workers)]
    if not v.warm:
        extra += ["--no-warmup"]
    extra += v.extra
    port = free_port()
    env = {"CROSSKNN_CUDA_GRAPH": v.graph, **v.env}
    tag = v.name.replace("+", "-")
    server = Server(
        ctx["index"],
        port,
        extra,
        log_dir / f"serve-{precision}-{tag}.log",
        env,
        standin=args.standin_device,
    )
    shown = " ".join(f"{k}={x}" for k, x in env.items())
    rep.doc["commands"].append(f"{shown} " + shlex.join(server.cmd))
    rep.save()
    try:
        info = server.wait_ready(
            min(180.0, dl.left() - 30), streak=1 if v.workers == 1 else 8 * v.workers
        )
        for q in queries[:3]:  # warm up
            closed_loop(port, 1, [q], 1, 60, args.budget)
        gpu_memory = gpu_name("memory.used") if ctx["gpu"] else None  # graphs captured: in use
        for conc in ctx["levels"]:
            if dl.left() < 12:
                rep.note("skipped", "serve", f"{precision} {v.name} concurrency {conc}: deadline")
                continue
            n = ctx["serve_requests"] * (1 if conc == 1 else 4 if conc <= 8 else 10)
            seconds = min(args.level_seconds, dl.left() - 10)
            before = ce_counters(port)
            if args.py_spy and conc == 32 and v.workers == 1:
                py_spy_dump(server.proc.pid, log_dir / f"pyspy-{tag}.log", 1.0)
            t_window = time.perf_counter()
            series = CeSeries(port) if ctx["gpu"] and conc > 1 and v.workers == 1 else None
            r = closed_loop(port, conc, queries, n, seconds, args.budget, ctx.get("exact"))
            if series is not None:  # (starts with the clients' processes and first requests)
                r["ce_series"] = series.rows()
            if v.workers == 1:  # (with workers, /metrics is one worker's; the counters' window
                # includes each client's uncounted first request)
                r.update(batch_stats(before, ce_counters(port), time.perf_counter() - t_window))
            rep.row(
                "serve",
                {
                    "device": ctx["device"],
                    "provider": info.get("provider"),
                    "precision": info.get("precision"),
                    "budget": args.budget,
                    "concurrency": conc,
                    **r,
                    "variant": v.name,
                    # what the server runs for a request with no method flag (its /info)
                    "method": (info.get("plan") or {}).get("method"),
                    "rounds": (info.get("plan") or {}).get("rounds"),
                    "plan": info.get("plan"),
                    "round_cost_ms": info.get("round_cost_ms"),
                    "cuda_graph": v.graph == "1",
                    "workers": v.workers,
                    "warmup": info.get("warmup"),
                    "batcher": info.get("batcher"),
                    "gpu_memory_used": gpu_memory,
                },
            )
        return True
    except Exception as exc:
        rep.note("errors", "serve", f"{precision} {v.name}: {type(exc).__name__}: {exc}")
        return False
    finally:
        server.stop()


# -- main ------------------------------------------------------------------------------------
def table(doc: dict) -> None:
    print("\nCE throughput (pairs/s)")
    print(f"{'provider':28}{'precision':>10}{'batch':>7}{'pairs/s':>11}{'top10 vs fp32':>15}")
    for r in doc.get("ce", []) + doc.get("torch", []):
        agree = r["top10_agreement_vs_fp32"]
        print(
            f"{r['provider']:28}{r['precision']:>10}{r['batch']:>7}{r['pairs_per_s']:>11.1f}"
            f"{'' if agree is None else f'{agree:.3f}':>15}"
        )
    for r in doc.get("round", []):
        print(
            f"one round's 20-pair call on {r['provider']} {r['precision']}, "
            f"{r.get('graph', 'exported')} graph, CUDA graph "
            f"{'on' if r.get('cuda_graph') else 'off'}: p50 {r['call_ms_p50']} ms"
        )
    print("\nsearch (ms per query)")
    print(
        f"{'mode':8}{'provider':26}{'prec':>6}{'variant':>15}{'conc':>6}{'q/s':>9}{'p50':>9}"
        f"{'p99':>9}{'ce':>8}{'other':>8}{'lock':>8}"
    )
    for kind in ("search", "serve"):
        for r in doc.get(kind, []):

            def f(x, w):
                return f"{'-' if x is None else x:>{w}}"

            print(
                f"{kind:8}{str(r['provider']):26}{str(r['precision']):>6}"
                f"{r.get('variant', 'graph' if r.get('cuda_graph') else 'no graph'):>15}"
                f"{r['concurrency']:>6}"
                f"{f(r['queries_per_s'], 9)}{f(r['p50_ms'], 9)}{f(r['p99_ms'], 9)}"
                f"{f(r['ce_ms'], 8)}{f(r['other_ms'], 8)}{f(r.get('lock_wait_ms'), 8)}"
            )
    for key in ("errors", "skipped"):
        for e in doc.get(key, []):
            print(f"{SINGULAR[key]}: [{e['section']}] {e['what']}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--provider", default="auto", choices=("auto", "cpu", "cuda", "tensorrt"))
    ap.add_argument("--data", type=Path, default=SHARED / "data" / "scifact", help="a BEIR folder")
    ap.add_argument("--quick", action="store_true", help="small counts (a smoke run on a CPU)")
    ap.add_argument("--max-seconds", type=float, default=270.0, help="global deadline (s)")
    ap.add_argument("--sections", default="ce,torch,search,serve")
    ap.add_argument(
        "--py-spy",
        action="store_true",
        help="py-spy dumps of each server's threads at concurrency 32 (py-spy on PATH; a dump "
        "pauses the server, so its p99 there is not for a table)",
    )
    ap.add_argument(
        "--serve-variants",
        default=None,
        help="the servers of the serve section in this order (see Variant; default on a GPU: "
        f"{GPU_SERVE_VARIANTS}; on a CPU: default)",
    )
    ap.add_argument(
        "--serve-requests",
        type=int,
        default=None,
        help="requests per serve level: this many at concurrency 1, x4 at 8, x10 at 32 and 64 "
        "(default 100; quick 2), each level also bounded by 10 s",
    )
    ap.add_argument(
        "--standin-device",
        default=None,
        metavar="A,B[,C,D]",
        help="no GPU: a stand-in device (bench/_standin_device.py) whose CE session runs sleep "
        "A + B ms a pair (DE: C + D a query), one batch at a time; with --provider cpu "
        "--sections serve: the serving path's host side at a GPU's device times",
    )
    ap.add_argument("--threads", type=int, default=None, help="CE/DE threads (default: all)")
    ap.add_argument("--budget", type=int, default=None, help="CE calls per query (100; quick 20)")
    ap.add_argument(
        "--exact-queries",
        type=int,
        default=None,
        help="queries whose exact CE top-10 (every item scored) the rows' "
        "top10_recall_vs_exact is measured against (default 100; quick 4)",
    )
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--work", type=Path, default=None, help="folder for the index and logs")
    args = ap.parse_args()
    dl = Deadline(args.max_seconds)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logging.getLogger("crossknn.ce").setLevel(logging.INFO)  # provider choice, fp16 graph
    cpu = args.provider == "cpu"
    if not cpu:
        try:  # PyTorch's CUDA libraries first, so onnxruntime's CUDA provider finds them
            import torch  # noqa: F401
        except ImportError:
            pass
    if args.standin_device:
        if not cpu or any(sec.strip() not in ("serve", "") for sec in args.sections.split(",")):
            ap.error("--standin-device needs --provider cpu and --sections serve")
        import _standin_device as standin_device

        standin_device.install(standin_device.parse(args.standin_device))
    out = args.out or result_path("gpu_bench", gpu=not cpu)
    quick = args.quick
    args.budget = args.budget or (20 if quick else 100)
    args.exact_queries = args.exact_queries or (4 if quick else 100)
    args.level_seconds = 6.0 if quick else 10.0
    args.search_seconds = 15.0 if quick else 25.0
    name = gpu_name()
    try:
        import onnxruntime as ort

        ort_providers = ort.get_available_providers()
    except Exception as exc:  # recorded in the JSON: the setup below fails and says so
        ort_providers = f"onnxruntime does not import: {type(exc).__name__}: {exc}"
    rep = Report(
        out,
        {
            "bench": "gpu_bench",
            "started": utc_now(),
            "device": (
                f"stand-in device {args.standin_device} ms (bench/_standin_device.py) on "
                if args.standin_device
                else ""
            )
            + (name or f"cpu: {platform.processor() or platform.machine()}"),
            "standin_device": args.standin_device,
            "nvidia_smi": name,
            "machine": machine("onnxruntime", "onnxruntime-gpu", "torch", "transformers", "onnx"),
            "ort_providers": ort_providers,
            "commands": [shlex.join([sys.executable, *sys.argv])],
            "provenance": provenance(),
            "setup_commands": os.environ.get("GPU_BENCH_SETUP", "").splitlines(),
            "settings": {"quick": quick, "max_seconds": args.max_seconds, "data": str(args.data)},
            "ce": [],
            "round": [],
            "torch": [],
            "search": [],
            "serve": [],
            "errors": [],
            "skipped": [],
        },
    )
    ctx: dict = {"device": rep.doc["device"]}
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    work = args.work or Path(tempfile.mkdtemp(prefix="gpu-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    ctx["work"] = str(work)
    try:
        from crossknn.ce.folders import open_dual_encoder

        ids, texts, queries = load_data(args.data, 200 if quick else None, 300)
        ctx["ids"], ctx["texts"] = ids, texts
        probe = open_ce("fp32", args.provider, args.threads)
        ctx["gpu"] = probe.provider != "CPUExecutionProvider"
        ctx["precisions"] = ["fp32", "fp16"] if ctx["gpu"] and not args.standin_device else ["fp32"]
        ctx["plan"] = probe._plan
        rep.doc["provider_auto"] = probe.provider
        rep.doc["provider_skipped"] = list(probe._s.skipped)  # why auto passed a provider by
        if not ctx["gpu"] and not quick:
            rep.note("skipped", "setup", "fp16 rows: the provider is the CPU")
        de = open_dual_encoder(None, precision="fp32", provider=args.provider, threads=args.threads)
        n_ce = 2 if quick else 60
        per = 20 if quick else 100
        t = time.perf_counter()
        ctx["cand"] = top_candidates(de, texts, queries[:n_ce], per)
        ctx["ce_queries"] = queries[:n_ce]
        ctx["search_queries"] = queries
        ctx["batches"] = [16, 40] if quick else [16, 256, 1024]
        ctx["levels"] = [1, 8] if quick else [1, 8, 32, 64]
        ctx["serve_requests"] = args.serve_requests or (2 if quick else 100)
        rep.doc["settings"].update(
            items=len(texts),
            queries=len(queries),
            ce_queries=n_ce,
            candidates=per,
            de_provider=de.provider,
            de_top_s=round(time.perf_counter() - t, 1),
        )
        rep.save()
        del probe, de
    except Exception as exc:
        rep.note("errors", "setup", f"{type(exc).__name__}: {exc}")
        traceback.print_exc()
        sections = []
    runners = {
        "ce": ce_section,
        "torch": torch_section,
        "search": search_section,
        "serve": serve_section,
    }
    for sec in sections:
        if sec not in runners:
            rep.note("errors", sec, "unknown section")
            continue
        if dl.left() < 10:
            rep.note("skipped", sec, "deadline")
            continue
        try:
            if sec in ("search", "serve") and "index" not in ctx:
                ctx["index"] = build_index(ctx, args, work / "index")
                rep.doc["settings"]["index_build_s"] = ctx["build_s"]
                rep.doc["settings"]["index_auto"] = ctx["index_auto"]
                rep.save()
            t = time.perf_counter()
            runners[sec](rep, dl, ctx, args)
            rep.doc.setdefault("section_seconds", {})[sec] = round(time.perf_counter() - t, 1)
            rep.save()
        except Exception as exc:
            rep.note("errors", sec, f"{type(exc).__name__}: {exc}")
            traceback.print_exc()
    rep.doc["finished"] = utc_now()
    rep.doc["seconds"] = round(args.max_seconds - dl.left(), 1)
    rep.save()
    table(rep.doc)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
