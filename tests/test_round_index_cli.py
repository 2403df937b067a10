"""crossknn build --round-index hnsw stores a FAISS index in the folder; search uses it, and
--round-index exact on the same folder still works (same hits: 40 items, exhaustive HNSW)."""

import json

import pytest

from crossknn.cli import main
from crossknn.data import load_corpus
from crossknn.index.files import load_index

pytest.importorskip("faiss")
pytestmark = [pytest.mark.shared, pytest.mark.slow]

N_ITEMS = 40


def test_build_and_search_with_round_index(model_cache, shared_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("CROSSKNN_CACHE", str(model_cache))
    full = load_corpus(shared_dir / "data" / "cisi")
    path = tmp_path / "corpus.jsonl"
    path.write_text(
        "".join(
            json.dumps({"id": i, "text": t}) + "\n"
            for i, t in zip(full.ids[:N_ITEMS], full.texts[:N_ITEMS], strict=True)
        ),
        encoding="utf-8",
    )
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
