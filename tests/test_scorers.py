import numpy as np
import pytest

from crossknn.scorers import BudgetedScorer, BudgetExceededError, MatrixScorer, Scorer


class Recording:
    """A scorer that records every (query, item) it is asked for."""

    def __init__(self, scores):
        self.inner = MatrixScorer(scores)
        self.n_items = self.inner.n_items
        self.pairs: list[tuple] = []
        self.batch_calls = 0

    def score(self, query, items):
        return self.score_batch([query], [items])[0]

    def score_batch(self, queries, items):
        self.batch_calls += 1
        for q, it in zip(queries, items, strict=True):
            self.pairs += [(q, int(i)) for i in it]
        return self.inner.score_batch(queries, items)


@pytest.fixture
def S():
    return np.random.default_rng(0).standard_normal((4, 30)).astype(np.float32)


def test_matrix_scorer_looks_up(S):
    sc = MatrixScorer(S)
    assert isinstance(sc, Scorer)
    assert sc.n_items == 30
    np.testing.assert_array_equal(sc.score(2, np.array([5, 0, 29])), S[2, [5, 0, 29]])
    out = sc.score_batch([1, 3], [np.array([1]), np.array([2, 3])])
    np.testing.assert_array_equal(out[1], S[3, [2, 3]])
    assert out[0].dtype == np.float32


@pytest.mark.parametrize(
    "call, err, match",
    [
        (lambda sc: sc.score(4, [0]), IndexError, "row 4"),
        (lambda sc: sc.score(0, [30]), IndexError, "item index 30"),
        (lambda sc: sc.score(0, [-1]), IndexError, "item index -1"),
        (lambda sc: sc.score(0, [0.5]), ValueError, "integer item indices"),
        (lambda sc: sc.score("text", [0]), TypeError, "row indices"),
        (lambda sc: sc.score_batch([0, 1], [[0]]), ValueError, "2 queries but 1"),
    ],
)
def test_matrix_scorer_errors(S, call, err, match):
    with pytest.raises(err, match=match):
        call(MatrixScorer(S))


def test_matrix_scorer_rejects_bad_matrix():
    with pytest.raises(ValueError, match="non-empty 2-D"):
        MatrixScorer(np.zeros(5))
    with pytest.raises(ValueError, match="non-empty 2-D"):
        MatrixScorer(np.zeros((0, 5)))


def test_budgeted_counts_caches_and_batches(S):
    rec = Recording(S)
    b = BudgetedScorer(rec, [2, 0], budget=5)
    out = b.score_batch([0, 1], [[3, 4], [3]])
    np.testing.assert_array_equal(out[0], S[2, [3, 4]])
    np.testing.assert_array_equal(out[1], S[0, [3]])
    assert rec.batch_calls == 1
    # repeated items are free and never sent again, also when repeated within one call
    out = b.score_batch([0], [[4, 3, 7, 7]])
    np.testing.assert_array_equal(out[0], S[2, [4, 3, 7, 7]])
    assert b.calls.tolist() == [3, 1]
    assert sorted(rec.pairs) == sorted([(2, 3), (2, 4), (0, 3), (2, 7)])
    # everything cached: no call to the wrapped scorer at all
    b.score_batch([0, 1], [[3], [3]])
    assert rec.batch_calls == 2
    items, scores = b.scored(0)
    assert items.tolist() == [3, 4, 7]
    np.testing.assert_array_equal(scores, S[2, [3, 4, 7]])
    assert b.remaining(0) == 2 and b.is_scored(0, 7) and not b.is_scored(1, 7)


def test_budgeted_refuses_to_exceed(S):
    b = BudgetedScorer(MatrixScorer(S), [0], budget=3)
    b.score(0, [0, 1])
    with pytest.raises(BudgetExceededError, match="budget is 3"):
        b.score(0, [2, 3])
    assert b.calls.tolist() == [2]  # nothing was scored by the refused call
    b.score(0, [0, 1, 2])  # reuses two, one new: fits exactly
    assert b.calls.tolist() == [3]


class Broken:
    n_items = 5

    def __init__(self, out):
        self.out = out

    def score_batch(self, queries, items):
        return [np.asarray(self.out(it), np.float32) for it in items]


def test_budgeted_rejects_nan_and_wrong_lengths():
    b = BudgetedScorer(Broken(lambda it: np.where(it == 2, np.nan, 1.0)), ["q"], budget=5)
    with pytest.raises(ValueError, match="NaN/inf score for query 0, item 2"):
        b.score(0, [1, 2])
    b = BudgetedScorer(Broken(lambda it: np.ones(len(it) + 1)), ["q"], budget=5)
    with pytest.raises(ValueError, match="2 scores for 1 items"):
        b.score(0, [1])


def test_budgeted_checks_inputs(S):
    with pytest.raises(TypeError, match="n_items"):
        BudgetedScorer(object(), [0], budget=1)
    with pytest.raises(ValueError, match="budget must be >= 0"):
        BudgetedScorer(MatrixScorer(S), [0], budget=-1)
    b = BudgetedScorer(MatrixScorer(S), [0], budget=3)
    with pytest.raises(IndexError, match="slot 1"):
        b.score(1, [0])
