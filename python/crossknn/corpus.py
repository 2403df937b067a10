"""A user's corpus: JSONL files, BEIR folders, and the demo corpus of standard-library docstrings.

A corpus is two parallel lists, ``ids`` and ``texts``. Item text follows the convention of the
benchmark matrices: ``text`` if the title is empty or ``text`` already starts with it, else
``title + " " + text``.
"""

from __future__ import annotations

import ast
import json
import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from crossknn.data import item_text  # the benchmark convention for title + text

__all__ = ["Corpus", "item_text", "load_corpus", "stdlib_docstrings"]


@dataclass(frozen=True)
class Corpus:
    ids: list[str]
    texts: list[str]
    source: str = ""

    def __post_init__(self) -> None:
        if len(self.ids) != len(self.texts):
            raise ValueError(
                f"ids ({len(self.ids)}) and texts ({len(self.texts)}) differ in length"
            )

    def __len__(self) -> int:
        return len(self.ids)

    def __repr__(self) -> str:
        return f"Corpus(n_items={len(self)}, source={self.source!r})"


def _read_jsonl(path: Path) -> Corpus:
    ids: list[str] = []
    texts: list[str] = []
    seen: set[str] = set()
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from None
            if not isinstance(rec, dict):
                raise ValueError(
                    f"{path}:{lineno}: expected a JSON object, got {type(rec).__name__}"
                )
            rid = rec.get("id", rec.get("_id"))
            if rid is None or (isinstance(rid, str) and not rid):
                raise ValueError(f"{path}:{lineno}: missing 'id' (or '_id')")
            text = rec.get("text")
            title = rec.get("title")
            if not isinstance(text, str) or (title is not None and not isinstance(title, str)):
                raise ValueError(f"{path}:{lineno}: 'text' (and 'title', if given) must be strings")
            joined = item_text(title, text)
            if not joined.strip():
                raise ValueError(f"{path}:{lineno}: item {rid!r} has an empty text")
            rid = str(rid)
            if rid in seen:
                raise ValueError(f"{path}:{lineno}: duplicate id {rid!r}")
            seen.add(rid)
            ids.append(rid)
            texts.append(joined)
    if not ids:
        raise ValueError(f"{path}: the corpus is empty (no JSON lines)")
    return Corpus(ids, texts, str(path))


def load_corpus(path: str | os.PathLike) -> Corpus:
    """Load a JSONL corpus file (``id``/``_id``, ``text``, optional ``title``) or a BEIR folder."""
    p = Path(path)
    if p.is_dir():
        if not (p / "corpus.jsonl").is_file():
            raise FileNotFoundError(
                f"{p} is a folder but has no corpus.jsonl (BEIR layout expected)"
            )
        p = p / "corpus.jsonl"
    elif not p.is_file():
        raise FileNotFoundError(f"corpus not found: {p}")
    return _read_jsonl(p)


_SKIP_DIRS = {
    "site-packages",
    "dist-packages",
    "test",
    "tests",
    "idlelib",
    "lib2to3",
    "turtledemo",
    "__pycache__",
    "ensurepip",
    "tkinter",
    "pydoc_data",
}


def _docstrings(tree: ast.Module, module: str):
    """(qualified name, docstring) for the module and every class and function in it."""
    doc = ast.get_docstring(tree)
    if doc:
        yield module, doc
    stack = [(node, module) for node in tree.body]
    while stack:
        node, prefix = stack.pop(0)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            name = f"{prefix}.{node.name}"
            doc = ast.get_docstring(node)
            if doc:
                yield name, doc
            stack.extend((child, name) for child in node.body)


def stdlib_docstrings(*, max_items: int | None = None, min_chars: int = 80) -> Corpus:
    """Docstrings of the installed Python standard library, read from source with ``ast``.

    Nothing is imported or executed. Items are ``module.Class.function`` ids with their docstrings;
    tests, IDLE, tkinter and third-party packages are skipped. With ``max_items`` a deterministic
    evenly spaced subset (by sorted id) is kept.
    """
    root = Path(sysconfig.get_paths()["stdlib"])
    found: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(
            d for d in dirnames if d not in _SKIP_DIRS and not d.startswith("config-")
        )
        for fname in sorted(filenames):
            if not fname.endswith(".py"):
                continue
            path = Path(dirpath) / fname
            module = ".".join(path.relative_to(root).with_suffix("").parts)
            module = module.removesuffix(".__init__")
            try:
                tree = ast.parse(path.read_text(encoding="utf-8"))
            except (SyntaxError, UnicodeDecodeError, ValueError):
                continue
            for name, doc in _docstrings(tree, module):
                doc = " ".join(doc.split())
                if len(doc) >= min_chars and not name.split(".")[-1].startswith("_"):
                    found.setdefault(name, doc)
    ids = sorted(found)
    if not ids:
        raise ValueError(f"no docstrings found under {root}")
    if max_items is not None and len(ids) > max_items:
        step = len(ids) / max_items
        ids = [ids[int(i * step)] for i in range(max_items)]
    return Corpus(ids, [found[i] for i in ids], f"stdlib docstrings ({root})")
