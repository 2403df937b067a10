"""``crossknn demo`` searches on the default path (``auto``) and prints for each query the method
and rounds that ran; it prints its results before the optional exact check, runs that check only
when asked (``--exact``), and the exact check's bar moves by pairs. No data needed."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import numpy as np
import pytest
from tqdm import tqdm

from crossknn.exact_cache import ExactScores


def test_exact_rows_are_scored_in_chunks_with_a_bar_by_pairs(tmp_path):
    calls = []
    full = np.linspace(0, 1, 10, dtype=np.float32)

    def score_items(q, idx):
        calls.append(len(idx))
        return full[idx]

    def score_row(q):
        raise AssertionError("score_items is used when given")

    ex = ExactScores(
        score_row, 10, items_key="i", model_key="m", cache_dir=tmp_path, score_items=score_items,
        chunk=4,
    )  # fmt: skip
    positions = []
    with tqdm(total=20, disable=True) as bar:
        real_update = bar.update
        bar.update = lambda n: (positions.append(n), real_update(n))
        rows = [ex.row(q, bar) for q in ("a", "b")]
    assert calls == [4, 4, 2, 4, 4, 2] and positions == [4, 4, 2, 4, 4, 2]
    assert all(np.array_equal(r, full) for r in rows)
    calls.clear()
    assert np.array_equal(ex.rows(["a"])[0], full) and calls == []  # cached


@pytest.mark.slow
def test_demo_prints_results_first_and_checks_exactly_only_when_asked(model_cache, tmp_path):
    env = {**os.environ, "CROSSKNN_CACHE": str(model_cache)}
    base = [sys.executable, "-m", "crossknn.cli", "demo", "--max-items", "60", "--budget", "20"]
    base += ["-k", "5", "--quiet", "--cache-dir", str(tmp_path), "--query", "read a file"]
    plain = subprocess.run(base, capture_output=True, text=True, timeout=600, env=env)
    assert plain.returncode == 0, plain.stderr
    out = plain.stdout
    assert "query [1] read a file" in out and "CE calls 20" in out
    # the default path: auto over the demo index's rows, with the method and rounds per query
    assert "search: method auto, the default" in out, out
    assert re.search(r"\n  auto, \d+ rounds? \([\d x+]+ CE calls\); CE calls 20;", out), out
    assert "exact check" not in out and "Top-5-Recall" in out and "--exact" in out
    exact = subprocess.run([*base, "--exact"], capture_output=True, text=True, timeout=600, env=env)
    assert exact.returncode == 0, exact.stderr
    out = exact.stdout
    assert out.index("query [1] read a file") < out.index("exact check: 60 CE calls per query")
    assert out.index("exact check") < out.index("mean Top-5-Recall@20")
    assert len(list((tmp_path).glob("*/exact/exact-*.npy"))) == 1  # the row is cached


def test_plan_text_names_the_method_and_its_rounds():
    from crossknn.commands._printing import plan_text

    assert plan_text({"method": "auto", "rounds": 4, "plan": [10, 30, 30, 30]}) == (
        "auto, 4 rounds (10 + 3 x 30 CE calls)"
    )
    assert plan_text({"method": "rnr", "rounds": 1, "plan": [100]}) == "rnr, 1 round (100 CE calls)"
