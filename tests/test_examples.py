"""examples/ run as a user runs them: the Python quickstart (the README's lines), the /rerank
client against a real ``crossknn serve``, and the C++ example built as an outside CMake project."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from serve_fixture import serving

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"


@pytest.fixture(scope="module")
def quickstart(model_cache, tmp_path_factory):
    """examples/quickstart.py run once: its output and the index it built."""
    work = tmp_path_factory.mktemp("quickstart")
    env = {**os.environ, "CROSSKNN_CACHE": str(model_cache)}
    r = subprocess.run(
        [sys.executable, str(EXAMPLES / "quickstart.py"), str(work)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout, work / "index", env


def test_quickstart_searches_on_its_budget(quickstart):
    out, index, _ = quickstart
    ranks = re.findall(r"^(\d)\. (\S+) +CE score (-?[0-9.]+)$", out, re.M)
    assert [int(r[0]) for r in ranks] == [1, 2, 3], out
    scores = [float(r[2]) for r in ranks]
    assert scores == sorted(scores, reverse=True), out
    assert "CE calls: 6 of 12 items" in out
    # the date-parsing docstrings are what a CE puts first for "how do I parse a date?"
    assert ranks[0][1] in {"strptime", "fromisoformat"}, out
    assert (index / "index.json").is_file()


def test_readme_quickstart_is_the_example():
    """The README's Python block is the example's code (same calls, same order)."""
    readme = (REPO / "README.md").read_text()
    example = (EXAMPLES / "quickstart.py").read_text()
    for call in (
        "crossknn.build_corpus_index(corpus, ",
        "crossknn.Searcher(crossknn.open_index(",
        'searcher.search("how do I parse a date?", k=',
        "load_corpus(",  # the README reads a file; the example has its texts inline
    ):
        assert call in readme and call in example, call


def test_rerank_client_against_a_real_server(quickstart, tmp_path):
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")

    _, index, env = quickstart
    key = tmp_path / "key.txt"
    key.write_text("example-secret-key-0123456789\n")
    crossknn = (str(Path(sys.executable).parent / "crossknn"),)  # the console script
    flags = ("--api-key-file", str(key), "--threads", "1")
    where = {"index_dir": index, "root": tmp_path}
    with serving(where, *flags, program=crossknn, environ=env, log_level=None) as s:
        run = [sys.executable, str(EXAMPLES / "rerank_client.py"), s.url]
        r = subprocess.run(
            [*run, "--api-key-file", str(key)], capture_output=True, text=True, timeout=120
        )
        assert r.returncode == 0, r.stderr
        lines = re.findall(r"^(\d)\. \[(\d)\] +(-?[0-9.]+)  (.+)$", r.stdout, re.M)
        assert sorted(int(x[1]) for x in lines) == [0, 1, 2, 3], r.stdout
        scores = [float(x[2]) for x in lines]
        assert scores == sorted(scores, reverse=True)
        assert lines[0][3].startswith("json."), r.stdout  # "how do I read a JSON file?"
        # without the key the server refuses, and the client says so in one line
        r = subprocess.run(run, capture_output=True, text=True, timeout=60)
        assert r.returncode != 0 and "/rerank answered 401" in r.stderr, r.stderr


def test_cpp_example_builds_against_the_source_tree_and_runs():
    tools = {
        t: shutil.which(t, path=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
        for t in ("cmake", "ninja", "c++")
    }
    missing = [t for t, p in tools.items() if p is None]
    if missing:
        pytest.skip(f"the C++ example needs {', '.join(missing)}")
    build = REPO / "build" / "examples-cpp"  # kept between runs: later builds are incremental
    cmd = [tools["cmake"], "-S", str(EXAMPLES / "cpp"), "-B", str(build), "-G", "Ninja"]
    cmd += [f"-DCMAKE_MAKE_PROGRAM={tools['ninja']}", f"-DCROSSKNN_SOURCE_DIR={REPO}"]
    cmd += ["-DCMAKE_BUILD_TYPE=Release"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    r = subprocess.run(
        [tools["cmake"], "--build", str(build), "-j2"], capture_output=True, text=True, timeout=900
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    r = subprocess.run([str(build / "rounds"), "20000", "100"], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    m = re.search(r"100 scorer calls of 20000 items; Top-10-Recall ([0-9.]+)", r.stdout)
    assert m, r.stdout
    # 100 of 20,000 items scored: the rounds find most of the exact top-10 (1.00 when written)
    assert float(m.group(1)) >= 0.7, r.stdout
