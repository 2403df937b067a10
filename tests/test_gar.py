"""GAR (crossknn.search.gar) and its corpus graph (crossknn.search.graph): the items it scores equal
those of the real ``pyterrier_adaptive.GAR`` on the same initial ranking, graph, batch size and
budget (a random matrix here, cisi-minilm's test queries with the data), and the product's
contract: at most B CE calls, each item once, one CE batch per step, allow masks honoured."""

from __future__ import annotations

import importlib.util
import json
import os

import numpy as np
import pytest

from crossknn.retrievers import DenseRetriever
from crossknn.scorers import MatrixScorer
from crossknn.search import make_method
from crossknn.search.gar import GAR
from crossknn.search.graph import graph_for, knn_graph
from crossknn.search.registry import available, get
from shared_fixtures import lazy_importorskip


def _need(name: str):
    if importlib.util.find_spec(name) is None and os.environ.get("CI", "").lower() in {
        "1",
        "true",
        "yes",
    }:
        pytest.fail(f"{name} is not installed; CI runs the GAR reference tests", pytrace=False)
    return lazy_importorskip(name)


pt = _need("pyterrier")
pta = _need("pyterrier_adaptive")


class CountingScorer(MatrixScorer):
    """A matrix CE that records every score_batch call."""

    def __init__(self, scores):
        super().__init__(scores)
        self.calls: list[list[np.ndarray]] = []

    def score_batch(self, queries, items):
        self.calls.append([np.asarray(i).copy() for i in items])
        return super().score_batch(queries, items)


def _synthetic(n_items=600, n_queries=12, d=24, seed=3):
    rng = np.random.default_rng(seed)
    items = rng.normal(size=(n_items, d)).astype(np.float32)
    queries = rng.normal(size=(n_queries, d)).astype(np.float32)
    # a CE that agrees with the DE only in part: the graph has something to find
    ce = (queries @ items.T + 2.0 * rng.normal(size=(n_queries, n_items))).astype(np.float32)
    return items, queries, ce


@pytest.fixture(scope="module")
def synthetic():
    return _synthetic()


def reference_batches(scores, graph, initial, budget, b, tmp_path):
    """``pyterrier_adaptive.GAR`` on the same inputs: the items each query scored, as a list of
    sets (one per scoring batch, in order)."""
    import pandas as pd
    from npids import Lookup

    n = scores.shape[1]
    width = len(str(n - 1))
    docnos = [str(i).zfill(width) for i in range(n)]  # equal width: string order = item order
    folder = tmp_path / "graph"
    if not folder.exists():
        folder.mkdir()
        with Lookup.builder(folder / "docnos.npids") as build:
            for d in docnos:
                build.add(d)
        (folder / "edges.u32.np").write_bytes(graph.astype(np.uint32).tobytes())
        (folder / "weights.f16.np").write_bytes(np.zeros(graph.shape, np.float16).tobytes())
        meta = {"type": "corpus_graph", "format": "np_topk", "doc_count": n, "k": graph.shape[1]}
        (folder / "pt_meta.json").write_text(json.dumps(meta))
    corpus_graph = pta.NpTopKCorpusGraph(folder)

    class MatrixCE(pt.Transformer):
        def transform(self, df):
            df = df.copy()
            pairs = zip(df.qid, df.docno, strict=True)
            df["score"] = [float(scores[int(q), int(d)]) for q, d in pairs]
            return df

    rows = [
        {"qid": str(q), "query": "q", "docno": docnos[i], "score": float(budget - r), "rank": r}
        for q, items in initial.items()
        for r, i in enumerate(items)
    ]
    ref = pta.GAR(MatrixCE(), corpus_graph, num_results=budget, batch_size=b, backfill=False)
    out = ref(pd.DataFrame(rows))
    batches = {}
    for q in initial:
        got = out[out.qid == str(q)]
        batches[q] = [
            {int(d) for d in got.docno[got.iteration == it]} for it in sorted(set(got.iteration))
        ]
    return batches


def ours_batches(res, j, b):
    items = res.scored_items[j].tolist()
    return [set(items[lo : lo + b]) for lo in range(0, len(items), b)]


