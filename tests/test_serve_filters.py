"""Filters over HTTP and removed items served as a mask (issue 53): a real ``crossknn serve``
over a small index whose items carry metadata. ``/search`` with ``filter`` and ``ids`` scores and
returns only allowed items; a bad filter is a 422 that points at it; and after ``crossknn remove``
commits a removal of most items, the next version is swapped in within the watch interval and no
removed id comes back, every answer holding min(k, live) hits (the old check search came back
short and refused the version, so the removed items kept being served)."""

from __future__ import annotations

import time

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

import crossknn  # noqa: E402
from crossknn.cli import main  # noqa: E402
from crossknn.data import Corpus  # noqa: E402
from serve_fixture import QUERIES, Server, index_env  # noqa: E402

pytestmark = [pytest.mark.slow]

N_ITEMS = 80
LANGS = ("en", "de", "fr", "es")


@pytest.fixture(scope="module")
def env(model_env, tmp_path_factory):
    from crossknn.demo_corpus import stdlib_docstrings

    docs = stdlib_docstrings(max_items=N_ITEMS)
    meta = [{"lang": LANGS[i % 4], "year": 2000 + i % 20} for i in range(len(docs))]
    corpus = Corpus(docs.ids, docs.texts, "filters", meta)
    return index_env(tmp_path_factory, "filters", corpus, index_calls=2 * len(docs))


def _search(server: Server, **body):
    body = {"k": 5, "budget": 20, **body}
    return httpx.post(server.url + "/search", json=body, headers=server.headers, timeout=120)


def _ids(r) -> list[set]:
    return [{x["id"] for x in h["results"]} for h in r.json()["hits"]]


def test_filters_and_ids_over_http(env):
    index = crossknn.open_index(env["index_dir"])
    recs = index.metadata.records()
    en_recent = {
        i
        for i, m in zip(index.corpus.ids, recs, strict=True)
        if m["lang"] == "en" and m["year"] >= 2010
    }
    server = Server(env["index_dir"], logs=env["root"])
    try:
        info = httpx.get(server.url + "/info", timeout=30).json()
        assert info["index"]["metadata_fields"] == {"lang": "string", "year": "number"}
        flt = {"lang": "en", "year": {"$gte": 2010}}
        r = _search(server, queries=QUERIES[:3], filter=flt)
        assert r.status_code == 200, r.text
        for got, h in zip(_ids(r), r.json()["hits"], strict=True):
            assert got <= en_recent and len(got) == 5
            assert h["allowed"] == len(en_recent)
        few = sorted(index.corpus.ids)[:3]
        r = _search(server, query=QUERIES[0], ids=few)
        assert r.status_code == 200 and _ids(r)[0] == set(few)
        assert r.json()["hits"][0]["ce_calls"] == 3  # every allowed item, once: exact
        for body, loc, msg in (
            ({"filter": {"lang2": "en"}}, ["body", "filter", "lang2"], "unknown field 'lang2'"),
            (
                {"filter": {"year": {"$gte": "2010"}}},
                ["body", "filter", "year", "$gte"],
                "expected a number",
            ),
            (
                {"filter": {"lang": {"$regex": "e"}}},
                ["body", "filter", "lang", "$regex"],
                "unknown operator",
            ),
            ({"filter": "en"}, ["body", "filter"], "dictionary"),
            ({"ids": "d1"}, ["body", "ids"], "list"),
        ):
            r = _search(server, query=QUERIES[0], **body)
            assert r.status_code == 422, (body, r.status_code, r.text)
            detail = r.json()["detail"][0]
            assert detail["loc"] == loc and msg in detail["msg"], (body, detail)
    finally:
        server.stop()


def test_a_committed_removal_is_served_and_no_removed_id_comes_back(env, tmp_path):
    import shutil

    idx = tmp_path / "idx"
    shutil.copytree(env["index_dir"], idx)
    server = Server(idx, "--watch-index", "0.3", logs=tmp_path)
    try:
        assert _search(server, query=QUERIES[0]).json()["index_version"] == 1
        ids = crossknn.open_index(idx).corpus.ids
        removed = [i for j, i in enumerate(ids) if j % 5]  # 80% of the items
        live = len(ids) - len(removed)
        (tmp_path / "rm.txt").write_text("\n".join(removed) + "\n")
        assert (
            main(["remove", str(idx), "--ids", str(tmp_path / "rm.txt"), "--compact-at", "1"]) == 0
        )
        t0 = time.monotonic()
        while time.monotonic() - t0 < 60:
            r = httpx.get(server.url + "/info", timeout=30).json()
            if r["index"]["version"] == 2:
                break
            time.sleep(0.2)
        info = httpx.get(server.url + "/info", timeout=30).json()
        assert info["index"]["version"] == 2, info.get("reload")
        assert info["index"]["removed_items"] == len(removed)
        for k, budget in ((5, 20), (10, 10), (40, 40)):
            r = _search(server, queries=QUERIES, k=k, budget=budget)
            assert r.status_code == 200 and r.json()["index_version"] == 2
            for got in _ids(r):
                assert not got & set(removed)
                assert len(got) == min(k, live)
    finally:
        server.stop()
