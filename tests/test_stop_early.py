"""The early stop (crossknn.search.stopping, SearchOptions::stop_threshold in the C++ loop): off is
today's loop exactly; on, the budget stays a ceiling, a stopped query's answer is the top-k of
what it scored, a batch equals its queries alone, and the calibration's replay of a traced search
is what the loop does at that threshold."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from crossknn.cli import main
from crossknn.corpus_folder import open_index
from crossknn.retrievers import make_retriever
from crossknn.scorers import MatrixScorer
from crossknn.search import stopping
from crossknn.search.auto import AUTO, IndexCallBudget, build_auto_index
from crossknn.search.engine import search_rounds
from crossknn.search.methods import ADACUR, AXN, CurIndex

N, D, NQ = 400, 12, 48
TRAIN, TEST = np.arange(24), np.arange(24, NQ)


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(69)
    A, B = rng.normal(size=(NQ, D)), rng.normal(size=(D, N))
    S = (A @ B + 0.8 * rng.normal(size=(NQ, N))).astype(np.float32)
    de_q = (A + 0.5 * rng.normal(size=A.shape)).astype(np.float32)
    de_i = (B.T + 0.5 * rng.normal(size=B.T.shape)).astype(np.float32)
    return S, de_q, de_i


@pytest.fixture(scope="module")
def methods(data):
    S, de_q, de_i = data
    reader = IndexCallBudget(MatrixScorer(S), TRAIN.tolist(), 8 * N)
    idx = build_auto_index(
        reader, TRAIN.tolist(), de_i, de_q[TRAIN], index_calls=reader.limit, seed=0
    )
    de = make_retriever("de", item_vectors=de_i, query_vectors=de_q)
    return {
        "auto": AUTO(idx, prior=de_q, first=de),
        "adacur": ADACUR(CurIndex.from_matrix(S, TRAIN, test_rows=TEST), rounds=8, first=de),
        "axn": AXN(de_i, prior=de_q, rounds=8, first=de),
    }


def _topk(items, scores, k):
    order = np.lexsort((items, -scores.astype(np.float64)))[:k]
    return items[order]


@pytest.mark.parametrize("name", ["auto", "adacur", "axn"])
def test_off_is_todays_loop_and_on_stays_under_the_ceiling(data, methods, name):
    S, _, _ = data
    meth, sc, qs = methods[name], MatrixScorer(S), TEST.tolist()
    base = meth.search(sc, qs, budget=60, k=10, seed=1)
    traced = search_rounds(meth, sc, qs, budget=60, k=10, seed=1, stop_trace=True)
    for other in (traced, search_rounds(meth, sc, qs, budget=60, k=10, seed=1, stop=0.0)):
        assert np.array_equal(other.indices, base.indices)
        assert np.array_equal(other.scores, base.scores)
        assert np.array_equal(other.ce_calls, base.ce_calls)
        assert [other.stop_reason(i) for i in range(len(qs))] == ["budget"] * len(qs)
    assert all(np.isnan(c[0]) for c in traced.stop_chance)  # no estimate before the first step
    assert any(np.isfinite(c).any() for c in traced.stop_chance)
    res = search_rounds(meth, sc, qs, budget=60, k=10, seed=1, stop=0.5)
    assert (res.ce_calls <= 60).all() and (res.ce_calls >= 10).all()
    reasons = [res.stop_reason(i) for i in range(len(qs))]
    assert set(reasons) <= {"found", "budget"} and "found" in reasons
    for i, why in enumerate(reasons):
        assert (res.ce_calls[i] < 60) == (why == "found")
        assert len(res.scored_items[i]) == res.ce_calls[i]
        # each item scored once, its score the CE's, the answer the top-k of what was scored
        assert len(set(res.scored_items[i].tolist())) == res.ce_calls[i]
        assert np.array_equal(res.scored_scores[i], S[qs[i], res.scored_items[i]])
        assert np.array_equal(res.indices[i], _topk(res.scored_items[i], res.scored_scores[i], 10))
        # a stopped search is a prefix of the full one
        n = int(res.ce_calls[i])
        assert np.array_equal(res.scored_items[i], base.scored_items[i][:n])


def test_a_batch_equals_its_queries_alone_stopping_at_different_rounds(data, methods):
    S, _, _ = data
    meth, sc, qs = methods["auto"], MatrixScorer(S), TEST.tolist()
    batch = search_rounds(meth, sc, qs, budget=80, k=10, seed=2, stop=0.2)
    assert len(set(batch.ce_calls.tolist())) > 2  # the queries stopped at different rounds
    for i, q in enumerate(qs):
        one = search_rounds(meth, sc, [q], budget=80, k=10, seed=2, stop=0.2)
        assert np.array_equal(one.indices[0], batch.indices[i])
        assert one.ce_calls[0] == batch.ce_calls[i]


def test_a_mask_of_at_most_b_items_is_allowed(data, methods):
    S, _, _ = data
    allow = np.zeros(N, bool)
    allow[:30] = True
    masks = [allow, None]
    res = search_rounds(
        methods["auto"], MatrixScorer(S), TEST[:2].tolist(), budget=50, k=10, allow=masks, stop=0.5
    )
    assert res.stop_reason(0) == "allowed" and res.ce_calls[0] == 30
    assert res.stop_reason(1) in ("found", "budget")


@pytest.mark.parametrize("threshold", [0.02, 0.1, 0.4])
def test_the_calibration_replays_what_the_loop_does(data, methods, threshold):
    S, _, _ = data
    meth, sc, qs = methods["auto"], MatrixScorer(S), TEST.tolist()
    traced = search_rounds(meth, sc, qs, budget=70, k=10, seed=0, stop_trace=True)
    sizes = [s.n for s in meth.plan(70)]
    found, share, ref = stopping.kept_by_threshold(traced, sizes, 10, np.array([threshold]), 70)
    run = search_rounds(meth, sc, qs, budget=70, k=10, seed=0, stop=threshold)
    assert np.array_equal(np.rint(share[0] * 70), run.ce_calls)
    full = [set(r.tolist()) for r in traced.indices]
    assert np.array_equal(ref, [10] * len(qs))  # the reference: the full run's own top-k
    assert np.array_equal(
        found[0], [len(full[i] & set(run.indices[i].tolist())) for i in range(len(qs))]
    )
    # against the exact top-k: the stopped top-k's hits among them
    exact = [np.argsort(-S[q], kind="stable")[:10] for q in qs]
    found_x, _, ref_x = stopping.kept_by_threshold(
        traced, sizes, 10, np.array([threshold]), 70, exact
    )
    assert np.array_equal(ref_x, [len(set(e.tolist()) & full[i]) for i, e in enumerate(exact)])
    got = [len(set(e.tolist()) & set(run.indices[i].tolist())) for i, e in enumerate(exact)]
    assert np.array_equal(found_x[0], got)


def test_the_index_stores_a_calibration_and_targets_map_to_thresholds(methods):
    idx = methods["auto"].index
    curve = idx.stop_curve
    assert curve is not None and idx.meta()["stop_curve"] == curve
    assert curve["budgets"] == [50, 100, 200] and curve["k"] == 10
    assert curve["queries"] == idx.n_rows * 3  # every complete row at every budget
    for table in curve["by_budget"].values():
        thr = [table["thresholds"][str(t)] for t in stopping.TARGETS]
        assert all(a >= b for a, b in zip(thr, thr[1:], strict=False))  # stricter target, lower
        kept = [table["kept"][str(t)] for t in stopping.TARGETS]
        assert all(k >= t - 1e-9 for k, t in zip(kept, stopping.TARGETS, strict=True))
    meth = methods["auto"]
    at100 = curve["by_budget"]["100"]["thresholds"]
    assert meth.stop_threshold(0.95, 100) == at100["0.95"]
    assert meth.stop_threshold(0.97, 120) == at100["0.98"]  # the nearest budget, stricter target
    assert meth.stop_threshold(0.95, 180) == curve["by_budget"]["200"]["thresholds"]["0.95"]
    assert meth.stop_threshold(0.9999, 100) == 0.0  # above every target: never stop
    with pytest.raises(ValueError, match=r"target_recall must be in \(0, 1\]; got 1.5"):
        meth.stop_threshold(1.5, 100)
    with pytest.raises(ValueError, match="calibrated the early stop"):
        stopping.stop_threshold(None, 0.9, 100)


def test_a_stop_threshold_outside_zero_one_is_refused(data, methods):
    S, _, _ = data
    with pytest.raises(ValueError, match=r"stop threshold is a chance in \[0, 1\]; got 2.0"):
        search_rounds(methods["axn"], MatrixScorer(S), [30], budget=40, k=5, stop=2.0)


@pytest.fixture(scope="module")
def auto_index_dir(model_env, calibrated_auto_index):
    """conftest's calibrated index, with $CROSSKNN_CACHE set for this module (its searches)."""
    return calibrated_auto_index


