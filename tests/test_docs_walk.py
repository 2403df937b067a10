"""Every shell block of the README and of the getting-started, living-index and serving pages,
run as a user would, in order, on a small corpus: a step that errors fails the test, naming the
page and line.

A page is one shell session (bash, ``set -e -o pipefail``): its ``bash`` blocks run in the order
they appear, in one working folder, so a server a block starts in the background is there for
the next block, as in a user's terminal; background jobs are stopped when the page ends. The
README's Python block runs as a script where it appears and must print something. What a user
brings is in the working folder: ``corpus.jsonl`` (150 standard-library docstrings),
``queries.txt``, ``new-items.jsonl``, ``gone.txt``, BEIR folders ``data/nfcorpus`` and
``DATA/nfcorpus`` (made here, small), ``~/models/my-ce`` (a tiny Hugging Face cross-encoder
folder in a temporary ``$HOME``), and the checkout's ``.venv``. curl runs with ``fail-with-body``
in that ``~/.curlrc``, so an HTTP error answer is a failed step. Substituted through documented
environment variables only: ``PORT`` (a free port; the blocks use ``${PORT:-8080}``),
``CROSSKNN_DEMO_ITEMS`` (the demo indexes 60 docstrings) and ``CROSSKNN_ORT_SPINNING`` (as the
test run has it: tests/conftest.py). The install steps (``pip install``,
``make demo``/``make test``) are checked, not run, by tests/docs_walk_check.py: the packages are
installed and the make targets expand (``make -n``). A block marked ``<!-- walk: needs a GPU -->``
is skipped on a machine without one.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = ["README.md", "docs/getting-started.md", "docs/living-index.md", "docs/serving.md"]
SHELL = {"bash", "sh", "shell"}
SKIP_REASONS = {"needs a GPU"}
FENCE = re.compile(r"^```([\w-]*)\s*$")
MARK = re.compile(r"^<!-- walk: (.+?) -->\s*$")


def blocks(page: str) -> list[dict]:
    """The fenced blocks of ``page``: language, first line number, lines, walk mark."""
    lines = (REPO / page).read_text(encoding="utf-8").splitlines()
    out, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        mark = MARK.match(lines[i - 1]) if i else None
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        out.append(
            {
                "lang": m.group(1),
                "line": i + 2,  # the block's first line, 1-based
                "body": lines[i + 1 : end],
                "mark": mark.group(1) if mark else None,
            }
        )
        i = end + 1
    return out


def test_every_block_says_what_it_is():
    """An untagged fence could be a shell block the walk never runs: every fence is tagged."""
    untagged = [
        f"{page}:{b['line'] - 1}" for page in PAGES for b in blocks(page) if not b["lang"].strip()
    ]
    assert not untagged, f"fenced blocks without a language (bash, text, json ...): {untagged}"
    shell = [b for page in PAGES for b in blocks(page) if b["lang"] in SHELL]
    assert len(shell) >= 10, "expected the pages' shell blocks"
    marks = {b["mark"] for page in PAGES for b in blocks(page) if b["mark"]}
    assert marks <= SKIP_REASONS, marks


def _has_gpu() -> bool:
    return shutil.which("nvidia-smi") is not None


def session(page: str, work: Path) -> tuple[str, list[str]]:
    """The page as one bash script, and for each script line the page line it came from."""
    where: list[str] = []
    script: list[str] = []

    def add(line: str, origin: str) -> None:
        script.append(line)
        where.append(origin)

    for text in (
        "set -eEo pipefail",
        "trap 'echo \"docs-walk: failed at script line $LINENO\" >&2' ERR",
        "trap 'kill $(jobs -p) 2>/dev/null; wait 2>/dev/null; true' EXIT",
        'pip() { "$WALK_PY" "$WALK_CHECK" pip "$@"; }',
        'make() { "$WALK_PY" "$WALK_CHECK" make "$@"; }',
    ):
        add(text, "(walk prelude)")
    for n, b in enumerate(blocks(page)):
        origin = f"{page}:{b['line']}"
        if b["mark"] and not (b["mark"] == "needs a GPU" and _has_gpu()):
            add(f"echo 'docs-walk: {origin}: skipped ({b['mark']})'", origin)
            continue
        if b["lang"] in SHELL:
            add(f"echo '=== {origin}' >&2", origin)
            for k, line in enumerate(b["body"]):
                add(line, f"{page}:{b['line'] + k}")
        elif b["lang"] == "python" and page == "README.md":
            script_file = work / f"block{n}.py"
            script_file.write_text("\n".join(b["body"]) + "\n", encoding="utf-8")
            add(f"echo '=== {origin} (python)' >&2", origin)
            # a script prints what it shows: the output must not be empty
            add(f'out=$(python {script_file.name}); echo "$out"; test -n "$out"', origin)
    return "\n".join(script) + "\n", where


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def walk_env(home: Path, model_cache: Path, **extra: str) -> dict[str, str]:
    """The environment a page's walk runs in: a user's (no pytest, Hugging Face or crossknn
    variables of this run), this virtual environment's commands on PATH, a free PORT, the run's
    model cache, offline, the walk's checker; ``extra`` on top."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PYTEST_", "HF_", "CROSSKNN_", "VIRTUAL_ENV"))
    }
    env.update(
        HOME=str(home),
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        PORT=str(_free_port()),
        CROSSKNN_CACHE=str(model_cache),
        CROSSKNN_ORT_SPINNING=os.environ.get("CROSSKNN_ORT_SPINNING", ""),
        HF_HUB_OFFLINE="1",
        WALK_PY=sys.executable,
        WALK_CHECK=str(REPO / "tests" / "docs_walk_check.py"),
        PYTHONUNBUFFERED="1",
        **extra,
    )
    return env


