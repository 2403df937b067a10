"""crossknn.pyterrier with the real PyTerrier: the retriever and the re-ranker (its input ranking
as the first stage), their columns and CE calls, filters, ``bm25 >> reranker`` in pt.Experiment,
and ``CrossknnReranker(method="gar")`` equal to ``pyterrier_adaptive.GAR`` over the same CE,
corpus graph and BM25 ranking (a stand-in CE over a small built index; no Java)."""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest

from crossknn.corpus_folder import open_index
from crossknn.searcher import Searcher
from lifecycle_stubs import StubCE, StubDE, build, corpus, queries
from shared_fixtures import lazy_importorskip


def _need(name: str):
    if importlib.util.find_spec(name) is None and os.environ.get("CI", "").lower() in {
        "1",
        "true",
        "yes",
    }:
        pytest.fail(f"{name} is not installed; CI runs the PyTerrier tests", pytrace=False)
    return lazy_importorskip(name)


pt = _need("pyterrier")
pta = _need("pyterrier_adaptive")
pd = _need("pandas")


class Recording(StubCE):
    def __init__(self):
        super().__init__()
        self.pairs = []

    def score_batch(self, queries, items_list):
        for q, its in zip(queries, items_list, strict=True):
            self.pairs += [(q, int(i)) for i in np.asarray(its).ravel()]
        return super().score_batch(queries, items_list)


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("pt") / "idx"
    build(out, corpus(400), rows=4)
    return out


@pytest.fixture
def searcher(index_dir):
    return Searcher(open_index(index_dir), ce=Recording(), de=StubDE())


@pytest.fixture(scope="module")
def topics():
    qs = queries(6, seed=7)
    return pd.DataFrame({"qid": [f"q{i}" for i in range(len(qs))], "query": qs})


def test_retriever_columns_calls_and_equal_to_searcher(searcher, topics):
    from crossknn.pyterrier import CrossknnRetriever

    res = CrossknnRetriever(searcher, budget=40, k=5).transform(topics)
    assert list(res.columns) == ["qid", "query", "docno", "score", "rank", "ce_calls"]
    assert res.groupby("qid").size().tolist() == [5] * len(topics)
    assert (res.ce_calls <= 40).all() and (res.ce_calls > 0).all()
    hits = searcher.search(list(topics["query"]), k=5, budget=40, query_ids=list(topics.qid))
    for h in hits:
        got = res[res.qid == h.qid]
        assert got.docno.tolist() == h.ids and got["rank"].tolist() == list(range(5))
        np.testing.assert_allclose(got.score, h.scores, rtol=1e-6)
    # a filter: only allowed items are scored or returned
    allowed = {f"d{i}" for i in range(0, 400, 3)}
    searcher.ce.pairs.clear()
    res = CrossknnRetriever(searcher, budget=40, k=5, ids=sorted(allowed)).transform(topics)
    assert set(res.docno) <= allowed
    assert {searcher.corpus.ids[i] for _, i in searcher.ce.pairs} <= allowed


def test_gar_reranker_equals_pyterrier_adaptive(searcher, topics, tmp_path):
    from crossknn.pyterrier import Bm25, CrossknnReranker, CrossknnScorer, corpus_graph

    bm25 = Bm25(searcher, num_results=100)
    first = bm25.transform(topics)
    assert (first.groupby("qid").size() > 0).all()
    budget = 30
    ours = CrossknnReranker(searcher, method="gar", budget=budget).transform(first)
    assert (ours.ce_calls == budget).all()
    scorer = CrossknnScorer(searcher)
    graph = corpus_graph(searcher, tmp_path / "graph")
    ref = pta.GAR(scorer, graph, num_results=budget, batch_size=16, backfill=False)(first)
    assert scorer.calls == budget * len(topics)
    for qid in topics.qid:
        mine, theirs = ours[ours.qid == qid], ref[ref.qid == qid]
        assert set(mine.docno) == set(theirs.docno), qid
        # the graph took GAR beyond BM25's list for some query
    assert not set(ours.docno) <= set(first.docno)
    # the same CE scores, the same order
    merged = ours.merge(ref, on=["qid", "docno"], suffixes=("", "_ref"))
    np.testing.assert_allclose(merged.score, merged.score_ref, rtol=1e-6)


def test_rnr_reranker_is_the_ce_order_of_the_input_top_b(searcher, topics):
    from crossknn.pyterrier import Bm25, CrossknnReranker

    first = Bm25(searcher, num_results=50).transform(topics)
    out = CrossknnReranker(searcher, method="rnr", budget=20, k=10).transform(first)
    ce = StubCE()
    ce.set_items(searcher.corpus.texts)
    pos = {d: i for i, d in enumerate(searcher.corpus.ids)}
    for qid, q in zip(topics.qid, topics["query"], strict=True):
        top = first[first.qid == qid].sort_values("rank").docno.tolist()[:20]
        idx = np.asarray([pos[d] for d in top])
        s = ce.score(q, idx)
        want = [top[i] for i in np.lexsort((idx, -s))[:10]]  # equal scores: the smaller item
        got = out[out.qid == qid]
        assert got.docno.tolist() == want and (got.ce_calls == min(20, len(top))).all()