@pytest.mark.slow
def test_searcher_and_cli_expose_the_target(auto_index_dir, capsys):
    from crossknn import Searcher

    idx = open_index(auto_index_dir)
    assert idx.params["auto"]["stop_curve"]["by_budget"]  # calibrated by the build
    s = Searcher(idx)
    full = s.search(["library automation", "indexing of documents"], k=5, budget=60)
    assert [h.stopped for h in full] == ["budget", "budget"] and full[0].ce_calls == 60
    hits = s.search(
        ["library automation", "indexing of documents"], k=5, budget=60, target_recall=0.9
    )
    for h in hits:
        assert h.stopped in ("found", "budget") and h.ce_calls <= 60
        assert (h.ce_calls < 60) == (h.stopped == "found")
        assert h.to_dict()["stopped"] == h.stopped
    with pytest.raises(ValueError, match="target_recall needs a method"):
        s.search("library automation", k=5, budget=60, method="rnr", target_recall=0.9)
    capsys.readouterr()
    argv = ["search", str(auto_index_dir), "library automation", "--budget", "60", "--json"]
    assert main([*argv, "-k", "5", "--quiet", "--target-recall", "0.9"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["hits"][0]["stopped"] == hits[0].stopped
    assert doc["hits"][0]["ce_calls"] == hits[0].ce_calls


@pytest.mark.slow
def test_served_groups_stop_at_different_rounds_as_the_searcher(auto_index_dir, model_cache):
    pytest.importorskip("fastapi")
    from concurrent.futures import ThreadPoolExecutor

    from crossknn import Searcher
    from crossknn.serve.schema import SearchRequest
    from crossknn.serve.service import SearchService, ServeConfig

    queries = ["library automation", "indexing of documents", "citation analysis", "retrieval"]
    want = Searcher(auto_index_dir).search(queries, k=5, budget=60, target_recall=0.9)
    svc = SearchService(
        ServeConfig(index=str(auto_index_dir), group_queries=4, admit_within=0, timeout_s=300.0)
    )
    svc.load()

    def one(q: str) -> dict:
        req = SearchRequest(query=q, k=5, budget=60, target_recall=0.9)
        decision = svc.try_admit(req)
        assert decision.admitted, decision
        ctx = svc.new_context()
        try:
            return svc.search(req, ctx)
        finally:
            svc.release(decision.ticket, ctx)

    try:
        svc.engine_lock.acquire()  # the requests queue, then start as one lockstep group
        with ThreadPoolExecutor(len(queries)) as pool:
            futs = []
            for i, q in enumerate(queries):
                futs.append(pool.submit(one, q))
                end = time.monotonic() + 30
                while svc.engine_lock.waiting < i + 1:
                    assert time.monotonic() < end, "timed out"
                    time.sleep(0.002)
            svc.engine_lock.release()
            answers = [f.result(120)["hits"][0] for f in futs]
        assert svc.groups.grouped_queries == len(queries)
        assert len({w.ce_calls for w in want}) > 1  # they stopped at different rounds
        for hit, w in zip(answers, want, strict=True):
            assert [r["id"] for r in hit["results"]] == w.ids
            assert hit["ce_calls"] == w.ce_calls and hit["stopped"] == w.stopped
    finally:
        svc.close()
    with pytest.raises(ValueError, match="target_recall"):
        SearchRequest(query="x", target_recall="high")
