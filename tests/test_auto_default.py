"""The default index budget of ``crossknn build`` and the pseudo-query kinds (issue 29)."""

import argparse
import re

import numpy as np
import pytest

from crossknn.commands.build_cmd import _index_calls, auto_summary, budget_summary
from crossknn.corpus.pseudo import PSEUDO_KINDS, SPAN_WORDS, auto_pseudo_queries, pseudo_queries
from crossknn.data import Corpus
from crossknn.index.auto import (
    ITEMS_PER_ROW,
    MAX_DEFAULT_ROWS,
    default_index_budget,
    default_index_rows,
    expected_gain,
    pseudo_query_count,
)


def test_default_rows_scale_with_the_corpus_and_stop_at_the_cap():
    assert default_index_rows(40) == 0  # tiny corpora read no row
    assert default_index_rows(ITEMS_PER_ROW - 1) == 0
    assert default_index_rows(1_000) == 10
    assert default_index_rows(3_633) == MAX_DEFAULT_ROWS == 32
    assert default_index_rows(10**7) == MAX_DEFAULT_ROWS
    assert default_index_rows(3_633, n_train=5) == 5
    with pytest.raises(ValueError, match="n_items >= 1"):
        default_index_rows(0)


def test_default_budget_is_a_function_of_the_corpus_alone():
    # no speed, no clock: the same numbers wherever and however fast the CE runs
    assert default_index_budget(1_460) == (14 * 1_460, 14)
    assert default_index_budget(5_183) == (32 * 5_183, 32)
    assert default_index_budget(3_633, n_train=5) == (5 * 3_633, 5)
    # below 100 items no row: the budget is the calibration's pairs (at most N items a query)
    assert default_index_budget(40) == (16 * 32, 0)
    assert default_index_budget(20, calibration_queries=4, calibration_items=32) == (4 * 20, 0)
    assert default_index_budget(40, n_train=3, calibration_items=8) == (3 * 8, 0)
    assert pseudo_query_count(16 * 3_633, 3_633, 16) == 16


def test_index_calls_flag_maps_to_the_rule_or_a_count():
    ns = argparse.Namespace
    assert _index_calls(ns(index_calls=None, index_minutes=None)) == "default"
    assert _index_calls(ns(index_calls=None, index_minutes=2.0)) == "default"
    assert _index_calls(ns(index_calls=0, index_minutes=None)) == 0  # no CE call at all
    assert _index_calls(ns(index_calls=500, index_minutes=None)) == 500
    with pytest.raises(ValueError, match="--index-minutes"):
        _index_calls(ns(index_calls=500, index_minutes=1.0))


