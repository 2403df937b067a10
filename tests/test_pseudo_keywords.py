"""Keyword pseudo-queries (crossknn.corpus.pseudo_keywords): one shared, distinctive word each."""

from __future__ import annotations

import pytest

from crossknn.corpus.pseudo_keywords import keyword_queries


def _corpus() -> list[str]:
    topics = ["melatonin", "thyroid", "curcumin", "acrylamide", "cranberry"]
    texts = []
    for t in topics:
        for r in range(6):  # each topic in six items: shared (df 6 of 30), not generic
            texts.append(
                f"{t.title()} and health outcome {r} in the cohort. The study of {t} "
                f"measured {t} levels with the usual methods and results."
            )
    return texts


def test_keywords_are_shared_distinct_words_of_the_openings():
    texts = _corpus()
    qs = keyword_queries(texts, 5, seed=0, max_df=0.3)
    # every topic word once (generic words like "health" occur in all items: over max_df)
    assert sorted(qs) == sorted(["melatonin", "thyroid", "curcumin", "acrylamide", "cranberry"])
    assert qs == keyword_queries(texts, 5, seed=0, max_df=0.3)  # seeded


def test_keywords_run_out_instead_of_repeating():
    qs = keyword_queries(_corpus(), 50, seed=1, max_df=0.3)
    assert len(qs) == len(set(qs)) and 5 <= len(qs) < 50


def test_keyword_edge_cases():
    assert keyword_queries([], 3) == []
    assert keyword_queries(["the and of"], 2) == []  # stop words only
    # a tiny corpus keeps every word; equal weights go to the earliest word
    assert keyword_queries(["Tiny corpus about beets"], 1) == ["tiny"]
    with pytest.raises(ValueError, match="n >= 0"):
        keyword_queries(["a b c"], -1)
