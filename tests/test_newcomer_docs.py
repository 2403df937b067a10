"""What a newcomer runs literally from the README and the guide pages:

- every wait for ``/readyz`` in the pages' shell blocks prints one answer, not the loading
  bodies of the retries glued to it (run here with bash and curl against an endpoint that says
  ``loading`` twice, with ``Retry-After``, as ``crossknn serve`` does while it loads);
- the README's command-line block runs after ``make demo``, that is without torch (torch and
  transformers cannot be imported in its processes); the commands that need torch are in a
  block of their own whose text says so;
- ``--quiet`` prints neither the CE's truncation note nor the provider line;
- serving.md's client comment shows a result as the server gives it (``rank``, ``id``,
  ``score``); filters.md says how a query line's filter meets ``--filter``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

from test_docs_walk import PAGES, REPO, SHELL, blocks

READY = {"status": "ready", "n_items": 3}
LOADING = {"detail": {"status": "loading"}}


class _Loading(BaseHTTPRequestHandler):
    """``/readyz`` as a loading server answers it: 503 ``loading`` with ``Retry-After: 1`` for
    the first ``server.loading`` requests, then 200."""

    def do_GET(self):  # noqa: N802 (http.server's name)
        self.server.seen += 1
        ready = self.server.seen > self.server.loading
        body = json.dumps(READY if ready else LOADING).encode()
        self.send_response(200 if ready else 503)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        if not ready:
            self.send_header("Retry-After", "1")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def _readyz_lines() -> list[tuple[str, list[str]]]:
    """(page:line, the block's lines from its first /readyz line to the last) of every shell
    block that waits for /readyz."""
    out = []
    for page in PAGES:
        for b in blocks(page):
            at = [i for i, line in enumerate(b["body"]) if "/readyz" in line]
            if b["lang"] in SHELL and at:
                out.append((f"{page}:{b['line'] + at[0]}", b["body"][at[0] : at[-1] + 1]))
    return out


def test_the_pages_wait_for_readyz():
    pages = {where.split(":")[0] for where, _ in _readyz_lines()}
    assert pages == set(PAGES), pages


@pytest.mark.parametrize("where,lines", _readyz_lines(), ids=lambda v: str(v)[:40])
def test_a_readyz_wait_prints_one_answer(where, lines, tmp_path):
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed")
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Loading)
    server.seen, server.loading = 0, 2
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        script = "set -eo pipefail\n" + "\n".join(lines) + "\n"
        env = {**os.environ, "PORT": str(server.server_address[1]), "HOME": str(tmp_path)}
        got = subprocess.run(
            ["bash", "-c", script], capture_output=True, text=True, env=env, timeout=120
        )
    finally:
        server.shutdown()
        server.server_close()
    assert got.returncode == 0, f"{where}: {got.stderr}"
    assert server.seen > 2, where  # it waited through the loading answers
    printed = [line for line in got.stdout.splitlines() if line.strip()]
    assert [json.loads(line) for line in printed] == [READY], f"{where} printed: {got.stdout!r}"


# -- the README's command line after make demo: no torch ----------------------------------------


def _section(page: str, title: str) -> str:
    text = (REPO / page).read_text(encoding="utf-8")
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else None]


def _cli_blocks() -> list[tuple[str, str]]:
    """(the text before it, the block) of each bash block of README's "Command line"."""
    section = _section("README.md", "Command line")
    parts = re.split(r"```bash\n(.*?)```", section, flags=re.DOTALL)
    return [(parts[i - 1], parts[i]) for i in range(1, len(parts), 2)]


TORCH_COMMANDS = re.compile(r"^crossknn (export|train-ce)\b", re.M)


def test_what_needs_torch_is_in_a_block_that_says_so():
    pairs = _cli_blocks()
    assert len(pairs) >= 2
    for before, block in pairs:
        if TORCH_COMMANDS.search(block):
            assert "need torch" in before.strip().split("\n\n")[-1], block
            assert all(
                line.startswith("crossknn export") or "torch" not in line
                for line in block.splitlines()
            )
    # the first block is the one a newcomer runs after make demo: nothing in it needs torch
    assert not TORCH_COMMANDS.search(pairs[0][1]) and "make demo" in pairs[0][0]


NO_TORCH = """
import sys


class NotInstalled:  # as after make demo: torch and transformers are not installed
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "transformers"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)


sys.meta_path.insert(0, NotInstalled())
sys.argv[0] = "crossknn"
from crossknn.cli import main
sys.exit(main())
"""


@pytest.fixture(scope="module")
def work(model_env, tmp_path_factory):
    from crossknn.demo_corpus import stdlib_docstrings
    from shared_fixtures import made_beir

    root = tmp_path_factory.mktemp("newcomer")
    docs = stdlib_docstrings(max_items=150)  # more than the budget 100 of the block's search
    rows = [json.dumps({"id": i, "text": t}) for i, t in zip(docs.ids, docs.texts, strict=True)]
    (root / "corpus.jsonl").write_text("\n".join(rows) + "\n", encoding="utf-8")
    made_beir(root / "data" / "nfcorpus", n_items=120, n_queries=2)
    bin_dir = root / "bin"
    bin_dir.mkdir()
    (bin_dir / "no_torch.py").write_text(NO_TORCH, encoding="utf-8")
    crossknn = bin_dir / "crossknn"  # `crossknn` on the PATH: the CLI without torch
    crossknn.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{bin_dir}/no_torch.py" "$@"\n')
    crossknn.chmod(0o755)
    return root


@pytest.mark.slow
def test_the_readme_command_line_runs_after_make_demo(work):
    block = _cli_blocks()[0][1]
    env = {**os.environ, "PATH": f"{work / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    got = subprocess.run(
        ["bash", "-c", "set -eo pipefail\n" + block],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert got.returncode == 0, f"{got.stdout[-2000:]}\n{got.stderr[-3000:]}"
    assert (work / "run.trec").is_file() and (work / "metrics.json").is_file()


@pytest.mark.slow
def test_quiet_prints_no_notes(work):
    long_query = "parse a date string into a datetime object " * 30  # longer than 128 tokens
    cmd = [sys.executable, "-m", "crossknn.cli", "search", str(work / "my-index"), long_query]
    cmd += ["-k", "3", "--budget", "10", "--exact"]
    if not (work / "my-index" / "index.json").is_file():
        built = subprocess.run(
            [sys.executable, "-m", "crossknn.cli", "build", "corpus.jsonl", "my-index", "--quiet"],
            cwd=work,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert built.returncode == 0, built.stderr
    loud = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert loud.returncode == 0, loud.stderr
    assert "longer than max_length" in loud.stderr and "# CE " in loud.stderr  # without --quiet
    quiet = subprocess.run([*cmd, "--quiet"], capture_output=True, text=True, timeout=600)
    assert quiet.returncode == 0, quiet.stderr
    assert "longer than max_length" not in quiet.stderr and "# CE " not in quiet.stderr, (
        quiet.stderr
    )


def test_the_client_comment_shows_a_result_as_served():
    from crossknn.searcher import Hits

    hit = Hits("q", ["d1"], np.array([0]), np.array([0.5], np.float32), 1, 0.0, 0.0)
    keys = set(hit.to_dict()["results"][0])
    text = (REPO / "docs" / "serving.md").read_text(encoding="utf-8")
    m = re.search(r'out\["hits"\]\[0\]\["results"\]\S*\s+# \[(\{.*?\})', text)
    assert m, "serving.md's client block shows a result in a comment"
    shown = set(re.findall(r'"(\w+)":', m.group(1)))
    assert shown == keys, (shown, keys)


def test_filters_page_says_the_query_filter_is_anded_with_filter():
    text = " ".join((REPO / "docs" / "filters.md").read_text(encoding="utf-8").split())
    assert "which then also applies" not in text
    assert 'its own `"filter"`, which is ANDed with `--filter`' in text


def test_the_demo_paragraph_names_the_measured_time():
    para = " ".join(_section("docs/getting-started.md", "The demo").split())
    assert re.search(r"2-core [^,]+, 20\d\d-\d\d-\d\d", para), para
    assert "1,500 docstrings" in para and "~3,000" not in para


def test_the_pages_name_the_committed_reference():
    for page in ("README.md",):
        text = (REPO / page).read_text(encoding="utf-8")
        assert "docs/reference/cli.md" in text and "that `make docs` generates" not in text
    assert (REPO / "docs" / "reference" / "cli.md").is_file()
    assert Path(REPO / "docs" / "reference" / "python.md").is_file()
