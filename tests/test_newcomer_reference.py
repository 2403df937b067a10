"""The reference pages are in the repository (docs/reference/cli.md and python.md, readable on
GitHub and in a clone) and cannot go stale: each equals what docs/hooks/reference.py renders
from the code now (``python docs/hooks/reference.py --write`` rewrites them; ``--check`` names a
page that drifted), every CLI flag and every public Python name is on them."""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
HOOK = REPO / "docs" / "hooks" / "reference.py"


@pytest.fixture(scope="module")
def hook():
    spec = importlib.util.spec_from_file_location("reference_hook", HOOK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def griffe():
    if importlib.util.find_spec("griffe") is None:
        if os.environ.get("CI") == "true":  # CI installs the docs tools: a miss is a failure
            pytest.fail("griffe is not installed: make docs (or make pytest) installs it")
        pytest.skip("griffe is not installed: make docs installs mkdocstrings and griffe")


def _page(name: str) -> str:
    return (REPO / "docs" / "reference" / name).read_text(encoding="utf-8")


def test_the_cli_reference_is_the_codes(hook):
    assert _page("cli.md") == hook.render_cli(), (
        "docs/reference/cli.md differs from the code: python docs/hooks/reference.py --write"
    )


def test_the_python_reference_is_the_codes(hook, griffe):
    assert _page("python.md") == hook.render_python_markdown(), (
        "docs/reference/python.md differs from the code: python docs/hooks/reference.py --write"
    )


def test_the_cli_page_is_the_same_on_any_terminal(hook, monkeypatch):
    monkeypatch.setenv("COLUMNS", "40")
    narrow = hook.render_cli()
    monkeypatch.setenv("COLUMNS", "250")
    assert hook.render_cli() == narrow


def test_every_flag_and_every_public_name_is_on_the_pages():
    import crossknn
    from crossknn.cli import build_parser

    cli = _page("cli.md")
    python = _page("python.md")

    def walk(parser, path):
        assert f"`{' '.join(path)}`" in cli, path
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, [*path, name])
            for flag in action.option_strings:
                if flag not in ("-h", "--help"):
                    assert f"`{flag}" in cli, (path, flag)

    walk(build_parser(), ["crossknn"])
    missing = [n for n in crossknn.__all__ if f"### `crossknn.{n}`" not in python]
    assert not missing or missing == ["__version__"], missing


def test_check_names_a_page_that_drifted(hook, griffe, tmp_path):
    copy = tmp_path / "docs" / "reference"
    copy.mkdir(parents=True)
    for name in ("cli.md", "python.md"):
        (copy / name).write_text(_page(name), encoding="utf-8")
    assert hook.drifted(tmp_path / "docs") == []
    (copy / "cli.md").write_text(_page("cli.md") + "typed by hand\n", encoding="utf-8")
    assert hook.drifted(tmp_path / "docs") == ["reference/cli.md"]


def test_the_check_runs_as_a_command(griffe):
    got = subprocess.run(
        [sys.executable, str(HOOK), "--check"], capture_output=True, text=True, timeout=300
    )
    assert got.returncode == 0, got.stdout + got.stderr


def _make_n(*goals: str) -> str:
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    got = subprocess.run(
        ["make", "-n", "-B", *goals], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert got.returncode == 0, got.stderr
    return got.stdout


def test_make_docs_needs_no_torch():
    # -B: every step from a fresh clone, as make would run them
    steps = _make_n("docs")
    assert "mkdocs build --strict" in steps
    assert "torch" not in steps.replace("no torch", ""), steps
    # within make test, docs and pytest share the one (test) install
    assert _make_n("test-steps").count("--no-build-isolation --no-deps -e .") == 1
