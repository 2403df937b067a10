"""docs/frameworks.md runs as written: its blocks in order, in one working folder, as a user's
terminal runs them (the docs walk of tests/test_docs_walk.py, with its user files: corpus.jsonl
and the rest): the bash blocks build an index with metadata and start a server in the
background, each Python block runs as a script against the folder and the server and must print
something. A failing step fails the test, naming the page line."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from frameworks_fixture import framework
from test_docs_walk import SHELL, _user_files, blocks, walk_env

PAGE = "docs/frameworks.md"
REPO = Path(__file__).resolve().parents[1]

for _module, _extra in (
    ("langchain_core", "langchain"),
    ("llama_index.core", "llamaindex"),
    ("haystack", "haystack"),
):
    framework(_module, _extra)


def session(work: Path) -> tuple[str, list[str]]:
    """The page as one bash script (bash blocks inline, Python blocks as scripts that must
    print), and for each script line the page line it came from."""
    script = [
        "set -eEo pipefail",
        "trap 'echo \"docs-walk: failed at script line $LINENO\" >&2' ERR",
        "trap 'kill $(jobs -p) 2>/dev/null; wait 2>/dev/null; true' EXIT",
        'pip() { "$WALK_PY" "$WALK_CHECK" pip "$@"; }',
    ]
    where = ["(walk prelude)"] * len(script)
    for n, b in enumerate(blocks(PAGE)):
        origin = f"{PAGE}:{b['line']}"
        if b["lang"] in SHELL:
            script.append(f"echo '=== {origin}' >&2")
            where.append(origin)
            for k, line in enumerate(b["body"]):
                script.append(line)
                where.append(f"{PAGE}:{b['line'] + k}")
        elif b["lang"] == "python":
            (work / f"block{n}.py").write_text("\n".join(b["body"]) + "\n", encoding="utf-8")
            script.append(f"echo '=== {origin} (python)' >&2")
            script.append(f'out=$(python block{n}.py); echo "$out"; test -n "$out"')
            where += [origin, origin]
    return "\n".join(script) + "\n", where


def test_the_page_has_a_runnable_block_per_framework():
    py = [b for b in blocks(PAGE) if b["lang"] == "python"]
    for name in ("langchain", "llamaindex", "haystack"):
        assert any(f"crossknn.integrations.{name} import" in "\n".join(b["body"]) for b in py)
    assert all(b["lang"] for b in blocks(PAGE)), "every fence says what it is"


@pytest.mark.slow
def test_the_page_runs_as_written(tmp_path, model_cache):
    pytest.importorskip("fastapi")
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed")
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    _user_files(work, home)
    script, where = session(work)
    (work / "walk.sh").write_text(script, encoding="utf-8")
    env = walk_env(home, model_cache)
    try:
        proc = subprocess.run(
            ["bash", "walk.sh"], cwd=work, env=env, capture_output=True, text=True, timeout=900
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{PAGE}: the walk did not finish in {exc.timeout} s")
    if proc.returncode != 0:
        m = re.findall(r"docs-walk: failed at script line (\d+)", proc.stderr)
        step = where[int(m[0]) - 1] if m else "?"
        pytest.fail(
            f"{PAGE}: a step failed at {step} (exit {proc.returncode})\n"
            f"--- stdout (end)\n{proc.stdout[-3000:]}\n--- stderr (end)\n{proc.stderr[-5000:]}"
        )
