"""Load test of ``crossknn serve`` on loopback: closed-loop clients, with and without
cross-request batching, against in-process ``Searcher.search``; plus two faults.

Index: the demo's stdlib docstrings, embedded CE and DE in int8 (built once, cached). Requests:
one query each, B=100, k=10, 5 rounds (AXN). Every level is bounded in requests
(``--requests``) and seconds (``--level-seconds``); every server is stopped by its PID.

    python bench/serve_bench.py                 # -> bench/results/serve_bench.json

Rows: ``{concurrency, batching, qps, p50_ms, p95_ms, p99_ms, mean_batch_pairs, errors, ...}``
for each level and server, one ``{concurrency, in_process_ms, ...}`` row per level, and the
fault results.

The overload rows (``"overload"``; ``--only overload`` runs just them and keeps the other rows of
the JSON file): the sustainable rate is measured first (closed loop, ``--sustain-concurrency``
clients for ``--sustain-seconds``), then a bounded open-loop client offers ``--overload-factor``
times that rate for ``--overload-seconds`` to a server with ``--timeout-s 20`` and a queue of 64,
once with deadline admission (``--admit-within 0.5``, the default) and once with the queue limit
alone (``--admit-within 0``, the behaviour before it), while ``/healthz`` is probed twice a
second. Goal: 0 x 5xx, every admitted request answered within its deadline (``n_late`` 0),
goodput >= 90% of the sustainable rate, ``/healthz`` 200 throughout.

    python bench/serve_bench.py --only overload

The soak (``--soak MIN``, issue 46): mixed ``/search`` and ``/rerank`` (k, budget, text lengths
and counts drawn log-uniformly from realistic ranges) at ``--soak-fraction`` (0.8) of the
sustainable rate of that mix (measured first), Poisson arrivals, for MIN minutes: per minute the
p50/p99 of the 200s, the statuses, the server's RSS and open file descriptors and the labelled
series in /metrics; written to the ``soak`` section of bench/results/api_contract.json.

    python bench/serve_bench.py --soak 30

The query-group rows (``"groups"``; ``--only groups``): the default server (requests waiting
together for the engine start as one lockstep search) and one with ``--group-queries 1
--engine-order any`` (the server before query groups), side by side at each level.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np

import crossknn
from crossknn import client

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import StealMeter  # noqa: E402

HERE = Path(__file__).resolve().parent
QUERIES = [
    "parse a date string into a datetime object",
    "compress data with gzip and write it to a file",
    "send an email message through an SMTP server",
    "run a shell command and capture its output",
    "read a CSV file row by row",
    "create a temporary directory that is removed afterwards",
    "encode binary data as base64 text",
    "sort a list in place with a key function",
    "open a TCP connection to a remote host",
    "format a number with thousands separators",
    "match a regular expression against a string",
    "serialize an object to JSON",
    "compute the SHA-256 hash of a file",
    "walk a directory tree recursively",
    "schedule a function to run later",
    "decode a URL query string into a dictionary",
    "start a thread and wait for it to finish",
    "copy a file and its permissions",
    "generate a random integer in a range",
    "measure the execution time of small code snippets",
    "parse command line options",
    "log a warning message",
    "read a configuration file with sections",
    "convert a timestamp to UTC",
    "iterate over pairs of consecutive items",
    "cache the results of a function call",
    "compare two sequences and show the differences",
    "extract files from a zip archive",
    "wrap long lines of text to a given width",
    "deep copy a nested data structure",
    "check whether a path is a symbolic link",
    "escape HTML special characters",
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tree_hash(path: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(path.rglob("*")):
        if p.is_file():
            h.update(str(p.relative_to(path)).encode())
            h.update(hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()


def build_index(
    root: Path, max_items: int | None, index_calls: int | None = None, precision: str = "int8"
):
    """The docstrings index (cached); ``index_calls=0``: no method index trained (seconds to
    build; the soak's, with the fp32 models: no int8 model to make first)."""
    from crossknn.ce import default_cross_encoder, default_dual_encoder
    from crossknn.demo_corpus import stdlib_docstrings

    corpus = stdlib_docstrings(max_items=max_items)
    key = hashlib.sha256("\0".join(corpus.ids).encode()).hexdigest()[:12]
    calls = "" if index_calls is None else f"-calls{index_calls}"
    path = root / f"stdlib-{precision}-{len(corpus)}-{key}{calls}"
    if (path / "index.json").is_file():
        return path
    t = time.perf_counter()
    crossknn.build_corpus_index(
        corpus,
        path,
        ce=default_cross_encoder(precision=precision),
        de=default_dual_encoder(precision=precision),
        progress=False,
        **({} if index_calls is None else {"index_calls": index_calls}),
    )
    print(f"index: built {path} ({len(corpus)} items) in {time.perf_counter() - t:.0f} s")
    return path


class Server:
    def __init__(self, index: Path, log_dir: Path, *args: str, precision: str = "int8") -> None:
        self.index, self.args, self.precision = index, args, precision
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_dir / f"serve-{self.port}.log"
        self.start()

    def start(self) -> float:
        cmd = [sys.executable, "-m", "crossknn.cli", "serve", str(self.index), "--port"]
        cmd += [str(self.port), "--precision", self.precision, "--log-level", "warning", *self.args]
        cmd += ["--allow-exact"]  # the disconnect fault sends an exact=True request
        self.log = open(self.log_path, "a")  # noqa: SIM115
        t = time.monotonic()
        env = dict(os.environ, PYTHONFAULTHANDLER="1")  # a crash leaves a trace in the log
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        client.wait_ready(self.url, timeout=300)
        return time.monotonic() - t

    def metrics(self) -> dict[str, float]:
        from prometheus_client.parser import text_string_to_metric_families

        out = {}
        for fam in text_string_to_metric_families(httpx.get(self.url + "/metrics").text):
            for s in fam.samples:
                if not s.labels:
                    out[s.name] = s.value
        return out

    def stop(self, sig=signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)
            try:
                self.proc.wait(120)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(30)
        self.log.close()
        return self.proc.returncode


def closed_loop(url: str, conc: int, n: int, seconds: float, body: dict) -> dict:
    """``conc`` clients, each sending its next request when the last one is answered, until
    ``n`` requests are done or ``seconds`` have passed. A 429 client waits 0.1 s."""
    lock = threading.Lock()
    state = {"next": 0}
    results: list[tuple[int, float]] = []
    overhead: list[float] = []  # client latency minus the search time the server reports
    stop_at = time.monotonic() + seconds

    def worker(w: int) -> None:
        with httpx.Client(timeout=httpx.Timeout(300.0)) as http:
            while time.monotonic() < stop_at:
                with lock:
                    i = state["next"]
                    if i >= n:
                        return
                    state["next"] += 1
                b = dict(body, query=QUERIES[(i * 7 + w) % len(QUERIES)])
                t = time.perf_counter()
                try:
                    resp = http.post(url + "/search", json=b)
                    code = resp.status_code
                except httpx.HTTPError:
                    code = -1
                lat = time.perf_counter() - t
                with lock:
                    results.append((code, lat))
                    if code == 200:
                        h = resp.json()["hits"][0]
                        overhead.append(lat - h["ce_s"] - h["other_s"])
                if code in (429, 503):
                    time.sleep(0.1)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(w,)) for w in range(conc)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    ok = np.array([lat for c, lat in results if c == 200]) * 1000
    errors = Counter(str(c) for c, _ in results if c != 200)

    def pct(q):
        return round(float(np.percentile(ok, q)), 1) if ok.size else None

    return {
        "requests": len(results),
        "ok": int(ok.size),
        "qps": round(ok.size / wall, 2),
        "p50_ms": pct(50),
        "p95_ms": pct(95),
        "p99_ms": pct(99),
        "errors": dict(sorted(errors.items())),
        "http_overhead_p50_ms": round(float(np.median(overhead)) * 1000, 2) if overhead else None,
        "wall_s": round(wall, 1),
    }


