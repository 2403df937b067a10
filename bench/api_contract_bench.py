"""The HTTP API's contract under generated input and crashes (issue 46), against a real
``crossknn serve``: writes its sections of bench/results/api_contract.json.

``--fuzz``: schemathesis' generated requests (positive and negative: boundary sizes, wrong
types, unicode, huge numbers, missing and extra fields, every auth state) on every operation of
the server's /openapi.json, on a server with ``--api-key-file`` and one without. A failure: any
5xx, a status the operation does not declare, a body that does not match its declared schema, a
body that shows a traceback or a file path.

``--kill N``: the server under a supervisor (a restart loop here, standing in for systemd:
examples/systemd/crossknn-serve.service), 8 clients, ``kill -9`` at random moments N times:
restart-to-/readyz seconds, wrong answers (every 200 must equal the answer of a fresh
in-process search), the index folder hashed before and after, no lock or PID file left behind.

The soak is ``python bench/serve_bench.py --soak MIN`` (its ``soak`` section of the same file).

    python bench/api_contract_bench.py --fuzz            # make fuzz-api
    python bench/api_contract_bench.py --kill 20
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import platform
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import StealMeter  # noqa: E402

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
OUT = HERE / "results" / "api_contract.json"
GOAL_KEYS = (
    "fuzz_requests",
    "fuzz_5xx",
    "fuzz_schema_violations",
    "fuzz_leaks",
    "soak_minutes",
    "soak_5xx",
    "soak_p99_ratio",
    "soak_rss_growth",
    "kill_restarts",
    "kill_max_ready_s",
    "kill_wrong_answers",
)
# what a body must never show: a traceback, a file path of this machine, a Python module file
LEAK = re.compile(
    r"Traceback \(most recent call last\)|File \"[^\"]+\", line \d+|"
    r"(?<![\w.])/(?:tmp|home|root|usr|work|var|etc|opt)/[\w.\-/]+|site-packages|\w+\.py\b"
)


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} logical cores, {platform.system()} (shared machine)"


def commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
        )
        return out.stdout.strip() or None
    except OSError:
        return None


def goals(result: dict) -> dict:
    """The issue's goals object, exactly these keys (None where that part has not run)."""
    fuzz, soak, kill = (result.get(k) or {} for k in ("fuzz", "soak", "kill"))
    return {
        "fuzz_requests": fuzz.get("requests"),
        "fuzz_5xx": fuzz.get("n_5xx"),
        "fuzz_schema_violations": fuzz.get("schema_violations"),
        "fuzz_leaks": fuzz.get("leaks"),
        "soak_minutes": soak.get("minutes"),
        "soak_5xx": soak.get("n_5xx"),
        "soak_p99_ratio": soak.get("p99_ratio"),
        "soak_rss_growth": soak.get("rss_growth"),
        "kill_restarts": kill.get("restarts"),
        "kill_max_ready_s": kill.get("max_ready_s"),
        "kill_wrong_answers": kill.get("wrong_answers"),
    }


def merge_section(path: Path, name: str, data: dict) -> dict:
    """Put section ``name`` into the JSON at ``path`` (keeping the others) and recompute the
    goals; each section keeps its own machine, date, commit and command."""
    result = json.loads(path.read_text()) if path.is_file() else {}
    data = {
        "machine": machine(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": commit(),
        **data,
    }
    result[name] = data
    result["goals"] = goals(result)
    assert tuple(result["goals"]) == GOAL_KEYS
    result["machine"] = data["machine"]
    result["date"] = data["date"]
    result["commit"] = data["commit"]
    result["command"] = {
        k: result[k].get("command") for k in ("fuzz", "soak", "kill") if k in result
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    return result


# -- a real server ------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, timeout: float, proc: subprocess.Popen | None = None) -> float:
    """Seconds until ``url/readyz`` answers 200 (polled every 50 ms)."""
    import httpx

    t = time.monotonic()
    # one client for all the polls (a new one per poll loads the CA bundle: ~1 s on a busy
    # machine); plain HTTP on loopback, so no certificates at all
    with httpx.Client(timeout=2, verify=False, trust_env=False) as http:
        while True:
            try:
                if http.get(url + "/readyz").status_code == 200:
                    return time.monotonic() - t
            except httpx.HTTPError:
                pass
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"the server exited with {proc.returncode} before /readyz")
            if time.monotonic() - t > timeout:
                raise TimeoutError(f"no /readyz 200 in {timeout} s")
            time.sleep(0.05)


def start_server(index: Path, port: int, log, *args: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "crossknn.cli", "serve", str(index), "--port", str(port)]
    cmd += ["--log-level", "warning", *args]
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)