@pytest.mark.parametrize(("budget", "b"), [(40, 16), (100, 16), (64, 5)])
def test_gar_equals_pyterrier_adaptive_random_matrix(synthetic, budget, b, tmp_path):
    items, queries, ce = synthetic
    graph = knn_graph(items, 16)
    first = DenseRetriever(items, query_vectors=queries)
    qs = list(range(len(queries)))
    res = GAR(graph, first=first, batch_size=b).search(MatrixScorer(ce), qs, budget=budget, k=10)
    initial = dict(zip(qs, first.retrieve(qs, budget).tolist(), strict=True))
    ref = reference_batches(ce, graph, initial, budget, b, tmp_path)
    for j, q in enumerate(qs):
        assert ours_batches(res, j, b) == ref[q], f"query {q}"
    # the graph was used: GAR scored items outside the first stage's top-B
    outside = [set(res.scored_items[j].tolist()) - set(initial[q]) for j, q in enumerate(qs)]
    assert all(outside)


def test_gar_equals_pyterrier_adaptive_cisi(shared_dir, tmp_path):
    from crossknn.matrix import load_score_matrix

    m = load_score_matrix(shared_dir / "matrices" / "cisi-minilm")
    first = DenseRetriever(m.de_items, query_vectors=m.de_queries)
    method = make_method("gar", first=first, n_items=m.n_items)  # the registry's defaults
    assert method.batch_size == 16 and method.graph.shape == (m.n_items, 16)
    test = m.test.tolist()
    for budget in (50, 100):
        res = method.search(MatrixScorer(m.scores), test, budget=budget, k=10)
        initial = dict(zip(test, first.retrieve(test, budget).tolist(), strict=True))
        ref = reference_batches(m.scores, method.graph, initial, budget, 16, tmp_path)
        same = [ours_batches(res, j, 16) == ref[q] for j, q in enumerate(test)]
        assert all(same), f"B={budget}: {same.count(False)} of {len(test)} queries differ"
        assert res.ce_calls.tolist() == [budget] * len(test)


def test_budget_batches_and_each_item_once(synthetic):
    items, queries, ce = synthetic
    scorer = CountingScorer(ce)
    first = DenseRetriever(items, query_vectors=queries)
    qs = list(range(len(queries)))
    res = GAR(knn_graph(items, 8), first=first, batch_size=16).search(scorer, qs, budget=70, k=10)
    assert res.ce_calls.tolist() == [70] * len(qs)
    # one score_batch per step for all queries: ceil(70 / 16) = 5 steps, 16 16 16 16 6
    assert [sorted({len(a) for a in call}) for call in scorer.calls] == [[16]] * 4 + [[6]]
    for j in range(len(qs)):
        seen = res.scored_items[j]
        assert len(set(seen.tolist())) == seen.size == 70
        np.testing.assert_array_equal(res.scored_scores[j], ce[j, seen])
        top = seen[np.argsort(-ce[j, seen], kind="stable")[:10]]
        assert set(res.indices[j].tolist()) == set(top.tolist())
        assert np.all(np.diff(res.scores[j]) <= 0)


def test_allow_masks(synthetic):
    items, queries, ce = synthetic
    n = items.shape[0]
    rng = np.random.default_rng(0)
    half = rng.random(n) < 0.5
    tiny = np.zeros(n, bool)
    tiny[rng.choice(n, 7, replace=False)] = True
    first = DenseRetriever(items, query_vectors=queries)
    method = GAR(knn_graph(items, 16), first=first)
    allow = [half, tiny, None]
    res = method.search(MatrixScorer(ce), [0, 1, 2], budget=60, k=10, allow=allow)
    assert half[res.scored_items[0]].all() and res.ce_calls[0] == 60
    # at most B allowed: every allowed item scored once, fewer than k: -1 padding after
    assert sorted(res.scored_items[1].tolist()) == np.flatnonzero(tiny).tolist()
    assert res.indices[1, 7:].tolist() == [-1, -1, -1] and np.isneginf(res.scores[1, 7:]).all()
    assert res.ce_calls[2] == 60
    assert [res.stop_reason(i) for i in range(3)] == ["budget", "allowed", "budget"]
    # a mask that excludes nothing changes nothing
    full = method.search(MatrixScorer(ce), [2], budget=60, k=10, allow=np.ones(n, bool))
    np.testing.assert_array_equal(full.scored_items[0], res.scored_items[2])