def run_groups(index: Path, root: Path, args, body, common) -> dict:
    """Query groups on this CPU, side by side in one run: the default server (requests waiting
    together for the engine start as one lockstep search, the engine lock by request age)
    against every request alone with a plain lock (the server before query groups), both with
    cross-request batching, at each level."""
    out: dict = {
        "machine": f"{platform.machine()}, {os.cpu_count()} logical cores, load average at start "
        f"{os.getloadavg()[0]:.1f} (compare the rows of one run)",
        "request": body,
        "rows": [],
    }
    for groups, flags in ((True, []), (False, ["--group-queries", "1", "--engine-order", "any"])):
        server = Server(index, root, "--max-batch-pairs", "256", "--max-queue", "128",
                        "--timeout-s", "600", "--admit-within", "0", *flags, *common)  # fmt: skip
        try:
            print(f"server, query groups {'on' if groups else 'off'}", flush=True)
            out["rows"] += run_levels(server, args.levels, args, body, True, {"groups": groups})
        finally:
            server.stop()
    return out


def run_levels(server: Server, levels, args, body, batching: bool, extra=None) -> list[dict]:
    rows = []
    for _ in range(3):  # warm up (not counted)
        client.search(server.url, QUERIES[0], k=body["k"], budget=body["budget"], timeout=300)
    for c in levels:
        m0 = server.metrics()
        r = closed_loop(server.url, c, args.requests, args.level_seconds, body)
        m1 = server.metrics()
        batches = m1["crossknn_ce_batches_total"] - m0["crossknn_ce_batches_total"]
        pairs = m1["crossknn_ce_pairs_total"] - m0["crossknn_ce_pairs_total"]
        row = {"concurrency": c, "batching": batching, **(extra or {}), **r}
        row["mean_batch_pairs"] = round(pairs / batches, 1) if batches else None
        row["ce_seconds_share"] = round(
            (m1["crossknn_ce_seconds_total"] - m0["crossknn_ce_seconds_total"]) / r["wall_s"], 2
        )
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def in_process(index: Path, levels, args, body) -> list[dict]:
    s = crossknn.Searcher(index, precision="int8")
    s.search(QUERIES[:2], k=body["k"], budget=body["budget"])  # warm up
    lat = []
    for i in range(args.in_process_queries):
        t = time.perf_counter()
        s.search(QUERIES[i % len(QUERIES)], k=body["k"], budget=body["budget"])
        lat.append(time.perf_counter() - t)
    p50 = float(np.median(lat)) * 1000
    rows = []
    for c in levels:
        # the Searcher's own batching: c queries in one call (skipped when it would take long)
        qps = None
        if c * p50 / 1000 <= args.level_seconds:
            qs = [QUERIES[i % len(QUERIES)] for i in range(c)]
            t = time.perf_counter()
            s.search(qs, k=body["k"], budget=body["budget"])
            qps = round(c / (time.perf_counter() - t), 2)
        row = {
            "concurrency": c,
            "in_process_ms": round(p50, 1),
            "in_process_p95_ms": round(float(np.percentile(lat, 95)) * 1000, 1),
            "in_process_qps": round(1000 / p50, 2),
            "in_process_batch_qps": qps,
        }
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def fault_disconnect(server: Server, n_items: int) -> dict:
    heavy = json.dumps({"query": QUERIES[3], "k": 10, "budget": 100, "exact": True}).encode()
    m0 = server.metrics()
    with socket.create_connection(("127.0.0.1", server.port)) as s:
        s.sendall(
            b"POST /search HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(heavy)}\r\n\r\n".encode()
            + heavy
        )
        time.sleep(0.3)
    time.sleep(1.0)
    t = time.perf_counter()
    out = client.search(server.url, QUERIES[0], k=10, budget=100, timeout=300)
    after_ms = (time.perf_counter() - t) * 1000
    m1 = server.metrics()
    return {
        "fault": "client disconnects 0.3 s into a request (exact=True: 100 + N CE pairs)",
        "disconnects_seen": m1["crossknn_client_disconnects_total"]
        - m0["crossknn_client_disconnects_total"],
        "pairs_dropped": m1["crossknn_ce_dropped_pairs_total"]
        - m0["crossknn_ce_dropped_pairs_total"],
        "pairs_scored": m1["crossknn_ce_pairs_total"] - m0["crossknn_ce_pairs_total"],
        # the dropped request would have cost 100 + N pairs, the next one 100
        "pairs_never_run": n_items
        + 200
        - (m1["crossknn_ce_pairs_total"] - m0["crossknn_ce_pairs_total"]),
        "next_request_ok": out["hits"][0]["ce_calls"] == 100,
        "next_request_ms": round(after_ms, 1),
    }