def build_small_index(root: Path, n_docs: int = 12) -> Path:
    """A tiny corpus and its index (seconds to build): what the fuzzing needs (a search
    spends at most ``n_docs`` CE calls per query, so generated requests stay cheap)."""
    from crossknn.cli import main

    idx = root / "idx"
    if (idx / "index.json").is_file():
        return idx
    topics = ["dates and times", "compression", "email", "shell commands", "csv files"]
    corpus = root / "c.jsonl"
    # metadata of every kind a filter can name (the /search filter examples name them)
    corpus.write_text(
        "".join(
            json.dumps(
                {
                    "id": f"d{i}",
                    "text": f"document {i} about {topics[i % 5]} and more",
                    "lang": ("en", "de", "fr")[i % 3],
                    "year": 2015 + i,
                    "tags": [topics[i % 5].split()[0], f"t{i % 4}"],
                    "published": f"2024-0{1 + i % 9}-15",
                    "open": bool(i % 2),
                }
            )
            + "\n"
            for i in range(n_docs)
        )
    )
    args = ["--calibration-queries", "2", "--calibration-items", "4", "--quiet"]
    if main(["build", str(corpus), str(idx), *args]) != 0:
        raise RuntimeError("crossknn build failed")
    return idx


# -- schemathesis -------------------------------------------------------------------------------


