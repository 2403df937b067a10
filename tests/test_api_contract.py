"""Issue 46: the HTTP API holds its contract (the eleven cases found by hand, the security basics,
two servers on one index, a port in use), against a real ``crossknn serve`` (uvicorn in a
subprocess on a free loopback port) over one small index built here with the embedded models.

Schemathesis' generated requests are in tests/test_api_contract_fuzz.py."""

from __future__ import annotations

import json
import re
import socket
import stat
import time

import pytest

from crossknn.serve.admission import Admission
from serve_fixture import cli_index_env, run_cli, served, serving, topic_rows

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

KEY = "s3cret-key-for-tests"
N_DOCS = 40
LONG = " ".join(["the quick brown fox jumps over the lazy dog near the river bank"] * 12)
PATHLIKE = re.compile(r"(/tmp/|/home/|/work/|site-packages|\.py\b|Traceback)")


# -- case 1, the policy (deterministic: a fake clock) -----------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_a_lone_request_over_the_deadline_is_refused_at_once():
    clock = FakeClock()
    a = Admission(max_queue=64, timeout_s=30.0, clock=clock)
    d = a.try_admit(100)
    clock.t += 1.0  # 10 ms per pair
    a.done(d.ticket)
    # 5,000 pairs alone: 50 s expected, over the 30 s limit but within its margin (2 x: the
    # estimate extrapolates from smaller requests): admitted
    big = a.try_admit(5000)
    assert big.admitted
    clock.t += 50.0
    a.done(big.ticket)
    # 11,600 pairs alone: ~116 s expected, over the limit: refused now, not 504 after 30 s
    d = a.try_admit(11_600)
    assert not d.admitted and d.reason == "too_large"
    assert d.expected_s == pytest.approx(116.0, rel=0.01) and d.retry_after_s >= 1
    assert a.in_server == 0  # nothing was taken


# -- the real server ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def env(model_env, tmp_path_factory):
    return cli_index_env(tmp_path_factory, "api-contract", topic_rows(N_DOCS))


server = served("--timeout-s", "4", "--body-timeout-s", "1", log_level="info")
roomy = served("--timeout-s", "120", log_level="info")  # fits 300 long /rerank texts (case 2)
# takes /rerank requests of 8,000 long texts (case 1): over twice its 4 s limit on any CPU that
# scores fewer than 1,000 pairs a second (a 2-core CPU scores 60-200)
wide = served(
    "--timeout-s", "4", "--max-rerank-texts", "8000", "--max-body-kb", "8192", log_level="info"
)  # fmt: skip
keyed = served(log_level="info", api_key=KEY)


def _raw(port: int, data: bytes, *, wait: float = 10.0) -> bytes:
    """Send ``data`` on a fresh connection; everything the server answers until it closes the
    connection or ``wait`` seconds pass."""
    out = b""
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(data)
        s.settimeout(wait)
        end = time.monotonic() + wait
        try:
            while time.monotonic() < end:
                got = s.recv(65536)
                if not got:
                    break
                out += got
        except TimeoutError:
            pass
    return out


def _split(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers, body


# -- case 1: a lone /rerank whose predicted CE work exceeds the deadline: 429 at once ---------


@pytest.mark.slow
def test_case01_lone_oversized_rerank_is_429_at_once(wide):
    server = wide
    # one /rerank of 16 such texts first: the service time the server measures is then that of
    # long texts, not only of its warm-up search over short items
    warm = {"query": "a river", "texts": [f"{i} {LONG}" for i in range(16)]}
    assert httpx.post(server.url + "/rerank", json=warm, timeout=60).status_code == 200
    # 8,000 pairs: at least 8 s of CE time up to 1,000 pairs/s (1,000 pairs were predicted to fit
    # in 8 s, and took over 4 s, on a 2-core AMD EPYC: a 504, not the 429 this case is about)
    body = {"query": "a river", "texts": [f"{i} {LONG}" for i in range(8000)]}
    t = time.monotonic()
    r = httpx.post(server.url + "/rerank", json=body, timeout=60)
    took = time.monotonic() - t
    assert r.status_code == 429, (r.status_code, r.text[:300], took)
    assert "retry-after" not in r.headers  # retrying it cannot help (issue 54)
    assert "alone" in r.json()["detail"] and "4 s limit" in r.json()["detail"]
    # and a small one is still answered
    small = httpx.post(server.url + "/rerank", json={"query": "a river", "texts": [LONG]})
    assert small.status_code == 200, small.text


# -- case 2: the CE work of a client that went away is dropped ---------------------------------


@pytest.mark.slow
def test_case02_ce_work_of_a_gone_client_is_dropped(roomy):
    server = roomy
    refused0 = server.metric("crossknn_rejected_total")
    scored0 = server.metric("crossknn_ce_pairs_total")
    gone0 = server.metric("crossknn_client_disconnects_total")
    n = 300
    data = json.dumps({"query": "a river", "texts": [f"{i} {LONG}" for i in range(n)]}).encode()
    head = (
        f"POST /rerank HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", server.port)) as s:
        s.sendall(head + data)
        time.sleep(0.3)
    deadline = time.monotonic() + 60
    while server.metric("crossknn_client_disconnects_total") <= gone0:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    # wait until the CE has nothing of it left
    while server.metric("crossknn_ce_pending_pairs") > 0:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    time.sleep(0.5)
    scored = server.metric("crossknn_ce_pairs_total") - scored0
    assert server.metric("crossknn_rejected_total") == refused0  # it was admitted
    # before: the first merged batch (256 of the 300 pairs) ran to its end after the client left
    assert scored < 256, scored
    assert (
        httpx.post(server.url + "/rerank", json={"query": "q", "texts": ["x"]}).status_code == 200
    )


