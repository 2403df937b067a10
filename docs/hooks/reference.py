"""mkdocs hook: the reference pages, generated from the code at build time (never typed by hand).

- ``reference/cli.md``: every ``crossknn`` subcommand and flag, read from
  ``crossknn.cli.build_parser()`` (usage, description, and one table row per argument with its
  help text and default).
- ``reference/python.md``: one mkdocstrings block (``::: crossknn.NAME``) per name in
  ``crossknn.__all__`` and per module a user reaches for, in sections ordered as a user reads
  (:data:`PYTHON_SECTIONS`: search a corpus, serve, models, the engine, research tools).

Both pages are also committed as Markdown that reads without mkdocs (on GitHub, in a clone):
``docs/reference/cli.md`` is :func:`render_cli`'s page, ``docs/reference/python.md`` is
:func:`render_python_markdown`'s (the same sections, signatures and docstrings read from the
source by griffe, mkdocstrings' own reader). ``python docs/hooks/reference.py --write``
rewrites them; ``--check`` fails naming a page that differs from what the code gives (``make
test`` runs it through tests/test_newcomer_reference.py); ``python docs/hooks/reference.py
OUT_DIR`` writes the site's versions to OUT_DIR.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import textwrap
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

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


@contextmanager
def _columns(n: int):
    """argparse wraps usage lines to the terminal's width: a fixed one, the same page anywhere."""
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(n)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old


