"""crossknn in LlamaIndex (crossknn.integrations.llamaindex) with the real llama-index-core, over
a small index with metadata, locally (the index folder) and through a real ``crossknn serve``:
``NodeWithScore`` come back with text, id, CE score and metadata; ``MetadataFilters`` (every
operator with a meaning here, AND/OR/NOT, nested) return only allowed items and equal crossknn's
own filter; a ``RetrieverQueryEngine`` with ``response_mode="no_text"`` and the reranker runs end
to end with no LLM called; a construct with no equivalent is refused in one line; without
llama-index-core the import names the extra."""

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

vs = framework("llama_index.core.vector_stores", "llamaindex")

pytestmark = [pytest.mark.slow]

env, server, source = source_fixtures()


def _f(key, value, op="=="):
    return vs.MetadataFilter(key=key, value=value, operator=vs.FilterOperator(op))


def _retriever(source, filters=None, **kw):
    from crossknn.integrations.llamaindex import CrossknnRetriever

    return CrossknnRetriever(source, similarity_top_k=K, budget=BUDGET, filters=filters, **kw)


def test_nodes_carry_text_id_score_and_metadata(source, env):
    import crossknn

    nodes = _retriever(source).retrieve(QUERIES[0])
    assert [(n.node.node_id, n.score) for n in nodes] == direct(
        source, QUERIES[0], k=K, budget=BUDGET
    )
    index = crossknn.open_index(env["index_dir"])
    text = dict(zip(index.corpus.ids, index.corpus.texts, strict=True))
    meta = dict(zip(index.corpus.ids, index.metadata.records(), strict=True))
    for rank, n in enumerate(nodes, start=1):
        assert n.node.get_content() == text[n.node.node_id] and n.node.metadata["rank"] == rank
        if source.url is not None:  # the server sends them (return_metadata)
            assert source._sends_metadata
        assert {k: v for k, v in n.node.metadata.items() if k != "rank"} == meta[n.node.node_id]


CASES = [
    ("eq", lambda: vs.MetadataFilters(filters=[_f("lang", "en")]), {"lang": {"$eq": "en"}}),
    (
        "ranges-or",
        lambda: vs.MetadataFilters(
            filters=[_f("year", 2007, ">="), _f("year", 2001, "<")], condition="or"
        ),
        {"$or": [{"year": {"$gte": 2007}}, {"year": {"$lt": 2001}}]},
    ),
    (
        "in-nin-ne",
        lambda: vs.MetadataFilters(
            filters=[
                _f("lang", ["de", "fr"], "in"),
                _f("year", [2002, 2005], "nin"),
                _f("lang", "fr", "!="),
            ]
        ),
        {
            "$and": [
                {"lang": {"$in": ["de", "fr"]}},
                {"year": {"$nin": [2002, 2005]}},
                {"lang": {"$ne": "fr"}},
            ]
        },
    ),
    (
        "list-any-all-contains",
        lambda: vs.MetadataFilters(
            filters=[
                _f("tags", ["b", "z"], "any"),
                _f("tags", ["a", "b"], "all"),
                _f("tags", "a", "contains"),
            ]
        ),
        {
            "$and": [
                {"tags": {"$in": ["b", "z"]}},
                {"$and": [{"tags": "a"}, {"tags": "b"}]},
                {"tags": "a"},
            ]
        },
    ),
    (
        "nested-not",
        lambda: vs.MetadataFilters(
            filters=[
                _f("year", 2003, ">"),
                vs.MetadataFilters(filters=[_f("lang", "en"), _f("lang", "de")], condition="not"),
            ]
        ),
        {
            "$and": [
                {"year": {"$gt": 2003}},
                {"$not": {"$or": [{"lang": {"$eq": "en"}}, {"lang": {"$eq": "de"}}]}},
            ]
        },
    ),
    (
        "is-empty",
        lambda: vs.MetadataFilters(filters=[_f("lang", None, "is_empty")]),
        {"lang": {"$exists": False}},
    ),
]


@pytest.mark.parametrize(("name", "make", "native"), CASES, ids=[c[0] for c in CASES])
def test_metadata_filters_equal_crossknns(source, env, name, make, native):
    from crossknn.integrations.llamaindex_filters import translate

    filters = make()
    assert translate(filters, source.fields) == native
    nodes = _retriever(source, filters).retrieve(QUERIES[1])
    got = [(n.node.node_id, n.score) for n in nodes]
    assert got == direct(source, QUERIES[1], k=K, budget=BUDGET, filter=native)
    allowed = allowed_ids(env["index_dir"], native)
    assert {i for i, _ in got} <= allowed and len(got) == min(K, len(allowed))


def test_aretrieve_equals_retrieve(source):
    r = _retriever(source, vs.MetadataFilters(filters=[_f("lang", "fr")]))
    assert [n.node.node_id for n in asyncio.run(r.aretrieve(QUERIES[2]))] == [
        n.node.node_id for n in r.retrieve(QUERIES[2])
    ]


def test_a_query_engine_with_no_text_and_the_reranker_runs_end_to_end(source, env, monkeypatch):
    from llama_index.core import Settings
    from llama_index.core.llms import MockLLM
    from llama_index.core.query_engine import RetrieverQueryEngine

    from crossknn.integrations.llamaindex import CrossknnReranker

    # no LLM: "no_text" never calls one, but LlamaIndex resolves Settings.llm when it builds
    # the synthesizer (its default is OpenAI's); MockLLM is LlamaIndex's own "no LLM"
    monkeypatch.setattr(Settings, "_llm", MockLLM())
    r = _retriever(source, vs.MetadataFilters(filters=[_f("lang", "en")]))
    engine = RetrieverQueryEngine.from_args(
        r, response_mode="no_text", node_postprocessors=[CrossknnReranker(source, top_n=3)]
    )
    resp = engine.query(QUERIES[3])
    assert resp.response in (None, "")
    got = [(n.node.node_id, n.score) for n in resp.source_nodes]
    assert len(got) == 3 and [s for _, s in got] == sorted((s for _, s in got), reverse=True)
    # the reranker's CE scores of the retrieved nodes are the retriever's own scores
    retrieved = {n.node.node_id: n.score for n in r.retrieve(QUERIES[3])}
    for i, s in got:
        assert s == pytest.approx(retrieved[i], abs=1e-4)
    assert {i for i, _ in got} <= allowed_ids(env["index_dir"], {"lang": "en"})


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (
            lambda: vs.MetadataFilters(filters=[_f("lang", "e", "text_match")]),
            "FilterOperator.TEXT_MATCH",
        ),
        (
            lambda: vs.MetadataFilters(filters=[_f("lang", "e", "contains")]),
            "CONTAINS on a string field",
        ),
        (
            lambda: vs.MetadataFilters(filters=[_f("tags", None, "is_empty")]),
            "IS_EMPTY on a list field",
        ),
    ],
)
def test_a_construct_with_no_equivalent_is_refused_in_one_line(source, make, says):
    with pytest.raises(ValueError) as err:
        _retriever(source, make()).retrieve(QUERIES[0])
    assert says in one_line(err.value) and "no crossknn equivalent" in str(err.value)


def test_without_llama_index_the_import_names_the_extra():
    code = (
        "import sys; sys.modules['llama_index'] = None\n"
        "try:\n    import crossknn.integrations.llamaindex\n"
        "except ImportError as e:\n    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == (
        "crossknn.integrations.llamaindex needs the llamaindex extra: "
        "pip install 'crossknn[llamaindex]'"
    )
