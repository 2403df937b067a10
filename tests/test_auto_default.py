"""The default index budget of ``crossknn build`` and the pseudo-query kinds (issue 29)."""

import argparse

import numpy as np
import pytest

from crossknn.commands.build_cmd import _index_calls, auto_summary
from crossknn.corpus.pseudo import PSEUDO_KINDS, auto_pseudo_queries, pseudo_queries
from crossknn.data import Corpus
from crossknn.index.auto import (
    ITEMS_PER_ROW,
    MAX_DEFAULT_ROWS,
    default_index_rows,
    expected_gain,
    pseudo_query_count,
)


def test_default_rows_scale_with_the_corpus_and_stop_at_the_cap():
    assert default_index_rows(40, None) == 0  # tiny corpora spend nothing
    assert default_index_rows(ITEMS_PER_ROW - 1, 1e9) == 0
    assert default_index_rows(1_000, None) == 10
    assert default_index_rows(3_633, None) == MAX_DEFAULT_ROWS == 32
    assert default_index_rows(10**7, None) == MAX_DEFAULT_ROWS


def test_default_rows_obey_the_time_cap_and_the_train_queries():
    # 3,633 items at 100 pairs/s: 10 minutes hold 60,000 pairs = 16 rows
    assert default_index_rows(3_633, 100.0, minutes=10) == 16
    assert default_index_rows(3_633, 100.0, minutes=0) == 0
    assert default_index_rows(3_633, 35_000.0) == 32  # a GPU: the row cap, not the clock
    assert default_index_rows(3_633, None, n_train=5) == 5
    assert pseudo_query_count(16 * 3_633, 3_633, 16) == 16
    with pytest.raises(ValueError, match="n_items >= 1"):
        default_index_rows(0, None)


def test_index_calls_flag_maps_to_the_rule_none_or_a_count():
    ns = argparse.Namespace
    assert _index_calls(ns(index_calls=None, index_minutes=None)) == "default"
    assert _index_calls(ns(index_calls=None, index_minutes=2.0)) == "default"
    assert _index_calls(ns(index_calls=0, index_minutes=None)) is None  # today's behaviour
    assert _index_calls(ns(index_calls=500, index_minutes=None)) == 500
    with pytest.raises(ValueError, match="--index-minutes"):
        _index_calls(ns(index_calls=500, index_minutes=1.0))


def test_summary_line_says_what_was_spent_and_what_it_buys():
    assert "fewer than 100 items" in auto_summary(None, 40)
    assert "none asked" in auto_summary(None, 4_000)
    line = auto_summary(
        {
            "index_calls": 58_128,
            "rows": 16,
            "index_calls_limit": 58_128,
            "default_rule": {"rows": 16, "pairs_per_s": 97.3, "minutes": 10.0},
        },
        3_633,
    )
    assert "58,128 CE calls for 16 complete rows" in line and "97 pairs/s" in line
    assert "Top-10-Recall@100 0.94" in line and "AXN over DE 0.71" in line
    assert "1 row's worth of CE calls gave Top-10-Recall@100 0.79" in expected_gain(3633, 3633)
    # a default build's 30 complete rows + partial rows spend 32 rows' worth (116,190 calls)
    assert "32 rows' worth" in expected_gain(116_190, 3633)
    assert "16 rows' worth" in expected_gain(31 * 3633 - 3633 // 2 - 1, 3633)
    assert "0 rows' worth" in expected_gain(0, 3633)


def _corpus():
    texts = [
        f"Title {i} here. First sentence of item {i} is long enough. Second one {i}! Third {i}?"
        for i in range(30)
    ]
    return Corpus([f"d{i}" for i in range(30)], texts)


def test_pseudo_query_kinds():
    c = _corpus()
    first = pseudo_queries(c, 5, seed=3)
    rng = np.random.default_rng(3)  # the first-words kind is unchanged: same items, same words
    picks = sorted(rng.choice(30, size=5, replace=False).tolist())
    assert first == [" ".join(c.texts[i].split()[:10]) for i in picks]
    sent = pseudo_queries(c, 5, seed=3, kind="sentence")
    assert len(sent) == 5 and sent == pseudo_queries(c, 5, seed=3, kind="sentence")
    for q, i in zip(sent, picks, strict=True):
        assert q in c.texts[i] and not c.texts[i].startswith(q)  # not the first sentence
        assert len(q.split()) <= 12
    one = Corpus(["a"], ["just one sentence without an end"])
    assert pseudo_queries(one, 1, kind="sentence") == ["just one sentence without an end"]
    with pytest.raises(ValueError, match="kind must be one of"):
        pseudo_queries(c, 2, kind="title")
    assert PSEUDO_KINDS == ("first", "sentence", "keywords")
    # keywords: the corpus above has no shared, non-generic word (every word is in every item)
    assert pseudo_queries(c, 3, seed=3, kind="keywords") == []
    topics = ["melatonin", "thyroid", "curcumin", "acrylamide", "cranberry", "beets"] * 5
    topics = [f"{t}{'abcde'[j // 6]}" for j, t in enumerate(topics)]  # 30 words, 2 items each
    kc = Corpus(
        [f"k{i}" for i in range(60)],
        [f"{topics[i % 30]} study. Results on {topics[i % 30]} levels." for i in range(60)],
    )
    kw = pseudo_queries(kc, 40, seed=3, kind="keywords")
    assert sorted(kw) == sorted(topics)  # each shared topic word once, then none left
    # auto's rows: keywords first, filled up with first-words queries
    rows = auto_pseudo_queries(kc, 40, seed=3)
    assert rows[:30] == kw and len(rows) == 40 and len(set(rows)) == 40
    assert auto_pseudo_queries(c, 5, seed=3) == first  # no keyword: the first-words kind
