"""One home for the retrieval metrics: ``crossknn.trec`` (ir_measures). train/, cmc/ and
bench/train_ce_bench.py compute through it; each gives the numbers of its former direct
ir_measures call (kept below as the reference) wherever scores do not tie. On tied scores
crossknn.trec ranks in trec_eval's order (docid descending) for every measure, where
ir_measures' msmarco provider (RR) took docid ascending: the one difference, shown here."""

from __future__ import annotations

import ir_measures
import numpy as np
import pytest
from ir_measures import RR, R, nDCG

from crossknn.cmc.evaluate import ndcg_at, qrels_metrics, recall_at
from crossknn.trec import query_metrics, run_metrics


def _runs(seed: int, n_queries: int = 30, depth: int = 120, n_docs: int = 400):
    """Random runs with distinct scores, graded qrels (some queries without any relevant doc)."""
    rng = np.random.default_rng(seed)
    run, qrels, rankings, relevants = {}, {}, [], []
    for q in range(n_queries):
        docs = rng.choice(n_docs, depth, replace=False)
        scores = rng.permutation(depth).astype(np.float64) + rng.random()
        run[str(q)] = {str(d): float(s) for d, s in zip(docs, scores, strict=True)}
        rankings.append([int(d) for d in docs[np.argsort(-scores)]])
        pool = rng.choice(n_docs, 12, replace=False)
        rel = {int(d): int(rng.integers(0, 3)) for d in pool} if q % 7 else {}
        relevants.append(rel)
        qrels[str(q)] = {str(d): g for d, g in rel.items()}
    return run, qrels, rankings, relevants


def _direct(run, qrels, measure, n_queries: int) -> list[float]:
    """What cmc/evaluate.py computed: ``measure`` by ir_measures.iter_calc on the queries with a
    relevant item, 0 for the others."""
    judged = {q: rel for q, rel in qrels.items() if rel}
    got = {m.query_id: float(m.value) for m in ir_measures.iter_calc([measure], judged, run)}
    return [got.get(str(q), 0.0) for q in range(n_queries)]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cmc_metrics_equal_their_former_ir_measures_values(seed):
    run, qrels, rankings, relevants = _runs(seed)
    n = len(rankings)
    for q, (r, rel) in enumerate(zip(rankings, relevants, strict=True)):
        one = {str(q): run[str(q)]}, {str(q): qrels[str(q)]}
        assert ndcg_at(r, rel, 10) == (_direct(*one, nDCG @ 10, q + 1)[q] if rel else 0.0)
        assert recall_at(r, rel, 100) == (_direct(*one, R @ 100, q + 1)[q] if rel else 0.0)

    class Data:
        relevant = relevants

    got = qrels_metrics(np.array(rankings), list(range(n)), Data)
    assert got == {
        "ndcg@10": float(np.mean(_direct(run, qrels, nDCG @ 10, n))),
        "recall@100": float(np.mean(_direct(run, qrels, R @ 100, n))),
        "n_queries": n,
    }
    assert 0 < got["ndcg@10"] < 1 and 0 < got["recall@100"] < 1


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_run_metrics_equal_a_direct_ir_measures_call_without_ties(seed):
    """train/dev.py and bench/train_ce_bench.py called calc_aggregate on the raw run."""
    run, qrels, _, _ = _runs(seed)
    measures = [nDCG @ 10, RR @ 10, R @ 100]
    direct = ir_measures.calc_aggregate(measures, qrels, run)
    got = run_metrics(run, qrels, measures)
    assert {k: got[k] for k in ("nDCG@10", "RR@10", "R@100")} == {
        str(m): float(v) for m, v in direct.items()
    }
    want: dict = {str(m): {} for m in measures}
    for x in ir_measures.iter_calc(measures, qrels, run):
        want[str(x.measure)][x.query_id] = float(x.value)
    assert query_metrics(run, qrels, measures) == want


def test_train_dev_metrics_go_through_trec():
    dev = pytest.importorskip("crossknn.train.dev")  # needs torch (the export extra)
    run, qrels, _, _ = _runs(3)
    direct = ir_measures.calc_aggregate([nDCG @ 10, RR @ 10], qrels, run)
    assert dev.rerank_metrics(qrels, run) == {
        "ndcg@10": float(direct[nDCG @ 10]),
        "rr@10": float(direct[RR @ 10]),
    }


def test_ties_rank_in_trec_eval_order_for_every_measure():
    """Two results tie; the relevant one has the lower docid. trec_eval (and crossknn.trec)
    rank equal scores by docid descending: the relevant one is second, RR@10 = 0.5. The
    msmarco provider behind ir_measures' RR took docid ascending: 1.0."""
    run = {"q": {"d1": 2.0, "d2": 2.0, "d0": 1.0}}
    qrels = {"q": {"d1": 1}}
    got = run_metrics(run, qrels, [nDCG @ 10, RR @ 10])
    assert got["RR@10"] == 0.5
    assert float(ir_measures.calc_aggregate([RR @ 10], qrels, run)[RR @ 10]) == 1.0
    # nDCG (pytrec_eval) already used trec_eval's order: the same either way
    assert got["nDCG@10"] == float(ir_measures.calc_aggregate([nDCG @ 10], qrels, run)[nDCG @ 10])
