"""crossknn in LangChain (crossknn.integrations.langchain) with the real langchain-core, over a
small index with metadata, locally (the index folder) and through a real ``crossknn serve``:
documents come back with text, id, CE score and metadata; a filter in LangChain's idioms (the
vector stores' dict, the self-query IR) returns only allowed items and equals crossknn's own
filter; an LCEL chain ``retriever | format`` and the reranker run end to end; a construct with
no equivalent is refused in one line; without langchain-core the import names the extra."""

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

sq = framework("langchain_core.structured_query", "langchain")

pytestmark = [pytest.mark.slow]

env, server, source = source_fixtures()


def _retriever(source, **search_kwargs):
    from crossknn.integrations.langchain import CrossknnRetriever

    return CrossknnRetriever(
        source=source, search_kwargs={"k": K, "budget": BUDGET, **search_kwargs}
    )


def test_documents_carry_text_id_score_and_metadata(source, env):
    import crossknn

    docs = _retriever(source).invoke(QUERIES[0])
    assert [(d.id, d.metadata["score"]) for d in docs] == direct(
        source, QUERIES[0], k=K, budget=BUDGET
    )
    index = crossknn.open_index(env["index_dir"])
    text = dict(zip(index.corpus.ids, index.corpus.texts, strict=True))
    meta = dict(zip(index.corpus.ids, index.metadata.records(), strict=True))
    for rank, d in enumerate(docs, start=1):
        assert d.page_content == text[d.id] and d.metadata["id"] == d.id
        assert d.metadata["rank"] == rank
        if source.url is not None:  # the server sends them (return_metadata)
            assert source._sends_metadata
        assert {k: d.metadata[k] for k in meta[d.id]} == meta[d.id]
        assert "lang" in d.metadata and "year" in d.metadata


@pytest.mark.parametrize(
    ("langchain_filter", "native"),
    [
        ({"lang": "en"}, {"lang": "en"}),
        (
            {"$and": [{"lang": {"$in": ["de", "fr"]}}, {"year": {"$between": [2002, 2006]}}]},
            {"$and": [{"lang": {"$in": ["de", "fr"]}}, {"year": {"$gte": 2002, "$lte": 2006}}]},
        ),
        (
            {"year": {"$not": {"$gt": 2004}}, "tags": "b"},
            {"$not": {"year": {"$gt": 2004}}, "tags": "b"},
        ),
    ],
)
def test_a_langchain_dict_filter_equals_crossknns(source, env, langchain_filter, native):
    docs = _retriever(source, filter=langchain_filter).invoke(QUERIES[1])
    got = [(d.id, d.metadata["score"]) for d in docs]
    assert got == direct(source, QUERIES[1], k=K, budget=BUDGET, filter=native)
    assert got and {i for i, _ in got} <= allowed_ids(env["index_dir"], native)


def test_the_self_query_ir_and_per_call_keywords(source, env):
    from crossknn.integrations.langchain import CrossknnTranslator

    ir = sq.Operation(
        operator=sq.Operator.OR,
        arguments=[
            sq.Comparison(comparator=sq.Comparator.EQ, attribute="lang", value="fr"),
            sq.Operation(
                operator=sq.Operator.NOT,
                arguments=[
                    sq.Comparison(comparator=sq.Comparator.LT, attribute="year", value=2008)
                ],
            ),
        ],
    )
    native = {"$or": [{"lang": {"$eq": "fr"}}, {"$not": {"year": {"$lt": 2008}}}]}
    query, kwargs = CrossknnTranslator().visit_structured_query(
        sq.StructuredQuery(query=QUERIES[2], filter=ir)
    )
    assert kwargs == {"filter": native}
    r = _retriever(source)
    docs = r.invoke(query, filter=ir, k=3)  # keywords of invoke override search_kwargs
    assert [(d.id, d.metadata["score"]) for d in docs] == direct(
        source, QUERIES[2], k=3, budget=BUDGET, filter=native
    )
    assert {d.id for d in docs} <= allowed_ids(env["index_dir"], native)


