"""``crossknn demo`` for a newcomer: sized to finish in about a minute on 2 CPU cores (a corpus of
1,500 docstrings and two rows' worth of CE calls, 3,000, where it took 6,010), every phase that
can take seconds on its own line or bar (the docstrings, each model's ONNX graph, the DE vectors,
the index's CE rows, each query as it is answered), and the same answers on every run."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from crossknn.commands import demo_cmd


def test_the_default_demo_spends_at_most_3000_index_calls():
    assert demo_cmd.DEMO_ITEMS * demo_cmd.DEMO_ROWS <= 3000
    from crossknn.cli import build_parser

    parser = build_parser()
    args = parser.parse_args(["demo"])
    assert args.index_rows == demo_cmd.DEMO_ROWS and args.max_items is None


def _demo(model_cache, cache_dir, *extra):
    env = {**os.environ, "CROSSKNN_CACHE": str(model_cache)}
    env.pop(demo_cmd.ITEMS_ENV, None)
    cmd = [sys.executable, "-m", "crossknn.cli", "demo", "--max-items", "60", "--budget", "20"]
    cmd += ["-k", "5", "--cache-dir", str(cache_dir), *extra]
    got = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert got.returncode == 0, got.stderr
    return got


def _answers(out: str) -> list[str]:
    """The hit lines (rank, score, id) of every query, in order."""
    return re.findall(r"^ +\d+ +[+-]\d+\.\d{4}  \S+", out, flags=re.M)


@pytest.mark.slow
def test_every_phase_shows_and_every_run_gives_the_same_answers(model_cache, tmp_path):
    first = _demo(model_cache, tmp_path / "a")
    out, err = first.stdout, first.stderr
    steps = [
        r"corpus: reading the docstrings of the Python \S+ stdlib \.\.\. 60 docstrings in [\d.]+ s",
        r"models: the embedded CE minilm-l6-joint \(its ONNX graph is built on first use\) \.\.\. "
        r"ready in [\d.]+ s",
        r"models: the embedded DE minilm-l6-de .*\.\.\. ready in [\d.]+ s",
        r"index: building ",
        r"index: built in [\d.]+ s, 120 CE calls",
        r"search: method auto, the default",
    ]
    at = 0
    for step in steps:
        m = re.compile(step).search(out, at)
        assert m, f"missing or out of order: {step}\n{out}"
        at = m.end()
    # the DE vectors and the index's CE rows have bars (stderr)
    assert "encode items (DE)" in err and "auto index (2 CE rows)" in err, err
    # each query's answer with what it ran, one after the other
    for i in range(1, 5):
        m = re.compile(rf"\nquery \[{i}\] .*\n(?:.*\n)*?  auto, \d+ rounds? ").search(out, at)
        assert m, f"query {i}\n{out}"
        at = m.end()
    answers = _answers(out)
    assert len(answers) == 20
    again = _demo(model_cache, tmp_path / "b")  # a new index: built again from nothing
    assert _answers(again.stdout) == answers
    cached = _demo(model_cache, tmp_path / "a", "--quiet")
    assert "(cached)" in cached.stdout and _answers(cached.stdout) == answers