def test_exhausted_sources_stop_early():
    # three items, no edges beyond them: B = 3 with an initial ranking of all three
    ce = np.array([[0.1, 0.9, 0.5]], np.float32)
    graph = np.array([[1, 2], [0, 2], [0, 1]])
    first = DenseRetriever(np.eye(3, dtype=np.float32), query_vectors=np.ones((1, 3), np.float32))
    res = GAR(graph, first=first, batch_size=2).search(MatrixScorer(ce), [0], budget=3, k=2)
    assert res.ce_calls.tolist() == [3]
    assert res.indices.tolist() == [[1, 2]]


def test_knn_graph_exact_and_ties():
    rng = np.random.default_rng(1)
    V = rng.normal(size=(300, 8)).astype(np.float32)
    G = knn_graph(V, 5)
    S = V @ V.T
    np.fill_diagonal(S, -np.inf)
    for i in range(300):
        want = np.lexsort((np.arange(300), -S[i]))[:5]
        assert G[i].tolist() == want.tolist()
    assert G.dtype == np.int32 and not (G == np.arange(300)[:, None]).any()
    # equal vectors: ties go to the smaller item index; N - 1 neighbours at most
    E = np.ones((4, 3), np.float32)
    assert knn_graph(E, 16).tolist() == [[1, 2, 3], [0, 2, 3], [0, 1, 3], [0, 1, 2]]
    with pytest.raises(ValueError, match="N x d"):
        knn_graph(np.ones(5, np.float32))


def test_faiss_graph_close_to_exact():
    lazy_importorskip("faiss")
    rng = np.random.default_rng(2)
    V = rng.normal(size=(2000, 16)).astype(np.float32)
    exact, approx = knn_graph(V, 16, method="exact"), knn_graph(V, 16, method="faiss")
    overlap = np.mean([len(set(a) & set(b)) / 16 for a, b in zip(exact, approx, strict=True)])
    assert overlap > 0.9 and not (approx == np.arange(2000)[:, None]).any()


def test_registry_entry_and_graph_cache(synthetic):
    items, queries, _ = synthetic
    spec = get("gar")
    assert spec.index == "none" and "gar" in available([])
    first = DenseRetriever(items, query_vectors=queries)
    a = make_method("gar", first=first, n_items=items.shape[0])
    b = make_method("gar", item_vectors=items, first=first, n_items=items.shape[0])
    assert a.graph is b.graph is graph_for(items, 16)  # built once, kept by the vectors' hash
    with pytest.raises(ValueError, match="corpus graph or the DE item vectors"):
        make_method("gar", first="random", n_items=items.shape[0])
    with pytest.raises(ValueError, match="one row per item"):
        GAR(np.zeros((3, 2), np.int64), n_items=4)


def test_eval_runs_gar_with_the_de_first_stage(shared_dir):
    from crossknn.eval import EvalConfig, evaluate
    from crossknn.matrix import load_score_matrix
    from crossknn.topk import topk_recall

    m = load_score_matrix(shared_dir / "matrices" / "cisi-minilm")
    cfg = EvalConfig(methods=["gar"], budgets=[40], ks=[10], firsts=("de",))
    (row,) = evaluate(m, cfg, progress=False)
    assert (row["method"], row["first"], row["ce_calls_max"], row["index_ce_calls"]) == (
        "gar",
        "de",
        40,
        0,
    )
    first = DenseRetriever(m.de_items, query_vectors=m.de_queries)
    res = make_method("gar", first=first, n_items=m.n_items).search(
        MatrixScorer(m.scores), m.test.tolist(), budget=40, k=10
    )
    assert row["recall"] == float(topk_recall(m.scores, m.test, res.indices, 10).mean())
    # another first stage (random): the corpus graph still comes from the DE item vectors
    (rnd,) = evaluate(m, EvalConfig(methods=["gar"], budgets=[40], ks=[10]), progress=False)
    assert (rnd["first"], rnd["ce_calls_max"]) == ("random", 40)
    res = make_method("gar", first="random", item_vectors=m.de_items, n_items=m.n_items).search(
        MatrixScorer(m.scores), m.test.tolist(), budget=40, k=10
    )
    assert rnd["recall"] == float(topk_recall(m.scores, m.test, res.indices, 10).mean())
