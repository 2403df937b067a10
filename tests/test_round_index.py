"""FAISS round indexes (IVF-SQ8, HNSW): equal to the exact kernel at exhaustive settings, never
return scored items, round-trip through an index folder with hash validation, and serve
least-squares round queries with high recall once the width is tuned on held-out queries."""

from __future__ import annotations

import numpy as np
import pytest

from shared_fixtures import lazy_importorskip

lazy_importorskip("faiss")

from crossknn.core import ItemFeatures  # noqa: E402
from crossknn.index.files import IndexFormatError, load_index, save_index  # noqa: E402
from crossknn.scorers import MatrixScorer  # noqa: E402
from crossknn.search import AXN  # noqa: E402
from crossknn.search.round_index import (  # noqa: E402
    ARRAY_NAME,
    IndexedFeatures,
    build_round_index,
    default_nlist,
    default_round_index,
    faiss_from_array,
    open_round_features,
    record_round_queries,
    round_index_arrays,
    round_recall,
    tune_round_widths,
    tune_width,
)
from crossknn.synthetic import EmbeddingTestbed  # noqa: E402
from crossknn.topk import topk_recall  # noqa: E402


def _features(n=1500, d=16, seed=0):
    V = np.random.default_rng(seed).standard_normal((n, d)).astype(np.float32)
    return ItemFeatures(V)


@pytest.fixture(scope="module")
def small():
    f = _features()
    ivf = build_round_index(f, "ivf", nlist=12, progress=False)
    hnsw = build_round_index(f, "hnsw", hnsw_m=16, progress=False)
    return f, ivf, hnsw


def _queries_and_excludes(f, q=6, seed=1):
    rng = np.random.default_rng(seed)
    U = rng.standard_normal((q, f.dim))
    excl = [rng.choice(f.n_items, size=rng.integers(0, 60), replace=False) for _ in range(q)]
    # also exclude part of each query's exact top items, as later rounds do
    for i in range(q):
        top = f.top_k(U[i], 20)[1]
        excl[i] = np.concatenate([excl[i], top[::2]])
    return U, excl