def fault_sigkill(server: Server, index: Path, body: dict) -> dict:
    before = _tree_hash(index)
    codes = Counter()
    stop = threading.Event()

    def load():
        with httpx.Client(timeout=60) as http:
            while not stop.is_set():
                try:
                    r = http.post(server.url + "/search", json=dict(body, query=QUERIES[5]))
                except httpx.HTTPError:
                    codes["connection error"] += 1
                    time.sleep(0.2)
                    continue
                codes[str(r.status_code)] += 1
                if r.status_code != 200:
                    time.sleep(0.2)  # 503 while the restarted server loads: do not spin

    threads = [threading.Thread(target=load) for _ in range(8)]
    for t in threads:
        t.start()
    time.sleep(5)
    server.stop(signal.SIGKILL)
    killed = time.monotonic()
    restart = server.start()
    ready_after_kill = time.monotonic() - killed
    stop.set()
    for t in threads:
        t.join(120)
    info = client.info(server.url)
    out = client.search(server.url, QUERIES[0], k=10, budget=100, timeout=300)
    return {
        "fault": "SIGKILL under load (8 clients), then restart",
        "restart_to_ready_s": round(restart, 1),
        "kill_to_ready_s": round(ready_after_kill, 1),
        "model_and_index_load_s": info.get("load_seconds"),
        "client_results_during": dict(codes),
        "serves_again": out["hits"][0]["ce_calls"] == 100,
        "index_unchanged": _tree_hash(index) == before,
    }


def open_loop(url: str, rate: float, seconds: float, body: dict, timeout_s: float) -> dict:
    """Requests at ``rate`` per second for ``seconds`` (no retries: each arrival is a new
    request), sent by a bounded pool of client threads (an arrival finding none free is counted
    in ``client_skipped``); ``/healthz`` probed every 0.5 s meanwhile. Waits for the answers at
    most ``timeout_s + 60`` s after the last arrival."""
    n_workers = 256
    free = threading.Semaphore(n_workers)
    local = threading.local()
    lock = threading.Lock()
    results: list[tuple[float, int, float, str | None]] = []  # (sent, code, latency, retry)
    health: list[tuple[int, float]] = []
    stop = threading.Event()

    def http() -> httpx.Client:
        if getattr(local, "http", None) is None:
            local.http = httpx.Client(timeout=httpx.Timeout(timeout_s + 60.0))
        return local.http

    def one(i: int, sent: float) -> None:
        try:
            b = dict(body, query=QUERIES[i % len(QUERIES)])
            t = time.perf_counter()
            try:
                r = http().post(url + "/search", json=b)
                code, retry = r.status_code, r.headers.get("retry-after")
            except httpx.HTTPError:
                code, retry = -1, None
            with lock:
                results.append((sent, code, time.perf_counter() - t, retry))
        finally:
            free.release()

    def probe() -> None:
        with httpx.Client(timeout=httpx.Timeout(5.0)) as h:
            while not stop.wait(0.5):
                t = time.perf_counter()
                try:
                    code = h.get(url + "/healthz").status_code
                except httpx.HTTPError:
                    code = -1
                health.append((code, time.perf_counter() - t))

    prober = threading.Thread(target=probe)
    prober.start()
    pool = ThreadPoolExecutor(n_workers)
    skipped, n = 0, int(rate * seconds)
    t0 = time.perf_counter()
    for i in range(n):
        at = t0 + i / rate
        delay = at - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        if free.acquire(blocking=False):
            pool.submit(one, i, time.perf_counter() - t0)
        else:
            skipped += 1
    window = time.perf_counter() - t0
    pool.shutdown(wait=True)  # every request is bounded by its client timeout
    stop.set()
    prober.join()
    return {"results": results, "health": health, "window_s": window, "skipped": skipped}


