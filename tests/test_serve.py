"""``crossknn serve`` end to end: the real server (uvicorn in a subprocess on a free loopback
port) over a small index built here with the embedded models."""

from __future__ import annotations

import hashlib
import json
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

import crossknn  # noqa: E402
from crossknn import client  # noqa: E402
from serve_fixture import QUERIES, Server, index_env, run_cli, served, serving  # noqa: E402

pytestmark = [pytest.mark.slow]

N_ITEMS = 200


@pytest.fixture(scope="module")
def env(model_env, tmp_path_factory):
    from crossknn.demo_corpus import stdlib_docstrings

    built = index_env(tmp_path_factory, "serve", stdlib_docstrings(max_items=N_ITEMS))
    assert len(built["index"]) == N_ITEMS
    return built


@pytest.fixture(scope="module")
def searcher(env):
    return crossknn.Searcher(env["index_dir"])


def _tree_hash(path: Path) -> dict[str, str]:
    return {
        str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(path.rglob("*"))
        if p.is_file()
    }


server = served(
    "--max-batch-pairs", "128", "--max-wait-ms", "5", "--timeout-s", "300", "--allow-exact"
)
# a queue of 2 and a 1.5 s limit, admission by the queue alone (the deadline check would refuse
# the 504 test's request at once: tests/test_api_contract.py, case 1)
tight = served(
    *("--max-queue", "2", "--timeout-s", "1.5", "--max-body-kb", "8", "--allow-exact"),
    *("--admit-within", "0"),
)


def _same(out: dict, hits) -> None:
    hits = hits if isinstance(hits, list) else [hits]  # one query string: one Hits
    assert len(out["hits"]) == len(hits)
    for got, want in zip(out["hits"], hits, strict=True):
        assert got["query"] == want.query
        assert [r["id"] for r in got["results"]] == want.ids
        np.testing.assert_allclose([r["score"] for r in got["results"]], want.scores, atol=1e-5)
        assert got["ce_calls"] == want.ce_calls


def test_server_timing_splits_the_request_time(server):
    """Each answer's Server-Timing header: where its time went, in ms, adding up to its total."""
    body = json.dumps({"query": QUERIES[1], "k": 5, "budget": 20}).encode()
    req = urllib.request.Request(
        server.url + "/search", body, {"Content-Type": "application/json"}, method="POST"
    )
    t = time.perf_counter()
    with urllib.request.urlopen(req, timeout=120) as resp:
        header = resp.headers["Server-Timing"]
        answer = json.loads(resp.read())
    elapsed_ms = 1e3 * (time.perf_counter() - t)
    parts = {}
    *timed, plan = header.split(", ")
    for part in timed:
        name, _, dur = part.partition(";dur=")
        parts[name] = float(dur)
    # the last entry says what ran: the method, its rounds and why, as the JSON answer does
    p = answer["plan"]
    by = (p.get("round_choice") or {}).get("by", "method")
    assert plan == f'plan;desc="{p["method"]} rounds={p["rounds"]} by={by}"'
    assert answer["method"] == p["method"] and answer["rounds"] == p["rounds"]
    assert sum(p["plan"]) == 20 and len(p["plan"]) == p["rounds"]
    names = ["start", "lock", "engine", "ce_queue", "ce_run", "ce_wake", "total"]
    assert list(parts) == names and all(v >= 0 for v in parts.values())
    assert parts["ce_run"] > 0 and parts["engine"] > 0  # 20 CE pairs were scored
    assert sum(parts[n] for n in names[:-1]) <= parts["total"] + 0.1 <= elapsed_ms + 0.1


def test_search_equals_in_process_searcher(server, searcher):
    for method in ("axn", "rnr"):
        out = client.search(server.url, QUERIES[0], k=5, budget=20, method=method, seed=3)
        assert out["method"] == method and out["k"] == 5 and out["budget"] == 20
        _same(out, searcher.search(QUERIES[0], k=5, budget=20, method=method, seed=3))
    out = client.search(server.url, QUERIES[:3], k=5, budget=12, rounds=3)
    _same(out, searcher.search(QUERIES[:3], k=5, budget=12, rounds=3))
    # the same JSON as `crossknn search --json`
    keys = set(searcher.search(QUERIES[0], k=5, budget=5, rounds=1).to_dict())
    assert set(out["hits"][0]) == keys