def test_default_nlist_keeps_lists_small_within_the_usual_range():
    # lists of about 256 items, clipped to [4 sqrt(N), 16 sqrt(N)] and to N / 39
    assert default_nlist(10_000_000) == 39_062  # 10^7 / 256: not 4 sqrt(N) = 12,649
    assert default_nlist(1_000_000) == 4_000  # 4 sqrt(N) is above 10^6 / 256
    assert default_nlist(10**9) == 505_964  # 16 sqrt(N) caps it
    assert default_nlist(1_000) == 25  # N / 39: enough rows per list for k-means
    assert default_nlist(5) == 1
    for n in (1_000, 123_457, 3_000_000, 50_000_000):
        assert 1 <= default_nlist(n) <= min(16 * np.sqrt(n), n // 39)
    index = build_round_index(_features(n=2_000), "ivf", progress=False)
    assert index.nlist == default_nlist(2_000)


@pytest.mark.parametrize("kind", ["ivf", "hnsw"])
def test_exhaustive_settings_equal_exact(small, kind):
    f, ivf, hnsw = small
    index = ivf if kind == "ivf" else hnsw
    width = ivf.nlist if kind == "ivf" else f.n_items
    # int8 codes order candidates approximately: oversampling brings the exact top-k into them
    feats = IndexedFeatures(f, index, width=width, oversample=4.0 if kind == "ivf" else 1.0)
    U, excl = _queries_and_excludes(f)
    s_exact, i_exact = f.top_k(U, 25, exclude=excl)
    s_idx, i_idx = feats.top_k(U, 25, exclude=excl)
    np.testing.assert_array_equal(i_idx, i_exact)
    np.testing.assert_allclose(s_idx, s_exact, rtol=1e-5, atol=1e-5)
    assert feats.exact_fallbacks == 0
    # a single query gives the same as its row of the batch (IVF: searched in parallel over its
    # probed lists, with two FAISS threads)
    import faiss

    threads = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(2)
    try:
        for q in range(U.shape[0]):
            s1, i1 = feats.top_k(U[q], 25, exclude=excl[q])
            np.testing.assert_array_equal(i1, i_exact[q])
    finally:
        faiss.omp_set_num_threads(threads)


@pytest.mark.parametrize("kind", ["ivf", "hnsw"])
@pytest.mark.parametrize("frac", [0.5, 0.2, 0.05])
def test_allow_masks_are_honoured_and_equal_exact_at_exhaustive_settings(small, kind, frac):
    """A selector in the search parameters (width grown by 1 / selectivity) above N / 8 allowed
    items, the exact kernel over the allowed rows below: never a disallowed item, and the exact
    answer within the mask at exhaustive settings."""
    f, ivf, hnsw = small
    index = ivf if kind == "ivf" else hnsw
    width = ivf.nlist if kind == "ivf" else f.n_items
    feats = IndexedFeatures(f, index, width=width, oversample=4.0 if kind == "ivf" else 1.0)
    narrow = IndexedFeatures(f, index, width=2)
    U, excl = _queries_and_excludes(f)
    rng = np.random.default_rng(4)
    allow = [rng.random(f.n_items) < frac for _ in range(U.shape[0])]
    allow[1] = allow[0]  # two queries of one mask: one FAISS search for both
    s_exact, i_exact = f.top_k(U, 25, exclude=excl, allow=allow)
    s_idx, i_idx = feats.top_k(U, 25, exclude=excl, allow=allow)
    np.testing.assert_array_equal(i_idx, i_exact)
    np.testing.assert_allclose(s_idx, s_exact, rtol=1e-5, atol=1e-5)
    for q in range(U.shape[0]):
        got = narrow.top_k(U[q], 25, exclude=excl[q], allow=allow[q])[1]
        assert allow[q][got].all() and not np.isin(got, excl[q]).any()
        _, sm = narrow.sample_softmax(U[q], 20, exclude=excl[q], allow=allow[q], seed=2)
        assert np.unique(sm).size == 20 and allow[q][sm].all() and not np.isin(sm, excl[q]).any()


def test_scored_items_are_never_returned(small):
    f, ivf, _ = small
    feats = IndexedFeatures(f, ivf, width=2)  # narrow: few candidates, exclusions matter
    U, _ = _queries_and_excludes(f)
    for i in range(U.shape[0]):
        top = f.top_k(U[i], 300)[1]
        excl = top[:250]  # most of the index's answer is scored already
        got = feats.top_k(U[i], 40, exclude=excl)[1]
        assert np.unique(got).size == 40
        assert not np.isin(got, excl).any()
        _, sm = feats.sample_softmax(U[i], 30, exclude=excl, temperature=0.5, seed=3)
        assert np.unique(sm).size == 30 and not np.isin(sm, excl).any()


def test_softmax_pool_at_small_temperature_is_top_k(small):
    f, _, hnsw = small
    feats = IndexedFeatures(f, hnsw, width=400)
    U, excl = _queries_and_excludes(f, q=3)
    _, i_top = f.top_k(U, 10, exclude=excl)
    _, i_sm = feats.sample_softmax(U, 10, exclude=excl, temperature=1e-6, seed=5)
    np.testing.assert_array_equal(i_sm, i_top)
    # the same seed gives the same sample; another seed (at T = 1) another one
    a = feats.sample_softmax(U, 10, exclude=excl, temperature=1.0, seed=5)[1]
    b = feats.sample_softmax(U, 10, exclude=excl, temperature=1.0, seed=5)[1]
    c = feats.sample_softmax(U, 10, exclude=excl, temperature=1.0, seed=6)[1]
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


def test_default_kind_and_bad_arguments(small):
    f, ivf, _ = small
    assert default_round_index(1000) == "exact" and default_round_index(10**6) == "ivf"
    with pytest.raises(ValueError, match="round index must be one of"):
        build_round_index(f, "lsh")
    with pytest.raises(ValueError, match="holds 1500 x 16 vectors but the features are"):
        IndexedFeatures(_features(n=100), ivf)
    with pytest.raises(ValueError, match="1-D uint8"):
        faiss_from_array(np.zeros((2, 2), np.float32))


def test_round_trip_through_index_folder(tmp_path, small):
    f, _, _ = small
    V = f.rows(np.arange(f.n_items)).astype(np.float32)
    arrays, meta = round_index_arrays(f, "ivf", nlist=12, width=12, progress=False)
    assert set(arrays) == {ARRAY_NAME} and meta["kind"] == "ivf" and meta["nprobe"] == 12
    save_index(
        tmp_path / "ix",
        "corpus",
        {"de_items": V, **arrays},
        ce={"model_id": "m", "model_hash": "h"},
        params={"round_index": meta},
    )
    idx = load_index(tmp_path / "ix")
    feats = open_round_features(idx.arrays, idx.params, ItemFeatures(idx["de_items"]))
    assert isinstance(feats, IndexedFeatures) and feats.kind == "ivf" and feats.width == 12
    U, excl = _queries_and_excludes(f, q=3)
    direct = IndexedFeatures(f, faiss_from_array(arrays[ARRAY_NAME]), width=12)
    np.testing.assert_array_equal(
        feats.top_k(U, 10, exclude=excl)[1], direct.top_k(U, 10, exclude=excl)[1]
    )
    # exact on the same folder; another kind is refused with what to do
    exact = open_round_features(idx.arrays, idx.params, ItemFeatures(idx["de_items"]), "exact")
    assert not isinstance(exact, IndexedFeatures)
    with pytest.raises(ValueError, match="has round index 'ivf', not 'hnsw'"):
        open_round_features(idx.arrays, idx.params, ItemFeatures(idx["de_items"]), "hnsw")
    # one flipped byte in the FAISS file: refused on load, naming the file
    path = tmp_path / "ix" / f"{ARRAY_NAME}.npy"
    raw = bytearray(path.read_bytes())
    raw[-100] ^= 0xFF
    path.write_bytes(bytes(raw))
    with pytest.raises(IndexFormatError, match=r"round_index\.npy is corrupt"):
        load_index(tmp_path / "ix")


def test_tuned_width_serves_least_squares_rounds():
    bed = EmbeddingTestbed(20_000, 32, n_clusters=64, seed=0, block=4096)
    V = bed.items(0, bed.n_items)
    f = ItemFeatures(V)
    W, Y = bed.queries(30, seed=0)
    S = np.stack([bed.score(q, W[q], Y[q], V, np.arange(bed.n_items)) for q in range(30)])
    scorer = MatrixScorer(S.astype(np.float32))

    def make(feats):
        return AXN(feats, rounds=5, prior=W * bed.beta, mix=0.3)

    dev, test = list(range(10)), list(range(10, 30))
    index = build_round_index(f, "ivf", nlist=64, progress=False)
    feats = IndexedFeatures(f, index, oversample=2.0)
    records = record_round_queries(make, f, scorer, dev, budget=50, k=10)
    width, table = tune_width(feats, records, candidates=[1, 2, 4, 8, 16, 32], target=0.99)
    assert table[width] >= 0.99 and width < 64  # reaches the target without scanning all lists
    assert table[1] < table[width]  # the width matters: the narrowest is worse
    # a target no width reaches: every width is tried, and the narrowest within the plateau
    # tolerance of the best recall is taken (not the widest of a flat top)
    w_plateau, full = tune_width(feats, records, candidates=[1, 2, 4, 8, 16, 32], target=1.01)
    assert sorted(full) == [1, 2, 4, 8, 16, 32]
    best = max(full.values())
    assert full[w_plateau] >= best - 0.002 and feats.width == w_plateau
    assert all(full[w] < best - 0.002 for w in full if w < w_plateau)
    w_best, _ = tune_width(feats, records, candidates=[1, 2, 4, 8, 16, 32], target=1.01, plateau=0)
    assert full[w_best] == best and all(full[w] < best for w in full if w < w_best)
    assert w_plateau <= w_best
    feats.width = width
    # held-out queries: per-round recall and end-to-end recall as with exact rounds
    rec = round_recall(feats, record_round_queries(make, f, scorer, test, budget=50, k=10))
    assert rec.mean() >= 0.97
    r_exact = topk_recall(S, test, make(f).search(scorer, test, budget=50, k=10).indices, 10)
    r_idx = topk_recall(S, test, make(feats).search(scorer, test, budget=50, k=10).indices, 10)
    assert r_idx.mean() >= r_exact.mean() - 0.03


def test_per_round_widths_tuned_on_held_out_rounds():
    """tune_round_widths: one width per round step (keyed by the items scored so far), each the
    narrowest reaching the target on that step's dev records; held-out rounds keep the recall."""
    bed = EmbeddingTestbed(8000, 24, n_clusters=40, seed=1, block=4096)
    V = bed.items(0, bed.n_items)
    f = ItemFeatures(V)
    W, Y = bed.queries(48, seed=0)
    S = np.stack([bed.score(q, W[q], Y[q], V, np.arange(bed.n_items)) for q in range(48)])
    scorer = MatrixScorer(S.astype(np.float32))

    def make(feats):
        return AXN(feats, rounds=5, prior=W * bed.beta, mix=0.3)

    dev, test = list(range(32)), list(range(32, 48))
    feats = IndexedFeatures(f, build_round_index(f, "ivf", nlist=40, progress=False))
    records = record_round_queries(make, f, scorer, dev, budget=50, k=10)
    cands = [1, 2, 4, 8, 16, 40]
    schedule, tables = tune_round_widths(feats, records, candidates=cands, target=0.99)
    # the first round is the DE's; rounds 2-5 add 10 items each
    assert sorted(schedule) == [10, 20, 30, 40]
    for scored, w in schedule.items():
        t = tables[scored]
        assert t[w] >= 0.99 or t[w] >= max(t.values()) - 0.002  # the target, or the plateau
        assert all(t[v] < 0.99 for v in t if v < w)  # the narrowest that reaches it
    assert feats.width_for(10) == schedule[10] and feats.width_for(45) == schedule[40]
    assert feats.width_for(5) == feats.width == max(schedule.values())  # before the first key
    held = record_round_queries(make, f, scorer, test, budget=50, k=10)
    assert round_recall(feats, held).mean() >= 0.97
    # one width for every step must serve the hardest step: per round probes fewer lists
    single = IndexedFeatures(f, feats.index)
    width, _ = tune_width(single, records, candidates=cands, target=0.99)
    assert np.mean(list(schedule.values())) < width
    feats.round_widths = {0: 1}  # the schedule is what the search uses: 1 list loses recall
    feats.width = 1
    assert round_recall(feats, held).mean() < 0.97


def test_many_lists_get_an_int8_coarse_graph_owned_by_the_index(monkeypatch):
    """Above HNSW_QUANTIZER_FROM lists the coarse quantizer is an HNSW graph over int8 codes of
    the k-means centroids: it survives serialization, finds every list at exhaustive settings
    (single queries equal the exact kernel) and outlives the Python objects that built it."""
    import gc

    import faiss

    import crossknn.search.round_index as ri

    monkeypatch.setattr(ri, "HNSW_QUANTIZER_FROM", 16)
    f = _features(n=3000, d=16, seed=4)
    index = build_round_index(f, "ivf", nlist=64, progress=False)
    graph = faiss.downcast_index(index.quantizer)
    assert isinstance(graph, faiss.IndexHNSWSQ) and graph.ntotal == 64
    assert graph.hnsw.efConstruction == ri.COARSE_EF_CONSTRUCTION
    assert index.own_fields
    arr = ri.faiss_to_array(index)
    del index, graph
    gc.collect()
    back = faiss_from_array(arr)
    assert isinstance(faiss.downcast_index(back.quantizer), faiss.IndexHNSWSQ)
    feats = IndexedFeatures(f, back, width=64, oversample=4.0)
    U, excl = _queries_and_excludes(f, q=4)
    _, want = f.top_k(U, 20, exclude=excl)
    for q in range(U.shape[0]):
        np.testing.assert_array_equal(feats.top_k(U[q], 20, exclude=excl[q])[1], want[q])


def test_per_round_widths_stored_in_the_folder(tmp_path, small):
    """params.round_index.round_widths reach IndexedFeatures; bad ones are named; update_params
    rewrites index.json (new hash, CE calls added) while a hand edit stays refused."""
    import json

    from crossknn.index.files import update_params
    from crossknn.search.round_index import round_widths_meta

    f, _, _ = small
    V = f.rows(np.arange(f.n_items)).astype(np.float32)
    arrays, meta = round_index_arrays(f, "ivf", nlist=12, width=12, progress=False)
    ce = {"model_id": "m", "model_hash": "h"}
    ix = tmp_path / "ix"
    save_index(ix, "corpus", {"de_items": V, **arrays}, ce=ce, params={"round_index": meta})
    schedule = {0: 2, 20: 6, 40: 12}
    meta = {**meta, "round_widths": round_widths_meta(schedule)}
    assert meta["round_widths"] == {"0": 2, "20": 6, "40": 12}
    update_params(ix, {"round_index": meta}, ce_calls_added=300)
    idx = load_index(ix)
    assert idx.ce_calls == 300
    feats = open_round_features(idx.arrays, idx.params, ItemFeatures(idx["de_items"]))
    assert feats.round_widths == schedule
    assert feats.width_for(0) == 2 and feats.width_for(39) == 6 and feats.width_for(90) == 12
    for bad in ({"0": 0}, {"-1": 4}, {"x": 4}, [4], {"0": 2.5}, {}):
        p = {"round_index": {**meta, "round_widths": bad}}
        with pytest.raises(ValueError, match="round_widths must map items scored"):
            open_round_features(idx.arrays, p, ItemFeatures(idx["de_items"]))
    doc = json.loads((ix / "index.json").read_text())
    doc["params"]["round_index"]["round_widths"]["0"] = 1
    (ix / "index.json").write_text(json.dumps(doc))
    with pytest.raises(IndexFormatError, match="was modified"):
        update_params(ix, {"round_index": meta})
