"""The docs site: built offline with --strict, its generated reference complete, its pages short.

The site is built once per session into a temporary folder with the same command as ``make docs``
(a subprocess, so mkdocs' own warnings do not meet pytest's ``-W error``). Then every CLI flag of
every subcommand (walked here from ``crossknn.cli.build_parser()``, independently of the
generator) must appear in the built command-line reference, and every name of
``crossknn.__all__`` must have rendered as an object of the built Python reference.
"""

from __future__ import annotations

import argparse
import html
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
GENERATED = {"reference/cli.md", "reference/python.md"}  # docs/hooks/reference.py --write
MAX_PAGE_LINES = 400
# the check, verbatim: development narrative never names a session
SESSION_WORDS = re.compile(
    r"(first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth"
    r"|[a-z]+teenth|twentieth|this|earlier|last|next|previous) session",
    re.IGNORECASE,
)
FAQ = [
    "Which method should I use for 10⁶ items on one GPU?",
    "How do I serve my own CE with auth?",
    "How do I reproduce the recall table?",
    "Where is the round loop and how do I add a method?",
]


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    try:
        import mkdocs  # noqa: F401
    except ImportError:
        if os.environ.get("CI") == "true":  # CI installs them (make pytest): a miss is a failure
            pytest.fail("mkdocs is not installed: make docs (or make pytest) installs it")
        pytest.skip("mkdocs is not installed: make docs installs mkdocs and mkdocstrings")
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stderr[-4000:]}"
    return out


def _text(page: Path) -> str:
    """The visible text of a built page (tags dropped, entities decoded)."""
    return html.unescape(re.sub(r"<[^>]+>", " ", page.read_text(encoding="utf-8")))


def _walk(parser: argparse.ArgumentParser, path: list[str]):
    """(command path, option strings) of every parser, subparsers included."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _walk(sub, path + [name])
    options = [
        s
        for a in parser._actions
        if not isinstance(a, argparse._HelpAction) and a.help != argparse.SUPPRESS
        for s in a.option_strings
    ]
    yield path, options


def _sections(page: Path) -> dict[str, str]:
    """Heading id -> the visible text from that heading to the next one (h1-h4)."""
    raw = page.read_text(encoding="utf-8")
    marks = [(m.start(), m.group(1)) for m in re.finditer(r'<h[1-4][^>]*\bid="([^"]+)"', raw)]
    ends = [start for start, _ in marks[1:]] + [len(raw)]
    return {
        anchor: html.unescape(re.sub(r"<[^>]+>", " ", raw[start:end]))
        for (start, anchor), end in zip(marks, ends, strict=True)
    }


def test_every_cli_flag_is_in_the_built_reference(site):
    from crossknn.cli import build_parser

    sections = _sections(site / "reference" / "cli.html")
    commands = list(_walk(build_parser(), ["crossknn"]))
    assert len(commands) > 10, "expected the crossknn subcommands"
    missing = []
    for path, options in commands:
        anchor = "-".join(path)
        if anchor not in sections:
            missing.append(" ".join(path))
            continue
        for flag in options:  # in that command's own section, its table of arguments
            if not re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", sections[anchor]):
                missing.append(f"{' '.join(path)} {flag}")
    assert not missing, f"not in the built CLI reference: {missing}"


def test_every_public_python_name_is_rendered(site):
    import crossknn

    page = (site / "reference" / "python.html").read_text(encoding="utf-8")
    names = [n for n in crossknn.__all__ if not n.startswith("__")]
    assert "Searcher" in names and "open_index" in names
    # mkdocstrings gives every rendered object an anchor with its full path
    missing = [n for n in names if f'id="crossknn.{n}"' not in page]
    assert not missing, f"crossknn.__all__ names not rendered in reference/python: {missing}"
    assert crossknn.__version__ in _text(site / "reference" / "python.html")


def test_the_python_reference_has_signatures_and_no_attribute_noise(site):
    raw = (site / "reference" / "python.html").read_text(encoding="utf-8")
    # the engine's self.X = ... lines (instance attributes without a docstring) are left out
    assert "instance-attribute" not in raw
    assert "np.ascontiguousarray" not in raw
    anchors = re.findall(r'\bid="(crossknn\.[\w.]+)"', raw)
    # the main job first: Searcher among the first objects, not ~750 lines in
    assert anchors.index("crossknn.Searcher") < 10, anchors[:12]
    text = _text(site / "reference" / "python.html")
    for arg in ("latency_target_ms", "round_index", "cmc_candidates", "rescore"):
        assert re.search(rf"{arg}\s+\S", text), arg  # Searcher's arguments, in a table
    # CrossEncoder.predict / rank carry their own docstrings (their arguments in a table)
    for name, words in (
        ("crossknn.CrossEncoder.predict", "Scores of (query, document) pairs"),
        ("crossknn.CrossEncoder.rank", "The documents ranked by their score"),
    ):
        start = raw.index(f'id="{name}"')
        section = " ".join(_text_of(raw[start : start + 8000]).split())
        assert words in section and "activation_fn" in section, name


def _text_of(fragment: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", " ", fragment))


def test_the_faq_is_on_the_home_page_and_built(site):
    home = (DOCS / "index.md").read_text(encoding="utf-8")
    built = _text(site / "index.html")
    for question in FAQ:
        assert question in home, f"docs/index.md lacks the FAQ question {question!r}"
        assert question in built


def _pages() -> list[Path]:
    return sorted(p for p in DOCS.rglob("*.md") if p.relative_to(DOCS).as_posix() not in GENERATED)


def test_no_user_page_is_longer_than_the_limit():
    pages = _pages()
    assert len(pages) >= 10, f"expected the docs pages under {DOCS}"
    long = {
        p.relative_to(REPO).as_posix(): n
        for p in pages
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_PAGE_LINES
    }
    assert not long, f"pages over {MAX_PAGE_LINES} lines (split them): {long}"


@pytest.mark.parametrize("tree", ["docs", "python", "bench", "README.md"])
def test_no_development_session_narrative(tree):
    root = REPO / tree
    files = [root] if root.is_file() else sorted(root.rglob("*"))
    hits = []
    for f in files:
        if f.suffix not in {".md", ".py", ".pyi", ".sh", ".txt", ".cpp", ".h"} or not f.is_file():
            continue
        for i, line in enumerate(f.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if SESSION_WORDS.search(line):
                hits.append(f"{f.relative_to(REPO)}:{i}: {line.strip()[:80]}")
    assert not hits, "development narrative (name the hardware and date instead):\n" + "\n".join(
        hits
    )


def test_the_session_check_catches_narrative():
    assert SESSION_WORDS.search("measured in the sixteenth session on an H100")
    assert SESSION_WORDS.search("as the earlier session found")
    assert not SESSION_WORDS.search("one ONNX Runtime session per thread")


def _commands_in_docs():
    """(page, command line) of every `crossknn ...` in the pages' code blocks and code spans."""
    for page in _pages() + [REPO / "README.md"]:
        text = page.read_text(encoding="utf-8")
        for block in re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.DOTALL):
            for line in block.replace("\\\n", " ").splitlines():
                line = re.sub(r"^\s*(?:\$\s+)?(?:\S+=\S+\s+)*(?:\.venv/bin/)?", "", line)
                if line.startswith("crossknn "):
                    yield page, line.split("#", 1)[0]
        prose = re.sub(r"```.*?```", "", text, flags=re.DOTALL)
        for span in re.findall(r"`(crossknn [^`]+)`", prose.replace("\n", " ")):
            yield page, span


