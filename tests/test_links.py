"""Every link of README.md and docs/ that points into the repository resolves: a relative link
(``[x](../examples/quickstart.py)``, ``[x](reference/cli.md#crossknn-serve)``) to a file or
folder of the checkout, and a link to this repository on GitHub
(``https://github.com/crossknn/crossknn/blob/main/docs/x.md``) to the same path here; a
``#fragment`` into a Markdown page to one of its headings (GitHub's and mkdocs' anchors)."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
GITHUB = re.compile(r"^https://github\.com/crossknn/crossknn/(?:blob|tree)/main/(.*)$")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)


def _pages() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def _links(page: Path) -> list[tuple[int, str]]:
    """(line, target) of every inline link of ``page``, outside code blocks and code spans."""
    text = page.read_text(encoding="utf-8")
    text = FENCE.sub(lambda m: "\n" * m.group().count("\n"), text)
    out = []
    for i, line in enumerate(text.splitlines(), start=1):
        line = re.sub(r"`[^`]*`", "", line)
        out += [(i, m.group(1)) for m in LINK.finditer(line)]
    return out


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it (letters, digits, ``_`` and ``-`` kept, spaces to
    hyphens)."""
    text = re.sub(r"<[^>]+>", "", heading).strip().lower()
    text = "".join(
        c for c in text if c in "-_ " or unicodedata.category(c)[0] in "LM" or c.isdecimal()
    )
    return text.replace(" ", "-")


def site_slug(heading: str) -> str:
    """The same heading's anchor on the docs site (Python-Markdown's toc: ASCII folding)."""
    text = unicodedata.normalize("NFKD", re.sub(r"<[^>]+>", "", heading))
    text = re.sub(r"[^\w\s-]", "", text.encode("ascii", "ignore").decode()).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def _anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    found: set[str] = set()
    for make in (slug, site_slug):
        seen: set[str] = set()
        for h in re.findall(r"^#{1,6}\s+(.*?)\s*#*\s*$", text, flags=re.M):
            base = make(h)
            name, n = base, 1
            while name in seen:  # repeated headings are numbered
                name, n = f"{base}-{n}", n + 1
            seen.add(name)
        found |= seen
    return found


def _target(page: Path, link: str) -> tuple[Path, str] | None:
    """(path in the checkout, fragment) of a link into the repository; None for others."""
    m = GITHUB.match(link)
    if m:
        path, _, frag = m.group(1).partition("#")
        return REPO / path, frag
    if re.match(r"^[a-z][a-z0-9+.-]*:", link) or link.startswith("//"):
        return None  # another site, mailto:
    path, _, frag = link.partition("#")
    return (page.parent / path if path else page), frag


def broken(page: Path) -> list[str]:
    out = []
    for line, link in _links(page):
        t = _target(page, link)
        if t is None:
            continue
        path, frag = t
        where = f"{page.relative_to(REPO)}:{line}: {link}"
        try:
            path.resolve().relative_to(REPO)
        except ValueError:
            out.append(f"{where} (outside the repository)")
            continue
        if not path.exists():
            out.append(f"{where} (no such file)")
        elif frag and path.suffix == ".md" and frag not in _anchors(path):
            out.append(f"{where} (no heading #{frag} in {path.relative_to(REPO)})")
    return out


@pytest.mark.parametrize("page", _pages(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_link_into_the_repository_resolves(page):
    assert not broken(page), "\n".join(broken(page))


def test_the_check_finds_a_dead_link(tmp_path, monkeypatch):
    page = REPO / "docs" / "x-links-probe.md"
    text = (
        "[ok](getting-started.md) [ok](getting-started.md#the-demo) [web](https://example.org)\n"
        "[dead](nope.md) [anchor](getting-started.md#no-such-heading) `[code](nope.md)`\n"
        "[gh](https://github.com/crossknn/crossknn/blob/main/docs/nope.md)\n"
    )
    monkeypatch.setattr(Path, "read_text", lambda self, **kw: text if self == page else _read(self))
    got = broken(page)
    assert len(got) == 3 and all("nope.md" in g or "no-such-heading" in g for g in got), got


_read = Path.read_text


def test_slugs_are_githubs():
    assert slug("`crossknn serve`") == "crossknn-serve"
    assert slug("Qdrant's form") == "qdrants-form"
    assert slug("The demo") == "the-demo"
    assert slug("Round indexes at 10⁷ items") == "round-indexes-at-10-items"
    assert site_slug("Round indexes at 10⁷ items") == "round-indexes-at-107-items"