def test_twenty_concurrent_requests_are_each_correct(server, searcher):
    before = server.metrics()
    reqs = [(QUERIES[i % len(QUERIES)], 2 + i % 3, 8 + 2 * (i % 3), i % 2) for i in range(20)]
    with httpx.Client(timeout=300) as http, ThreadPoolExecutor(20) as pool:
        outs = list(
            pool.map(
                lambda r: client.search(
                    server.url, r[0], k=r[1], budget=r[2], seed=r[3], http=http
                ),
                reqs,
            )
        )
    for (q, k, b, seed), out in zip(reqs, outs, strict=True):
        _same(out, searcher.search(q, k=k, budget=b, seed=seed))
    after = server.metrics()
    batches = after["crossknn_ce_batches_total"] - before["crossknn_ce_batches_total"]
    pairs = after["crossknn_ce_pairs_total"] - before["crossknn_ce_pairs_total"]
    assert pairs == sum(b for _, _, b, _ in reqs)
    # 20 requests x 5 rounds = 100 request-rounds went through fewer CE batches: merged
    assert batches < 100


@pytest.mark.parametrize(
    "body, field",
    [
        (b"{not json", None),
        (b"[1, 2]", None),
        ({"query": "x", "k": 20, "budget": 10}, "k"),
        ({"query": "x", "budget": N_ITEMS + 1}, "budget"),
        ({"query": "   "}, "query"),
        ({"queries": []}, "queries"),
        ({"query": "x", "method": "bm42"}, "method"),
        ({"query": "x", "method": "adacur"}, "method"),
        ({"query": "x", "k": "10"}, "k"),
        ({"query": "x", "rounds": 0}, "rounds"),
        ({"query": "x", "colour": "red"}, "colour"),
        ({"k": 5}, "query"),
        ({"query": "x", "queries": ["y"]}, "query"),
        ({"query": "x", "exact": "yes"}, "exact"),
    ],
)
def test_bad_input_is_422_naming_the_field(server, body, field):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = httpx.post(
        server.url + "/search",
        content=data,
        headers={"Content-Type": "application/json"},
        timeout=30,
    )
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert isinstance(detail, list) and detail[0]["msg"]
    if field is not None:
        assert detail[0]["loc"][:2] == ["body", field], detail


def test_oversized_body_is_413(tight):
    big = json.dumps({"query": "x" * 20_000}).encode()
    json_type = {"Content-Type": "application/json"}
    r = httpx.post(tight.url + "/search", content=big, headers=json_type, timeout=30)
    assert r.status_code == 413
    # chunked, with no Content-Length: still refused once the limit is passed
    r = httpx.post(
        tight.url + "/search",
        content=iter([big[:5000], big[5000:]]),
        headers=json_type,
        timeout=30,
    )
    assert r.status_code == 413
    assert client.health(tight.url)


def test_queue_full_is_429_with_retry_after(tight):
    slow = {"queries": QUERIES[:4], "k": 5, "budget": 50}
    statuses, headers = [], []
    barrier = threading.Barrier(8)

    def call(_):
        barrier.wait()
        r = httpx.post(tight.url + "/search", json=slow, timeout=60)
        statuses.append(r.status_code)
        headers.append(r.headers.get("retry-after"))

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(call, range(8)))
    assert statuses.count(429) >= 4, statuses  # a queue of 2
    assert set(statuses) <= {200, 429, 504}, statuses
    # Retry-After: whole seconds until the work ahead has drained enough (at least 1)
    assert all(int(h) >= 1 for s, h in zip(statuses, headers, strict=True) if s == 429)