def overload_row(server: Server, sustainable: float, args, body, admit_within: float) -> dict:
    rate = args.overload_factor * sustainable
    m0 = server.metrics()
    r = open_loop(server.url, rate, args.overload_seconds, body, args.overload_timeout_s)
    m1 = server.metrics()
    res, window = r["results"], r["window_s"]
    codes = Counter(c for _, c, _, _ in res)
    ok = [(sent, lat) for sent, c, lat, _ in res if c == 200]
    on_time = [(sent, lat) for sent, lat in ok if lat <= args.overload_timeout_s]
    # goodput: answers within their deadline that came back inside the offered window
    in_window = [1 for sent, lat in on_time if sent + lat <= window]
    lat_ok = np.array([lat for _, lat in ok]) * 1000
    lat_429 = np.array([lat for _, c, lat, _ in res if c == 429]) * 1000
    retry = [int(h) for _, c, _, h in res if c == 429 and h is not None and h.isdigit()]
    health_codes = [c for c, _ in r["health"]]

    def pct(a, q):
        return round(float(np.percentile(a, q)), 1) if len(a) else None

    def delta(name):
        return int(m1.get(name, 0) - m0.get(name, 0))

    row = {
        "row": "overload",
        "admission": "deadline" if admit_within > 0 else "queue",
        "admit_within": admit_within,
        "timeout_s": args.overload_timeout_s,
        "max_queue": args.overload_max_queue,
        "overload_factor": args.overload_factor,
        "seconds": args.overload_seconds,
        "sustainable_rps": round(sustainable, 3),
        "offered_rps": round(rate, 3),
        "n_offered": len(res) + r["skipped"],
        "client_skipped": r["skipped"],
        "n_200": codes.get(200, 0),
        "n_429": codes.get(429, 0),
        "n_5xx": sum(v for c, v in codes.items() if c >= 500),
        "n_504": codes.get(504, 0),
        "other_codes": {str(c): v for c, v in sorted(codes.items()) if c not in (200, 429, 504)},
        # admitted and not answered 200 within the deadline (504s included)
        "n_late": len(ok) - len(on_time) + codes.get(504, 0),
        "goodput_rps": round(len(in_window) / window, 3),
        "goodput_over_sustainable": round(len(in_window) / window / sustainable, 3),
        "p50_ms_200": pct(lat_ok, 50),
        "p99_ms_200": pct(lat_ok, 99),
        "max_ms_200": round(float(lat_ok.max()), 1) if lat_ok.size else None,
        "p50_ms_429": pct(lat_429, 50),
        "p99_ms_429": pct(lat_429, 99),
        "retry_after_s_median": float(np.median(retry)) if retry else None,
        "rejected_deadline": delta("crossknn_rejected_deadline_total"),
        "server_timeouts": delta("crossknn_timeouts_total"),
        "healthz_probes": len(health_codes),
        "healthz_ok": bool(health_codes) and all(c == 200 for c in health_codes),
        "healthz_max_ms": round(max(t for _, t in r["health"]) * 1000, 1) if r["health"] else None,
    }
    return row


def run_overload(index: Path, root: Path, args, body, common) -> dict:
    """The sustainable rate: ``--sustain-concurrency`` closed-loop clients on a server with the
    queue limit alone and no time limit to speak of (what it can do); then the overload rows,
    one server each."""
    out: dict = {"rows": []}
    flags = ["--max-batch-pairs", "256", "--max-queue", str(args.overload_max_queue), *common]
    server = Server(index, root, *flags, "--timeout-s", "600", "--admit-within", "0")
    try:
        for _ in range(3):  # warm up (not counted)
            client.search(server.url, QUERIES[0], k=body["k"], budget=body["budget"], timeout=300)
        n = int(args.sustain_seconds * 20)
        r = closed_loop(server.url, args.sustain_concurrency, n, args.sustain_seconds, body)
    finally:
        server.stop()
    sustainable = r["qps"]
    out["sustainable"] = {"concurrency": args.sustain_concurrency, "timeout_s": 600, **r}
    print(json.dumps(out["sustainable"]), flush=True)
    for within in args.overload_admission:
        server = Server(index, root, *flags, "--timeout-s", str(args.overload_timeout_s),
                        "--admit-within", str(within))  # fmt: skip
        try:
            for _ in range(3):  # warm up; the server measures its service time
                client.search(
                    server.url, QUERIES[0], k=body["k"], budget=body["budget"], timeout=300
                )
            row = overload_row(server, sustainable, args, body, within)
            print(json.dumps(row), flush=True)
            out["rows"].append(row)
        finally:
            server.stop()
    deadline = [r for r in out["rows"] if r["admission"] == "deadline"]
    if deadline:
        r = deadline[0]
        out["goal_met"] = (
            r["n_5xx"] == 0
            and r["n_late"] == 0
            and r["goodput_over_sustainable"] >= 0.9
            and r["healthz_ok"]
        )
    return out


