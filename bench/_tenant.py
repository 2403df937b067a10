"""One tenant never hurts another: a real ``crossknn serve`` under grouped failing requests and
adversarial bodies. Writes the ``cross_request_failures`` and ``max_extra_rss_mb_per_mb_body``
goals (and a ``tenant_bench`` section) into bench/results/filter_fuzz.json, keeping what other
benches wrote there.

    python bench/filter_bench.py tenant           # about 5 minutes on a 2-core CPU
    python bench/filter_bench.py tenant --waves 20 --distinct 20   # a quick look

The bench builds a small index (stdlib docstrings, ``N_ITEMS`` items, each with a ``tenant``
field) with ``crossknn build`` and starts ``crossknn serve`` on it on 127.0.0.1 (a free port,
``--max-body-kb 4096`` so that a body of 10^5 ids fits). It stops the server by its PID.

**Cross-request failures.** Two faults are injected into the server process by this bench (its
launcher wraps ``crossknn.cli.main``; the library has no such hook): the CE raises MemoryError for
any batch holding the query :data:`POISON_QUERY`, and the allow mask of a filter naming the tenant
:data:`POISON_TENANT` raises MemoryError. Each wave sends, at once, one request of another search
(a larger budget: it is not grouped with the wave and keeps the engine busy, so the wave's
requests queue and start as one lockstep group, as under load) and then ``WAVE`` requests of one
search (same k, budget, seed): ``WAVE - 1`` good ones (tenant filters; a filter of 256 conditions
with ids; ids alone; no filter) and one failing one (either fault). A good request must be
answered 200 with its reference answer (the same request sent alone before); a good request
answered with anything else is a cross-request failure (the goal: 0). The server's
``crossknn_grouped_queries`` says how many queries it searched in groups.

**Memory per body.** For each adversarial body kind (long strings in ``$in``, 10^5 ids as
``ids`` and in a filter, 32 levels of nesting with 255 conditions, a stream of distinct 0.9 MB id
lists as filters and as ids), the server's peak RSS is reset (``5`` into
``/proc/PID/clear_refs``) and the bodies are sent one after another: the peak growth (``VmHWM``
after less ``VmRSS`` before) of the kind's first body (cold) and of the others (steady), each
divided by the size of one body. The worst of all is the goal (at most 20 MB per MB). Under
glibc each request thread that serves a large body grows a heap arena of its own once, so the
steady growth can exceed the cold one; ``MALLOC_ARENA_MAX=2`` in the server's environment
roughly halves it (measured once, not the default).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from _common import RESULTS, machine, provenance, utc_now
from crossknn.fileio import atomic_write_bytes

OUT = RESULTS / "filter_fuzz.json"
N_ITEMS = 200
TENANTS = ("acme", "globex", "initech", "umbrella")
POISON_QUERY = "tenant bench poison query"
POISON_TENANT = "poisoned-tenant"
K, BUDGET = 3, 6  # the wave's search (every request of a wave shares it: one group key)
OPENER_K, OPENER_BUDGET = 1, 1  # the request before each wave (another key: never grouped)
WAVE = 8  # requests per wave (the server's default --group-queries)
QUERIES = [
    "parse a date string into a datetime object",
    "compress data with gzip",
    "send an email through an SMTP server",
    "run a shell command and capture its output",
    "read a CSV file row by row",
    "create a temporary directory",
    "encode bytes as base64",
    "open a network socket",
]
# the opener's 32 queries, new in each wave: their DE encoding keeps the engine busy while the
# wave queues, for few CE pairs
OPENER_QUERIES = [f"{q} (variant {i})" for i in range(4) for q in QUERIES]
READY_S = 600.0

# the server process: `crossknn serve`, with this bench's two faults injected (never the library's)
LAUNCHER = f"""
import sys
import crossknn.searcher as searcher_mod
import crossknn.serve.service as service_mod
from crossknn.cli import main

POISON_QUERY, POISON_TENANT = {POISON_QUERY!r}, {POISON_TENANT!r}


class FaultyCE:
    def __init__(self, ce):
        self._ce = ce

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self._ce, name)

    def score_batch(self, queries, items):
        if POISON_QUERY in queries:
            raise MemoryError("injected: no memory for the poison query's batch")
        return self._ce.score_batch(queries, items)


open_models = service_mod.open_index_models


def faulty_models(*args, **kwargs):
    ce, de = open_models(*args, **kwargs)
    return FaultyCE(ce), de


service_mod.open_index_models = faulty_models
filter_mask = searcher_mod.Searcher.filter_mask


