"""A handful of example queries shapes the default index's pseudo-queries (issue 55): topics of
a few words keep today's keyword rows, longer queries get rows of item passages as long as they
are, chosen from four a row; the examples themselves are never scored and never rows. Stand-in
models, and one run of the command line with the embedded ones."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import lifecycle_stubs as stubs
from crossknn.commands.build_cmd import pseudo_summary
from crossknn.corpus.build import build_corpus_index, corpus_build_key
from crossknn.corpus.pseudo import auto_pseudo_queries
from crossknn.corpus.pseudo_shape import (
    PASSAGE_MAX_WORDS,
    POOL_PER_ROW,
    TOPIC_WORDS,
    check_example_queries,
    pseudo_shape,
)

TOPICS = ["vitamin d", "obesity", "breast cancer risk", "statins"]
CLAIMS = [
    "vitamin d supplements lower the risk of fractures in older adults",
    "statins reduce cardiovascular mortality in people without heart disease",
    "what is known about how obesity changes the response to chemotherapy",
]


class RecordingCE(stubs.StubCE):
    """The stand-in CE, keeping every query it was asked to score."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()

    def score_batch(self, queries, items_list):
        self.seen.update(queries)
        return super().score_batch(queries, items_list)


def _build(out, c, **kw):
    ce = RecordingCE()
    idx = build_corpus_index(c, out, ce=ce, de=stubs.StubDE(), progress=False, **kw)
    return idx, ce


def test_the_examples_median_length_picks_the_kind():
    # 800 items: 8 complete rows at the default budget (C = 6,400)
    none = pseudo_shape(None, 6400, 800, 16)
    assert none == {"shape": {"from": "items", "kind": "keywords", "count": 16}, "auto_options": {}}
    short = pseudo_shape(TOPICS, 6400, 800, 16)
    assert short["shape"]["kind"] == "keywords" and short["shape"]["count"] == 16
    assert short["shape"]["median_words"] == 1.5 and short["auto_options"] == {}
    long = pseudo_shape(CLAIMS, 6400, 800, 16)
    assert long["shape"] == {
        "from": "example queries",
        "kind": "passage",
        "examples": 3,
        "median_words": 11.0,
        "words": 11,
        "count": POOL_PER_ROW * 8,
    }
    assert long["auto_options"] == {"partial_items": 0}
    # the boundary: a median of TOPIC_WORDS words is a topic, one more is not
    at = ["w " * TOPIC_WORDS] * 3
    past = ["w " * (TOPIC_WORDS + 1)] * 3
    assert pseudo_shape(at, 6400, 800, 16)["shape"]["kind"] == "keywords"
    assert pseudo_shape(past, 6400, 800, 16)["shape"]["kind"] == "passage"
    # passages as long as the examples' median (rounded), at most PASSAGE_MAX_WORDS
    assert pseudo_shape(["w " * 7, "w " * 8], 6400, 800, 16)["shape"]["words"] == 8
    long_q = ["w " * 200] * 2
    assert pseudo_shape(long_q, 6400, 800, 16)["shape"]["words"] == PASSAGE_MAX_WORDS
    # 32 rows (the most the default gives): 128 pseudo-queries to choose them from
    assert pseudo_shape(CLAIMS, 32 * 5000, 5000, 16)["shape"]["count"] == 128


@pytest.mark.parametrize(
    ("bad", "error", "says"),
    [
        ([], ValueError, "at least one example query, got none"),
        (["a topic", "   "], ValueError, "example query 2 is '   '"),
        ("one string", TypeError, "expected a list of query texts"),
        (["q"] * 1001, ValueError, "at most 1,000"),
    ],
)
def test_bad_example_queries_are_refused_with_what_was_expected(bad, error, says):
    with pytest.raises(error, match=says):
        check_example_queries(bad)


