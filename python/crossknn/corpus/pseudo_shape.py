"""Example queries shape the day-one pseudo-queries: a handful of real queries (never scored,
never rows) tell topics from claims and questions, which the item texts alone cannot.

Measured on train splits (``bench/recall_bench.py day-one --part choose``;
docs/design/notes-day-one.md): on a corpus of 1-3 word topic queries (NFCorpus) one-word keyword
rows are about as good as rows of real queries and every other kind loses; on questions (CISI) and
one-sentence claims (SciFact) passages of an item as long as the examples (the CE reads query and
item in one window, and a long query leaves the item little of it), four pseudo-queries a row to
choose the rows from and no learned prior beat keyword rows by 0.08 to 0.11 at B = 50. The examples'
median length in words picks between the two and sets the passages' length.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from crossknn.index.auto import pseudo_query_count

__all__ = [
    "PASSAGE_MAX_WORDS",
    "POOL_PER_ROW",
    "TOPIC_WORDS",
    "check_example_queries",
    "pseudo_shape",
]

#: example queries of at most this many words (median) are topics: keyword rows
TOPIC_WORDS = 4
#: pseudo-queries made per complete row for longer examples (the rows are chosen among them)
POOL_PER_ROW = 4
#: the longest ``passage`` pseudo-query in words (the default CE reads 128 tokens of query and
#: item together)
PASSAGE_MAX_WORDS = 64
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
    -> ``passage`` pseudo-queries of that many words (at most :data:`PASSAGE_MAX_WORDS`; see
    :func:`crossknn.corpus.pseudo.pseudo_queries`), :data:`POOL_PER_ROW` a row, no partial rows
    of the learned prior (``auto_options = {"partial_items": 0}``: their CE calls go to
    complete rows)."""
    shape: dict[str, Any] = {"from": "items", "kind": "keywords"}
    count = pseudo_query_count(index_calls, n_items, calibration_queries)
    rows = int(index_calls) // max(int(n_items), 1)
    auto_options: dict[str, Any] = {}
    if examples:
        words = float(np.median([len(q.split()) for q in examples]))
        shape.update({"from": "example queries", "examples": len(examples), "median_words": words})
        if words > TOPIC_WORDS:
            shape["kind"] = "passage"  # as long as the examples
            shape["words"] = int(min(round(words), PASSAGE_MAX_WORDS))
            count = max(int(calibration_queries), POOL_PER_ROW * rows)
            auto_options = {"partial_items": 0}
    shape["count"] = count
    return {"shape": shape, "auto_options": auto_options}
