"""crossknn in Haystack 2 (crossknn.integrations.haystack) with the real haystack-ai, over a small
index with metadata, locally (the index folder) and through a real ``crossknn serve``: documents
come back with text, id, CE score and metadata; Haystack filters (comparisons, AND/OR/NOT, ``in``,
``None``, ``id``, the filter policy) return only allowed items and equal crossknn's own filter; a
``Pipeline`` of the retriever and the ranker, saved with ``dumps`` and loaded again, runs end to
end; a construct with no equivalent is refused in one line; without haystack-ai the import names
the extra."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

pytest.importorskip("httpx")
pytest.importorskip("fastapi")

from frameworks_fixture import (  # noqa: E402
    BUDGET,
    K,
    allowed_ids,
    direct,
    framework,
    one_line,
    source_fixtures,
)
from serve_fixture import QUERIES  # noqa: E402

haystack = framework("haystack", "haystack")

pytestmark = [pytest.mark.slow]
ALLOWED = ["crossknn.integrations.haystack"]  # Pipeline.loads' allowlist of component modules

env, server, source = source_fixtures()


def _retriever(source, **kw):
    from crossknn.integrations.haystack import CrossknnRetriever

    return CrossknnRetriever(source, **{"top_k": K, "budget": BUDGET, **kw})


def _cmp(field, op, value):
    return {"field": field, "operator": op, "value": value}


def test_documents_carry_text_id_score_and_metadata(source, env):
    import crossknn

    docs = _retriever(source).run(QUERIES[0])["documents"]
    assert [(d.id, d.score) for d in docs] == direct(source, QUERIES[0], k=K, budget=BUDGET)
    index = crossknn.open_index(env["index_dir"])
    text = dict(zip(index.corpus.ids, index.corpus.texts, strict=True))
    meta = dict(zip(index.corpus.ids, index.metadata.records(), strict=True))
    for rank, d in enumerate(docs, start=1):
        assert d.content == text[d.id] and d.meta["rank"] == rank
        if source.url is not None:  # the server sends them (return_metadata)
            assert source._sends_metadata
        assert {k: v for k, v in d.meta.items() if k != "rank"} == meta[d.id]


CASES = [
    ("comparison", _cmp("meta.lang", "==", "en"), {"lang": {"$eq": "en"}}),
    (
        "and-range-in",
        {
            "operator": "AND",
            "conditions": [_cmp("meta.year", ">", 2001), _cmp("meta.lang", "in", ["de", "fr"])],
        },
        {"$and": [{"year": {"$gt": 2001}}, {"lang": {"$in": ["de", "fr"]}}]},
    ),
    (
        "or-not-nin",
        {
            "operator": "OR",
            "conditions": [
                {"operator": "NOT", "conditions": [_cmp("meta.year", "<=", 2007)]},
                _cmp("meta.lang", "not in", ["en", "de"]),
            ],
        },
        {"$or": [{"$not": {"year": {"$lte": 2007}}}, {"lang": {"$nin": ["en", "de"]}}]},
    ),
    (
        "none-and-list",
        {
            "operator": "AND",
            "conditions": [_cmp("meta.tags", "!=", None), _cmp("meta.tags", "==", "b")],
        },
        {"$and": [{"tags": {"$exists": True}}, {"tags": {"$eq": "b"}}]},
    ),
    ("legacy-field-and-ne", _cmp("lang", "!=", "fr"), {"lang": {"$ne": "fr"}}),
]


@pytest.mark.parametrize(("name", "flt", "native"), CASES, ids=[c[0] for c in CASES])
def test_haystack_filters_equal_crossknns(source, env, name, flt, native):
    from crossknn.integrations.haystack_filters import translate

    assert translate(flt) == native
    docs = _retriever(source).run(QUERIES[1], filters=flt)["documents"]
    got = [(d.id, d.score) for d in docs]
    assert got == direct(source, QUERIES[1], k=K, budget=BUDGET, filter=native)
    allowed = allowed_ids(env["index_dir"], native)
    assert {i for i, _ in got} <= allowed and len(got) == min(K, len(allowed))


def test_ids_and_the_filter_policy(source, env):
    en = allowed_ids(env["index_dir"], {"lang": "en"})
    few = sorted(en)[:3]
    r = _retriever(source, filters=_cmp("meta.lang", "==", "en"), filter_policy="merge")
    docs = r.run(QUERIES[2], filters=_cmp("id", "in", few), top_k=2)["documents"]
    native = {"$and": [{"lang": {"$eq": "en"}}, {"id": {"$in": few}}]}
    assert [(d.id, d.score) for d in docs] == direct(
        source, QUERIES[2], k=2, budget=BUDGET, filter=native
    )
    assert {d.id for d in docs} <= set(few)
    replace = _retriever(source, filters=_cmp("meta.lang", "==", "en"))  # REPLACE: the default
    docs = replace.run(QUERIES[2], filters=_cmp("meta.lang", "==", "de"))["documents"]
    assert {d.id for d in docs} <= allowed_ids(env["index_dir"], {"lang": "de"})
    assert [d.id for d in asyncio.run(replace.run_async(QUERIES[2]))["documents"]] == [
        d.id for d in replace.run(QUERIES[2])["documents"]
    ]


@pytest.mark.parametrize("kind", ["local", "server"])
def test_a_saved_pipeline_runs_end_to_end(kind, env, server, monkeypatch):
    from haystack import Pipeline

    from crossknn.integrations.haystack import CrossknnRanker, CrossknnRetriever

    monkeypatch.setenv("CROSSKNN_API_KEY", "never-written-out")
    where = server.url if kind == "server" else str(env["index_dir"])
    pipe = Pipeline()
    pipe.add_component(
        "retriever",
        CrossknnRetriever(where, top_k=K, budget=BUDGET, filters=_cmp("meta.year", ">=", 2002)),
    )
    pipe.add_component("ranker", CrossknnRanker(where, top_k=3))
    pipe.connect("retriever.documents", "ranker.documents")
    saved = pipe.dumps()
    assert "never-written-out" not in saved and "CROSSKNN_API_KEY" in saved
    loaded = Pipeline.loads(saved, allowed_modules=ALLOWED)
    assert loaded.to_dict() == pipe.to_dict()
    flt = {"operator": "AND", "conditions": [_cmp("meta.lang", "==", "de")]}  # replaces year
    out = loaded.run(
        {"retriever": {"query": QUERIES[3], "filters": flt}, "ranker": {"query": QUERIES[3]}}
    )
    docs = out["ranker"]["documents"]
    assert len(docs) == 3 and [d.score for d in docs] == sorted(
        (d.score for d in docs), reverse=True
    )
    assert {d.id for d in docs} <= allowed_ids(env["index_dir"], {"lang": "de"})
    # the ranker's CE scores of the retrieved documents are the retriever's own scores
    retrieved = loaded.get_component("retriever").run(QUERIES[3], filters=flt)["documents"]
    best = sorted(retrieved, key=lambda d: -d.score)[:3]
    assert [d.id for d in docs] == [d.id for d in best]
    assert [d.score for d in docs] == pytest.approx([d.score for d in best], abs=1e-4)
    r = CrossknnRetriever.from_dict(pipe.get_component("retriever").to_dict())
    assert r.to_dict() == pipe.get_component("retriever").to_dict()


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        (_cmp("content", "==", "a date"), "the Document field 'content'"),
        (_cmp("meta.lang", "like", "e%"), "unknown operator 'like'"),
        (_cmp("meta.year", ">", None), "> None has no crossknn equivalent"),
        ({"operator": "XOR", "conditions": []}, "got operator 'XOR'"),
    ],
)
def test_a_construct_with_no_equivalent_is_refused_in_one_line(source, bad, says):
    with pytest.raises(ValueError) as err:
        _retriever(source).run(QUERIES[0], filters=bad)
    assert says in one_line(err.value) and one_line(err.value).startswith("Haystack filter ")
    with pytest.raises(ValueError, match="the Document field 'content'"):
        _retriever(source, filters=_cmp("content", "==", "x"))  # refused at init too


def test_only_a_folder_or_a_url_is_saved(source):
    objects = [source] if source.url is not None else [source, source.searcher]
    for obj in objects:  # a Source, a Searcher: objects, not a place to open again
        with pytest.raises(TypeError, match="cannot be saved; give the component an index folder"):
            _retriever(obj).to_dict()
    where = source.url or str(source.where)
    assert _retriever(where).to_dict()["init_parameters"]["source"] == where


def test_without_haystack_the_import_names_the_extra():
    code = (
        "import sys; sys.modules['haystack'] = None\n"
        "try:\n    import crossknn.integrations.haystack\n"
        "except ImportError as e:\n    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == (
        "crossknn.integrations.haystack needs the haystack extra: pip install 'crossknn[haystack]'"
    )
