"""The generated reference pages in the order a user reads them (docs/hooks/reference.py): the
CLI's commands as ``crossknn --help`` lists them (the main job first, research tools last), the
Python reference by sections (search a corpus, serve, models, the engine, research tools), every
public name in exactly one section. No docs tools needed (the pages' Markdown is rendered here);
tests/test_docs.py checks the built site."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import crossknn
from crossknn.commands.declared import spec

HOOK = Path(__file__).resolve().parents[1] / "docs" / "hooks" / "reference.py"


def _hook():
    spec = importlib.util.spec_from_file_location("reference_hook", HOOK)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_every_public_name_is_in_exactly_one_section():
    sections = _hook().PYTHON_SECTIONS
    placed = [name for _, _, names, _ in sections for name in names]
    public = [n for n in crossknn.__all__ if not n.startswith("__")]
    assert sorted(placed) == sorted(public), set(placed) ^ set(public)
    assert len(placed) == len(set(placed))
    modules = [m for _, _, _, mods in sections for m in mods]
    assert len(modules) == len(set(modules))
    for module in modules:
        assert importlib.util.find_spec(module) is not None, module


def test_the_python_reference_starts_with_the_main_job():
    page = _hook().render_python().splitlines()
    blocks = [line.split()[1] for line in page if line.startswith("::: ")]
    assert blocks[:4] == [
        "crossknn.open_index",
        "crossknn.build_corpus_index",
        "crossknn.Searcher",
        "crossknn.Hits",
    ]
    order = {name: i for i, name in enumerate(blocks)}
    assert order["crossknn.CrossEncoder"] < order["crossknn.client"] < order["crossknn.ce"]
    assert order["crossknn.ce"] < order["crossknn.make_method"] < order["crossknn.search"]
    assert order["crossknn.search"] < order["crossknn.eval"] < order["crossknn.cmc"]
    titles = [line[3:] for line in page if line.startswith("## ")]
    assert titles == ["Search a corpus", "Serve", "Models", "The engine", "Research tools"]


def test_the_cli_reference_lists_the_main_job_first():
    page = _hook().render_cli()
    heads = re.findall(r"^### `crossknn ([\w-]+)`$", page, flags=re.M)
    assert heads == list(spec()["commands"]), heads
    first = {c: heads.index(c) for c in heads}
    for main in ("demo", "build", "search", "serve"):
        for research in ("eval", "rank", "score-matrix", "index", "cmc"):
            assert first[main] < first[research], (main, research)
    assert heads[:4] == ["demo", "build", "search", "serve"]
