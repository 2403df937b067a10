"""``crossknn build --index-calls C`` builds auto's index; ``crossknn search`` then uses auto."""

import json

import numpy as np
import pytest

from crossknn.ce import default_cross_encoder
from crossknn.cli import main
from crossknn.corpus_index import open_index
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
    assert idx.ce_calls == len(TRAIN) * 8 + 2 * N_ITEMS  # calibration + auto rows
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
