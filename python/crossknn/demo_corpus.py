"""The demo corpus every machine has: docstrings of the installed Python standard library.

Read from source with :mod:`ast` (nothing is imported); one item per module, class and function
docstring, ids are qualified names.
"""

from __future__ import annotations

import ast
import functools
import os
import sysconfig
from pathlib import Path

from crossknn.data import Corpus

__all__ = ["stdlib_docstrings"]


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
    evenly spaced subset (by sorted id) is kept. The library is parsed once per process (a few
    seconds); later calls take their items from that parse.
    """
    root = Path(sysconfig.get_paths()["stdlib"])
    found = _parsed(str(root), min_chars)
    ids = sorted(found)
    if not ids:
        raise ValueError(f"no docstrings found under {root}")
    if max_items is not None and len(ids) > max_items:
        step = len(ids) / max_items
        ids = [ids[int(i * step)] for i in range(max_items)]
    return Corpus(ids, [found[i] for i in ids], f"stdlib docstrings ({root})")


@functools.lru_cache(maxsize=4)
def _parsed(root_dir: str, min_chars: int) -> dict[str, str]:
    """Every docstring of at least ``min_chars`` under the standard library ``root_dir``, by id
    (the caller copies what it keeps: never change the returned dict)."""
    root = Path(root_dir)
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
    return found