def test_long_examples_build_passage_rows_and_are_never_scored(tmp_path):
    c = stubs.corpus(400)  # 4 complete rows
    idx, ce = _build(tmp_path / "ex", c, example_queries=CLAIMS)
    shape = idx.params["pseudo_queries"]
    assert shape["kind"] == "passage" and shape["from"] == "example queries"
    assert shape["count"] == 16 and shape["words"] == 11  # 4 a row, >= the calibration's 16
    assert not ce.seen & set(CLAIMS)  # the examples are never scored
    made = auto_pseudo_queries(c, 16, seed=0, kind="passage", words=11)
    assert ce.seen <= set(made)  # every scored query is one of the passages
    assert idx.params["auto"]["rows"] == 4 and idx.params["auto"]["partial_rows"] == 0
    budget = idx.params["budget"]
    assert ce.calls == idx.ce_calls == budget["ce_calls"] <= budget["index_calls"] == 1600
    summary = pseudo_summary(shape)
    assert summary.startswith("pseudo-queries: 16 passages of 11 words")
    assert "chosen by 3 example queries (median 11 words)" in summary


def test_topic_examples_build_todays_keyword_index(tmp_path):
    c = stubs.corpus(400)
    default, ce_d = _build(tmp_path / "default", c)
    topics, ce_t = _build(tmp_path / "topics", c, example_queries=TOPICS)
    assert default.params["pseudo_queries"] == {"from": "items", "kind": "keywords", "count": 16}
    assert topics.params["pseudo_queries"]["kind"] == "keywords"
    assert ce_d.seen == ce_t.seen and not ce_t.seen & set(TOPICS)
    assert sorted(default.arrays) == sorted(topics.arrays)
    for name in default.arrays:  # the same rows, bit for bit
        np.testing.assert_array_equal(np.asarray(default[name]), np.asarray(topics[name]))


def test_examples_enter_the_build_key_only_when_given():
    c, ce, de = stubs.corpus(200), stubs.StubCE(), stubs.StubDE()
    plain = corpus_build_key(c, ce, de)
    assert corpus_build_key(c, ce, de, example_queries=None) == plain
    a = corpus_build_key(c, ce, de, example_queries=TOPICS)
    b = corpus_build_key(c, ce, de, example_queries=CLAIMS)
    assert len({plain, a, b}) == 3


def test_examples_and_train_queries_together_are_refused(tmp_path):
    with pytest.raises(ValueError, match="--train-queries or --example-queries, not both"):
        _build(tmp_path / "x", stubs.corpus(200), train_queries=TOPICS, example_queries=CLAIMS)


@pytest.mark.slow
def test_the_cli_builds_with_example_queries(tmp_path, model_cache):
    lines = [
        json.dumps({"id": f"d{i}", "text": f"Item {i} is about topic {i % 7}. It says more."})
        for i in range(120)
    ]
    (tmp_path / "corpus.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (tmp_path / "examples.txt").write_text("\n".join(CLAIMS) + "\n", encoding="utf-8")
    (tmp_path / "train.txt").write_text("topic 3\n", encoding="utf-8")
    env = {**os.environ, "CROSSKNN_CACHE": str(model_cache)}

    def build(*extra):
        cmd = [sys.executable, "-m", "crossknn.cli", "build", "corpus.jsonl", "idx", "--quiet"]
        return subprocess.run(
            cmd + list(extra), capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600
        )

    both = build("--example-queries", "examples.txt", "--train-queries", "train.txt")
    assert both.returncode != 0 and "give one of them" in both.stderr, both.stderr
    assert not (tmp_path / "idx").exists()
    done = build("--example-queries", "examples.txt")
    assert done.returncode == 0, done.stderr
    assert (
        "pseudo-queries: 16 passages of 11 words, chosen by 3 example queries "
        "(median 11 words)" in done.stdout
    ), done.stdout
    meta = json.loads((tmp_path / "idx" / "index.json").read_text(encoding="utf-8"))
    assert meta["params"]["pseudo_queries"]["kind"] == "passage"
    assert meta["params"]["budget"]["ce_calls"] <= meta["params"]["budget"]["index_calls"] == 120