def _user_files(work: Path, home: Path) -> None:
    from crossknn.demo_corpus import stdlib_docstrings
    from shared_fixtures import made_beir, tiny_bert

    docs = stdlib_docstrings(max_items=160)
    rows = [json.dumps({"id": i, "text": t}) for i, t in zip(docs.ids, docs.texts, strict=True)]
    (work / "corpus.jsonl").write_text("\n".join(rows[:150]) + "\n", encoding="utf-8")
    (work / "new-items.jsonl").write_text("\n".join(rows[150:155]) + "\n", encoding="utf-8")
    (work / "gone.txt").write_text(f"{docs.ids[3]}\n{docs.ids[7]}\n", encoding="utf-8")
    (work / "queries.txt").write_text(
        "parse a date string\nread a file line by line\nsend an email\n", encoding="utf-8"
    )
    for name in ("data", "DATA"):
        made_beir(work / name / "nfcorpus", n_items=120, n_queries=4)  # > the budget 100
    (work / ".venv").symlink_to(sys.prefix)
    (home / "models").mkdir(parents=True)
    tiny_bert(home / "models" / "my-ce")  # what ~/models/my-ce stands for
    (home / ".curlrc").write_text("fail-with-body\nmax-time = 600\n", encoding="utf-8")


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES)
def test_the_page_runs_as_written(page, tmp_path, model_cache):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("fastapi")
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed")
    if not (Path(sys.prefix) / "bin" / "activate").is_file():
        pytest.skip(f"{sys.prefix} is not a virtual environment (no bin/activate)")
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    _user_files(work, home)
    script, where = session(page, work)
    (work / "walk.sh").write_text(script, encoding="utf-8")
    env = walk_env(home, model_cache, CROSSKNN_DEMO_ITEMS="60")
    try:
        proc = subprocess.run(
            ["bash", "walk.sh"],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=1200,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{page}: the walk did not finish in {exc.timeout} s")
    if proc.returncode != 0:
        m = re.findall(r"docs-walk: failed at script line (\d+)", proc.stderr)
        step = where[int(m[0]) - 1] if m else "?"  # the first: the failed step itself
        pytest.fail(
            f"{page}: a step failed at {step} (exit {proc.returncode})\n"
            f"--- stdout (end)\n{proc.stdout[-3000:]}\n--- stderr (end)\n{proc.stderr[-5000:]}"
        )