def padding_stats(index: Path, seed: int = 0, requests: int = 16, pairs: int = 20) -> dict:
    """How much padding cross-request batching can save here: pair lengths in tokens from the
    CE's own tokenizer (query + item + 3 special tokens, cut at max_length), cut into batches
    by the CE's rule (longest first, at most 16 pairs and 2,048 padded tokens) either per
    request (``pairs`` random items each) or merged over ``requests`` requests."""
    from tokenizers import Tokenizer

    from crossknn.ce import DEFAULT_CE, ensure_model

    d = ensure_model(DEFAULT_CE, precision="int8")
    max_len = int(json.loads((d / "crossknn_model.json").read_text())["max_length"])
    tok = Tokenizer.from_file(str(d / "tokenizer.json"))
    tok.no_padding()
    tok.no_truncation()
    texts = crossknn.open_index(index).corpus.texts
    item_len = np.array(
        [len(e.ids) for e in tok.encode_batch(list(texts), add_special_tokens=False)]
    )
    q_len = np.array([len(e.ids) for e in tok.encode_batch(QUERIES, add_special_tokens=False)])
    rng = np.random.default_rng(seed)

    def padded(lengths):  # tokens actually run, the CE's batching rule
        order = np.sort(lengths)[::-1]
        total, i = 0, 0
        while i < order.size:
            m = max(1, min(16, 2048 // int(order[i])))
            total += int(order[i]) * len(order[i : i + m])
            i += m
        return total

    per_request, merged, real = 0, 0, 0
    for _ in range(50):
        rounds = []
        for _ in range(requests):
            ql = int(rng.choice(q_len))
            lens = np.minimum(
                ql + item_len[rng.choice(len(texts), pairs, replace=False)] + 3, max_len
            )
            rounds.append(lens)
            per_request += padded(lens)
        allp = np.concatenate(rounds)
        merged += padded(allp)
        real += int(allp.sum())
    return {
        "items_at_the_token_limit": round(
            float(np.mean(item_len + 3 + q_len.mean() >= max_len)), 3
        ),
        "max_length": max_len,
        "padding_per_request_batches": round(per_request / real - 1, 3),
        "padding_merged_batches": round(merged / real - 1, 3),
        "token_work_saved_by_merging": round(1 - merged / per_request, 3),
    }


# -- the soak (issue 46): mixed /search and /rerank at 80% of the sustainable rate for minutes --

WORDS = sorted({w.strip(",.").lower() for q in QUERIES for w in q.split()})


def _mean_or_none(xs: list) -> float | None:
    xs = [x for x in xs if x is not None]
    return round(float(np.mean(xs)), 1) if xs else None


def soak_request(rng: np.random.Generator, n_items: int) -> tuple[str, dict]:
    """One request of the soak's mix: 70% /search (k 1..20, budget k..min(200, N), a query of
    3..40 words), 30% /rerank (1..40 texts of 5..150 words, a query of 3..20 words); every size
    drawn log-uniformly (small ones common, large ones rare, as real traffic)."""

    def logu(lo: int, hi: int) -> int:
        return int(round(float(np.exp(rng.uniform(np.log(lo), np.log(hi + 0.999))))))

    def text(lo: int, hi: int) -> str:
        return " ".join(rng.choice(WORDS, size=min(max(logu(lo, hi), lo), hi)))

    if rng.random() < 0.7:
        k = min(logu(1, 20), 20)
        budget = min(max(logu(max(k, 10), min(200, n_items)), k), n_items)
        return "/search", {"query": text(3, 40), "k": k, "budget": budget}
    n = min(max(logu(1, 40), 1), 40)
    return "/rerank", {"query": text(3, 20), "texts": [text(5, 150) for _ in range(n)]}


def _proc_stats(pid: int) -> tuple[float, int]:
    """RSS (MiB) and open file descriptors of process ``pid`` (Linux /proc)."""
    rss = 0.0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) / 1024.0
    return rss, len(os.listdir(f"/proc/{pid}/fd"))


def _label_sets(server: Server, http: httpx.Client) -> int:
    """Distinct label sets of every labelled series in /metrics (bounded: path x status)."""
    from prometheus_client.parser import text_string_to_metric_families

    text = http.get(server.url + "/metrics").text
    return sum(1 for fam in text_string_to_metric_families(text) for s in fam.samples if s.labels)


def soak_sustainable(server: Server, n_items: int, seconds: float, conc: int, seed: int) -> dict:
    """Closed loop, ``conc`` clients of the soak's mix for ``seconds``: requests/s answered."""
    lock = threading.Lock()
    codes: Counter = Counter()
    stop_at = time.monotonic() + seconds

    def worker(w: int) -> None:
        rng = np.random.default_rng(seed * 1000 + w)
        with httpx.Client(timeout=httpx.Timeout(120.0)) as http:
            while time.monotonic() < stop_at:
                path, body = soak_request(rng, n_items)
                try:
                    code = http.post(server.url + path, json=body).status_code
                except httpx.HTTPError:
                    code = -1
                with lock:
                    codes[code] += 1
                if code != 200:
                    time.sleep(0.5)  # a 429: back off (a spinning client takes the server's CPU)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(w,)) for w in range(conc)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    return {
        "concurrency": conc,
        "seconds": round(wall, 1),
        "rps": round(codes.get(200, 0) / wall, 3),
        "codes": {str(c): v for c, v in sorted(codes.items())},
    }