def test_over_the_time_limit_is_504_and_its_ce_work_dropped(tight):
    heavy = {"queries": QUERIES[:8], "k": 10, "budget": N_ITEMS, "exact": True}
    before = tight.metrics()
    t = time.monotonic()
    r = httpx.post(tight.url + "/search", json=heavy, timeout=30)
    assert r.status_code == 504, r.text
    assert time.monotonic() - t < 15  # 1.5 s limit (slack for a loaded machine)
    time.sleep(1.0)
    after = tight.metrics()
    scored = after["crossknn_ce_pairs_total"] - before["crossknn_ce_pairs_total"]
    assert scored < 8 * 2 * N_ITEMS  # most of the 3,200 pairs were never run
    assert after["crossknn_timeouts_total"] >= before.get("crossknn_timeouts_total", 0) + 1
    # and the server goes on serving: the CE batch that was running when the request was
    # cancelled still finishes, so on a loaded machine a small request may first time out too
    deadline = time.monotonic() + 30
    while True:
        try:
            out = client.search(tight.url, QUERIES[1], k=1, budget=3, rounds=1)
            break
        except client.ServeError as exc:
            if exc.status != 504 or time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    assert out["hits"][0]["ce_calls"] == 3


def test_client_gone_mid_request_drops_its_work(server):
    heavy = json.dumps({"queries": QUERIES[:8], "budget": N_ITEMS, "exact": True}).encode()
    before = server.metrics()
    with socket.create_connection(("127.0.0.1", server.port)) as s:
        s.sendall(
            b"POST /search HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(heavy)}\r\n\r\n".encode()
            + heavy
        )
        time.sleep(0.5)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        after = server.metrics()
        if after.get("crossknn_client_disconnects_total", 0) > before.get(
            "crossknn_client_disconnects_total", 0
        ):
            break
        time.sleep(0.2)
    else:
        pytest.fail("the server did not notice the client leaving")
    assert client.search(server.url, QUERIES[2], k=3, budget=20)["hits"][0]["ce_calls"] == 20
    after = server.metrics()
    scored = after["crossknn_ce_pairs_total"] - before["crossknn_ce_pairs_total"]
    assert scored < 8 * 2 * N_ITEMS


def test_metrics_parse_as_prometheus_text(server):
    client.search(server.url, QUERIES[0], k=3, budget=20)
    m = server.metrics()
    for name in (
        'crossknn_requests_total{"path": "/search", "status": "200"}',
        "crossknn_request_latency_seconds_count",
        "crossknn_ce_pairs_total",
        "crossknn_ce_pairs_per_second",
        "crossknn_ce_batch_pairs_count",
        "crossknn_queue_depth",
        "crossknn_engine_seconds_total",
        "crossknn_ce_seconds_total",
        "crossknn_ce_wait_seconds_total",
    ):
        assert name in m, name
    assert m["crossknn_ready"] == 1
    assert m["crossknn_ce_pairs_per_second"] > 0


def test_info_health_ready_and_openapi(server, searcher):
    info = client.info(server.url)
    assert info["index"]["n_items"] == N_ITEMS
    assert info["models"]["ce"]["model_hash"] == searcher.ce.model_hash
    assert info["models"]["de"]["model_id"] == searcher.de.model_id
    assert info["precision"] == "fp32" and info["provider"].endswith("ExecutionProvider")
    # the load-time warm-up: no CUDA graphs on the CPU; the engine's item Gram cache is built
    # (the default method's least-squares rounds over 384-d DE vectors of a small corpus)
    assert info["config"]["warmup"] is True
    # on the CPU there are no graphs to capture (the CE worker thread ran its warm-up); the
    # engine's Gram cache is built
    assert info["warmup"] == {"buckets": 0, "seconds": 0.0, "threads": 1, "engine": ["gram"]}
    assert httpx.get(server.url + "/healthz").json() == {"status": "ok"}
    assert httpx.get(server.url + "/readyz").status_code == 200
    spec = httpx.get(server.url + "/openapi.json").json()
    body = spec["paths"]["/search"]["post"]["requestBody"]["content"]["application/json"]
    assert {"query", "queries", "k", "budget", "method"} <= set(body["schema"]["properties"])
    assert httpx.get(server.url + "/docs").status_code == 200


