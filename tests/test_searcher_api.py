"""``Searcher.search``'s calling conventions on one list-based body: a query string gives one
``Hits``, a list a list; ``return_documents=False`` leaves ``texts`` empty and nothing else
changes. A tiny index built with the stand-in models (no CE model is loaded)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from crossknn import Hits, Searcher
from test_reliability_build import StubCE, StubDE, build


@pytest.fixture(scope="module")
def searcher(tmp_path_factory):
    idx = build("A", tmp_path_factory.mktemp("api") / "idx")
    return Searcher(idx, ce=StubCE(), de=StubDE())


def _same(a: Hits, b: Hits, *, texts: bool = True) -> None:
    assert (a.query, a.ids, a.ce_calls, a.qid) == (b.query, b.ids, b.ce_calls, b.qid)
    np.testing.assert_array_equal(a.indices, b.indices)
    np.testing.assert_array_equal(a.scores, b.scores)
    assert (a.texts == b.texts) if texts else (a.texts == [] and b.texts)


def test_a_string_is_a_list_of_one(searcher):
    one = searcher.search("topic 1 words", k=3, budget=8, method="axn")
    many = searcher.search(["topic 1 words", "item number 4"], k=3, budget=8, method="axn")
    assert isinstance(one, Hits) and isinstance(many, list) and len(many) == 2
    _same(one, many[0])
    assert len(one.ids) == 3 and one.texts == [searcher.corpus.texts[i] for i in one.indices]


def test_return_documents_false_only_empties_texts(searcher):
    kw = {"k": 4, "budget": 10, "method": "axn", "top_k": None}
    with_docs = searcher.search(["topic 2", "item number 7"], **kw)
    without = searcher.search(["topic 2", "item number 7"], return_documents=False, **kw)
    for a, b in zip(without, with_docs, strict=True):
        _same(a, b, texts=False)
        assert dataclasses.replace(b, texts=[]).texts == a.texts
    single = searcher.search("topic 2", return_documents=False, **kw)
    assert isinstance(single, Hits) and single.texts == []
    _same(single, with_docs[0], texts=False)


def test_bad_queries_are_refused_by_position(searcher):
    with pytest.raises(ValueError, match="query 1 is ''"):
        searcher.search(["ok", ""], k=2, budget=4)
    with pytest.raises(ValueError, match="query 0 is '  '"):
        searcher.search("  ", k=2, budget=4)


def test_a_printed_hits_shows_the_texts_it_returns(searcher):
    hits = searcher.search("topic 2", k=3, budget=8, method="axn")
    shown = repr(hits)
    assert hits.texts and all(repr(t[:40])[:-1] in shown for t in hits.texts), shown
    assert shown.startswith("Hits(query='topic 2', ids=") and "ce_calls=8" in shown
    bare = repr(searcher.search("topic 2", k=3, budget=8, method="axn", return_documents=False))
    assert "texts=" not in bare and "paid=" not in bare and "plan=" not in bare
    long = dataclasses.replace(hits, texts=["x" * 100])
    assert "'" + "x" * 57 + "...'" in repr(long)
