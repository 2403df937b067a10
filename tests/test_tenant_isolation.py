"""One tenant's request never hurts another (issue 64 part B): the server and the Searcher.

A ``crossknn serve`` service over a small index of two tenants, in process with stand-in models
(tests/lifecycle_stubs.py), and its HTTP app through Starlette's test client. Requests are
grouped the way the server groups them under load: the engine lock is held while they queue, so
they start as lockstep groups (crossknn.serve.groups). Checked: a failing request inside a group
fails alone and every other one gets its own answer (defect 2); a filter and ids each within the
limits are searched as sent (2); the mask cache is bounded in bytes, keys included (5); the query
log credits each request with its own scored items (8); ``exact`` scores the allowed items only
(10); unknown ids are counted (11); a field name holding ``": "`` is one ``loc`` element, a 500
is JSON, a torn log record is worded right (12); small indexes are read into memory, so a file cut
in place does not kill the server, and the start-up line says so (13)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
import time
import tracemalloc
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("httpx")

from fastapi.testclient import TestClient  # noqa: E402

import crossknn.serve.service as service_mod  # noqa: E402
from crossknn.corpus.query_log import QueryLog, read_log  # noqa: E402
from crossknn.data import Corpus  # noqa: E402
from crossknn.searcher import Searcher  # noqa: E402
from crossknn.serve.app import create_app  # noqa: E402
from crossknn.serve.schema import SearchRequest  # noqa: E402
from crossknn.serve.service import SearchService, ServeConfig  # noqa: E402
from lifecycle_stubs import StubCE, StubDE, build, corpus, queries  # noqa: E402

N_ITEMS = 120
TENANT = "tenant"
NOTE = "note: kind"  # a field name holding ": "
POISON = "poison query text"  # the CE fails on this query (MemoryError)


class CE(StubCE):
    """The stand-in CE as the server opens one; a query ``POISON`` fails with MemoryError."""

    provider, batch_size, backend, kind = "cpu", 16, "onnx", "ce"

    def score_batch(self, queries, items_list):
        if POISON in queries:
            raise MemoryError("no memory for this request")
        return super().score_batch(queries, items_list)


class DE(StubDE):
    provider, backend, kind = "cpu", "onnx", "de"


def _meta(i: int) -> dict:
    return {TENANT: "a" if i % 2 else "b", NOTE: f"k{i % 3}"}


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tenants")
    c = corpus(N_ITEMS)
    build(root / "idx", Corpus(c.ids, c.texts, "tenants", [_meta(i) for i in range(N_ITEMS)]))
    return root / "idx"


@pytest.fixture(scope="module")
def models():
    made = {"ce": CE(), "de": DE()}
    mp = pytest.MonkeyPatch()
    mp.setattr(service_mod, "open_index_models", lambda index, **kw: (made["ce"], made["de"]))
    yield made
    mp.undo()


def _service(index_dir, models, **config) -> SearchService:
    opts = {"warmup": False, "admit_within": 0, "timeout_s": 60.0, "watch_index_s": 0, **config}
    svc = SearchService(ServeConfig(index=str(index_dir), **opts))
    svc.load()
    return svc


@pytest.fixture(scope="module")
def svc(index_dir, models):
    s = _service(index_dir, models, allow_exact=True)
    yield s
    s.close()


@pytest.fixture(scope="module")
def alone(index_dir):
    """A plain Searcher with the same models: the answer each request must get."""
    return Searcher(index_dir, ce=StubCE(), de=StubDE())


def _one(svc, req: SearchRequest):
    """One admitted search through the service, as the app runs it: the answer or the error."""
    decision = svc.try_admit(req)
    assert decision.admitted, decision
    ctx = svc.new_context()
    try:
        return svc.search(req, ctx)
    except Exception as exc:
        return exc
    finally:
        svc.release(decision.ticket, ctx)


def _grouped(svc, reqs: list[SearchRequest]) -> list:
    """``reqs`` queued while the engine is busy (each behind the one before), then let go:
    they start as lockstep groups; the answer or error of each."""
    lock = svc.engine_lock
    lock.acquire()
    try:
        with ThreadPoolExecutor(len(reqs)) as pool:
            futs = []
            for i, r in enumerate(reqs):
                futs.append(pool.submit(_one, svc, r))
                end = time.monotonic() + 10
                while lock.waiting < i + 1:
                    assert time.monotonic() < end, "the request never queued"
                    time.sleep(0.001)
            lock.release()
            lock = None
            return [f.result(60) for f in futs]
    finally:
        if lock is not None:
            lock.release()


def _req(q: str, **kw) -> SearchRequest:
    return SearchRequest(query=q, k=5, budget=20, **kw)


@pytest.mark.parametrize("failure", ["filter made invalid by a swap", "MemoryError in the CE"])
def test_a_failing_request_in_a_group_fails_alone(svc, alone, failure):
    qs = queries(12, seed=7)
    flt = [{TENANT: "a"} if i % 2 else {TENANT: "b"} for i in range(len(qs))]
    reqs = [_req(q, filter=f) for q, f in zip(qs, flt, strict=True)]
    bad = 5
    if failure.startswith("filter"):  # checked at parse time against the index it had then
        reqs[bad] = _req(qs[bad], filter={"gone_field": "x"})
    else:
        reqs[bad] = _req(POISON, filter=flt[bad])
    before = svc.groups.grouped_queries
    outs = _grouped(svc, reqs)
    assert svc.groups.grouped_queries - before >= 8  # they did run as groups
    assert isinstance(outs[bad], ValueError if failure.startswith("filter") else MemoryError)
    for i, (q, f, out) in enumerate(zip(qs, flt, outs, strict=True)):
        if i == bad:
            continue
        assert isinstance(out, dict), f"request {i} got another request's error: {out!r}"
        want = alone.search(q, k=5, budget=20, filter=f)
        got = out["hits"][0]
        assert [r["id"] for r in got["results"]] == want.ids
        np.testing.assert_allclose([r["score"] for r in got["results"]], want.scores, rtol=1e-6)


def test_filter_and_ids_within_the_limits_are_searched_as_sent(svc, alone):
    ids = [f"d{i}" for i in range(0, N_ITEMS, 3)]
    wide = {"$and": [{TENANT: {"$ne": f"x{i}"}} for i in range(255)] + [{TENANT: "a"}]}
    deep: dict = {TENANT: "a"}
    for _ in range(32):  # 32 levels: the most a filter may have
        deep = {"$and": [deep]}
    q = queries(1, seed=3)[0]
    for flt in (wide, deep):
        out = _one(svc, _req(q, filter=flt, ids=ids))
        assert isinstance(out, dict), out
        want = alone.search(q, k=5, budget=20, filter={TENANT: "a"}, ids=ids)
        assert [r["id"] for r in out["hits"][0]["results"]] == want.ids
        assert all(int(r["id"][1:]) % 2 == 1 and r["id"] in ids for r in out["hits"][0]["results"])
    # and beside others in a group: every one answered
    outs = _grouped(svc, [_req(x, filter=wide, ids=ids) for x in queries(6, seed=4)])
    assert all(isinstance(o, dict) for o in outs), outs


def test_the_mask_cache_is_bounded_in_bytes_keys_included(index_dir):
    s = Searcher(index_dir, ce=StubCE(), de=StubDE())
    s.MASK_CACHE_BYTES = 1 << 20
    q = queries(1)[0]
    many = [[f"unknown-id-{j}-{i:07d}" for i in range(10_000)] for j in range(40)]  # ~0.2 MB each
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for j, ids in enumerate(many):
            s.search(q, k=1, budget=1, filter={"id": {"$in": ids + [f"d{j}"]}})
            s.search(q, k=1, budget=1, ids=ids + [f"d{j}"])
        kept = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    # 40 distinct filters of 0.2 MB: the cache keeps at most 1 MB, keys included
    assert kept < s.MASK_CACHE_BYTES + (1 << 20), f"{kept / 1e6:.1f} MB kept"


def test_the_query_log_credits_each_request_with_its_own_items(index_dir, models, tmp_path):
    log = tmp_path / "q.log"
    svc = _service(index_dir, models, log_queries=str(log))
    try:
        q = queries(1, seed=9)[0]
        reqs = [_req(q, filter={TENANT: t}) for t in ("a", "b", "a", "b")]
        outs = _grouped(svc, reqs)
        assert all(isinstance(o, dict) for o in outs), outs
        assert svc.groups.grouped_queries >= 3
    finally:
        svc.close()
    recs = read_log(log)
    assert len(recs) == 4
    tenants = sorted("".join(sorted({_meta(int(i[1:]))[TENANT] for i in r.items})) for r in recs)
    assert tenants == ["a", "a", "b", "b"]  # never the other tenant's items
    assert all(len(r.items) == 20 for r in recs)


def test_exact_scores_only_the_allowed_items(svc, alone, models):
    q = queries(1, seed=5)[0]
    alone.ce.calls = 0
    h = alone.search(q, k=3, budget=20, ids=["d5"], exact=True)
    assert h.exact_ids == ["d5"] and alone.ce.calls == 2  # one for the search, one exact
    alone.ce.calls = 0
    h = alone.search(q, k=3, budget=20, filter={TENANT: "a"}, exact=True)
    assert alone.ce.calls == 20 + N_ITEMS // 2
    assert all(int(i[1:]) % 2 == 1 for i in h.exact_ids)
    ce = models["ce"]
    ce.calls = 0
    out = _one(svc, SearchRequest(query=q, k=3, budget=20, ids=["d5"], exact=True))
    assert out["hits"][0]["exact"]["ids"] == ["d5"] and ce.calls == 2


def test_unknown_ids_are_counted(svc, alone):
    q = queries(1, seed=6)[0]
    h = alone.search(q, k=3, budget=10, ids=["d1", "d2", "nope", "nope", "zz"])
    assert h.unknown_ids == 2 and h.to_dict()["unknown_ids"] == 2
    assert alone.search(q, k=3, budget=10).unknown_ids == 0
    outs = _grouped(
        svc, [_req(q, ids=["d1", "d3", "x"]), _req(q, ids=["d1", "y", "z", "w"]), _req(q)]
    )
    assert [o["hits"][0]["unknown_ids"] for o in outs] == [1, 3, 0]


@pytest.fixture(scope="module")
def http(svc):
    app = create_app(svc.config, service=svc, load="none")
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client


def _post(http, **body):
    return http.post("/search", json={"k": 3, "budget": 10, **body})


def test_http_answers_count_unknown_ids(http):
    r = _post(http, query=queries(1)[0], ids=["d1", "d2", "nobody"])
    assert r.status_code == 200, r.text
    assert r.json()["hits"][0]["unknown_ids"] == 1


def test_http_422_names_a_field_holding_a_colon_as_one_element(http):
    q = queries(1)[0]
    r = _post(http, query=q, filter={NOTE: "k1"})
    assert r.status_code == 200, r.text
    for flt, loc in (
        ({NOTE: {"$gte": "k"}}, ["body", "filter", NOTE, "$gte"]),
        ({"$or": [{TENANT: "a"}, {NOTE: 5}]}, ["body", "filter", "$or", 1, NOTE]),
        ({"x: y": 1}, ["body", "filter", "x: y"]),
    ):
        r = _post(http, query=q, filter=flt)
        assert r.status_code == 422, r.text
        detail = r.json()["detail"][0]
        assert detail["loc"] == loc, detail
        assert not detail["msg"].startswith(("kind", "y", ":")), detail


def test_a_500_is_json_without_a_traceback(http, svc, monkeypatch):
    import crossknn.serve.app as app_mod

    def broken_check(*a, **kw):
        raise OverflowError("Python int too large to convert to C long (in /secret/path.py)")

    monkeypatch.setattr(app_mod, "parse_search_request", broken_check)
    r = _post(http, query="anything")
    assert r.status_code == 500
    assert r.headers["content-type"].startswith("application/json"), r.headers
    assert r.json() == {"detail": "internal error (logged)"}
    monkeypatch.undo()

    def broken_search(req, ctx):
        raise RuntimeError("boom in /secret/path.py")

    monkeypatch.setattr(svc, "search", broken_search)
    app = create_app(svc.config, service=svc, load="none")
    with TestClient(app, raise_server_exceptions=False) as client:
        r = _post(client, query="anything")
    assert r.status_code == 500 and r.json() == {"detail": "internal error (logged)"}
    assert "Traceback" not in r.text and "secret" not in r.text


def test_torn_and_unreadable_log_records_are_worded_right(tmp_path, capsys):
    path = tmp_path / "q.log"
    path.write_bytes(b"not json\n")
    with QueryLog(path) as log:
        log.append("good", ["d1"], [1.0])
    with open(path, "ab") as f:
        f.write(b'{"query": "torn", "ite')
    assert [r.query for r in read_log(path)] == ["good"]
    err = capsys.readouterr().err
    assert "skipping an unreadable query-log record" in err
    assert "skipping a torn query-log record" in err
    assert "a unreadable" not in err


def test_a_small_index_is_read_into_memory_and_says_so(index_dir, models, caplog, tmp_path):
    from crossknn.serve.arrays import hold_arrays

    with caplog.at_level(logging.INFO, logger="crossknn.serve"):
        svc = _service(index_dir, models)
    svc.close()
    line = [r.getMessage() for r in caplog.records if "ready in" in r.getMessage()]
    assert len(line) == 1 and "index arrays read into memory" in line[0], line
    assert svc.info()["index"]["arrays_held"] == "memory"
    import crossknn

    big = crossknn.open_index(index_dir)
    assert hold_arrays(big, max_bytes=0)["held"] == "mapped"
    assert isinstance(big.arrays["de_items"], np.memmap)


def test_an_array_cut_in_place_does_not_kill_the_server(tmp_path):
    """In a subprocess (a SIGBUS would end this one): load the service, cut the served item
    vectors file in place (what cp / rsync --inplace over the folder do), search again. The
    index has 1,200 items: its vectors file spans pages past the cut (a cut within the last
    page reads zeros, no SIGBUS)."""
    idx = tmp_path / "idx"
    build(idx, corpus(1200))
    code = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        import test_tenant_isolation as t
        import crossknn.serve.service as service_mod
        service_mod.open_index_models = lambda index, **kw: (t.CE(), t.DE())
        svc = t._service({str(idx)!r}, None)
        q = t.queries(1)[0]
        first = t._one(svc, t._req(q))
        with open({str(idx / "de_items.npy")!r}, "r+b") as f:
            f.truncate(64)
        again = t._one(svc, t._req(q))
        assert again["hits"][0]["results"] == first["hits"][0]["results"], again
        print("served after the cut")
        svc.close()
        """
    )
    env = {**os.environ, "PYTHONFAULTHANDLER": "1"}
    p = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env
    )
    assert p.returncode == 0 and "served after the cut" in p.stdout, p.stderr[-2000:]
