"""``crossknn serve`` as a reranker (``POST /rerank``), item texts in /search hits, the declared
response schemas, the ``--allow-exact`` gate, the API key and CORS: the real app, in process
(FastAPI's TestClient), over a small index built here with the embedded models."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("httpx")

from fastapi.testclient import TestClient  # noqa: E402

from crossknn.commands import serve_cmd  # noqa: E402
from crossknn.commands.declared import add_arguments  # noqa: E402
from crossknn.serve.app import create_app  # noqa: E402
from serve_fixture import index_env  # noqa: E402

pytestmark = [pytest.mark.slow]

N_ITEMS = 60
QUERY = "compress data with gzip"
TEXTS = [
    "Compress a file with the gzip algorithm and write the result.",
    "Send an email message through an SMTP server.",
    "Decompress gzip data read from a stream.",
    "Sort a list in place.",
    "Open a network socket and connect to a host.",
    "Return the zlib-compressed form of a bytes object.",
]


@pytest.fixture(scope="module")
def env(model_env, tmp_path_factory):
    from crossknn.demo_corpus import stdlib_docstrings

    built = index_env(tmp_path_factory, "rerank", stdlib_docstrings(max_items=N_ITEMS))
    return {**built, "index_dir": str(built["index_dir"])}


def _client(env, *flags: str):
    """The app of ``crossknn serve INDEX *flags`` (the CLI's own argument parsing)."""
    import argparse

    p = argparse.ArgumentParser()
    add_arguments(p, "serve")
    args = p.parse_args([env["index_dir"], "--threads", "1", *flags])
    return TestClient(create_app(serve_cmd.config_from_args(args), load="now"))


@pytest.fixture(scope="module")
def app_client(env):
    with _client(env, "--max-rerank-texts", "10") as c:
        yield c


@pytest.fixture(scope="module")
def ce(app_client):
    return app_client.app.state.service.ce


def test_rerank_order_and_scores_are_the_ces_rank(app_client, ce):
    r = app_client.post("/rerank", json={"query": QUERY, "texts": TEXTS})
    assert r.status_code == 200, r.text
    out = r.json()
    expected = ce.rank(QUERY, TEXTS)
    assert [x["index"] for x in out] == [x["corpus_id"] for x in expected]
    np.testing.assert_allclose(
        [x["score"] for x in out], [x["score"] for x in expected], rtol=1e-5, atol=1e-6
    )
    assert all("text" not in x for x in out)  # return_documents defaults to false
    scores = [x["score"] for x in out]
    assert scores == sorted(scores, reverse=True)


def test_top_n_top_k_and_return_documents(app_client):
    full = app_client.post("/rerank", json={"query": QUERY, "texts": TEXTS}).json()
    r = app_client.post(
        "/rerank", json={"query": QUERY, "texts": TEXTS, "top_n": 2, "return_documents": True}
    )
    assert r.status_code == 200, r.text
    top = r.json()
    assert [x["index"] for x in top] == [x["index"] for x in full[:2]]
    assert [x["text"] for x in top] == [TEXTS[x["index"]] for x in top]
    r = app_client.post(
        "/rerank", json={"query": QUERY, "texts": TEXTS, "top_k": 3, "return_text": True}
    )
    assert [x["index"] for x in r.json()] == [x["index"] for x in full[:3]]
    assert all(x["text"] == TEXTS[x["index"]] for x in r.json())
    assert (
        app_client.post("/rerank", json={"query": QUERY, "texts": TEXTS, "top_n": 0}).json() == []
    )


def test_cohere_shape_with_documents(app_client):
    full = app_client.post("/rerank", json={"query": QUERY, "texts": TEXTS}).json()
    body = {"query": QUERY, "documents": TEXTS, "top_n": 3, "return_documents": True}
    r = app_client.post("/rerank", json=body)
    assert r.status_code == 200, r.text
    res = r.json()["results"]
    assert [x["index"] for x in res] == [x["index"] for x in full[:3]]
    assert [x["relevance_score"] for x in res] == [x["score"] for x in full[:3]]
    assert [x["document"]["text"] for x in res] == [TEXTS[x["index"]] for x in res]


def test_rerank_goes_through_the_batcher(app_client):
    service = app_client.app.state.service
    before = service.metrics.ce_pairs._value.get()
    assert app_client.post("/rerank", json={"query": QUERY, "texts": TEXTS[:4]}).status_code == 200
    deadline = time.monotonic() + 5  # the batch is counted just after its scores are handed back
    while service.metrics.ce_pairs._value.get() - before < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert service.metrics.ce_pairs._value.get() - before == 4


@pytest.mark.parametrize(
    "body, loc",
    [
        ({"query": QUERY}, ["body", "texts"]),
        ({"query": QUERY, "texts": []}, ["body", "texts"]),
        ({"query": QUERY, "texts": ["a"] * 11}, ["body", "texts"]),  # --max-rerank-texts 10
        ({"query": QUERY, "texts": ["a", " "]}, ["body", "texts", 1]),
        ({"query": QUERY, "documents": ["a", ""]}, ["body", "documents", 1]),
        ({"query": QUERY, "texts": ["a", "b\ud800"]}, ["body", "texts", 1]),
        ({"query": "  ", "texts": ["a"]}, ["body", "query"]),
        ({"query": "\ud800", "texts": ["a"]}, ["body", "query"]),
        ({"query": QUERY, "texts": ["a", 3]}, ["body", "texts", "1"]),
        ({"query": QUERY, "texts": ["a"], "top_n": -1}, ["body", "top_n"]),
        ({"query": QUERY, "texts": ["a"], "colour": 1}, ["body", "colour"]),
        ({"query": QUERY, "texts": ["a"], "documents": ["b"]}, ["body", "documents"]),
    ],
)
def test_bad_rerank_input_is_422_naming_the_field(app_client, body, loc):
    data = json.dumps(body).encode()  # json.dumps writes a lone surrogate as \ud800
    r = app_client.post("/rerank", content=data, headers={"content-type": "application/json"})
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"] == loc, r.text


def test_search_hits_carry_text_with_return_documents(app_client):
    service = app_client.app.state.service
    body = {"query": QUERY, "k": 3, "budget": 10}
    plain = app_client.post("/search", json=body).json()
    assert all("text" not in row for row in plain["hits"][0]["results"])
    r = app_client.post("/search", json={**body, "return_documents": True})
    assert r.status_code == 200, r.text
    rows = r.json()["hits"][0]["results"]
    assert [row["id"] for row in rows] == [row["id"] for row in plain["hits"][0]["results"]]
    corpus = service.searcher.corpus
    by_id = dict(zip(corpus.ids, corpus.texts, strict=True))
    assert all(row["text"] == by_id[row["id"]] for row in rows)


def test_openapi_declares_the_200_schemas(app_client):
    spec = app_client.get("/openapi.json").json()
    search = spec["paths"]["/search"]["post"]["responses"]["200"]["content"]["application/json"]
    assert search["schema"] == {"$ref": "#/components/schemas/SearchResponse"}
    rerank = spec["paths"]["/rerank"]["post"]["responses"]["200"]["content"]["application/json"]
    refs = json.dumps(rerank["schema"])
    assert "RerankResult" in refs and "CohereRerankResponse" in refs
    comps = spec["components"]["schemas"]
    for name in ("SearchResponse", "SearchHits", "RerankResult", "CohereRerankResponse"):
        assert name in comps, sorted(comps)
    assert set(comps["RerankResult"]["properties"]) == {"index", "score", "text"}
    assert "/rerank" in spec["paths"] and "requestBody" in spec["paths"]["/rerank"]["post"]


def test_exact_is_refused_by_default(app_client):
    r = app_client.post("/search", json={"query": QUERY, "k": 2, "budget": 5, "exact": True})
    assert r.status_code == 403, r.text
    detail = r.json()["detail"][0]
    assert detail["loc"] == ["body", "exact"] and "--allow-exact" in detail["msg"]


def test_exact_allowed_with_the_flag_api_key_and_cors(env, tmp_path):
    key_file = tmp_path / "key"
    key_file.write_text("s3cret-key\n")
    flags = ["--allow-exact", "--api-key-file", str(key_file), "--cors", "https://a.example"]
    body = {"query": QUERY, "k": 2, "budget": 5, "exact": True}
    auth = {"Authorization": "Bearer s3cret-key"}
    with _client(env, *flags) as c:
        assert c.get("/healthz").status_code == 200  # open without a key
        assert c.get("/readyz").status_code == 200
        assert c.post("/search", json=body).status_code == 401
        r = c.post("/search", json=body, headers={"Authorization": "Bearer wrong"})
        assert r.status_code == 401 and "wrong API key" in r.text
        assert c.post("/rerank", json={"query": QUERY, "texts": ["a"]}).status_code == 401
        assert c.get("/info").status_code == 401
        r = c.post("/search", json=body, headers={**auth, "Origin": "https://a.example"})
        assert r.status_code == 200, r.text
        assert r.json()["hits"][0]["exact"]["recall"] is not None
        assert r.headers["access-control-allow-origin"] == "https://a.example"
        r = c.post("/search", json=body, headers={**auth, "Origin": "https://b.example"})
        assert "access-control-allow-origin" not in r.headers
        pre = c.options(
            "/rerank",
            headers={
                "Origin": "https://a.example",
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "authorization,content-type",
            },
        )
        assert pre.status_code == 200, pre.text


def test_no_cors_headers_and_no_key_by_default(app_client):
    r = app_client.get("/healthz", headers={"Origin": "https://a.example"})
    assert "access-control-allow-origin" not in r.headers
    assert app_client.get("/info").status_code == 200


def test_empty_api_key_file_is_one_clear_error(env, tmp_path):
    empty = tmp_path / "empty"
    empty.write_text("\n")
    with pytest.raises(ValueError, match="the file is empty"):
        _client(env, "--api-key-file", str(empty))
    with pytest.raises(ValueError, match="cannot read it"):
        _client(env, "--api-key-file", str(tmp_path / "missing"))


def test_text_and_item_jobs_share_one_batch(ce):
    """A rerank's text job and a search's item job pending together run in one worker batch,
    each with the scores the CE gives alone."""
    from crossknn.serve.batcher import Batcher

    batches = []
    b = Batcher(
        ce,
        max_batch_pairs=64,
        max_wait_s=2.0,
        active=lambda: 2,
        on_batch=lambda n, jobs, s: batches.append((n, jobs)),
    )
    try:
        items = np.arange(7)
        item_job = b.submit([QUERY], [items])
        text_job = b.submit([QUERY], None, texts=TEXTS)
        got_items = item_job.wait(30)[0]
        got_texts = text_job.wait(30)[0]
    finally:
        b.stop(5)
    assert batches == [(7 + len(TEXTS), 2)]
    np.testing.assert_allclose(got_items, ce.score_batch([QUERY], [items])[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(
        got_texts, ce.predict([(QUERY, t) for t in TEXTS]), rtol=1e-5, atol=1e-6
    )


def test_no_warmup_flag_reaches_the_config(env):
    import argparse

    p = argparse.ArgumentParser()
    add_arguments(p, "serve")
    on = serve_cmd.config_from_args(p.parse_args([env["index_dir"]]))
    off = serve_cmd.config_from_args(p.parse_args([env["index_dir"], "--no-warmup"]))
    assert on.warmup is True and off.warmup is False


def test_de_thread_flag_reaches_the_config(env):
    import argparse

    p = argparse.ArgumentParser()
    add_arguments(p, "serve")

    def de_thread(*flags):
        return serve_cmd.config_from_args(p.parse_args([env["index_dir"], *flags])).de_thread

    assert de_thread() is None  # by provider: on a GPU only
    assert de_thread("--de-thread") is True and de_thread("--no-de-thread") is False
