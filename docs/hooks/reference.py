"""mkdocs hook: the reference pages, generated from the code at build time (never typed by hand).

- ``reference/cli.md``: every ``crossknn`` subcommand and flag, read from
  ``crossknn.cli.build_parser()`` (usage, description, and one table row per argument with its
  help text and default).
- ``reference/python.md``: one mkdocstrings block (``::: crossknn.NAME``) per name in
  ``crossknn.__all__`` and per module a user reaches for, in sections ordered as a user reads
  (:data:`PYTHON_SECTIONS`: search a corpus, serve, models, the engine, research tools).

``python docs/hooks/reference.py OUT_DIR`` writes both pages to OUT_DIR (to read them without
mkdocs).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

# The Python reference in the order a user reads it: the main job first (open or build an index,
# search it, the CE alone, serve it), then the models, the engine under the search, and the
# research tools. Each section: top-level names of crossknn (every name of crossknn.__all__ is in
# exactly one section: tests/test_reference_order.py), then modules.
PYTHON_SECTIONS: list[tuple[str, str, list[str], list[str]]] = [
    (
        "Search a corpus",
        "Build an index of your corpus, open it, search it on a budget of CE calls; the CE alone "
        "with sentence-transformers' API; corpora and queries from files.",
        ["open_index", "build_corpus_index", "Searcher", "Hits", "CrossEncoder"],
        ["crossknn.data"],
    ),
    (
        "Serve",
        "A client of `crossknn serve` (the server itself is the command: [CLI](cli.md)).",
        [],
        ["crossknn.client"],
    ),
    (
        "Models",
        "Cross-encoders and dual encoders: the embedded defaults, your folders, Hub ids.",
        [],
        ["crossknn.ce", "crossknn.ce.folders", "crossknn.ce.hub"],
    ),
    (
        "The engine",
        "The round engine and the methods on it, the scorers that count CE calls, first "
        "stages, index files.",
        [
            "make_method",
            "AXN",
            "ADACUR",
            "ANNCUR",
            "RNR",
            "CurIndex",
            "SearchResult",
            "ItemFeatures",
            "RoundState",
            "ScoreMap",
            "BudgetedScorer",
            "BudgetExceededError",
            "MatrixScorer",
        ],
        [
            "crossknn.search",
            "crossknn.search.round_plan",
            "crossknn.search.round_index",
            "crossknn.search.shards",
            "crossknn.core",
            "crossknn.scorers",
            "crossknn.retrievers",
            "crossknn.index",
        ],
    ),
    (
        "Research tools",
        "Recall against score matrices, run files and metrics, resumable CE jobs, CMC.",
        [],
        ["crossknn.eval", "crossknn.matrix", "crossknn.trec", "crossknn.jobs", "crossknn.cmc"],
    ),
]

# pages in the nav that other owners write; until one exists, the build shows a stub in its place
# (generated here, never written to docs/), so that the nav and the links to it resolve
PAGES_WRITTEN_ELSEWHERE = {
    "operating.md": "Operating it safely",
    "living-index.md": "The living index",
}

CLI_PAGE = "reference/cli.md"
PYTHON_PAGE = "reference/python.md"


def _cell(text: str) -> str:
    """Help text as literal markdown on one line: HTML and emphasis characters escaped, pipes
    escaped for a table cell."""
    text = " ".join(str(text).split())
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    for ch in "\\`*_[]|":
        text = text.replace(ch, "\\" + ch)
    return text


def _flags(action: argparse.Action) -> str:
    if action.option_strings:
        metavar = ""
        if action.nargs != 0:
            metavar = action.metavar or action.dest.upper()
            if isinstance(metavar, tuple):
                metavar = " ".join(metavar)
            metavar = f" {metavar}"
        return ", ".join(f"`{s}{metavar}`" for s in action.option_strings)
    return f"`{action.metavar or action.dest}`"


def _default(action: argparse.Action) -> str:
    if not action.option_strings or action.nargs == 0 or action.required:
        return ""
    if action.default is None or action.default is argparse.SUPPRESS:
        return ""
    return f"`{action.default!r}`" if not isinstance(action.default, str) else f"`{action.default}`"


def _section(parser: argparse.ArgumentParser, path: list[str], level: int) -> list[str]:
    name = " ".join(path)
    out = [f"{'#' * level} `{name}`", ""]
    if parser.description:
        out += [_cell(parser.description), ""]
    usage = parser.format_usage().strip()
    out += ["```text", usage, "```", ""]
    formatter = parser._get_formatter()
    rows = []
    subcommands: list[tuple[str, argparse.ArgumentParser]] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            subcommands += list(action.choices.items())
            continue
        if isinstance(action, argparse._HelpAction) or action.help == argparse.SUPPRESS:
            continue
        help_text = formatter._expand_help(action) if action.help else ""
        choices = ""
        if action.choices is not None and not isinstance(action, argparse._SubParsersAction):
            choices = ", ".join(f"`{c}`" for c in action.choices)
        rows.append((_flags(action), _cell(help_text), choices, _default(action)))
    if rows:
        out += ["| argument | help | choices | default |", "|---|---|---|---|"]
        out += [f"| {f} | {h} | {c} | {d} |" for f, h, c, d in rows]
        out.append("")
    for sub_name, sub in subcommands:
        out += _section(sub, path + [sub_name], level + 1)
    return out


def render_cli() -> str:
    """The CLI reference page: every subcommand of ``crossknn`` with every argument."""
    from crossknn.cli import build_parser

    parser = build_parser()
    out = [
        "# Command line reference",
        "",
        "Generated from `crossknn.cli.build_parser()` when the site is built (`make docs`): every",
        "subcommand and every flag, with the help text `crossknn COMMAND --help` prints.",
        "",
    ]
    out += _section(parser, ["crossknn"], 2)
    return "\n".join(out) + "\n"


def render_python() -> str:
    """The Python API page, in :data:`PYTHON_SECTIONS`' order: the main job, then the models,
    the engine and the research tools; signatures shown, instance attributes without a docstring
    left out (``docs/hooks/griffe_attributes.py``)."""
    import crossknn

    out = [
        "# Python API reference",
        "",
        "Generated from the docstrings when the site is built (`make docs`, mkdocstrings), in the",
        "order a user needs them: search a corpus, serve it, the models, then the engine and the",
        "research tools.",
        "",
        f"`crossknn.__version__` is the package version (`{crossknn.__version__}` in this build).",
        "",
    ]
    for title, intro, names, modules in PYTHON_SECTIONS:
        out += [f"## {title}", "", intro, ""]
        for name in names:
            out += [f"::: crossknn.{name}", "    options:", "      heading_level: 3", ""]
        for module in modules:
            out += [f"### `{module}`", "", f"::: {module}", "    options:"]
            out += ["      heading_level: 4", "      show_root_heading: false"]
            out += ["      show_root_toc_entry: false", ""]
    return "\n".join(out) + "\n"


def on_files(files, config):
    """Add the generated pages to the site's files (they exist only in the build)."""
    from mkdocs.structure.files import File

    for src_uri, render in ((CLI_PAGE, render_cli), (PYTHON_PAGE, render_python)):
        existing = files.get_file_from_path(src_uri)
        if existing is not None:
            files.remove(existing)
        files.append(File.generated(config, src_uri, content=render()))
    for src_uri, title in PAGES_WRITTEN_ELSEWHERE.items():
        if files.get_file_from_path(src_uri) is None:
            stub = f"# {title}\n\nThis page is not written yet.\n"
            files.append(File.generated(config, src_uri, content=stub))
    return files


# docstrings use Sphinx roles (:class:`x`); mkdocstrings renders them as ":class:" + code
_ROLE = re.compile(r":(?:mod|class|func|meth|data|attr|exc|obj):<code>(~?)([^<]*)</code>")


def _strip_role(match: re.Match) -> str:
    target = match.group(2)
    return f"<code>{target.rsplit('.', 1)[-1] if match.group(1) else target}</code>"


def on_page_content(html, page, config, files):
    """Sphinx roles in the rendered docstrings shown as plain code."""
    return _ROLE.sub(_strip_role, html)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python docs/hooks/reference.py OUT_DIR")
    out_dir = Path(sys.argv[1])
    for page, render in ((CLI_PAGE, render_cli), (PYTHON_PAGE, render_python)):
        path = out_dir / page
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(render(), encoding="utf-8")
        print(path)
