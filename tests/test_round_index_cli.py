"""crossknn build --round-index hnsw stores a FAISS index in the folder; search uses it, and
--round-index exact on the same folder still works (same hits: 40 items, exhaustive HNSW)."""

import json

import pytest

from crossknn.cli import main
from crossknn.index.files import load_index
from shared_fixtures import lazy_importorskip, made_corpus

lazy_importorskip("faiss")
pytestmark = pytest.mark.slow

N_ITEMS = 40


def _small_corpus(tmp_path):
    """N_ITEMS real-text items every machine has, as a JSONL corpus file."""
    path = tmp_path / "corpus.jsonl"
    made_corpus(N_ITEMS, path)
    return path


def test_build_and_search_with_round_index(model_cache, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("CROSSKNN_CACHE", str(model_cache))
    path = _small_corpus(tmp_path)
    out = tmp_path / "idx"
    args = ["--calibration-queries", "2", "--calibration-items", "4", "--quiet"]
    assert main(["build", str(path), str(out), "--round-index", "hnsw", *args]) == 0
    idx = load_index(out)
    assert idx.params["round_index"]["kind"] == "hnsw" and "round_index" in idx.arrays
    capsys.readouterr()
    hits = {}
    for mode in ("auto", "exact"):
        q = ["the use of computers in libraries", "-k", "3", "--budget", "10", "--json"]
        assert main(["search", str(out), *q, "--round-index", mode]) == 0
        hits[mode] = [
            (h["results"], h["ce_calls"]) for h in json.loads(capsys.readouterr().out)["hits"]
        ]
    assert hits["auto"] == hits["exact"]
    # the folder has no IVF index: asking for one says what to do
    assert main(["search", str(out), "a query", "--round-index", "ivf"]) == 2
    assert "has round index 'hnsw', not 'ivf'" in capsys.readouterr().err


def test_build_tunes_round_widths_per_step(model_cache, tmp_path, capsys, monkeypatch):
    """--tune-rounds Q: the exact rounds of Q pseudo-queries tune one width per round step; the
    widths land in params.round_index (CE calls counted), the searcher uses them, and a build
    without a FAISS round index refuses the option before doing any work."""
    from crossknn.corpus_folder import open_index
    from crossknn.searcher import Searcher

    monkeypatch.setenv("CROSSKNN_CACHE", str(model_cache))
    path = _small_corpus(tmp_path)
    args = ["--calibration-queries", "2", "--calibration-items", "4", "--quiet"]
    plain, tuned = tmp_path / "plain", tmp_path / "tuned"
    assert main(["build", str(path), str(plain), "--round-index", "hnsw", *args]) == 0
    assert (
        main(["build", str(path), str(tuned), "--round-index", "hnsw", "--tune-rounds", "2", *args])
        == 0
    )
    meta = load_index(tuned).params["round_index"]
    widths = meta["round_widths"]
    # default search: 5 rounds over a 40-call budget (all 40 items): 4 least-squares steps
    assert len(widths) == 4 and all(int(k) >= 1 for k in widths)
    assert all(w == 16 for w in widths.values())  # 40 items: the narrowest width is exhaustive
    assert meta["tuned_on"] == {
        "queries": 2,
        "from": "pseudo-queries from item texts",
        "method": "axn",
        "rounds": 5,
        "budget": N_ITEMS,
    }
    assert load_index(tuned).ce_calls == load_index(plain).ce_calls + 2 * N_ITEMS
    searcher = Searcher(open_index(tuned))
    assert searcher.round_features.round_widths == {int(k): v for k, v in widths.items()}
    exact = Searcher(open_index(tuned), round_index="exact")
    q = "the use of computers in libraries"
    a, b = searcher.search(q, k=3, budget=10), exact.search(q, k=3, budget=10)
    assert a.ids == b.ids and a.ce_calls == b.ce_calls
    with pytest.raises(ValueError, match="needs a FAISS round index"):
        exact.tune_round_widths([q])
    capsys.readouterr()
    bad = tmp_path / "bad"
    assert main(["build", str(path), str(bad), "--tune-rounds", "2", *args]) == 2
    assert "--tune-rounds tunes a FAISS round index" in capsys.readouterr().err
