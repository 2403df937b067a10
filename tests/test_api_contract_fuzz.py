"""Issue 46: schemathesis' generated requests against a real ``crossknn serve`` (with and without
``--api-key-file``), every operation of its /openapi.json, positive and negative cases: no 5xx,
no undeclared status, no body off its declared schema, no traceback or file path in a body.

A bounded run (about 2 minutes on 2 CPU cores); the long one is ``make fuzz-api``
(bench/api_contract_bench.py --fuzz, its counts in bench/results/api_contract.json)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from serve_fixture import serving

pytest.importorskip("schemathesis")
pytest.importorskip("fastapi")

BENCH = Path(__file__).resolve().parents[1] / "bench" / "api_contract_bench.py"
KEY = "fuzz-key-0123456789"
EXAMPLES = 12  # per operation and mode (x 2 modes x 8 operations x 2 servers, plus auth probes)


def _bench():
    spec = importlib.util.spec_from_file_location("api_contract_bench", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def bench():
    return _bench()


@pytest.fixture(scope="module")
def env(bench, model_env, tmp_path_factory):
    root = tmp_path_factory.mktemp("api-fuzz")
    return {"root": root, "index_dir": bench.build_small_index(root)}


@pytest.mark.slow
@pytest.mark.parametrize("keyed", [False, True], ids=["no-key", "api-key-file"])
def test_generated_requests_hold_the_contract(bench, env, keyed):
    args = ["--timeout-s", "20", "--max-queue", "8", "--max-rerank-texts", "16"]
    key = KEY if keyed else None
    with serving(env, *args, api_key=key) as server:
        out = bench.fuzz(server.url, key=key, examples=EXAMPLES)
    ops = set(out["operations"])
    assert {"POST /search", "POST /rerank", "GET /healthz", "HEAD /healthz", "GET /readyz"} <= ops
    assert {"GET /info", "GET /metrics"} <= ops
    assert out["cases"]["negative"] > 0 and out["cases"]["positive"] > 0
    # POST operations get all their examples (their bodies are never exhausted)
    assert out["by_operation"]["POST /search"] >= 2 * EXAMPLES, out["by_operation"]
    bad = {k: out[k] for k in ("n_5xx", "schema_violations", "leaks", "transport_errors")}
    if keyed:
        bad["auth_failures"] = out["auth_failures"]
    assert not any(bad.values()), (bad, out["failures"])
    text = server.output()
    assert "Traceback" not in text, text[-3000:]
    assert KEY not in text
    # the server answered 2xx as well as 4xx: the generated requests reached the searches
    assert any(s.startswith("2") for s in out["by_status"]), out["by_status"]
    assert any(s.startswith("4") for s in out["by_status"]), out["by_status"]


def test_leak_pattern_catches_paths_and_tracebacks():
    bench = _bench()
    for text in (
        'Traceback (most recent call last):\n  File "/x/y.py", line 3',
        "cannot open /tmp/pytest-1/idx/index.json",
        "error in site-packages/fastapi/routing.py",
    ):
        assert bench.LEAK.search(text), text
    for text in ('{"detail": "the query is empty"}', '{"status": "ok"}', "k must be >= 1"):
        assert not bench.LEAK.search(text), text


def test_goals_have_exactly_the_issue_keys(tmp_path):
    bench = _bench()
    out = tmp_path / "r.json"
    result = bench.merge_section(out, "fuzz", {"requests": 10, "n_5xx": 0, "command": "x"})
    assert tuple(result["goals"]) == bench.GOAL_KEYS
    assert result["goals"]["fuzz_requests"] == 10 and result["goals"]["soak_minutes"] is None
    assert {"machine", "date", "commit", "command"} <= set(result)
    assert os.path.getsize(out) > 0
