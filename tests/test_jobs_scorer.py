"""Deterministic cheap scorers for the job/index tests (importable by subprocesses and Ray
workers via PYTHONPATH=tests), plus a check that they follow the Scorer protocol."""

from __future__ import annotations

import hashlib
import os
import time

import numpy as np


def lookup_matrix(n_queries: int, n_items: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n_queries, n_items)).astype(np.float32)


class LookupScorer:
    """scores[query_row, item]; counts pairs scored; optional sleep per score_batch call."""

    def __init__(self, scores: np.ndarray, *, sleep: float = 0.0) -> None:
        self.scores = np.asarray(scores, np.float32)
        self.n_items = self.scores.shape[1]
        self.sleep = sleep
        self.pairs = 0
        self.model_id = "lookup"
        self.model_hash = hashlib.sha256(self.scores.tobytes()).hexdigest()
        self.pid = os.getpid()

    def score(self, query, items):
        self.pairs += len(items)
        return self.scores[int(query), np.asarray(items, np.int64)]

    def score_batch(self, queries, items):
        if self.sleep:
            time.sleep(self.sleep)
        return [self.score(q, it) for q, it in zip(queries, items, strict=True)]


def make_lookup_scorer(n_queries: int, n_items: int, seed: int = 0, sleep: float = 0.0):
    """Module-level factory: what a LazyScorer pickles."""
    return LookupScorer(lookup_matrix(n_queries, n_items, seed), sleep=sleep)


def test_lookup_scorer_protocol():
    s = make_lookup_scorer(3, 5)
    out = s.score_batch([0, 2], [np.array([1, 4]), np.array([0])])
    assert [o.tolist() for o in out] == [s.scores[0, [1, 4]].tolist(), [s.scores[2, 0]]]
    assert s.pairs == 3 and s.n_items == 5