def test_ainvoke_and_batch_equal_invoke(source):
    r = _retriever(source, filter={"lang": "de"})
    one = [d.id for d in r.invoke(QUERIES[3])]
    assert [d.id for d in asyncio.run(r.ainvoke(QUERIES[3]))] == one
    batch = r.batch(QUERIES[3:5])
    assert [d.id for d in batch[0]] == one and len(batch[1]) == K


def test_an_lcel_chain_and_the_reranker_run_end_to_end(source):
    from crossknn.integrations.langchain import CrossknnReranker

    r = _retriever(source, filter={"lang": "en"})
    chain = r | (lambda docs: "\n".join(f"{d.id}: {d.page_content[:30]}" for d in docs))
    text = chain.invoke(QUERIES[0])
    docs = r.invoke(QUERIES[0])
    assert text.splitlines()[0].startswith(docs[0].id + ": ") and len(text.splitlines()) == K
    reranker = CrossknnReranker(source=source, top_n=2)
    top = reranker.compress_documents(docs, QUERIES[4])
    scores = [d.metadata["relevance_score"] for d in top]
    assert len(top) == 2 and scores == sorted(scores, reverse=True)
    assert top[0].metadata["lang"] == "en" if source.url is None else True
    # every document's CE score against the query: the same as the retriever's own scores
    same = reranker.compress_documents(docs, QUERIES[0])
    for d in same:
        assert d.metadata["relevance_score"] == pytest.approx(d.metadata["score"], abs=1e-4)
    again = asyncio.run(reranker.acompress_documents(docs, QUERIES[4]))
    assert [d.id for d in again] == [d.id for d in top]


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        ({"lang": {"$like": "e%"}}, "filter.lang.$like: $like (pattern matching)"),
        ({"$or": [{"lang": "en"}, {"title": {"$contains": "date"}}]}, "$contains (substring"),
        (lambda meta: meta["lang"] == "en", "a callable filter"),
    ],
)
def test_a_construct_with_no_equivalent_is_refused_in_one_line(source, bad, says):
    with pytest.raises(ValueError) as err:
        _retriever(source, filter=bad).invoke(QUERIES[0])
    assert says in one_line(err.value) and "no crossknn equivalent" in str(err.value)
    ir = sq.Comparison(comparator=sq.Comparator.LIKE, attribute="lang", value="e")
    with pytest.raises(ValueError, match="Comparator.LIKE"):
        _retriever(source, filter=ir).invoke(QUERIES[0])


def test_without_langchain_the_import_names_the_extra_and_crossknn_imports_none():
    code = (
        "import sys; import crossknn, crossknn.integrations, crossknn.integrations.source\n"
        "assert not [m for m in sys.modules if m.split('.')[0] in "
        "('langchain_core', 'llama_index', 'haystack')], 'a framework was imported'\n"
        "sys.modules['langchain_core'] = None\n"
        "try:\n    import crossknn.integrations.langchain\n"
        "except ImportError as e:\n    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == (
        "crossknn.integrations.langchain needs the langchain extra: "
        "pip install 'crossknn[langchain]'"
    )


def test_a_servers_metadata_is_asked_for_once_it_has_the_field(server, monkeypatch):
    """A server whose /search takes ``return_metadata`` (its /openapi.json says so) is asked for
    each result's metadata, and one without the field is not (today's crossknn serve)."""
    import httpx

    from crossknn.integrations import source as src

    spec = httpx.get(server.url + "/openapi.json", timeout=30).json()
    takes = src._takes_metadata(spec)  # False until crossknn serve has the field
    monkeypatch.setattr(src, "METADATA_FIELD", "return_documents")  # a field it has
    assert src._takes_metadata(spec) is True
    monkeypatch.undo()
    s = src.Source(server.url)
    items = s.search(QUERIES[0], k=2, budget=BUDGET)
    assert s._sends_metadata is takes and len(items) == 2
    assert all(("lang" in it.metadata) is takes for it in items)  # every item has a lang
    s.close()
    row = {"id": "d1", "score": 0.5, "text": "t", "metadata": {"lang": "en"}, "new_field": 1}
    answer = {"hits": [{"results": [row], "stopped": True}], "target_recall": 0.9}
    (item,) = src.remote_items(answer)  # fields this code does not know are left alone
    assert (item.id, item.score, item.rank, item.metadata) == ("d1", 0.5, 1, {"lang": "en"})
