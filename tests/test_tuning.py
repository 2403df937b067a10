"""choose_on_dev: ties on dev recall are broken by the candidate recall, then toward the later
candidate (a larger share of the budget for the index-driven part), never toward the smallest."""

import numpy as np

from crossknn.search import SearchResult, choose_on_dev
from crossknn.topk import exact_top_k


def _probe(S, extra_hits):
    """A method that returns each row's exact top-1 (every candidate ties at k=1) and scores
    ``extra_hits`` more of the row's exact top-2 items besides."""

    class Probe:
        def search(self, scorer, queries, *, budget, k, seed=0):
            top = [exact_top_k(S[q], 2) for q in queries]
            idx = np.array([[t[0]] for t in top], np.int64)
            far = [np.argsort(S[q])[:3] for q in queries]  # low-scored filler items
            scored = [np.r_[t[: 1 + extra_hits], f] for t, f in zip(top, far, strict=True)]
            return SearchResult(
                np.zeros((len(queries), 1), np.float32),
                idx,
                np.full(len(queries), 4, np.int64),
                scored_items=scored,
            )

    return Probe()


def test_ties_go_to_the_better_candidate_recall_not_the_smallest():
    S = np.random.default_rng(0).standard_normal((20, 30)).astype(np.float32)
    hits = {0.1: 0, 0.5: 1, 0.9: 0}
    best, table = choose_on_dev(
        lambda v, rows: _probe(S, hits[v]), [0.1, 0.5, 0.9], S, np.arange(20), budget=4, k=1
    )
    assert set(table.values()) == {1.0}  # a three-way tie on dev recall
    assert best == 0.5  # the old rule (first of equals) took 0.1


def test_full_ties_go_to_the_later_candidate():
    S = np.random.default_rng(1).standard_normal((20, 30)).astype(np.float32)
    best, _ = choose_on_dev(
        lambda v, rows: _probe(S, 0), [0.1, 0.5, 0.9], S, np.arange(20), budget=4, k=1
    )
    assert best == 0.9


def test_a_better_dev_recall_still_wins_over_the_tie_break():
    S = np.random.default_rng(2).standard_normal((20, 30)).astype(np.float32)

    class Worse:
        def search(self, scorer, queries, *, budget, k, seed=0):
            idx = np.array([[int(np.argmin(S[q]))] for q in queries], np.int64)
            scored = [exact_top_k(S[q], 2) for q in queries]
            return SearchResult(
                np.zeros((len(queries), 1)), idx, np.ones(len(queries), int), [*scored]
            )

    make = {0.1: _probe(S, 0), 0.9: Worse()}
    best, _ = choose_on_dev(lambda v, rows: make[v], [0.1, 0.9], S, np.arange(20), budget=4, k=1)
    assert best == 0.1