def fuzz(url: str, *, key: str | None, examples: int, seed: int = 0) -> dict:
    """Generated requests on every operation of ``url``'s /openapi.json, positive and negative
    (``examples`` of each per operation). With a ``key``: every case is sent with it, and every
    fourth case also without it, with a wrong one and with a malformed one (each must be 401).
    Counts; the first failures of each kind (at most 20). ``GET /info`` is left out of the leak
    check: it shows the index path by design (behind the key when there is one)."""
    import hypothesis
    import schemathesis
    from hypothesis import HealthCheck, Phase, given, settings
    from schemathesis import GenerationMode
    from schemathesis.checks import not_a_server_error
    from schemathesis.specs.openapi.checks import (
        content_type_conformance,
        response_schema_conformance,
        status_code_conformance,
    )

    checks = [
        not_a_server_error,
        status_code_conformance,
        content_type_conformance,
        response_schema_conformance,
    ]
    good = {"Authorization": f"Bearer {key}"} if key else {}
    schema = schemathesis.openapi.from_url(url + "/openapi.json", headers=good)
    schema.config.generation.update(allow_x00=True, codec="utf-8")
    stats: Counter = Counter()
    by_status: Counter = Counter()
    by_op: Counter = Counter()
    failures: list[dict] = []

    def fail(kind: str, label: str, detail: str, status: int | None) -> None:
        stats[kind] += 1
        if sum(1 for f in failures if f["kind"] == kind) < 20:
            failures.append(
                {"kind": kind, "operation": label, "status": status, "detail": detail[:600]}
            )

    def send(case, label: str, headers: dict, *, validate: bool, want: int | None = None) -> None:
        import requests

        t = time.perf_counter()
        try:
            resp = case.call(base_url=url, headers=headers, timeout=90)
        except requests.RequestException as exc:
            fail("transport_errors", label, f"{type(exc).__name__}: {exc}", None)
            return
        stats["requests"] += 1
        stats["http_s"] += time.perf_counter() - t
        by_op[label] += 1
        by_status[resp.status_code] += 1
        if resp.status_code >= 500:
            stats["n_5xx"] += 1
        text = resp.text
        if label == "GET /info" and resp.status_code == 200:
            text = ""
        if LEAK.search(text) or LEAK.search(" ".join(f"{k}: {v}" for k, v in resp.headers.items())):
            fail("leaks", label, f"{resp.status_code}: {text[:400]}", resp.status_code)
        if want is not None and resp.status_code != want:
            fail("auth_failures", label, f"wanted {want}, got {resp.status_code}", resp.status_code)
        if validate:
            try:
                case.validate_response(resp, checks=checks, headers=headers)
            except Exception as exc:  # schemathesis' FailureGroup (or one failure)
                names = {type(f).__name__ for f in getattr(exc, "exceptions", [exc])}
                kind = (
                    "n_5xx_reported"
                    if any("ServerError" in n for n in names)
                    else "schema_violations"
                )
                fail(kind, label, f"{sorted(names)}: {exc}", resp.status_code)

    def fuzz_operation(op, label: str, mode) -> None:
        n = {"i": 0}

        @hypothesis.seed(seed)
        @settings(
            max_examples=examples,
            deadline=None,
            database=None,
            phases=[Phase.explicit, Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        @given(case=op.as_strategy(generation_mode=mode))
        def run(case):
            n["i"] += 1
            stats[f"cases_{mode.value}"] += 1
            send(case, label, good, validate=True)
            if key and n["i"] % 4 == 0:
                for bad in (
                    {"Authorization": ""},
                    {"Authorization": "Bearer wrong-key"},
                    {"Authorization": f"Bearer {key}, Bearer {key}"},
                ):
                    send(case, label, bad, validate=False, want=401)

        try:
            run()
        except hypothesis.errors.Unsatisfiable:  # nothing to negate (no parameters, no body)
            stats[f"unsatisfiable_{mode.value}"] += 1

    ops = [r.ok() for r in schema.get_all_operations()]
    for op in ops:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            fuzz_operation(op, f"{op.method.upper()} {op.path}", mode)
            print(
                f"fuzz: {op.method.upper()} {op.path} {mode.value}: {stats['requests']} "
                f"requests so far, {stats['n_5xx']} x 5xx",
                flush=True,
            )
    for kind in ("n_5xx", "leaks", "schema_violations", "auth_failures", "transport_errors"):
        stats.setdefault(kind, 0)
    return {
        "url_key": bool(key),
        "operations": sorted(by_op),
        "requests": stats["requests"],
        "cases": {m: stats[f"cases_{m}"] for m in ("positive", "negative")},
        "operations_without_negative_cases": stats["unsatisfiable_negative"],
        "n_5xx": stats["n_5xx"],
        "schema_violations": stats["schema_violations"],
        "leaks": stats["leaks"],
        "auth_failures": stats["auth_failures"],
        "transport_errors": stats["transport_errors"],
        "seconds_in_requests": round(stats["http_s"], 1),
        "by_status": {str(k): v for k, v in sorted(by_status.items())},
        "by_operation": dict(sorted(by_op.items())),
        "failures": failures,
    }


# -- kill -9 under load -------------------------------------------------------------------------


def tree_hash(path: Path) -> str:
    """SHA-256 over every file's relative name, mode bits and bytes (the folder bitwise)."""
    h = hashlib.sha256()
    for p in sorted(path.rglob("*")):
        h.update(str(p.relative_to(path)).encode())
        h.update(oct(p.stat().st_mode).encode())
        if p.is_file():
            h.update(hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()


class Supervisor:
    """A restart loop standing in for systemd's ``Restart=always`` (RestartSec=0): whenever the
    server process ends, a new one is started on the same port with the same arguments."""

    def __init__(self, index: Path, port: int, log_path: Path, *args: str) -> None:
        self.index, self.port, self.args = index, port, args
        self.log = open(log_path, "a")  # noqa: SIM115
        self.stop = threading.Event()
        self.starts: list[tuple[float, subprocess.Popen]] = []
        self.exits: list[int] = []
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while not self.stop.is_set():
            proc = start_server(self.index, self.port, self.log, *self.args)
            with self.lock:
                self.starts.append((time.monotonic(), proc))
            rc = proc.wait()
            self.exits.append(rc)

    @property
    def proc(self) -> subprocess.Popen:
        with self.lock:
            return self.starts[-1][1]

    def close(self) -> None:
        self.stop.set()
        p = self.proc
        if p.poll() is None:
            p.terminate()
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()
        self.thread.join(60)
        self.log.close()


def reference_answers(index: Path, queries: list[str], body: dict) -> dict[str, dict]:
    """Each query's answer from a fresh in-process search (what every 200 must equal)."""
    import crossknn

    s = crossknn.Searcher(index)
    out = {}
    for q in queries:
        h = s.search(
            q,
            k=body["k"],
            budget=body["budget"],
            method=body["method"],
            rounds=body["rounds"],
            seed=body["seed"],
        )
        out[q] = {"ids": list(h.ids), "scores": [float(x) for x in h.scores], "calls": h.ce_calls}
    return out


def same_answer(got: dict, want: dict) -> bool:
    hit = got["hits"][0]
    scores = [r["score"] for r in hit["results"]]
    return (
        [r["id"] for r in hit["results"]] == want["ids"]
        and hit["ce_calls"] == want["calls"]
        and len(scores) == len(want["scores"])
        and all(abs(a - b) <= 1e-5 for a, b in zip(scores, want["scores"], strict=True))
    )


def kill_run(
    index: Path,
    root: Path,
    queries: list[str],
    *,
    kills: int,
    clients: int,
    seed: int,
    gap: tuple[float, float] = (2.0, 6.0),
) -> dict:
    """``kills`` times kill -9 at a random moment (2 to 6 s after the last restart was ready)
    while ``clients`` clients search; the supervisor restarts the server each time."""
    import httpx

    rng = random.Random(seed)
    import crossknn

    budget = min(50, len(crossknn.open_index(index)))
    body = {"k": min(10, budget), "budget": budget, "method": "axn", "rounds": 5, "seed": 0}
    print(f"kill: {len(queries)} reference answers (fresh in-process searches)", flush=True)
    in_process = reference_answers(index, queries, body)
    files_before = sorted(str(p.relative_to(index)) for p in index.rglob("*"))
    hash_before = tree_hash(index)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    sup = Supervisor(index, port, root / "kill-serve.log", "--timeout-s", "30")
    codes: Counter = Counter()
    wrong: list[dict] = []
    stop = threading.Event()
    lock = threading.Lock()

    def client(w: int) -> None:
        r = random.Random(seed * 100 + w)
        with httpx.Client(timeout=httpx.Timeout(60.0), verify=False, trust_env=False) as http:
            while not stop.is_set():
                q = r.choice(queries)
                try:
                    resp = http.post(url + "/search", json={"query": q, **body})
                except httpx.HTTPError:
                    with lock:
                        codes["connection error"] += 1
                    time.sleep(0.1)
                    continue
                with lock:
                    codes[str(resp.status_code)] += 1
                if resp.status_code == 200:
                    if not same_answer(resp.json(), ref[q]):
                        with lock:
                            wrong.append({"query": q, "got": resp.json()["hits"][0]["results"][:3]})
                else:
                    time.sleep(0.5)  # 503 while loading, 429: back off (no spinning)

    rows = []
    steal = StealMeter()
    try:
        first_ready = wait_ready(url, 300, None)
        # the reference: the first server's answers, before any kill (a fresh process, a fresh
        # search); whether they equal the in-process searcher's is reported beside
        ref = {}
        for q in queries:
            resp = httpx.post(url + "/search", json={"query": q, **body}, timeout=120)
            resp.raise_for_status()
            hit = resp.json()["hits"][0]
            ref[q] = {
                "ids": [r["id"] for r in hit["results"]],
                "scores": [r["score"] for r in hit["results"]],
                "calls": hit["ce_calls"],
            }
        first_equals_in_process = all(
            ref[q]["ids"] == in_process[q]["ids"]
            and all(
                abs(a - b) <= 1e-5
                for a, b in zip(ref[q]["scores"], in_process[q]["scores"], strict=True)
            )
            for q in queries
        )
        threads = [threading.Thread(target=client, args=(w,), daemon=True) for w in range(clients)]
        for t in threads:
            t.start()
        for i in range(kills):
            time.sleep(rng.uniform(*gap))
            n_starts = len(sup.starts)
            victim = sup.proc
            t_kill = time.monotonic()
            os.kill(victim.pid, signal.SIGKILL)
            while len(sup.starts) == n_starts:  # the supervisor notices and starts a new one
                time.sleep(0.005)
            t_start, proc = sup.starts[-1]
            steal.read()
            wait_ready(url, 120, proc)
            t_ready = time.monotonic()
            row = {
                "kill": i + 1,
                "restart_to_ready_s": round(t_ready - t_start, 2),
                "kill_to_ready_s": round(t_ready - t_kill, 2),
                "exit_code": victim.returncode,
                # the hypervisor's share of this VM's CPU while it restarted (other guests')
                "cpu_steal_pct": steal.read(),
            }
            rows.append(row)
            print(f"kill: {json.dumps(row)}", flush=True)
        time.sleep(3.0)  # the last restart under load too
        stop.set()
        for t in threads:
            t.join(90)
        # the last server still answers every query as a fresh search does
        final_wrong = 0
        for q in queries:
            resp = httpx.post(url + "/search", json={"query": q, **body}, timeout=60)
            final_wrong += resp.status_code != 200 or not same_answer(resp.json(), ref[q])
    finally:
        stop.set()
        sup.close()
    files_after = sorted(str(p.relative_to(index)) for p in index.rglob("*"))
    stale = [
        str(p)
        for p in [*index.rglob("*"), *root.glob("*")]
        if re.search(r"\.(lock|pid)$|^LOCK$", p.name)
    ]
    ready = [r["restart_to_ready_s"] for r in rows]
    return {
        "kills": kills,
        "clients": clients,
        "request": body,
        "first_start_ready_s": round(first_ready, 2),
        "restarts": len(rows),
        "max_ready_s": max(ready) if ready else None,
        "median_ready_s": sorted(ready)[len(ready) // 2] if ready else None,
        "max_kill_to_ready_s": max(r["kill_to_ready_s"] for r in rows) if rows else None,
        "all_within_10s": bool(ready) and max(ready) <= 10.0,
        "client_results": dict(sorted(codes.items())),
        "answers_checked": codes.get("200", 0) + len(queries),  # and the last server's
        "kill_gap_s": list(gap),
        "reference": "the first server's answers before any kill",
        "first_server_equals_in_process_search": first_equals_in_process,
        "wrong_answers": len(wrong) + final_wrong,
        "wrong_examples": wrong[:5],
        "index_unchanged": tree_hash(index) == hash_before,
        "index_files_unchanged": files_before == files_after,
        "stale_lock_or_pid_files": stale,
        "rows": rows,
    }


def nfcorpus_queries(shared: Path, n: int = 16) -> list[str]:
    """The queries the --kill clients send: the first ``n`` of NFCorpus' queries."""
    with open(shared / "data" / "nfcorpus" / "queries.jsonl", encoding="utf-8") as f:
        return [json.loads(line)["text"] for _, line in zip(range(n), f, strict=False)]


def nfcorpus_index(shared: Path, cache: Path, max_items: int | None) -> Path:
    """The NFCorpus index of --kill (built once with ``--index-calls 0``, cached)."""
    from crossknn.cli import main as cli

    corpus = shared / "data" / "nfcorpus" / "corpus.jsonl"
    if not corpus.is_file():
        raise FileNotFoundError(f"{corpus}: the NFCorpus data is needed for --kill")
    lines = corpus.read_text(encoding="utf-8").splitlines()
    if max_items:
        lines = lines[:max_items]
    key = hashlib.sha256("\n".join(lines).encode()).hexdigest()[:12]
    idx = cache / f"nfcorpus-{len(lines)}-{key}"
    if not (idx / "index.json").is_file():
        sub = cache / f"nfcorpus-{len(lines)}-{key}.jsonl"
        sub.write_text("\n".join(lines) + "\n", encoding="utf-8")
        t = time.perf_counter()
        if cli(["build", str(sub), str(idx), "--index-calls", "0", "--quiet"]) != 0:
            raise RuntimeError("crossknn build failed")
        print(f"kill: built {idx} in {time.perf_counter() - t:.0f} s", flush=True)
    return idx


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--fuzz", action="store_true", help="schemathesis on a server with and without a key"
    )
    p.add_argument(
        "--examples", type=int, default=200, help="generated cases per operation and mode"
    )
    p.add_argument("--kill", type=int, default=0, metavar="N", help="kill -9 N times under load")
    p.add_argument("--clients", type=int, default=8)
    p.add_argument(
        "--kill-gap",
        type=float,
        nargs=2,
        default=[2.0, 6.0],
        metavar=("LO", "HI"),
        help="seconds from /readyz to the next kill, drawn uniformly",
    )
    p.add_argument("--kill-max-items", type=int, default=None, help="NFCorpus items (default: all)")
    p.add_argument(
        "--kill-index",
        default=None,
        help="an NFCorpus index already built (crossknn build CORPUS DIR --index-calls 0)",
    )
    p.add_argument("--shared", default=str(REPO.parent / "shared"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(OUT))
    args = p.parse_args()
    if not args.fuzz and not args.kill:
        p.error("give --fuzz and/or --kill N")
    from crossknn.ce import cache_root

    cache = cache_root() / "api-contract-bench"
    cache.mkdir(parents=True, exist_ok=True)
    command = "python bench/api_contract_bench.py " + " ".join(sys.argv[1:])
    if args.fuzz:
        t0 = time.time()
        root = Path(tempfile.mkdtemp(prefix="api-fuzz-"))
        idx = build_small_index(root)
        runs = []
        for keyed in (False, True):
            key = "fuzz-" + hashlib.sha256(str(time.time()).encode()).hexdigest()[:24]
            extra = ["--timeout-s", "20", "--max-queue", "8", "--max-rerank-texts", "16"]
            if keyed:
                kf = root / "key"
                kf.write_text(key + "\n")
                kf.chmod(0o600)
                extra += ["--api-key-file", str(kf)]
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            log_path = root / f"serve-{port}.log"
            with open(log_path, "w") as log:
                proc = start_server(idx, port, log, *extra)
                try:
                    wait_ready(url, 120, proc)
                    run = fuzz(
                        url, key=key if keyed else None, examples=args.examples, seed=args.seed
                    )
                finally:
                    proc.terminate()
                    proc.wait(60)
            text = log_path.read_text()
            run["server_log_tracebacks"] = text.count("Traceback")
            run["key_in_log"] = key in text
            runs.append(run)
            print(json.dumps({k: v for k, v in run.items() if k != "failures"}), flush=True)
        fz = {
            "command": command,
            "index": "12 short documents with metadata (lang, year, tags, published, open; "
            "crossknn build, embedded models); --max-rerank-texts 16",
            "examples_per_operation_and_mode": args.examples,
            "requests": sum(r["requests"] for r in runs),
            "n_5xx": sum(r["n_5xx"] for r in runs),
            "schema_violations": sum(r["schema_violations"] for r in runs),
            "leaks": sum(r["leaks"] + r["server_log_tracebacks"] for r in runs),
            "auth_failures": sum(r["auth_failures"] for r in runs),
            "runs": runs,
            "wall_s": round(time.time() - t0, 1),
        }
        merge_section(Path(args.out), "fuzz", fz)
        print(
            f"wrote {args.out} (fuzz): {fz['requests']} requests, {fz['n_5xx']} x 5xx, "
            f"{fz['schema_violations']} schema violations, {fz['leaks']} leaks"
        )
    if args.kill:
        t0 = time.time()
        if args.kill_index:
            idx = Path(args.kill_index)
        else:
            idx = nfcorpus_index(Path(args.shared), cache, args.kill_max_items)
        queries = nfcorpus_queries(Path(args.shared))
        import crossknn

        n_items = len(crossknn.open_index(idx))
        root = Path(tempfile.mkdtemp(prefix="api-kill-"))
        kr = kill_run(
            idx,
            root,
            queries,
            kills=args.kill,
            clients=args.clients,
            seed=args.seed,
            gap=tuple(args.kill_gap),
        )
        kr = {
            "command": command,
            "index": {
                "corpus": "NFCorpus",
                "items": n_items,
                "build": "crossknn build --index-calls 0",
            },
            **kr,
            "wall_s": round(time.time() - t0, 1),
        }
        merge_section(Path(args.out), "kill", kr)
        print(json.dumps({k: v for k, v in kr.items() if k != "rows"}, indent=2))
        print(f"wrote {args.out} (kill)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