def test_every_flag_the_docs_show_exists():
    from crossknn.cli import build_parser

    def subparsers(parser):
        return {
            name: sub
            for a in parser._actions
            if isinstance(a, argparse._SubParsersAction)
            for name, sub in a.choices.items()
        }

    lines = list(_commands_in_docs())
    assert len(lines) > 20, "expected crossknn command lines in the docs' code blocks"
    wrong = []
    for page, line in lines:
        parser, words = build_parser(), line.split()[1:]
        while words and words[0] in subparsers(parser):
            parser = subparsers(parser)[words.pop(0)]
        known = {s for a in parser._actions for s in a.option_strings}
        for word in words:
            flag = re.match(r"\[?(--?[a-z][\w-]*)", word)
            if flag and flag.group(1) not in known:
                wrong.append(f"{page.relative_to(REPO)}: {flag.group(1)} in {line.strip()[:70]}")
    assert not wrong, "flags the docs show but the CLI does not have:\n" + "\n".join(wrong)


# dotted names in the pages that are not Python objects: a C++ header, and the toy method that
# docs/design/architecture.md adds in a diff to show how a method is added
NOT_PYTHON = {"crossknn.h", "crossknn.search.toy_random"}


def test_every_python_name_the_docs_show_exists():
    import importlib

    names = set()
    for page in _pages():
        for m in re.finditer(r"\bcrossknn(?:\.[A-Za-z_]\w*)+", page.read_text(encoding="utf-8")):
            names.add((m.group(0), page.relative_to(REPO).as_posix()))
    assert len(names) > 30, "expected crossknn.* names in the docs"
    missing = []
    for name, page in sorted(names):
        if name in NOT_PYTHON:
            continue
        parts = name.split(".")
        for i in range(len(parts), 0, -1):  # the longest importable module, then attributes
            try:
                obj = importlib.import_module(".".join(parts[:i]))
                break
            except ModuleNotFoundError:
                continue
        try:
            for attr in parts[i:]:
                obj = getattr(obj, attr)
        except AttributeError:
            missing.append(f"{page}: {name}")
    assert not missing, "names the docs show that the package does not have:\n" + "\n".join(missing)