def test_summary_line_says_what_was_spent_and_what_it_buys():
    assert "fewer than 100 items" in auto_summary(None, 40)
    assert "none asked" in auto_summary(None, 4_000)
    line = auto_summary({"index_calls": 58_128, "rows": 16, "index_calls_limit": 58_128}, 3_633)
    assert "58,128 CE calls for 16 complete rows;" in line and "pairs/s" not in line
    assert "Top-10-Recall@100 0.94" in line and "AXN over DE 0.71" in line
    assert "1 row's worth of CE calls gave Top-10-Recall@100 0.79" in expected_gain(3633, 3633)
    # a default build's 30 complete rows + partial rows spend 32 rows' worth (116,190 calls)
    assert "32 rows' worth" in expected_gain(116_190, 3633)
    assert "16 rows' worth" in expected_gain(31 * 3633 - 3633 // 2 - 1, 3633)
    assert "0 rows' worth" in expected_gain(0, 3633)
    assert "the time cap read no row" in auto_summary(None, 4_000, {"time_cap": {"cut": True}})


def test_budget_line_says_how_the_budget_was_spent_and_where_a_time_cap_cut():
    budget = {
        "index_calls": 20_440,
        "rule": "default: 14 complete rows (one per 100 items, at most 32) x 1460 items",
        "spent": {"calibration": 0, "auto_rows": 18_980, "auto_partial_rows": 1_400},
        "ce_calls": 20_380,
    }
    line = budget_summary(budget)
    assert line.startswith("index budget: 20,440 CE calls (default: 14 complete rows")
    assert "spent 20,380: calibration 0, auto rows 18,980, partial rows 1,400" in line
    assert "time cap" not in line
    cap = {"minutes": 2.0, "rows_planned": 14, "rows_read": 5, "cut": True}
    assert "time cap 2 min: cut at 5 of 14 rows" in budget_summary({**budget, "time_cap": cap})
    cap = {**cap, "rows_read": 14, "cut": False}
    assert "time cap 2 min: not reached (14 rows)" in budget_summary({**budget, "time_cap": cap})
    extra = {
        **budget,
        "extra": {"tune_rounds": 400},
        "spent": {**budget["spent"], "tune_rounds": 350},
    }
    assert "--tune-rounds 350 (of 400 stated)" in budget_summary(extra)
    assert "not recorded" in budget_summary(None)


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
    assert PSEUDO_KINDS == ("first", "sentence", "keywords", "spans", "mix", "passage")
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


def test_spans_run_from_topics_to_claims_and_mix_takes_a_third_of_each_kind():
    topics = [
        a + b
        for a in ("mel", "thy", "cur", "acr")
        for b in ("atonin", "oid", "cumin", "ylic", "ber")
    ]
    texts = [
        f"{topics[i // 2]} alpha beta gamma. Second sentence of item {i} has quite a few words "
        f"in it to cut from here on. Third {i}!"
        for i in range(40)
    ]
    c = Corpus([f"d{i}" for i in range(40)], texts)
    spans = pseudo_queries(c, 14, seed=5, kind="spans")
    assert spans == pseudo_queries(c, 14, seed=5, kind="spans") and len(set(spans)) == 14
    for j, q in enumerate(spans):
        # the opening words of one of the item's sentences, SPAN_WORDS long in turn (a short
        # sentence gives all its words)
        assert any(s.startswith(q) for t in texts for s in re.split(r"(?<=[.!?])\s+", t))
        assert len(q.split()) <= SPAN_WORDS[j % len(SPAN_WORDS)]
    assert {len(q.split()) for q in spans} >= {2, 3, 4}  # topics beside claims
    mix = pseudo_queries(c, 9, seed=5, kind="mix")
    kw = auto_pseudo_queries(c, 3, seed=5, kind="keywords")
    first = pseudo_queries(c, 3, seed=5)
    sent = pseudo_queries(c, 3, seed=5, kind="sentence")
    assert mix == [q for trio in zip(kw, first, sent, strict=True) for q in trio]
    assert len(pseudo_queries(c, 100, seed=5, kind="spans")) <= 40  # one per item at most


def test_passages_are_as_long_as_asked_from_a_sentence_on():
    texts = [
        f"Title {i} here. First sentence of item {i} runs on. Then a second one {i}. End {i}."
        for i in range(30)
    ]
    c = Corpus([f"d{i}" for i in range(30)], texts)
    flat = [" ".join(t.split()) for t in texts]
    got = pseudo_queries(c, 12, seed=2, kind="passage", words=9)
    assert got == pseudo_queries(c, 12, seed=2, kind="passage", words=9) and len(got) == 12
    starts = set()
    for q in got:
        assert len(q.split()) == 9  # every start chosen leaves 9 words (items have 19)
        t = next(t for t in flat if q in t)
        starts.add(t.index(q) > 0)
        # it starts a sentence: the item's start or after a sentence's end
        assert t.index(q) == 0 or t[: t.index(q)].rstrip().endswith(".")
    assert starts == {True, False}  # the first sentence and later ones
    # an item shorter than a passage: all of it
    short = Corpus(["s"], ["only five words in here"])
    assert pseudo_queries(short, 1, kind="passage", words=64) == ["only five words in here"]
