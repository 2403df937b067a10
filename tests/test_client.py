"""crossknn.client against a real ``crossknn serve`` (started with an API key) over a small index
with metadata: every /search and /rerank field, the same answer as the same HTTP body, per-query
filters, the key from ``api_key=`` or ``$CROSSKNN_API_KEY``, one typed error carrying the
server's message and ``loc``, and the async twin. The 429 retry is checked on httpx's own
MockTransport (a server that answers 429 with ``Retry-After`` on demand)."""

from __future__ import annotations

import asyncio
import time

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

import crossknn  # noqa: E402
from crossknn import client  # noqa: E402
from frameworks_fixture import BUDGET, K, allowed_ids, shared_index  # noqa: E402
from serve_fixture import QUERIES, served  # noqa: E402

pytestmark = [pytest.mark.slow]

KEY = "test-key-65"


@pytest.fixture(scope="module")
def env(model_env, tmp_path_factory):
    return shared_index(tmp_path_factory)


server = served(api_key=KEY)


def _strip(out: dict) -> dict:
    """An answer without its timings (ce_s, other_s differ from call to call)."""
    hits = [{k: v for k, v in h.items() if k not in ("ce_s", "other_s")} for h in out["hits"]]
    return {**out, "hits": hits}


def test_a_client_call_and_the_same_http_body_give_the_same_answer(server, env):
    flt = {"lang": "en", "year": {"$gte": 2003}}
    fields = {
        "k": 3,
        "budget": 12,
        "method": "axn",
        "rounds": 2,
        "seed": 1,
        "filter": flt,
        "return_documents": True,
    }
    out = client.search(server.url, QUERIES[:2], api_key=KEY, **fields)
    raw = httpx.post(
        server.url + "/search",
        json=client.search_body(QUERIES[:2], **fields),
        headers=server.headers,
        timeout=120,
    )
    assert raw.status_code == 200, raw.text
    assert _strip(out) == _strip(raw.json())
    allowed = allowed_ids(env["index_dir"], flt)
    for h in out["hits"]:
        assert {r["id"] for r in h["results"]} <= allowed and len(h["results"]) == 3
        assert all(r["text"] for r in h["results"])
        assert h["allowed"] == len(allowed)
    ids = sorted(allowed)[:4]
    got = client.search(server.url, QUERIES[0], k=2, budget=4, rounds=1, ids=ids, api_key=KEY)
    assert {r["id"] for r in got["hits"][0]["results"]} <= set(ids)
    assert got["hits"][0]["ce_calls"] == 4  # every allowed item once: exact


def test_per_query_filters_equal_one_request_each(server):
    filters = [{"lang": "de"}, None, {"tags": "b"}]
    ids = [None, None, None]
    with client.Client(server.url, api_key=KEY) as c:
        out = c.search(QUERIES[:3], k=K, budget=BUDGET, filter=filters, ids=ids)
        one = [
            c.search(q, k=K, budget=BUDGET, filter=f)["hits"][0]
            for q, f in zip(QUERIES[:3], filters, strict=True)
        ]
    assert [h["query"] for h in out["hits"]] == QUERIES[:3]
    assert [h["qid"] for h in out["hits"]] == ["1", "2", "3"]  # as one request numbers them
    assert [h["results"] for h in out["hits"]] == [h["results"] for h in one]
    with pytest.raises(ValueError, match="2 entries for 3 queries"):
        client.search(server.url, QUERIES[:3], filter=[None, None], api_key=KEY)


def test_the_key_comes_from_the_argument_or_the_environment(server, monkeypatch):
    monkeypatch.delenv(client.API_KEY_ENV, raising=False)
    with pytest.raises(client.ServeError) as err:
        client.search(server.url, QUERIES[0], k=K, budget=BUDGET)
    assert err.value.status == 401 and "missing API key" in err.value.message
    assert str(err.value).startswith("HTTP 401: missing API key")
    monkeypatch.setenv(client.API_KEY_ENV, KEY)
    assert client.search(server.url, QUERIES[0], k=K, budget=BUDGET)["hits"][0]["results"]
    assert client.info(server.url)["index"]["metadata_fields"] == {
        "lang": "string",
        "tags": "strings",
        "year": "number",
    }
    with pytest.raises(client.ServeError, match="HTTP 401: wrong API key"):
        client.info(server.url, api_key="not-the-key")
    assert "api_key=***" in repr(client.Client(server.url)) and KEY not in repr(
        client.Client(server.url)
    )


