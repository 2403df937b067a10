"""Example queries shape the day-one pseudo-queries: a handful of real queries (never scored,
never rows) tell topics from claims and questions, which the item texts alone cannot.

Measured on train splits (``bench/recall_bench.py day-one --part choose``, docs/design/notes.md):
on a corpus of 1-3 word topic queries (NFCorpus) one-word keyword rows are about as good as rows
of real queries and every other kind loses; on questions (CISI) and one-sentence claims (SciFact)
a mix of keywords, first words and sentences, four pseudo-queries a row to choose the rows from
and no learned prior beats keyword rows by 0.04 to 0.07 at B = 50. The examples' median length in
words picks between the two.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from crossknn.index.auto import pseudo_query_count

__all__ = [
    "NEAR_CANDIDATES",
    "POOL_PER_ROW",
    "TOPIC_WORDS",
    "check_example_queries",
    "near_examples",
    "pseudo_shape",
]

#: example queries of at most this many words (median) are topics: keyword rows
TOPIC_WORDS = 4
#: pseudo-queries made per complete row for longer examples (the rows are chosen among them)
POOL_PER_ROW = 4
#: pseudo-queries cut per one kept when the examples choose them (:func:`near_examples`)
NEAR_CANDIDATES = 4
#: the kind of pseudo-queries for examples longer than topics
LONG_KIND = "mix"
#: the longest ``passage`` pseudo-query in words (the CE reads 128 tokens of query and item)
PASSAGE_MAX_WORDS = 64
#: the kinds whose pseudo-queries the examples choose (:func:`near_examples`)
NEAR_KINDS = ("mix",)
#: the most example queries read (a handful is enough to tell their length)
MAX_EXAMPLES = 1000


def check_example_queries(examples: Sequence[str], *, src: str = "example queries") -> list[str]:
    """The example queries as a list; a clear error for none, a blank one or too many."""
    if isinstance(examples, str):
        raise TypeError(f"{src}: expected a list of query texts, got one string")
    out = list(examples)
    if not out:
        raise ValueError(f"{src}: expected at least one example query, got none")
    for i, q in enumerate(out):
        if not isinstance(q, str) or not q.split():
            raise ValueError(f"{src}: example query {i + 1} is {q!r}; expected a non-empty text")
    if len(out) > MAX_EXAMPLES:
        raise ValueError(
            f"{src}: {len(out):,} example queries; a handful shapes the pseudo-queries (at most "
            f"{MAX_EXAMPLES:,}); give many real queries as --train-queries instead, which "
            "become rows"
        )
    return out


def pseudo_shape(
    examples: Sequence[str] | None, index_calls: int, n_items: int, calibration_queries: int
) -> dict:
    """How the pseudo-queries of the ``index_calls // n_items`` complete rows are made.

    Without examples, the default: ``keywords``, one a row and at least the calibration's
    (:func:`crossknn.index.auto.pseudo_query_count`), auto's learned prior on. With examples:
    their median length in words; at most :data:`TOPIC_WORDS` -> the same keyword rows; longer
    -> ``mix`` (a third each of keywords, first words and sentences), :data:`POOL_PER_ROW` a row,
    no partial rows of the learned prior (``auto_options = {"partial_items": 0}``: their CE
    calls go to complete rows)."""
    shape: dict[str, Any] = {"from": "items", "kind": "keywords"}
    count = pseudo_query_count(index_calls, n_items, calibration_queries)
    rows = int(index_calls) // max(int(n_items), 1)
    auto_options: dict[str, Any] = {}
    if examples:
        words = float(np.median([len(q.split()) for q in examples]))
        shape.update({"from": "example queries", "examples": len(examples), "median_words": words})
        if words > TOPIC_WORDS:
            shape["kind"] = LONG_KIND
            if LONG_KIND == "passage":  # as long as the examples
                shape["words"] = int(min(round(words), PASSAGE_MAX_WORDS))
            count = max(int(calibration_queries), POOL_PER_ROW * rows)
            auto_options = {"partial_items": 0}
        if shape["kind"] in NEAR_KINDS:
            shape["near_examples"] = NEAR_CANDIDATES * count
    shape["count"] = count
    return {"shape": shape, "auto_options": auto_options}


def near_examples(candidates: Sequence[str], examples: Sequence[str], de, count: int) -> list[str]:
    """The ``count`` pseudo-queries of ``candidates`` nearest the example queries in the DE's
    space (cosine), taken in turn: each example its nearest candidate not yet taken, then each
    its next, so every example draws the same share and the pool keeps their spread. Fewer
    candidates than ``count``: all of them, in their order."""
    cands = list(dict.fromkeys(candidates))
    if len(cands) <= count:
        return cands

    def unit(texts):
        x = np.asarray(de.encode(list(texts)), np.float64)
        return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)

    sim = unit(examples) @ unit(cands).T  # (examples, candidates)
    order = np.argsort(-sim, axis=1, kind="stable")
    taken: list[int] = []
    seen = np.zeros(len(cands), bool)
    pos = np.zeros(len(examples), np.int64)
    while len(taken) < count:
        for e in range(len(examples)):
            while seen[order[e, pos[e]]]:
                pos[e] += 1
            j = int(order[e, pos[e]])
            seen[j] = True
            taken.append(j)
            if len(taken) == count:
                break
    return [cands[j] for j in sorted(taken)]
