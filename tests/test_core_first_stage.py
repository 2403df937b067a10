"""The dense first stage inside the C++ loop (``_core.run_search(first_features=...)``, used by
``search_rounds`` when ``first`` is a :class:`DenseRetriever`) against the Python one
(``DenseRetriever.retrieve`` through ``ItemFeatures.top_k``): the same items in the same order,
for ordinary query vectors and for those ``top_k`` rescales by a power of two (tiny, huge)."""

from __future__ import annotations

import numpy as np
import pytest

from crossknn import RNR, MatrixScorer, _core
from crossknn.retrievers import DenseRetriever
from crossknn.search import make_method
from crossknn.search.engine import search_rounds

N, D = 400, 10


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(7)
    V = rng.standard_normal((N, D)).astype(np.float32)
    Qv = rng.standard_normal((12, D)).astype(np.float32)
    Qv[1] *= np.float32(2.0**-70)  # max|V| sum|u| below 2^-60: top_k scales it up
    Qv[2] *= np.float32(2.0**125)  # beyond 2^100 (float32 scores overflow): scaled down
    Qv[6] *= np.float32(2.0**-128)  # float32 scores in the denormals: scaled up
    Qv[3, :] = 0.0  # no order at all: ties to the lower id
    Qv[4] = np.round(Qv[4])  # many equal scores
    Qv[5] *= np.float32(1e-38)  # float32 denormal range
    S = (Qv.astype(np.float64) @ V.T.astype(np.float64) * 1e-3).astype(np.float32)
    S = np.nan_to_num(S) + rng.standard_normal(S.shape).astype(np.float32)
    return V, Qv, S


def _first(de, plan_n, rows):
    """The first step through the loop with first_features: the items it scores."""
    got = []

    def score(slots, items):
        got.extend(np.asarray(it).copy() for it in items)
        return [np.zeros(len(it), np.float32) for it in items]

    _core.run_search(
        de.features._f,
        score,
        [("first", plan_n)],
        list(range(len(rows))),
        budget=plan_n,
        k=1,
        **de.loop_first_stage(rows),
    )
    return np.stack(got)


@pytest.mark.parametrize("n", [1, 7, 60])
def test_loop_first_stage_equals_retrieve(data, n):
    V, Qv, _ = data
    de = DenseRetriever(V, query_vectors=Qv)
    rows = list(range(Qv.shape[0]))
    np.testing.assert_array_equal(_first(de, n, rows), de.retrieve(rows, n))


def test_text_queries_through_the_encoder(data):
    """The Searcher's first stage: text queries encoded by the DE (``encode``), and vectors."""
    V, Qv, _ = data
    texts = [f"query {i}" for i in range(8)]
    vec = {t: Qv[i] for i, t in enumerate(texts)}
    de = DenseRetriever(V, encode=lambda ts: np.stack([vec[t] for t in ts]))
    np.testing.assert_array_equal(_first(de, 9, texts), de.retrieve(texts, 9))
    mixed = [texts[0], Qv[3].astype(np.float64), texts[5]]  # a query may also be its vector
    np.testing.assert_array_equal(_first(de, 4, mixed), de.retrieve(mixed, 4))


def test_tiny_and_huge_queries_are_rescaled_as_top_k_does():
    """Two items whose scores differ by 2^-20 relative: unscaled, a tiny query's float32 scores are
    denormals that tie (and a huge one's overflow to inf); top_k's power-of-two scaling orders
    them, and the loop's first stage must too."""
    V = np.array([[2.0, 0.0], [2.0 + 2.0**-19, 0.0], [0.0, 1.0]], np.float32)
    Qv = np.array([[2.0**-140, 0.0], [2.0**127, 0.0], [1.0, 0.0]], np.float32)
    de = DenseRetriever(V, query_vectors=Qv)
    raw = de.features._f.top_k(Qv, 1, None, None)[1][:, 0]
    assert raw.tolist() == [0, 0, 1]  # tied (denormal, inf): the lower id
    assert de.retrieve([0, 1, 2], 1)[:, 0].tolist() == [1, 1, 1]
    np.testing.assert_array_equal(_first(de, 1, [0, 1, 2]), de.retrieve([0, 1, 2], 1))


@pytest.mark.parametrize("method", ["rnr", "axn"])
def test_product_path_uses_the_loop_first_stage(data, method, monkeypatch):
    """search_rounds hands a DenseRetriever's queries to the loop (retrieve is not called), and the
    result equals the one with the items from retrieve (the Python first stage)."""
    V, Qv, S = data
    de = DenseRetriever(V, query_vectors=Qv)
    if method == "rnr":
        meth = RNR(de, n_items=N)
    else:
        meth = make_method("axn", item_vectors=V, first=de, prior=Qv, mix=0.5, rounds=3)
    rows = list(range(Qv.shape[0]))
    scorer = MatrixScorer(S)
    old = search_rounds(meth, scorer, rows, budget=30, k=5, seed=1)  # before the patch below
    monkeypatch.setattr(type(meth), "core_first_stage", lambda self, q: None)
    py = search_rounds(meth, scorer, rows, budget=30, k=5, seed=1)  # first items from retrieve
    for a, b in zip(old.scored_items, py.scored_items, strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(old.indices, py.indices)
    np.testing.assert_array_equal(old.scores, py.scores)
    monkeypatch.undo()

    def no_retrieve(*a, **k):
        raise AssertionError("the first stage went through retrieve")

    monkeypatch.setattr(de, "retrieve", no_retrieve)
    meth.search(scorer, rows, budget=30, k=5, seed=1)


def test_subclassed_retrievers_keep_their_own_retrieve(data):
    V, Qv, _ = data

    class Reversed(DenseRetriever):
        def retrieve(self, queries, k):
            return super().retrieve(queries, k)[:, ::-1].copy()

    assert RNR(Reversed(V, query_vectors=Qv), n_items=N).core_first_stage([0]) is None
    assert RNR(DenseRetriever(V, query_vectors=Qv), n_items=N).core_first_stage([0]) is not None


def test_first_stage_errors(data):
    V, Qv, _ = data
    de = DenseRetriever(V, query_vectors=Qv)
    f = de.features._f

    def run(**kw):
        return _core.run_search(
            f,
            lambda s, it: [np.zeros(len(i), np.float32) for i in it],
            [("first", 3)],
            [0],
            budget=3,
            k=1,
            **kw,
        )

    with pytest.raises(ValueError, match="both be given or both be None"):
        run(first_features=f)
    with pytest.raises(ValueError, match="not both"):
        run(first_features=f, first_queries=Qv[:1].copy(), first_items=np.zeros((1, 3), np.int64))
    with pytest.raises(ValueError, match=r"first_queries must have shape \(Q, d\) = \(1, 10\)"):
        run(first_features=f, first_queries=Qv[:2].copy())
    with pytest.raises(TypeError, match="first_queries must have dtype float32"):
        run(first_features=f, first_queries=Qv[:1].astype(np.float64))
    bad = Qv[:1].copy()
    bad[0, 3] = np.nan
    with pytest.raises(ValueError, match="NaN or inf"):
        run(first_features=f, first_queries=bad)
    other = _core.Features(V[:-1].copy())
    with pytest.raises(ValueError, match="the first stage has 399 items but the features 400"):
        run(first_features=other, first_queries=Qv[:1].copy())
    with pytest.raises(ValueError, match="first_vmax must be finite"):
        run(first_features=f, first_queries=Qv[:1].copy(), first_vmax=float("inf"))