@pytest.mark.parametrize(
    ("fields", "loc", "msg"),
    [
        ({"filter": {"lang2": "en"}}, ("body", "filter", "lang2"), "unknown field 'lang2'"),
        ({"filter": {"year": {"$gte": "x"}}}, ("body", "filter", "year", "$gte"), "a number"),
        ({"budget": 10_000}, ("body", "budget"), "exceeds the number of items"),
        ({"k": 30, "budget": 20}, ("body", "k"), "exceeds the budget"),
        ({"method": "nope"}, ("body", "method"), "nope"),
        # a field a newer server may take is sent as given; this one takes no such field
        ({"no_such_field": 1}, ("body", "no_such_field"), "Extra inputs are not permitted"),
    ],
)
def test_one_typed_error_with_the_servers_message_and_loc(server, fields, loc, msg):
    with pytest.raises(client.ServeError) as err:
        client.search(server.url, QUERIES[0], api_key=KEY, **{"budget": BUDGET, **fields})
    e = err.value
    assert e.status == 422 and e.loc == loc and msg in e.message, (e.loc, e.message)
    assert "\n" not in str(e) and str(e).startswith(f"HTTP 422 at {'.'.join(loc)}: ")
    assert isinstance(e.detail, list) and e.detail[0]["loc"] == list(loc)


def test_rerank_every_field(server):
    texts = ["parse dates and times", "compress a file", "send an email message"]
    with client.Client(server.url, api_key=KEY) as c:
        tei = c.rerank("how to parse a date", texts, top_n=2, return_documents=True)
        raw = httpx.post(
            server.url + "/rerank",
            json=client.rerank_body("how to parse a date", texts, top_n=2, return_documents=True),
            headers=server.headers,
            timeout=60,
        ).json()
        assert tei == raw and len(tei) == 2 and tei[0]["text"] == texts[tei[0]["index"]]
        cohere = c.rerank("how to parse a date", documents=texts, top_n=1, return_documents=True)
        assert cohere["results"][0]["index"] == tei[0]["index"]
        assert cohere["results"][0]["relevance_score"] == pytest.approx(tei[0]["score"])
        with pytest.raises(client.ServeError) as err:
            c.rerank("q", [])
        assert err.value.loc == ("body", "texts")


def test_the_async_twin_gives_the_same_answers(server):
    async def run():
        async with client.AsyncClient(server.url, api_key=KEY) as c:
            one = await c.search(QUERIES[0], k=K, budget=BUDGET, filter={"lang": "fr"})
            many = await c.search(QUERIES[:2], k=K, budget=BUDGET, filter=[{"lang": "fr"}, None])
            rr = await c.rerank(QUERIES[0], ["a date", "an email"])
            try:
                await c.search(QUERIES[0], budget=BUDGET, filter={"nope": 1})
            except client.ServeError as exc:
                err = exc
            return one, many, rr, err, await c.health()

    one, many, rr, err, ready = asyncio.run(run())
    with client.Client(server.url, api_key=KEY) as c:
        sync = c.search(QUERIES[0], k=K, budget=BUDGET, filter={"lang": "fr"})
        assert rr == c.rerank(QUERIES[0], ["a date", "an email"])
    assert one["hits"][0]["results"] == sync["hits"][0]["results"]
    assert many["hits"][0]["results"] == sync["hits"][0]["results"]
    assert err.status == 422 and err.loc == ("body", "filter", "nope") and ready


# -- 429: retried after Retry-After, bounded -----------------------------------------------------