def render_cli() -> str:
    """The CLI reference page: every subcommand of ``crossknn`` with every argument."""
    from crossknn.cli import build_parser

    with _columns(100):
        parser = build_parser()
        out = [
            "# Command line reference",
            "",
            "Generated from `crossknn.cli.build_parser()` (`python docs/hooks/reference.py "
            "--write`; `make test` fails",
            "when it differs from the code): every subcommand and every flag, with the help "
            "text `crossknn COMMAND --help` prints.",
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


# ---- the Python reference as Markdown that reads without mkdocs ------------------------------

# Sphinx roles (:class:`~a.B`) and reST literals (``x``) in docstrings, as Markdown code
_MD_ROLE = re.compile(r":(?:mod|class|func|meth|data|attr|exc|obj):`(~?)([^`]*)`")


_SECTION = re.compile(r"^(Args|Arguments|Returns|Raises|Attributes|Yields|Examples?|Notes?):$")
_ITEM = re.compile(r"^    (\*{0,2}[\w.]+)( \([^)]*\))?: ?(.*)$")


def _google_sections(text: str) -> str:
    """Google-style sections (``Args:`` and indented ``name (type): text`` lines) as a bold
    label and a list, so that Markdown keeps the items apart."""
    out, in_section = [], False
    for line in text.splitlines():
        if _SECTION.match(line):
            out += ["", f"**{line[:-1]}**", ""]
            in_section = True
            continue
        if in_section and line and not line.startswith("    "):
            in_section = False
            out.append("")
        m = _ITEM.match(line) if in_section else None
        if m:
            out.append(f"- `{m.group(1)}`{m.group(2) or ''}: {m.group(3)}")
        elif in_section and line.startswith("    "):
            out.append("  " + line.strip())
        else:
            out.append(line)
    return "\n".join(out)


def _md_doc(text: str | None) -> list[str]:
    if not text:
        return []
    text = _google_sections(textwrap.dedent(text))
    text = _MD_ROLE.sub(
        lambda m: f"`{m.group(2).rsplit('.', 1)[-1] if m.group(1) else m.group(2)}`", text
    )
    text = re.sub(r"``([^`]+)``", r"`\1`", text)
    return [textwrap.dedent(text).strip(), ""]


def _params(fn, *, drop_self: bool) -> str:
    parts, star = [], False
    for i, p in enumerate(fn.parameters):
        if drop_self and i == 0 and p.name in ("self", "cls"):
            continue
        kind = p.kind.value
        if kind == "keyword-only" and not star:
            parts.append("*")
            star = True
        name = {"variadic positional": "*", "variadic keyword": "**"}.get(kind, "") + p.name
        star = star or kind == "variadic positional"
        if p.annotation is not None:
            name += f": {p.annotation}"
        if p.default is not None and not kind.startswith("variadic"):
            name += f" = {p.default}" if p.annotation is not None else f"={p.default}"
        parts.append(name)
        if kind == "positional-only" and (
            i + 1 == len(fn.parameters) or fn.parameters[i + 1].kind.value != "positional-only"
        ):
            parts.append("/")
    return ", ".join(parts)


def _signature(obj, name: str) -> str:
    kind = obj.kind.value
    if kind == "class":
        init = obj.members.get("__init__")
        init = init.final_target if init is not None and init.is_alias else init
        args = (
            _params(init, drop_self=True)
            if init is not None and init.kind.value == "function"
            else ""
        )
        return f"class {name}({args})"
    if kind == "function":
        ret = f" -> {obj.returns}" if obj.returns is not None else ""
        labels = getattr(obj, "labels", set())
        prefix = "@property\n" if "property" in labels else ""
        return f"{prefix}def {name}({_params(obj, drop_self='staticmethod' not in labels)}){ret}"
    if kind == "attribute":
        ann = f": {obj.annotation}" if obj.annotation is not None else ""
        value = f" = {obj.value}" if obj.value is not None else ""
        if len(value) > 200:
            value = " = ..."
        return f"{name}{ann}{value}"
    return name


def _public_members(obj) -> list:
    """A class's or module's members a reader looks up: the module's ``__all__`` (in order), else
    public names defined there; a class's public methods and documented attributes."""
    if obj.kind.value == "module":
        exports = getattr(obj, "exports", None)
        if exports:
            names = [str(n) for n in exports]
        else:
            names = [n for n, m in obj.members.items() if not m.is_alias and not n.startswith("_")]
        out = []
        for n in names:
            m = obj.members.get(n)
            if m is None or m.kind.value == "module":
                continue
            out.append((n, m.final_target if m.is_alias else m))
        return out
    out = []
    for n, m in obj.members.items():
        if n.startswith("_") or m.is_alias:
            continue
        if m.kind.value == "attribute" and not (m.docstring and m.docstring.value.strip()):
            continue  # an instance attribute the engine sets: not API
        out.append((n, m))
    return out


def _md_object(obj, title: str, level: int) -> list[str]:
    obj = obj.final_target if obj.is_alias else obj
    short = title.rsplit(".", 1)[-1]
    out = [f"{'#' * min(level, 6)} `{title}`", ""]
    out += ["```python", _signature(obj, short), "```", ""]
    out += _md_doc(obj.docstring.value if obj.docstring else None)
    if obj.kind.value == "class":
        for n, m in _public_members(obj):
            out += _md_object(m, f"{short}.{n}", level + 1)
    return out


def render_python_markdown() -> str:
    """The Python reference as Markdown (:data:`PYTHON_SECTIONS`' order and names): each name's
    signature and docstring, a class's public methods, a module's ``__all__``; read from the
    source by griffe (nothing is imported, so the page is the same on every machine)."""
    import griffe

    pkg = griffe.load(
        "crossknn", search_paths=[str(REPO / "python")], resolve_aliases=True,
        resolve_external=False,
    )  # fmt: skip
    version = pkg.members["__version__"].value if "__version__" in pkg.members else None
    out = [
        "# Python API reference",
        "",
        "Generated from the docstrings (`python docs/hooks/reference.py --write`; `make test`",
        "fails when it differs from the code), in the order a user needs them: search a corpus,",
        "serve it, the models, then the engine and the research tools.",
        "",
    ]
    if version is not None:
        out += ["`crossknn.__version__` is the package version.", ""]
    for title, intro, names, modules in PYTHON_SECTIONS:
        out += [f"## {title}", "", intro, ""]
        for name in names:
            out += _md_object(pkg[name], f"crossknn.{name}", 3)
        for module in modules:
            mod = pkg[module.removeprefix("crossknn.")]
            out += [f"### `{module}`", ""]
            out += _md_doc(mod.docstring.value if mod.docstring else None)
            for n, m in _public_members(mod):
                out += _md_object(m, f"{module}.{n}", 4)
    text = "\n".join(out)
    text = re.sub(r"\n{3,}", "\n\n", text)
    return text.rstrip("\n") + "\n"


COMMITTED = {CLI_PAGE: render_cli, PYTHON_PAGE: render_python_markdown}


def drifted(docs_dir: Path = REPO / "docs") -> list[str]:
    """The committed reference pages (``docs_dir``/reference/) that differ from what the code
    gives."""
    return [
        page
        for page, render in COMMITTED.items()
        if not (docs_dir / page).is_file()
        or (docs_dir / page).read_text(encoding="utf-8") != render()
    ]


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
        sys.exit("usage: python docs/hooks/reference.py --write | --check | OUT_DIR")
    if sys.argv[1] == "--write":
        for page, render in COMMITTED.items():
            (REPO / "docs" / page).parent.mkdir(parents=True, exist_ok=True)
            (REPO / "docs" / page).write_text(render(), encoding="utf-8")
            print(f"docs/{page}")
        sys.exit(0)
    if sys.argv[1] == "--check":
        stale = drifted()
        for page in stale:
            print(f"docs/{page} differs from the code: python docs/hooks/reference.py --write")
        sys.exit(1 if stale else 0)
    out_dir = Path(sys.argv[1])
    for page, render in ((CLI_PAGE, render_cli), (PYTHON_PAGE, render_python)):
        path = out_dir / page
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(render(), encoding="utf-8")
        print(path)
