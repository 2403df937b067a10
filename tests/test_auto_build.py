"""``crossknn build --index-calls C`` builds auto's index; ``crossknn search`` then uses auto."""

import json

import numpy as np
import pytest

from crossknn.ce import default_cross_encoder
from crossknn.cli import main
from crossknn.corpus_folder import open_index
from crossknn.searcher import Searcher
from shared_fixtures import made_corpus

pytestmark = pytest.mark.slow

N_ITEMS = 40
TRAIN = ["library catalogs", "information retrieval systems", "citation analysis"]


@pytest.fixture(scope="module")
def env(model_cache, tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("CROSSKNN_CACHE", str(model_cache))
    root = tmp_path_factory.mktemp("auto_build")
    path = root / "corpus.jsonl"
    corpus = made_corpus(N_ITEMS, path)
    train = root / "train.txt"
    train.write_text("\n".join(TRAIN) + "\n")
    yield {"corpus": corpus, "path": path, "train": train, "root": root}
    mp.undo()


def _build(env, out, *extra):
    argv = ["build", str(env["path"]), str(out), "--calibration-items", "8", "--quiet", *extra]
    assert main(argv) == 0
    return open_index(out)


def test_build_index_calls_makes_auto_the_default(env, capsys):
    idx = _build(
        env, env["root"] / "a", "--train-queries", str(env["train"]), "--index-calls", "95"
    )
    auto = idx.params["auto"]
    assert auto["rows"] == 2 and auto["index_calls"] == 2 * N_ITEMS <= 95
    assert idx["auto_rows"].shape == (2, N_ITEMS)
    # the row prior's item covariance is stored by the build (no O(N d^2) pass at every load)
    V = np.asarray(idx["de_items"], np.float64)
    np.testing.assert_allclose(idx["auto_item_cov"], np.cov(V, rowvar=False, bias=True), atol=1e-9)
    # the calibration's pairs are read from the rows: every CE call is inside the budget
    assert idx.ce_calls == 2 * N_ITEMS and idx.params["calibration"] == "auto rows"
    assert idx.params["budget"]["spent"] == {
        "calibration": 0,
        "auto_rows": 2 * N_ITEMS,
        "auto_partial_rows": 0,
    }
    ce = default_cross_encoder()
    ce.set_items(env["corpus"].texts)
    exact = np.stack([ce.score(q, np.arange(N_ITEMS)) for q in TRAIN])
    for row in idx["auto_rows"]:  # complete CE rows of train queries
        assert np.abs(exact - row).max(axis=1).min() < 1e-4
    s = Searcher(idx)
    assert s.method == "auto"
    hits = s.search(["the use of computers in libraries"], k=3, budget=10)
    assert hits[0].ce_calls <= 10 and len(hits[0].ids) == 3
    capsys.readouterr()
    rc = main(
        ["search", str(env["root"] / "a"), "indexing of documents", "--budget", "10", "--json"]
    )
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["method"] == "auto" and doc["hits"][0]["ce_calls"] <= 10


def test_pseudo_queries_and_no_auto_without_index_calls(env):
    idx = _build(env, env["root"] / "b", "--calibration-queries", "3", "--index-calls", "40")
    assert idx.params["auto"]["rows"] == 1 and idx["auto_rows"].shape == (1, N_ITEMS)
    assert Searcher(idx).method == "auto"
    plain = _build(env, env["root"] / "c", "--calibration-queries", "3")
    assert "auto" not in plain.params and Searcher(plain).method == "axn"
    with pytest.raises(ValueError, match="--index-calls"):
        Searcher(plain, method="auto")


def test_default_budget_builds_auto_from_the_rule(env, monkeypatch, capsys):
    import crossknn.commands.build_cmd as build_cmd
    import crossknn.index.auto as auto_index

    # 40 items are under the rule's 100 items per row: no auto index, search keeps axn
    plain = _build(env, env["root"] / "d", "--calibration-queries", "3")
    assert "auto" not in plain.params and Searcher(plain).method == "axn"
    assert "auto index: none (fewer than 100 items)" in capsys.readouterr().out
    # one row per 10 items: 4 complete rows of pseudo-queries, C = 4 x 40
    monkeypatch.setattr(auto_index, "ITEMS_PER_ROW", 10)
    monkeypatch.setattr(build_cmd, "ITEMS_PER_ROW", 10)  # its message reads its own binding
    idx = _build(env, env["root"] / "e", "--calibration-queries", "3")
    auto = idx.params["auto"]
    assert auto["rows"] == 4 and auto["index_calls"] == 4 * N_ITEMS == auto["index_calls_limit"]
    assert idx.ce_calls == 4 * N_ITEMS and Searcher(idx).method == "auto"
    out = capsys.readouterr().out
    assert f"auto index: {4 * N_ITEMS} CE calls for 4 complete rows;" in out
    assert f"index budget: {4 * N_ITEMS} CE calls (default: 4 complete rows" in out
    # a zero time cap reads no row: no auto index, the calibration inside the budget
    capped = _build(env, env["root"] / "f", "--calibration-queries", "3", "--index-minutes", "0")
    assert "auto" not in capped.params and capped.ce_calls == 3 * 8
    assert capped.params["budget"]["time_cap"]["cut"] is True
    out = capsys.readouterr().out
    assert "time cap 0 min: cut at 0 of 4 rows" in out and "the time cap read no row" in out


class _Interrupting:
    """The real CE, interrupted (KeyboardInterrupt) at its ``stop_at``-th complete row."""

    def __init__(self, ce, n_items, stop_at=None):
        self.ce, self.n_items, self.stop_at, self.rows = ce, n_items, stop_at, 0

    def __getattr__(self, name):
        return getattr(self.ce, name)

    def score_batch(self, queries, items):
        for it in items:
            if len(it) == self.n_items:
                self.rows += 1
                if self.rows == self.stop_at:
                    raise KeyboardInterrupt
        return self.ce.score_batch(queries, items)


def test_interrupted_auto_rows_resume(env, tmp_path):
    from crossknn.ce import default_dual_encoder
    from crossknn.corpus.build import build_corpus_index

    de = default_dual_encoder()
    kw = {"calibration_queries": 3, "calibration_items": 8, "progress": False, "de": de}
    first = _Interrupting(default_cross_encoder(), N_ITEMS, stop_at=4)
    with pytest.raises(KeyboardInterrupt):
        build_corpus_index(env["corpus"], tmp_path / "i", ce=first, index_calls=5 * N_ITEMS, **kw)
    assert first.rows == 4  # three rows finished and kept, the fourth interrupted
    again = _Interrupting(default_cross_encoder(), N_ITEMS)
    idx = build_corpus_index(env["corpus"], tmp_path / "i", ce=again, index_calls=5 * N_ITEMS, **kw)
    assert again.rows == 2  # only the two rows not finished before are scored
    assert idx.params["auto"]["rows"] == 5 and idx.params["auto"]["index_calls"] == 5 * N_ITEMS
    whole = build_corpus_index(
        env["corpus"], tmp_path / "w", ce=default_cross_encoder(), index_calls=5 * N_ITEMS, **kw
    )
    assert np.array_equal(idx["auto_rows"], whole["auto_rows"])
    assert idx.params["auto"] == whole.params["auto"]


def test_build_spends_partial_rows_on_the_learned_prior(env, monkeypatch, capsys):
    """At few rows the CLI build spends 4% of C on partial rows of other (pseudo-)queries and
    stores the learned prior; search reads it back (5 entries a partial row: 40 items here)."""
    import crossknn.search.auto as auto_mod

    monkeypatch.setattr(auto_mod, "PARTIAL_ITEMS", 5)
    capsys.readouterr()
    idx = _build(
        env, env["root"] / "p", "--calibration-queries", "12", "--index-calls", str(4 * N_ITEMS)
    )
    auto = idx.params["auto"]
    assert (auto["rows"], auto["partial_rows"]) == (3, 8)
    assert auto["index_calls"] == 3 * N_ITEMS + 8 * 5 <= 4 * N_ITEMS
    assert idx.ce_calls == auto["index_calls"]  # auto rows + partial rows; calibration from rows
    n = auto["learned_prior"]
    assert 1 <= n <= 11 and idx["auto_prior_vectors"].shape == (n, idx["de_items"].shape[1])
    assert idx["auto_prior_deltas"].shape[0] == n and "auto_item_cov" in idx.arrays
    assert f"auto index: {auto['index_calls']} CE calls for 3 complete rows + 8 partial rows" in (
        capsys.readouterr().out
    )
    s = Searcher(idx)
    assert s.method == "auto"
    hits = s.search(["the use of computers in libraries"], k=3, budget=10)
    assert hits[0].ce_calls <= 10 and len(hits[0].ids) == 3
    # a later build without the learned prior leaves none of its arrays behind
    again = _build(
        env, env["root"] / "p", "--calibration-queries", "12", "--index-calls", str(2 * N_ITEMS)
    )
    assert again.params["auto"]["partial_rows"] == 0
    assert "auto_prior_vectors" not in again.arrays and "auto_prior_deltas" not in again.arrays