# -- case 3: a body that never comes is 408 after the body-read timeout ------------------------


@pytest.mark.slow
def test_case03_body_read_timeout_is_408(server):
    t = time.monotonic()
    raw = _raw(
        server.port,
        b"POST /search HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b'Content-Length: 100\r\n\r\n{"query":',
        wait=20,
    )
    took = time.monotonic() - t
    assert raw, f"no answer in {took:.0f} s"
    status, headers, body = _split(raw)
    assert status == 408, raw[:300]
    assert "body stopped coming" in json.loads(body)["detail"][0]["msg"]
    assert headers.get("connection") == "close"


# -- case 4: two Authorization headers are refused ---------------------------------------------


@pytest.mark.slow
def test_case04_two_authorization_headers_are_401(keyed):
    headers = [("Authorization", "Bearer wrong"), ("Authorization", f"Bearer {KEY}")]
    r = httpx.get(keyed.url + "/info", headers=headers)
    assert r.status_code == 401, r.text
    assert "more than one" in r.json()["detail"]
    r = httpx.get(keyed.url + "/info", headers=list(reversed(headers)))
    assert r.status_code == 401
    assert httpx.get(keyed.url + "/info", headers=keyed.headers).status_code == 200


# -- cases 5 and 6: the key file's permissions and encoding -----------------------------------


@pytest.mark.slow
def test_case05_world_readable_key_file_warns(env, tmp_path):
    key = tmp_path / "open.key"
    key.write_text("abc\n")
    key.chmod(0o644)
    # a missing index stops it right after the key check: rc 2, the warning first
    r = run_cli("serve", str(tmp_path / "no-index"), "--api-key-file", str(key))
    assert r.returncode == 2
    warn = [line for line in r.stderr.splitlines() if "warning" in line]
    assert len(warn) == 1 and str(key) in warn[0] and "chmod 600" in warn[0], r.stderr
    assert "abc" not in r.stderr and "abc" not in r.stdout  # the key is never printed
    key.chmod(0o600)
    r = run_cli("serve", str(tmp_path / "no-index"), "--api-key-file", str(key))
    assert r.returncode == 2 and "warning" not in r.stderr, r.stderr


@pytest.mark.slow
def test_case06_key_file_not_utf8_names_the_file(env, tmp_path):
    key = tmp_path / "bad.key"
    key.write_bytes(b"ab\xff\xfecd\n")
    key.chmod(0o600)
    r = run_cli("serve", str(tmp_path / "no-index"), "--api-key-file", str(key))
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and str(key) in lines[0] and "UTF-8" in lines[0], r.stderr
    assert "Traceback" not in r.stderr


# -- case 7: a query of zero-width or control characters only is empty -------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    "path, body, loc",
    [
        ("/search", {"query": "\u200b", "k": 2, "budget": 5}, ["body", "query"]),
        ("/search", {"query": "\u0000", "k": 2, "budget": 5}, ["body", "query"]),
        ("/search", {"query": " \ufeff\u2060\u00a0", "k": 2, "budget": 5}, ["body", "query"]),
        (
            "/search",
            {"queries": ["ok", "\u200b\u200c"], "k": 2, "budget": 5},
            ["body", "queries", 1],
        ),
        ("/rerank", {"query": "\u200d", "texts": ["a"]}, ["body", "query"]),
        ("/rerank", {"query": "a", "texts": ["b", "\u0000\u0001"]}, ["body", "texts", 1]),
    ],
)
def test_case07_invisible_query_is_422_the_query_is_empty(server, path, body, loc):
    r = httpx.post(server.url + path, json=body)
    assert r.status_code == 422, r.text
    d = r.json()["detail"][0]
    assert d["loc"] == loc and "empty" in d["msg"], d


# -- case 8: POST bodies must say they are JSON ------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    "ctype",
    ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", None],
)
@pytest.mark.parametrize("path", ["/search", "/rerank"])
def test_case08_non_json_content_type_is_415(server, path, ctype):
    body = (
        {"query": "email", "k": 2, "budget": 5}
        if path == "/search"
        else {
            "query": "email",
            "texts": ["a", "b"],
        }
    )
    headers = {} if ctype is None else {"Content-Type": ctype}
    r = httpx.post(server.url + path, content=json.dumps(body).encode(), headers=headers)
    assert r.status_code == 415, r.text
    assert "application/json" in r.json()["detail"]
    ok = httpx.post(
        server.url + path,
        content=json.dumps(body).encode(),
        headers={"Content-Type": "application/json; charset=utf-8"},
    )
    assert ok.status_code == 200, ok.text