def faulty_filter_mask(self, spec):
    if POISON_TENANT in repr(spec):
        raise MemoryError("injected: no memory for the poisoned tenant's mask")
    return filter_mask(self, spec)


searcher_mod.Searcher.filter_mask = faulty_filter_mask
sys.exit(main(sys.argv[1:]))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build_index(root: Path) -> Path:
    from crossknn.demo_corpus import stdlib_docstrings

    docs = stdlib_docstrings(max_items=N_ITEMS)
    rows = [
        {"id": i, "text": t, "tenant": TENANTS[j % len(TENANTS)]}
        for j, (i, t) in enumerate(zip(docs.ids, docs.texts, strict=True))
    ]
    corpus = root / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    idx = root / "idx"
    cmd = [sys.executable, "-m", "crossknn.cli", "build", str(corpus), str(idx)]
    cmd += ["--calibration-queries", "2", "--calibration-items", "4", "--quiet"]
    subprocess.run(cmd, check=True, timeout=1800)
    return idx


class Server:
    """``crossknn serve`` (with the injected faults) on a free loopback port; stopped by PID."""

    def __init__(self, index: Path, log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-c", LAUNCHER, "serve", str(index), "--port", str(self.port)]
        cmd += ["--max-body-kb", "4096", "--admit-within", "0", "--timeout-s", "120"]
        cmd += ["--watch-index", "0", "--log-level", "warning"]
        self.log = open(log, "w")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        end = time.monotonic() + READY_S
        with httpx.Client(timeout=5, trust_env=False) as http:
            while True:
                try:
                    if http.get(self.url + "/readyz").status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if self.proc.poll() is not None or time.monotonic() > end:
                    self.stop()
                    raise RuntimeError(f"the server did not start; see {log}")
                time.sleep(0.2)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def status(self, key: str) -> int:
        """``VmHWM`` / ``VmRSS`` of the server process, in kB."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
        raise KeyError(key)

    def reset_peak(self) -> bool:
        try:
            Path(f"/proc/{self.pid}/clear_refs").write_text("5")
            return True
        except OSError:
            return False

    def metric(self, http: httpx.Client, name: str) -> float:
        for line in http.get(self.url + "/metrics").text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        return 0.0

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.pid, signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.kill(self.pid, signal.SIGKILL)
                self.proc.wait(30)
        self.log.close()


def _ids_of(r: httpx.Response) -> list | None:
    if r.status_code != 200:
        return None
    return [[x["id"] for x in h["results"]] for h in r.json()["hits"]]


def good_bodies(all_ids: list[str]) -> list[dict]:
    rng = random.Random(1)
    some = rng.sample(all_ids, 40)
    wide = {"$and": [{"tenant": {"$ne": f"x{i}"}} for i in range(255)] + [{"tenant": "acme"}]}
    out = []
    for i, q in enumerate(QUERIES):
        out.append({"query": q, "filter": {"tenant": TENANTS[i % len(TENANTS)]}})
        out.append({"query": q, "filter": wide, "ids": some})
        out.append({"query": q, "ids": [*some[i : i + 12], "not-an-id"]})
        out.append({"query": q})
    return [{"k": K, "budget": BUDGET, **b} for b in out]


def failing_bodies() -> list[dict]:
    return [
        {"k": K, "budget": BUDGET, "query": POISON_QUERY},
        {"k": K, "budget": BUDGET, "query": QUERIES[0], "filter": {"tenant": POISON_TENANT}},
    ]


def cross_requests(server: Server, all_ids: list[str], waves: int) -> dict:
    goods = good_bodies(all_ids)
    bads = failing_bodies()
    rng = random.Random(7)
    with httpx.Client(timeout=120, trust_env=False) as http:
        ref = []
        for b in goods:  # each alone, the server idle: the answer it must get in a group
            r = http.post(server.url + "/search", json=b)
            if r.status_code != 200:
                raise RuntimeError(f"a good request failed alone: {r.status_code} {r.text[:300]}")
            ref.append(_ids_of(r))
        for b in bads:
            r = http.post(server.url + "/search", json=b)
            if r.status_code != 500:
                raise RuntimeError(f"the injected fault did not fail: {r.status_code} {r.text}")
        grouped0 = server.metric(http, "crossknn_grouped_queries")
    good_n = cross = wrong = bad_n = bad_500 = 0
    examples: list[str] = []
    t0 = time.perf_counter()
    clients = [httpx.Client(timeout=120, trust_env=False) for _ in range(WAVE + 1)]
    try:
        for w in range(waves):
            picks = rng.sample(range(len(goods)), WAVE - 1)
            bad = bads[w % len(bads)]
            slot = rng.randrange(WAVE)
            wave: list = [(goods[i], i) for i in picks]
            wave.insert(slot, (bad, None))
            texts = [f"{q}, wave {w}" for q in OPENER_QUERIES]  # never in the DE's cache
            opener = {"queries": texts, "k": OPENER_K, "budget": OPENER_BUDGET}
            got: list = [None] * (WAVE + 1)

            def send(j, body, got=got):
                got[j] = clients[j].post(server.url + "/search", json=body)

            threads = [threading.Thread(target=send, args=(WAVE, opener))]
            threads += [threading.Thread(target=send, args=(j, b)) for j, (b, _) in enumerate(wave)]
            threads[0].start()
            time.sleep(0.01)  # the opener takes the engine; the wave queues behind it
            for t in threads[1:]:
                t.start()
            for t in threads:
                t.join(300)
            for j, (_, i) in enumerate(wave):
                r = got[j]
                if i is None:
                    bad_n += 1
                    bad_500 += r is not None and r.status_code == 500
                    continue
                good_n += 1
                if r is None or r.status_code != 200:
                    cross += 1
                    if len(examples) < 5:
                        examples.append("none" if r is None else f"{r.status_code} {r.text[:200]}")
                elif _ids_of(r) != ref[i]:
                    wrong += 1
    finally:
        for c in clients:
            c.close()
    with httpx.Client(timeout=30, trust_env=False) as http:
        grouped = server.metric(http, "crossknn_grouped_queries") - grouped0
    return {
        "waves": waves,
        "requests_per_wave": WAVE,
        "good_requests": good_n,
        "failing_requests": bad_n,
        "failing_answered_500": bad_500,
        "cross_request_failures": cross,
        "wrong_answers": wrong,
        "queries_searched_in_groups": int(grouped),
        "examples": examples,
        "seconds": round(time.perf_counter() - t0, 1),
    }


def _deep_filter(values_per_cond: int) -> dict:
    """32 levels of $and / $or, 255 conditions in all (8 per level), each a $nin of distinct
    strings: about the most a filter may hold, made large."""
    node: dict = {"tenant": {"$nin": [f"z{j}" for j in range(values_per_cond)]}}
    c = 1
    for level in range(31):
        conds = [
            {"tenant": {"$nin": [f"l{level}-{j}-{v}" for v in range(values_per_cond)]}}
            for j in range(8 if level < 30 else 255 - c)
        ]
        c += len(conds)
        node = {("$and" if level % 2 else "$or"): [node, *conds]}
    return node


def body_kinds(all_ids: list[str], distinct: int) -> dict:
    """Each adversarial body kind: ``(how many bodies, body n -> dict)`` (made one at a time:
    120 bodies of 0.9 MB are not held at once)."""
    base = {"query": QUERIES[1], "k": K, "budget": BUDGET}
    long_in = [f"v{j:05d}" for j in range(20_000)] + ["x" * 500_000, "acme"]
    many_ids = [f"unknown-{j:07d}" for j in range(100_000 - 20)] + all_ids[:20]
    deep = _deep_filter(300)

    def distinct_ids(n: int) -> dict:  # a 0.9 MB id list no other request sends
        rng = random.Random(n)
        ids = [f"t{n}-{rng.randrange(10**9):09d}" for _ in range(52_000)]
        return {**base, "filter": {"id": {"$in": ids}}} if n % 2 == 0 else {**base, "ids": ids}

    return {
        "long strings in $in": (5, lambda n: {**base, "filter": {"tenant": {"$in": long_in}}}),
        "1e5 ids": (5, lambda n: {**base, "ids": many_ids}),
        "1e5 ids in a filter": (5, lambda n: {**base, "filter": {"id": {"$in": many_ids}}}),
        "32 levels, 255 conditions": (5, lambda n: {**base, "filter": deep}),
        "distinct 0.9 MB id lists": (distinct, distinct_ids),
    }


def _send(http: httpx.Client, server: Server, body: bytes) -> int:
    headers = {"Content-Type": "application/json"}
    return http.post(server.url + "/search", content=body, headers=headers).status_code


def memory(server: Server, all_ids: list[str], distinct: int) -> list[dict]:
    """Per body kind: the peak growth of its first body (``cold``: the request threads' heaps
    grow to it once) and of the next ones (``steady``), each per MB of one body."""
    rows = []
    with httpx.Client(timeout=300, trust_env=False) as http:
        for name, (count, make) in body_kinds(all_ids, distinct).items():
            statuses: dict[str, int] = {}
            grown = []
            mb = 0.0
            for part in (range(1), range(1, count)):
                reset = server.reset_peak()
                before = server.status("VmRSS" if reset else "VmHWM")
                for n in part:
                    body = json.dumps(make(n)).encode()
                    mb = max(mb, len(body) / 1e6)
                    code = str(_send(http, server, body))
                    statuses[code] = statuses.get(code, 0) + 1
                grown.append(max(server.status("VmHWM") - before, 0) / 1024)
            rows.append(
                {
                    "kind": name,
                    "bodies": count,
                    "body_mb": round(mb, 3),
                    "statuses": statuses,
                    "cold_extra_peak_mb": round(grown[0], 1),
                    "steady_extra_peak_mb": round(grown[1], 1),
                    "cold_mb_per_mb_body": round(grown[0] / mb, 2),
                    "steady_mb_per_mb_body": round(grown[1] / mb, 2),
                    "extra_mb_per_mb_body": round(max(grown) / mb, 2),
                    "rss_after_mb": round(server.status("VmRSS") / 1024, 1),
                    "peak_reset": reset,
                }
            )
    return rows


def write_goals(section: dict, goals: dict) -> None:
    """Read-modify-write of bench/results/filter_fuzz.json: this bench's goals and section, the
    other keys as they are."""
    doc = json.loads(OUT.read_text()) if OUT.is_file() else {}
    doc.setdefault("goals", {}).update(goals)
    doc["tenant_bench"] = section
    OUT.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(OUT, (json.dumps(doc, indent=1) + "\n").encode("utf-8"))
    print(f"wrote {OUT}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--waves", type=int, default=130, help="waves of grouped requests")
    ap.add_argument("--distinct", type=int, default=100, help="distinct 0.9 MB id lists sent")
    ap.add_argument("--no-write", action="store_true", help="print only")
    ap.add_argument("--index", type=Path, help="an index this bench built before (not rebuilt)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="tenant-bench-") as tmp:
        root = Path(tmp)
        t = time.perf_counter()
        idx = args.index or build_index(root)
        print(f"index {idx}: {N_ITEMS} items ({time.perf_counter() - t:.0f} s)")
        import crossknn

        all_ids = list(crossknn.open_index(idx).corpus.ids)
        server = Server(idx, root / "serve.log")
        try:
            cross = cross_requests(server, all_ids, args.waves)
            mem = memory(server, all_ids, args.distinct)
        except BaseException:
            print((root / "serve.log").read_text()[-3000:], file=sys.stderr)
            raise
        finally:
            server.stop()
    print(
        f"\n{cross['good_requests']} good + {cross['failing_requests']} failing requests in "
        f"{cross['waves']} waves of {WAVE} ({cross['queries_searched_in_groups']} queries "
        f"searched in groups, {cross['seconds']} s)"
    )
    print(
        f"  good requests answered with another request's error: {cross['cross_request_failures']}"
    )
    print(f"  good requests with a wrong answer:                  {cross['wrong_answers']}")
    print(f"  failing requests answered 500:                      {cross['failing_answered_500']}")
    print(
        f"\n{'body kind':28} {'n':>4} {'body MB':>8} {'cold +MB':>9} {'steady +MB':>11} "
        f"{'MB/MB':>7}  statuses"
    )
    for r in mem:
        print(
            f"{r['kind']:28} {r['bodies']:>4} {r['body_mb']:>8.3f} "
            f"{r['cold_extra_peak_mb']:>9.1f} {r['steady_extra_peak_mb']:>11.1f} "
            f"{r['extra_mb_per_mb_body']:>7.2f}  {r['statuses']}"
        )
    worst = max(r["extra_mb_per_mb_body"] for r in mem)
    goals = {
        "cross_request_failures": cross["cross_request_failures"],
        "max_extra_rss_mb_per_mb_body": worst,
    }
    print(f"\ngoals: {goals}")
    section = {
        "when": utc_now(),
        "machine": machine("httpx", "fastapi", "uvicorn"),
        "provenance": provenance(),
        "n_items": N_ITEMS,
        "cross_requests": cross,
        "memory": mem,
        "targets": {"cross_request_failures": 0, "max_extra_rss_mb_per_mb_body": 20},
    }
    if not args.no_write:
        write_goals(section, goals)
    return 0


if __name__ == "__main__":
    sys.exit(main())