def test_reranker_filter_duplicates_and_unknown_docnos(searcher):
    from crossknn.pyterrier import CrossknnReranker

    q = queries(1, seed=3)[0]
    docs = [f"d{i}" for i in range(60)] + ["not-an-item"]
    ranking = pd.DataFrame(
        {
            "qid": ["a"] * len(docs) + ["b"] * len(docs),
            "query": [q] * (2 * len(docs)),  # two qids, one query text
            "docno": docs + docs[::-1],
            "rank": list(range(len(docs))) * 2,
        }
    )
    even = [f"d{i}" for i in range(0, 400, 2)]
    searcher.ce.pairs.clear()
    out = CrossknnReranker(searcher, method="auto", budget=24, ids=even).transform(ranking)
    assert set(out.qid) == {"a", "b"} and set(out.docno) <= set(even)
    assert {searcher.corpus.ids[i] for _, i in searcher.ce.pairs} <= set(even)
    assert out.groupby("qid").ce_calls.max().tolist() == [24, 24]


def test_pipeline_in_pt_experiment(searcher, topics):
    from crossknn.pyterrier import Bm25, CrossknnReranker, CrossknnRetriever

    bm25 = Bm25(searcher, num_results=100)
    first = bm25.transform(topics)
    # qrels: BM25's 3rd and 4th items of each query are the relevant ones
    rel = first[first["rank"].isin([2, 3])]
    qrels = pd.DataFrame({"qid": rel.qid, "docno": rel.docno, "label": 1})
    systems = [
        bm25 >> CrossknnReranker(searcher, method=m, budget=30) for m in ("rnr", "gar", "auto")
    ]
    systems.append(CrossknnRetriever(searcher, budget=30, k=10))
    from ir_measures import nDCG

    table = pt.Experiment(
        systems, topics, qrels, [nDCG @ 10], names=["rnr", "gar", "auto", "crossknn"]
    )
    assert table.name.tolist() == ["rnr", "gar", "auto", "crossknn"]
    assert table["nDCG@10"].between(0, 1).all()


def test_build_writes_the_corpus_graph(index_dir, tmp_path):
    from crossknn.corpus.edit import add_items
    from crossknn.search.graph import GRAPH_ARRAY, graph_of_index, knn_graph

    index = open_index(index_dir)
    V = np.asarray(index["de_items"], np.float32)
    G = index.arrays[GRAPH_ARRAY]
    assert G.dtype == np.int64 and G.shape == (400, 16)
    np.testing.assert_array_equal(G, knn_graph(V, 16))
    assert graph_of_index(index) is not None and index.params["gar_graph"]["k"] == 16
    np.testing.assert_array_equal(graph_of_index(index), G)
    # items added since the build: the stored graph no longer matches, one is made anew
    out = tmp_path / "idx"
    build(out, corpus(120), rows=2)
    add_items(out, corpus(5, prefix="n"), ce=StubCE(), de=StubDE(), progress=False)
    grown = open_index(out)
    V2 = np.asarray(grown["de_items"], np.float32)
    assert V2.shape[0] == 125
    np.testing.assert_array_equal(graph_of_index(grown), knn_graph(V2, 16))


def test_retriever_runs_gar_from_the_registry(searcher, topics):
    from crossknn.pyterrier import CrossknnRetriever

    res = CrossknnRetriever(searcher, method="gar", budget=48, k=5).transform(topics)
    assert (res.ce_calls == 48).all() and res.groupby("qid").size().tolist() == [5] * 6
    assert (res.groupby("qid").score.diff().dropna() <= 0).all()
    assert len(searcher.ce.pairs) == 48 * len(topics) == len(set(searcher.ce.pairs))


def test_searcher_reads_the_graph_build_wrote(index_dir, monkeypatch):
    """``Searcher`` hands gar the index's stored corpus graph: no k-NN graph is computed."""
    import crossknn.search.graph as graph_mod
    import crossknn.search.registry as registry_mod

    def refuse(*_a, **_k):
        raise AssertionError("the corpus graph was computed again")

    monkeypatch.setattr(graph_mod, "graph_for", refuse)
    monkeypatch.setattr(registry_mod, "graph_for", refuse)
    s = Searcher(open_index(index_dir), ce=Recording(), de=StubDE())
    (hits,) = s.search(queries(1, seed=3), k=5, budget=32, method="gar")
    assert hits.ce_calls == 32 and len(hits.ids) == 5