def test_sigterm_drains_in_flight_requests_and_leaves_the_index_unchanged(env):
    before = _tree_hash(env["index_dir"])
    results = []
    # all four admitted, however loaded this machine is
    with serving(env, "--admit-within", "0") as s:

        def call(q):
            body = {"query": q, "k": 5, "budget": 25}
            results.append(httpx.post(s.url + "/search", json=body, timeout=300))

        threads = [threading.Thread(target=call, args=(q,)) for q in QUERIES[:4]]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 60
        while s.metrics().get("crossknn_queue_depth", 0) < 4:  # all four in flight
            assert time.monotonic() < deadline, "the requests never got in flight"
            time.sleep(0.05)
        s.proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(300)
        rc = s.proc.wait(120)  # no second signal: the server exits by itself once drained
    assert [r.status_code for r in results] == [200] * 4, s.output()
    assert all(r.json()["hits"][0]["ce_calls"] == 25 for r in results)
    # uvicorn re-raises the signal after its graceful shutdown: the exit status says SIGTERM
    assert rc in (0, -signal.SIGTERM), s.output()
    assert _tree_hash(env["index_dir"]) == before


@pytest.mark.xdist_group("ray")  # one local Ray cluster at a time (tests/conftest.py)
def test_ray_serve_two_replicas(env, searcher):
    """``crossknn serve --ray --replicas 2``: the same app on Ray Serve, two replicas."""
    pytest.importorskip("ray.serve", exc_type=ImportError)
    flags = ("--ray", "--replicas", "2", "--threads", "1")
    with serving(env, *flags, log_level=None, environ={"RAY_USAGE_STATS_ENABLED": "0"}) as s:
        body = {"query": QUERIES[0], "k": 3, "budget": 10}

        def call(_):
            r = httpx.post(s.url + "/search", json=body, timeout=300)
            return r.status_code, r.headers.get("x-served-by"), r.json()

        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(call, range(16)))
    want = searcher.search(QUERIES[0], k=3, budget=10)
    for status, _, out in answers:
        assert status == 200
        _same(out, want)
    # concurrent requests were spread over both replicas (processes)
    assert len({by for _, by, _ in answers}) == 2, answers


@pytest.mark.xdist_group("ray")  # one local Ray cluster at a time (tests/conftest.py)
def test_serve_with_item_shards_equals_in_process_searcher(env, searcher, monkeypatch):
    """``crossknn serve --shards 2``: the rounds' top-k over two local Ray actors, the hits of
    the single-process searcher exactly."""
    pytest.importorskip("ray")
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    with serving(env, "--shards", "2", "--threads", "1", "--timeout-s", "300") as s:
        rf = client.info(s.url)["round_features"]
        assert rf == {"kind": "ShardedFeatures", "shards": 2}
        for method in ("axn", "rnr"):
            out = client.search(s.url, QUERIES[:2], k=5, budget=20, method=method, seed=3)
            _same(out, searcher.search(QUERIES[:2], k=5, budget=20, method=method, seed=3))


def test_two_worker_processes_answer_like_the_in_process_searcher(env, searcher):
    """--workers 2: two server processes on one port (each its own models and batcher); their
    answers equal the in-process searcher's, and the server process has both as children."""
    import concurrent.futures

    s = Server(env["index_dir"], "--workers", "2", "--threads", "1", logs=env["root"])
    try:
        # /readyz answered by one worker says nothing of the other: wait for a streak of 200s
        streak, deadline = 0, time.monotonic() + 120
        while streak < 12 and time.monotonic() < deadline:
            ok = httpx.get(s.url + "/readyz", headers={"Connection": "close"}).status_code == 200
            streak = streak + 1 if ok else 0
            time.sleep(0.05 if ok else 0.5)
        assert streak >= 12, s.output()
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            outs = list(
                pool.map(
                    lambda q: client.search(s.url, q, k=5, budget=12, method="axn", seed=1),
                    QUERIES[:6],
                )
            )
        for q, out in zip(QUERIES[:6], outs, strict=True):
            _same(out, searcher.search(q, k=5, budget=12, method="axn", seed=1))
        children = subprocess.run(
            ["pgrep", "-P", str(s.pid)], capture_output=True, text=True
        ).stdout.split()
        assert len(children) >= 2, s.output()  # the two workers (the command supervises them)
    finally:
        assert s.stop() == 0, s.output()


def test_workers_refuse_ray_and_bad_counts(env):
    for args, msg in (
        (["--workers", "0"], "--workers must be >= 1; got 0"),
        (["--workers", "2", "--shards", "2"], "cannot be combined with --ray or --shards"),
    ):
        out = run_cli("serve", str(env["index_dir"]), *args)
        assert out.returncode == 2 and msg in out.stderr, out.stderr