def run_soak(index: Path, root: Path, args, common) -> dict:
    """The soak: a server as deployed (default admission, --timeout-s 30), its sustainable rate
    for the mix measured first, then Poisson arrivals at ``--soak-fraction`` of it for
    ``--soak`` minutes; per minute: p50/p99 of the 200s, statuses, the server's RSS and open
    file descriptors, and the number of labelled series in /metrics."""
    n_items = len(crossknn.open_index(index))
    server = Server(index, root, "--timeout-s", "30", *common, precision="fp32")
    pid = server.proc.pid
    try:
        rng = np.random.default_rng(args.soak_seed)
        for _ in range(3):  # warm up (not counted)
            path, body = soak_request(rng, n_items)
            httpx.post(server.url + path, json=body, timeout=120)
        sustain = soak_sustainable(
            server, n_items, args.soak_sustain_seconds, args.soak_concurrency, args.soak_seed
        )
        print("soak: sustainable", json.dumps(sustain), flush=True)
        rate = args.soak_fraction * sustain["rps"]
        minutes = int(args.soak)
        lock = threading.Lock()
        per_min: list[dict] = [
            {"lat": [], "codes": Counter(), "rss": [], "fds": [], "steal": []}
            for _ in range(minutes)
        ]
        local = threading.local()
        stop = threading.Event()
        t0 = time.monotonic()

        def http() -> httpx.Client:
            if getattr(local, "http", None) is None:
                local.http = httpx.Client(timeout=httpx.Timeout(90.0))
            return local.http

        def one(path: str, body: dict, sent: float) -> None:
            t = time.perf_counter()
            try:
                code = http().post(server.url + path, json=body).status_code
            except httpx.HTTPError:
                code = -1
            lat = time.perf_counter() - t
            m = min(int(sent // 60), minutes - 1)
            with lock:
                per_min[m]["codes"][code] += 1
                if code == 200:
                    per_min[m]["lat"].append(lat)

        def sampler() -> None:
            steal = StealMeter()
            with httpx.Client(timeout=30, trust_env=False) as scrape:
                while not stop.wait(10.0):
                    m = min(int((time.monotonic() - t0) // 60), minutes - 1)
                    per_min[m]["steal"].append(steal.read())
                    rss, fds = _proc_stats(pid)
                    per_min[m]["rss"].append(rss)
                    per_min[m]["fds"].append(fds)
                    try:
                        per_min[m]["label_sets"] = _label_sets(server, scrape)
                    except httpx.HTTPError:
                        pass

        sampler_t = threading.Thread(target=sampler, daemon=True)
        sampler_t.start()
        rss0, fds0 = _proc_stats(pid)
        pool = ThreadPoolExecutor(64)
        n_sent = skipped = 0
        busy = threading.Semaphore(64)
        t_next = 0.0
        end = minutes * 60.0
        last_print = -1
        while True:
            t_next += float(rng.exponential(1.0 / rate))
            if t_next >= end:
                break
            delay = t0 + t_next - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            path, body = soak_request(rng, n_items)
            if busy.acquire(blocking=False):

                def task(p=path, b=body, s=t_next):
                    try:
                        one(p, b, s)
                    finally:
                        busy.release()

                pool.submit(task)
                n_sent += 1
            else:
                skipped += 1
            m = int(t_next // 60)
            if m != last_print and m > 0:
                last_print = m
                row = per_min[m - 1]
                lat = np.array(row["lat"]) * 1000
                p99 = round(float(np.percentile(lat, 99)), 1) if lat.size else None
                print(
                    f"soak: minute {m}/{minutes}: {dict(row['codes'])} p99 {p99} ms "
                    f"rss {row['rss'][-1] if row['rss'] else '?'} MiB "
                    f"fds {row['fds'][-1] if row['fds'] else '?'}",
                    flush=True,
                )
        pool.shutdown(wait=True)
        stop.set()
        sampler_t.join()
        rss_end, fds_end = _proc_stats(pid)
    finally:
        server.stop()

    def pct(a, q):
        return round(float(np.percentile(a, q)) * 1000, 1) if len(a) else None

    rows = []
    for i, r in enumerate(per_min):
        rows.append(
            {
                "minute": i + 1,
                "n": sum(r["codes"].values()),
                "codes": {str(c): v for c, v in sorted(r["codes"].items())},
                "p50_ms": pct(r["lat"], 50),
                "p99_ms": pct(r["lat"], 99),
                "rss_mib": round(max(r["rss"]), 1) if r["rss"] else None,
                "open_fds": max(r["fds"]) if r["fds"] else None,
                "metric_label_sets": r.get("label_sets"),
                # the hypervisor's share of this VM's CPU time in the minute (other guests')
                "cpu_steal_pct": _mean_or_none(r["steal"]),
            }
        )
    window = min(5, max(1, minutes // 3))  # the first and last 5 minutes (of a 30-minute run)
    first = [x for r in per_min[:window] for x in r["lat"]]
    last = [x for r in per_min[-window:] for x in r["lat"]]
    warm = max(1, minutes // 5)  # warm-up: the first fifth of the run
    rss_warm = rows[warm - 1]["rss_mib"]
    rss_after = [r["rss_mib"] for r in rows[warm:] if r["rss_mib"] is not None]
    fds_after = [r["open_fds"] for r in rows[warm:] if r["open_fds"] is not None]
    codes = Counter()
    for r in per_min:
        codes.update(r["codes"])
    return {
        "minutes": minutes,
        "sustainable": sustain,
        "fraction": args.soak_fraction,
        "offered_rps": round(rate, 3),
        "n_sent": n_sent,
        "client_skipped": skipped,
        "codes": {str(c): v for c, v in sorted(codes.items())},
        "n_5xx": sum(v for c, v in codes.items() if c >= 500),
        "n_connection_errors": codes.get(-1, 0),
        "p99_first_ms": pct(first, 99),
        "p99_last_ms": pct(last, 99),
        "p99_window_minutes": window,
        "p99_ratio": round(float(np.percentile(last, 99) / np.percentile(first, 99)), 3)
        if first and last
        else None,
        "warmup_minutes": warm,
        "rss_start_mib": round(rss0, 1),
        "rss_after_warmup_mib": rss_warm,
        "rss_max_after_warmup_mib": max(rss_after) if rss_after else None,
        "rss_end_mib": round(rss_end, 1),
        "rss_growth": round(max(rss_after) / rss_warm - 1, 4) if rss_after and rss_warm else None,
        "fds_start": fds0,
        "fds_after_warmup": [min(fds_after), max(fds_after)] if fds_after else None,
        "fds_end": fds_end,
        "rows": rows,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--levels", type=int, nargs="+", default=[1, 4, 16, 64])
    p.add_argument("--requests", type=int, default=200, help="requests per level")
    p.add_argument("--level-seconds", type=float, default=120.0, help="time cap per level")
    p.add_argument("--in-process-queries", type=int, default=30)
    p.add_argument("--max-items", type=int, default=None, help="docstrings (default: all)")
    p.add_argument("--threads", type=int, default=None, help="CE threads (default: cores)")
    p.add_argument("--out", default=str(HERE / "results" / "serve_bench.json"))
    p.add_argument(
        "--only",
        choices=("all", "overload", "groups"),
        default="all",
        help="overload: run only the overload rows, keeping the rest of --out; groups: only the "
        "query groups on/off rows (the 'groups' entry)",
    )
    p.add_argument("--sustain-concurrency", type=int, default=16)
    p.add_argument("--sustain-seconds", type=float, default=40.0)
    p.add_argument("--overload-factor", type=float, default=4.0)
    p.add_argument("--overload-seconds", type=float, default=60.0)
    p.add_argument("--overload-timeout-s", type=float, default=20.0)
    p.add_argument("--overload-max-queue", type=int, default=64)
    p.add_argument(
        "--overload-admission",
        type=float,
        nargs="+",
        default=[0.5, 0.0],
        metavar="F",
        help="--admit-within of each overload server (0: the queue limit alone)",
    )
    p.add_argument(
        "--soak",
        type=float,
        default=None,
        metavar="MIN",
        help="run only the soak: mixed /search and /rerank at --soak-fraction of the measured "
        "sustainable rate for MIN minutes (its section of --soak-out)",
    )
    p.add_argument("--soak-fraction", type=float, default=0.8)
    p.add_argument("--soak-sustain-seconds", type=float, default=60.0)
    p.add_argument(
        "--soak-concurrency",
        type=int,
        default=4,
        help="closed-loop clients that measure the mix's sustainable rate",
    )
    p.add_argument("--soak-seed", type=int, default=0)
    p.add_argument("--soak-out", default=str(HERE / "results" / "api_contract.json"))
    args = p.parse_args()

    from crossknn.ce import cache_root

    root = cache_root() / "serve-bench"
    root.mkdir(parents=True, exist_ok=True)
    if args.soak is not None:
        index = build_index(root, args.max_items, 0, "fp32")
    else:
        index = build_index(root, args.max_items)
    n_items = len(crossknn.open_index(index))
    body = {"k": 10, "budget": 100, "rounds": 5, "method": "axn"}
    common = ["--threads", str(args.threads)] if args.threads else []
    t0 = time.time()
    out = Path(args.out)
    if args.soak is not None:
        sys.path.insert(0, str(HERE))
        from api_contract_bench import merge_section

        soak = run_soak(index, root, args, common)
        soak["index"] = {"items": n_items, "precision": "fp32", "corpus": "stdlib docstrings"}
        soak["command"] = "python bench/serve_bench.py " + " ".join(sys.argv[1:])
        soak["wall_s"] = round(time.time() - t0, 1)
        summary = {k: v for k, v in soak.items() if k != "rows"}
        print(json.dumps(summary, indent=2), flush=True)
        merge_section(Path(args.soak_out), "soak", soak)
        print(f"wrote {args.soak_out} (soak)")
        return 0
    if args.only == "groups":
        result = json.loads(out.read_text()) if out.is_file() else {}
        result["groups"] = run_groups(index, root, args, body, common)
        result["groups"]["wall_s"] = round(time.time() - t0, 1)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {out} (groups)")
        return 0
    if args.only == "overload":
        result = json.loads(out.read_text()) if out.is_file() else {}
        over = run_overload(index, root, args, body, common)
        over["machine"] = (
            f"{platform.machine()}, {os.cpu_count()} logical cores, load average at start "
            f"{os.getloadavg()[0]:.1f} (other jobs share the machine: compare the rows of one run)"
        )
        over["request"] = body
        over["wall_s"] = round(time.time() - t0, 1)
        result["overload"] = over
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {out} (overload)")
        return 0
    result: dict = {
        "machine": f"{platform.machine()}, {os.cpu_count()} logical cores, "
        f"load average at start {os.getloadavg()[0]:.1f}",
        "index": {"items": n_items, "precision": "int8", "path": str(index)},
        "request": body,
        "requests_per_level": args.requests,
        "level_seconds_cap": args.level_seconds,
        "rows": [],
        "faults": [],
    }

    result["padding"] = padding_stats(index)
    print(json.dumps(result["padding"]), flush=True)
    print("in-process Searcher.search", flush=True)
    inproc = in_process(index, args.levels, args, body)
    result["rows"] += inproc

    on = Server(index, root, "--max-batch-pairs", "256", "--max-wait-ms", "2",
                "--max-queue", "128", "--timeout-s", "600", *common)  # fmt: skip
    try:
        print("server, cross-request batching on", flush=True)
        result["rows"] += run_levels(on, args.levels, args, body, True)
        result["faults"].append(fault_disconnect(on, n_items))
        print(json.dumps(result["faults"][-1]), flush=True)
    finally:
        on.stop()
    off = Server(index, root, "--max-batch-pairs", "0", "--max-queue", "128",
                 "--group-queries", "1", "--engine-order", "any",
                 "--timeout-s", "600", *common)  # fmt: skip
    try:
        print("server, cross-request batching off", flush=True)
        result["rows"] += run_levels(off, args.levels, args, body, False)
    finally:
        off.stop()
    q16 = Server(index, root, "--max-batch-pairs", "256", "--max-queue", "16",
                 "--timeout-s", "600", *common)  # fmt: skip
    try:
        print("server, --max-queue 16 at concurrency 64", flush=True)
        result["rows"] += run_levels(q16, [64], args, body, True, {"max_queue": 16})
        result["faults"].append(fault_sigkill(q16, index, body))
        print(json.dumps(result["faults"][-1]), flush=True)
    finally:
        q16.stop()

    # the goals
    def row(c, batching, **kw):
        for r in result["rows"]:
            if (
                r.get("concurrency") == c
                and r.get("batching") == batching
                and all(r.get(k) == v for k, v in kw.items())
            ):
                if "max_queue" in r and "max_queue" not in kw:
                    continue
                return r
        return None

    c1 = row(1, True)
    on16, off16 = row(16, True), row(16, False)
    goals = {
        "http_overhead_p50_ms_at_c1": c1.get("http_overhead_p50_ms") if c1 else None,
        "server_overhead_ms_at_c1": round(c1["p50_ms"] - inproc[0]["in_process_ms"], 1)
        if c1 and c1["p50_ms"]
        else None,
        "batching_speedup_at_c16": round(on16["qps"] / off16["qps"], 2)
        if on16 and off16 and off16["qps"]
        else None,
        "p99_over_p50": {
            f"{r['concurrency']}/{'on' if r['batching'] else 'off'}": round(
                r["p99_ms"] / r["p50_ms"], 2
            )
            for r in result["rows"]
            if "batching" in r and r.get("p50_ms") and "max_queue" not in r
        },
        "5xx": sum(
            v for r in result["rows"] for k, v in r.get("errors", {}).items() if k.startswith("5")
        ),
    }
    result["goals"] = goals
    result["load_average_at_end"] = round(os.getloadavg()[0], 1)
    result["wall_s"] = round(time.time() - t0, 1)
    result["overload"] = run_overload(index, root, args, body, common)
    print(json.dumps(goals, indent=2))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