def _busy_server(answers: list):
    """httpx's MockTransport answering ``answers`` in turn: (status, Retry-After or None)."""
    seen = []

    def handler(request):
        seen.append(time.monotonic())
        status, after = answers[min(len(seen) - 1, len(answers) - 1)]
        headers = {} if after is None else {"Retry-After": after}
        if status == 200:  # a newer server's answer: fields this client does not know
            body = {"method": "auto", "stopped": True, "hits": [{"results": [], "target": 0.9}]}
            return httpx.Response(200, json=body)
        return httpx.Response(status, json={"detail": "queue full; retry later"}, headers=headers)

    return handler, seen


def test_a_429_is_sent_again_after_its_retry_after_at_most_retries_times():
    handler, seen = _busy_server([(429, "0.2"), (429, "0.2"), (200, None)])
    with client.Client(
        "http://crossknn.test", http=httpx.Client(transport=httpx.MockTransport(handler))
    ) as c:
        out = c.search("q")
    assert len(seen) == 3 and seen[1] - seen[0] >= 0.2 and seen[2] - seen[1] >= 0.2
    assert out["stopped"] is True and out["hits"][0]["target"] == 0.9  # passed through
    assert c.retried == 2

    handler, seen = _busy_server([(429, "0.1")])
    with pytest.raises(client.ServeError) as err:
        client.search(
            "http://crossknn.test",
            "q",
            retries=1,
            http=httpx.Client(transport=httpx.MockTransport(handler)),
        )
    assert len(seen) == 2 and err.value.status == 429 and err.value.retry_after == 0.1
    assert err.value.message == "queue full; retry later"

    for after in (None, "600"):  # no Retry-After (too large), or longer than max_retry_wait
        handler, seen = _busy_server([(429, after), (200, None)])
        with pytest.raises(client.ServeError):
            client.search(
                "http://crossknn.test",
                "q",
                http=httpx.Client(transport=httpx.MockTransport(handler)),
            )
        assert len(seen) == 1


def test_the_async_twin_retries_a_429_too():
    handler, seen = _busy_server([(429, "0.1"), (200, None)])

    async def run():
        http = httpx.AsyncClient(transport=httpx.MockTransport(handler))
        async with client.AsyncClient("http://crossknn.test", http=http) as c:
            out = await c.search("q")
        await http.aclose()
        return out

    assert asyncio.run(run())["stopped"] is True
    assert len(seen) == 2 and seen[1] - seen[0] >= 0.1


def test_bodies_leave_out_what_was_not_given():
    assert client.search_body("q") == {
        "query": "q",
        "k": 10,
        "budget": 100,
        "exact": False,
        "seed": 0,
    }
    body = client.search_body(
        ["a", "b"], ids=("d1",), method="rnr", rounds=1, return_documents=True
    )
    assert body["queries"] == ["a", "b"] and body["ids"] == ["d1"] and body["return_documents"]
    assert client.rerank_body("q", ["a"], top_n=0) == {"query": "q", "texts": ["a"], "top_n": 0}
    assert client.search_body("q", target_recall=0.99, stopped=None)["target_recall"] == 0.99
    assert "stopped" not in client.search_body("q", stopped=None)
    with pytest.raises(TypeError, match="ids must be a list"):
        client.search_body("q", ids="d1")
    with pytest.raises(ValueError, match="http:// or https://"):
        client.Client("localhost:8080")


def test_metadata_and_target_recall_reach_the_server(server, env):
    """``return_metadata``: each result carries its item's fields as the index stores them;
    ``target_recall`` reaches the server (this index's default method has no calibrated early
    stop, so the server refuses it naming the field)."""
    index = crossknn.open_index(env["index_dir"])
    meta = dict(zip(index.corpus.ids, index.metadata.records(), strict=True))
    out = client.search(server.url, QUERIES[:2], k=3, budget=12, return_metadata=True, api_key=KEY)
    for h in out["hits"]:
        for r in h["results"]:
            assert r["metadata"] == meta[r["id"]]
    body = client.search_body(QUERIES[0], target_recall=0.9, return_metadata=True)
    assert body["target_recall"] == 0.9 and body["return_metadata"] is True
    with pytest.raises(client.ServeError, match="target_recall") as err:
        client.search(server.url, QUERIES[0], k=3, budget=12, target_recall=0.9, api_key=KEY)
    assert err.value.status == 422
