"""auto's rounds: the rounds curve of an index, the cost per round, the choice under a latency
target, and what ran reported where it ran (Searcher, search --json, eval)."""

import json

import numpy as np
import pytest

import crossknn.search.round_plan as rp
from crossknn.cli import main
from crossknn.corpus_folder import open_index
from crossknn.matrix import load_score_matrix
from crossknn.scorers import MatrixScorer
from crossknn.search.auto import AUTO, IndexCallBudget, build_auto_index, rounds_curve
from crossknn.search.round_plan import RoundCost, choose_rounds, measure_round_cost
from crossknn.searcher import Searcher

CURVE = {3: 0.80, 4: 0.82, 5: 0.826, 6: 0.830, 8: 0.837, 10: 0.843, 12: 0.841, 20: 0.842, 30: 0.844}


def test_latency_target_takes_the_best_curve_value_that_fits():
    cost = RoundCost(floor_s=0.7e-3, pair_s=15e-6, round_host_s=0.2e-3, fixed_s=1e-3)
    # 8 ms at B = 100: 1 + 1.5 + 0.9 R <= 8 -> R <= 6
    c = choose_rounds(CURVE, 30, budget=100, cost=cost, target_ms=8.0)
    assert (c.rounds, c.by) == (6, "latency_target")
    assert c.predicted_ms == pytest.approx(1 + 1.5 + 6 * 0.9) and c.curve_recall == 0.830
    # a looser target: the best of the curve within it, the fewest rounds among equals
    c = choose_rounds(CURVE, 30, budget=100, cost=cost, target_ms=12.0)
    assert c.rounds == 10 and c.curve_recall == 0.843  # 12 rounds is no better (monotone: 0.843)
    c = choose_rounds(CURVE, 30, budget=100, cost=cost, target_ms=100.0)
    assert c.rounds == 30 and c.curve_recall == 0.844
    # nothing fits: the fewest rounds of the curve
    c = choose_rounds(CURVE, 30, budget=100, cost=cost, target_ms=1.0)
    assert (c.rounds, c.by) == (3, "latency_target")


def test_without_target_curve_or_cost_the_index_rounds_run_and_asked_rounds_win():
    cost = RoundCost(1e-3, 0.0)
    assert choose_rounds(CURVE, 30, budget=100).to_dict()["by"] == "index"
    assert choose_rounds(None, 30, budget=100, cost=cost, target_ms=5).rounds == 30
    assert choose_rounds(CURVE, 30, budget=100, cost=None, target_ms=5).rounds == 30
    assert choose_rounds(CURVE, 30, budget=20, cost=None).rounds == 20  # capped at the budget
    asked = choose_rounds(CURVE, 30, budget=100, cost=cost, target_ms=5, rounds=7)
    assert (asked.rounds, asked.by, asked.predicted_ms) == (7, "rounds", 7.0)
    with pytest.raises(ValueError, match="rounds must be >= 1"):
        choose_rounds(CURVE, 30, budget=100, rounds=0)
    with pytest.raises(ValueError, match="latency target must be > 0"):
        choose_rounds(CURVE, 30, budget=100, cost=cost, target_ms=-1)
    with pytest.raises(ValueError, match="finite number >= 0"):
        RoundCost(float("nan"), 0.0)


def test_monotone_curve_never_prefers_fewer_rounds_by_noise():
    assert rp.monotone_curve({5: 0.8, 10: 0.79, 20: 0.81}) == {5: 0.8, 10: 0.8, 20: 0.81}


def test_measure_round_cost_separates_the_floor_from_the_pairs(monkeypatch):
    """A CE that costs 2 ms a call plus 0.1 ms a pair, on a clock it advances itself."""
    clock = [0.0]
    monkeypatch.setattr(rp.time, "perf_counter", lambda: clock[0])

    class CE:
        def score_batch(self, queries, items):
            clock[0] += 2e-3 + 1e-4 * sum(len(i) for i in items)
            return [np.zeros(len(i), np.float32) for i in items]

    cost = measure_round_cost(CE(), 1000, pairs=64)
    assert cost.floor_s == pytest.approx(2e-3) and cost.pair_s == pytest.approx(1e-4)
    assert cost.latency_s(10, 100) == pytest.approx(10 * 2e-3 + 100 * 1e-4)


