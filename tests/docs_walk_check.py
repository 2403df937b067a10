"""The install steps of the docs, checked instead of run by the docs walk (tests/test_docs_walk.py).

    python tests/docs_walk_check.py pip install [OPTIONS] REQ ...
    python tests/docs_walk_check.py pip uninstall [OPTIONS] NAME ...
    python tests/docs_walk_check.py make TARGET ...

A walk runs in the test environment, which ``make test`` installed: a ``pip install`` there must
not replace the checkout's crossknn with a download, and ``make test`` inside ``make test`` would
never end. So ``pip install REQ`` checks that each requirement is installed, extras included
(every requirement of ``crossknn[EXTRA]`` that the installed crossknn declares for that extra;
an extra it does not declare is an error); ``pip uninstall`` is reported and not run; ``make
TARGET`` runs ``make -n TARGET`` in the checkout (the target exists and its recipe expands).
Exit status 0 when the step would succeed, 1 (with one line saying why) when not.
"""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata
from pathlib import Path

from packaging.markers import Marker
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[1]


def _installed(name: str) -> bool:
    try:
        metadata.distribution(name)
    except metadata.PackageNotFoundError:
        return False
    return True


def _extra_requirements(dist: str, extra: str) -> list[Requirement] | None:
    """The requirements ``dist`` declares for ``extra`` (None: it declares no such extra)."""
    if extra not in (metadata.metadata(dist).get_all("Provides-Extra") or []):
        return None
    out = []
    for line in metadata.requires(dist) or []:
        req = Requirement(line)
        if req.marker is not None and req.marker.evaluate({"extra": extra}):
            if not Marker(str(req.marker)).evaluate({"extra": ""}):  # not a base requirement
                out.append(req)
    return out


def check_pip_install(args: list[str]) -> str | None:
    reqs = [a for a in args if not a.startswith("-")]
    if not reqs:
        return "pip install names no package"
    for text in reqs:
        req = Requirement(text)
        if not _installed(req.name):
            return f"{req.name} is not installed"
        for extra in sorted(req.extras):
            needs = _extra_requirements(req.name, extra)
            if needs is None:
                return f"{req.name} has no extra {extra!r}"
            missing = [r.name for r in needs if not _installed(r.name)]
            if missing:
                return f"{req.name}[{extra}] needs {', '.join(missing)}, which is not installed"
    return None


def main(argv: list[str]) -> int:
    tool, args = argv[0], argv[1:]
    line = " ".join([tool, *args])
    if tool == "pip" and args[:1] == ["install"]:
        why = check_pip_install(args[1:])
    elif tool == "pip" and args[:1] == ["uninstall"]:
        print(f"docs-walk: {line}: not run (it would change the test environment)")
        return 0
    elif tool == "make" and args and not any(a.startswith("-") for a in args):
        proc = subprocess.run(
            ["make", "-n", "-C", str(REPO), *args], capture_output=True, text=True, timeout=120
        )
        why = None if proc.returncode == 0 else (proc.stderr.strip().splitlines() or ["?"])[-1]
    else:
        why = "the docs walk checks only 'pip install', 'pip uninstall' and 'make TARGET'"
    if why:
        print(f"docs-walk: {line}: {why}", file=sys.stderr)
        return 1
    print(f"docs-walk: {line}: checked (installed / make -n), not run")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