# -- case 9: no host or process details on a 401 -----------------------------------------------


@pytest.mark.slow
def test_case09_no_served_by_on_401(keyed):
    for path in ("/search", "/info", "/metrics", "/openapi.json", "/nope"):
        r = httpx.get(keyed.url + path)
        assert r.status_code == 401
        assert "x-served-by" not in r.headers, (path, r.headers)
        assert str(keyed.proc.pid) not in str(r.headers) + r.text
    assert "x-served-by" not in httpx.get(keyed.url + "/healthz").headers


# -- case 10: uvicorn's 400s carry the JSON error shape ----------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    "raw",
    [
        b"POST /search HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: -1\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Bad: a\rb\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Bad: a\nInjected: b\r\n\r\n",
        b"NOT-HTTP\r\n\r\n",
    ],
)
def test_case10_malformed_http_is_400_with_a_json_body(server, raw):
    status, headers, body = _split(_raw(server.port, raw))
    assert status == 400, (raw, status, body)
    assert headers["content-type"].startswith("application/json")
    detail = json.loads(body)["detail"]
    assert "malformed HTTP request" in detail
    assert not PATHLIKE.search(body.decode())


# -- case 11: HEAD on the probes ---------------------------------------------------------------


@pytest.mark.slow
def test_case11_head_healthz_and_readyz_are_200(server, keyed):
    for s in (server, keyed):
        for path in ("/healthz", "/readyz"):
            r = httpx.head(s.url + path)
            assert r.status_code == 200, (path, r.status_code)
            assert r.content == b""


# -- security basics ---------------------------------------------------------------------------


@pytest.mark.slow
def test_every_route_but_the_probes_needs_the_key(keyed):
    """Every route of the app (read from the app's own OpenAPI, so routes added later are
    covered), with every method it declares: 401 without the key, 401 with a wrong one."""
    spec = httpx.get(keyed.url + "/openapi.json", headers=keyed.headers).json()
    routes = [(m.upper(), p) for p, ops in spec["paths"].items() for m in ops]
    routes += [("GET", "/docs"), ("GET", "/openapi.json"), ("GET", "/redoc")]
    assert ("POST", "/search") in routes and ("GET", "/info") in routes
    for method, path in routes:
        for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": KEY}):
            r = httpx.request(method, keyed.url + path, headers=headers)
            if path in ("/healthz", "/readyz"):
                assert r.status_code == 200, (method, path)
            else:
                assert r.status_code == 401, (method, path, headers, r.status_code)
                assert r.headers.get("www-authenticate") == "Bearer"
    assert KEY not in keyed.output()  # never logged


@pytest.mark.slow
def test_error_bodies_reveal_no_paths(server, env):
    bad = [
        ("/search", b"{"),
        ("/search", b'{"query": "x", "method": "../../etc/passwd"}'),
        ("/search", b'{"query": "x", "budget": 100000}'),
        ("/rerank", b'{"query": "x"}'),
        ("/rerank", b'{"query": "x", "texts": ["\\ud800"]}'),
    ]
    for path, data in bad:
        r = httpx.post(
            server.url + path, content=data, headers={"Content-Type": "application/json"}
        )
        assert 400 <= r.status_code < 500, r.text
        assert str(env["index_dir"]) not in r.text and not PATHLIKE.search(r.text), r.text
    assert "Traceback" not in server.output()


@pytest.mark.slow
def test_cors_is_off_by_default(server):
    r = httpx.options(
        server.url + "/search",
        headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"},
    )
    assert "access-control-allow-origin" not in r.headers
    r = httpx.post(
        server.url + "/search",
        json={"query": "email", "k": 2, "budget": 5},
        headers={"Origin": "https://evil.example"},
    )
    assert r.status_code == 200 and "access-control-allow-origin" not in r.headers


# -- two servers on one index; a port in use ---------------------------------------------------


@pytest.mark.slow
def test_two_servers_on_one_index_both_answer(env, server):
    with serving(env, log_level="info") as other:
        body = {"query": "email", "k": 3, "budget": 10}
        a = httpx.post(server.url + "/search", json=body).json()
        b = httpx.post(other.url + "/search", json=body).json()
        assert a["hits"][0]["results"] == b["hits"][0]["results"]


@pytest.mark.slow
def test_port_in_use_is_one_line_and_nonzero(env, server):
    r = run_cli("serve", str(env["index_dir"]), "--port", str(server.port), timeout=60)
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and str(server.port) in lines[0] and "in use" in lines[0], r.stderr
    assert httpx.get(server.url + "/healthz").status_code == 200


def test_key_file_mode_check_helper(tmp_path):
    from crossknn.serve.app import key_file_warning

    key = tmp_path / "k"
    key.write_text("abc\n")
    key.chmod(0o640)
    assert "group" in key_file_warning(str(key))
    key.chmod(0o604)
    assert "everyone" in key_file_warning(str(key))
    key.chmod(stat.S_IRUSR | stat.S_IWUSR)
    assert key_file_warning(str(key)) is None
