"""``rescore=(precision, N)`` / ``--rescore``: an int8 search's top N scored again by the fp32 CE
of the same model (the embedded one), over a tiny index of standard-library docstrings."""

from __future__ import annotations

import json

import numpy as np
import pytest

import crossknn
from crossknn.ce import default_cross_encoder, default_dual_encoder
from crossknn.ce.models import DEFAULT_CE, ensure_model
from crossknn.cli import main
from crossknn.searcher import Searcher
from shared_fixtures import made_corpus

pytestmark = [pytest.mark.slow]

N_ITEMS = 40
QUERIES = ["parse a date string", "compress data with gzip", "open a network socket"]
K, N, B = 3, 6, 12


@pytest.fixture(scope="module")
def env(model_cache_int8, tmp_path_factory):
    model_cache = model_cache_int8  # the int8 CE exported once for the run
    mp = pytest.MonkeyPatch()
    mp.setenv("CROSSKNN_CACHE", str(model_cache))
    root = tmp_path_factory.mktemp("rescore")
    corpus = made_corpus(N_ITEMS)
    crossknn.build_corpus_index(
        corpus,
        root / "idx",
        ce=default_cross_encoder(precision="int8"),
        de=default_dual_encoder(),
        calibration_queries=4,
        calibration_items=16,
        progress=False,
    )
    fp32 = default_cross_encoder()
    fp32.set_items(list(corpus.texts))
    yield {"index_dir": root / "idx", "fp32": fp32, "cache": model_cache, "ids": corpus.ids}
    mp.undo()


def test_rescored_top_k_is_the_fp32_ranking_of_the_int8_top_n(env):
    plain = Searcher(env["index_dir"])
    assert plain.ce.precision == "int8"
    top_n = plain.search(QUERIES, k=N, budget=B)  # the int8 search's top N
    base = plain.search(QUERIES, k=K, budget=B)
    s = Searcher(env["index_dir"], rescore=("fp32", N))
    assert s.rescore_ce.precision == "fp32" and s.ce.precision == "int8"
    hits = s.search(QUERIES, k=K, budget=B)
    for h, hn, hb in zip(hits, top_n, base, strict=True):
        assert len(h.indices) == K
        assert h.rescore_calls == N
        assert h.ce_calls == hb.ce_calls + N and hb.ce_calls <= B
        assert h.to_dict()["rescore_calls"] == N
        fp32 = np.asarray(env["fp32"].score(h.query, hn.indices), np.float32)
        order = np.lexsort((hn.indices, -fp32))[:K]
        np.testing.assert_array_equal(h.indices, hn.indices[order])
        # the reported scores are the fp32 CE's scores of those items, in descending order
        own = np.asarray(env["fp32"].score(h.query, h.indices), np.float32)
        np.testing.assert_allclose(h.scores, own, atol=1e-5, rtol=0)
        assert np.all(np.diff(h.scores) <= 0)
    # rescore_top=0: the plain int8 search, no rescore calls
    off = s.search(QUERIES, k=K, budget=B, rescore_top=0)
    for h, hb in zip(off, base, strict=True):
        np.testing.assert_array_equal(h.indices, hb.indices)
        assert h.rescore_calls == 0 and h.ce_calls == hb.ce_calls
    assert "rescore_calls" not in base[0].to_dict()


def test_refusals(env, tmp_path):
    s = Searcher(env["index_dir"], rescore=("fp32", N))
    with pytest.raises(ValueError, match=r"less than k=8"):
        s.search("q", k=8, budget=B)
    with pytest.raises(ValueError, match=r"rescore N=13 exceeds the budget B=12"):
        s.search("q", k=K, budget=B, rescore_top=13)
    with pytest.raises(ValueError, match="search's own precision"):
        Searcher(env["index_dir"], rescore=("int8", N))
    with pytest.raises(ValueError, match="must be one of"):
        Searcher(env["index_dir"], rescore=("fp64", N))
    with pytest.raises(ValueError, match=r"needs a Searcher made with rescore"):
        Searcher(env["index_dir"]).search("q", k=K, budget=B, rescore_top=N)
    # a crossknn model folder holding only the int8 variant: no fp32 to rescore with
    int8_only = ensure_model(DEFAULT_CE, precision="int8", cache_dir=env["cache"])
    with pytest.raises(ValueError, match=r"has no 'fp32' variant"):
        Searcher(env["index_dir"], model=int8_only, rescore=("fp32", N))


def test_cli_rescore(env, capsys):
    argv = ["search", str(env["index_dir"]), QUERIES[0], "-k", str(K), "--budget", str(B)]
    assert main([*argv, "--rescore", "fp32", str(N), "--json", "--quiet"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["rescore"] == {"precision": "fp32", "n": N} and doc["precision"] == "int8"
    (h,) = doc["hits"]
    assert h["rescore_calls"] == N and h["ce_calls"] > N
    scores = [r["score"] for r in h["results"]]
    ids = list(env["ids"])
    own = env["fp32"].score(QUERIES[0], [ids.index(r["id"]) for r in h["results"]])
    np.testing.assert_allclose(scores, own, atol=1e-5, rtol=0)
    for extra, msg in [
        (["--rescore", "fp32", "2"], "less than -k 3"),
        (["--rescore", "fp32", "20"], "exceeds --budget 12"),
        (["--rescore", "int8", str(N)], "search's own precision"),
        (["--rescore", "fp32", "six"], "must be an integer"),
    ]:
        assert main([*argv, *extra, "--quiet"]) == 2
        assert msg in capsys.readouterr().err