def test_rounds_curve_on_cisi_rows_and_the_index_keeps_it(shared_dir):
    m = load_score_matrix(shared_dir / "matrices" / "cisi-minilm")
    train = m.train.tolist()
    N = m.n_items
    sc = MatrixScorer(m.scores)
    idx = build_auto_index(
        IndexCallBudget(sc, train, 16 * N),
        train,
        m.de_items,
        m.de_queries[m.train],
        index_calls=16 * N,
        curve_rounds=(4, 10, 30),
    )
    curve = idx.rounds_curve
    assert set(curve) == {4, 10, 30} and idx.rounds in curve
    assert all(0 < v <= 1 for v in curve.values())
    assert idx.meta()["rounds_curve"] == {str(r): v for r, v in sorted(curve.items())}
    # the curve is the cross-validation over the index's own rows: recomputed, the same values
    again = rounds_curve(
        idx.rows,
        idx.row_vectors,
        idx.item_vectors,
        rho_d=idx.rho_d,
        rho_r=idx.rho_r,
        first_share=idx.first_share,
        alpha=idx.prior_alpha,
        query_dirs=idx.query_dirs,
        grid=(4, 10, 30),
    )
    assert again == curve
    # fewer rounds cost recall on held-out rows (the trade the latency target makes)
    assert curve[4] < curve[30]
    # under a target that allows 10 rounds the search runs 10: B CE calls, one batch a round
    meth = AUTO(idx, prior=m.de_queries, first="random")
    meth.set_cost(RoundCost(1e-3, 0.0), 10.5)
    assert meth.choice(100).rounds == 10 and len(meth.plan(100)) == 10
    calls = []

    class Counting:
        n_items = N

        def score_batch(self, queries, items):
            calls.append(sum(len(i) for i in items))
            return sc.score_batch(queries, items)

    res = meth.search(Counting(), m.test[:3].tolist(), budget=100, k=10)
    assert len(calls) == 10 and sum(calls) == 300 and (res.ce_calls == 100).all()


@pytest.fixture(scope="module")
def auto_index_dir(model_env, calibrated_auto_index):
    """conftest's calibrated index, with $CROSSKNN_CACHE set for this module (its searches)."""
    return calibrated_auto_index


@pytest.mark.slow
def test_what_ran_is_what_is_reported(auto_index_dir, capsys):
    idx = open_index(auto_index_dir)
    assert idx.params["auto"]["rows"] == 5 and idx.params["auto"]["rounds_curve"]
    s = Searcher(idx)  # a CPU: no latency target, the index's rounds
    assert s.latency_target_ms is None
    info = s.plan_info(budget=40)
    assert info["method"] == "auto" and info["round_choice"]["by"] == "index"
    assert info["rounds"] == min(idx.params["auto"]["rounds"], 40) and sum(info["plan"]) == 40
    hit = s.search("library automation", k=5, budget=40)
    assert hit.plan == info and hit.ce_calls == 40
    # --rounds applies to auto, and the JSON says what ran
    capsys.readouterr()
    argv = ["search", str(auto_index_dir), "library automation", "--budget", "40", "--json"]
    assert main([*argv, "--rounds", "5", "-k", "5", "--quiet"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["method"] == "auto" and doc["rounds"] == 5
    assert doc["plan"]["plan"] == [8] * 5 and doc["plan"]["round_choice"]["by"] == "rounds"
    # a latency target on a (given) cost: the rounds the curve allows within it
    t = Searcher(idx, latency_target_ms=4.0)
    t._round_cost = RoundCost(floor_s=1e-3, pair_s=0.0)  # as if measured: 1 ms a round
    got = t.plan_info(budget=40)
    assert got["round_choice"]["by"] == "latency_target" and got["rounds"] <= 4
    assert t.search("library automation", k=5, budget=40).plan == got
