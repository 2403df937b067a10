"""The ``crossknn`` command line: a thin dispatcher over ``crossknn.commands.*``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from crossknn import __version__
from crossknn.commands._printing import terminal_safe
from crossknn.commands.declared import add_commands


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors (which echo the user's input) are safe for a terminal."""

    def error(self, message: str):
        super().error(terminal_safe(" ".join(message.splitlines())))


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="crossknn",
        description="k-NN search with cross-encoders on a small budget of CE calls.",
    )
    parser.add_argument("--version", action="version", version=f"crossknn {__version__}")
    # the commands and their options: crossknn/commands/commands.toml, in the order a user meets
    # them (the main job, the index's life, models, data and evaluation, then research tools)
    add_commands(parser.add_subparsers(dest="command", metavar="COMMAND"))
    return parser


# top-level module of an optional dependency -> the extra that installs it (pyproject.toml)
EXTRAS: dict[str, str] = {
    "torch": "export",
    "transformers": "export",
    "accelerate": "trainers",
    "datasets": "trainers",
    "fastapi": "serve",
    "uvicorn": "serve",
    "prometheus_client": "serve",
    "httpx": "serve",
    "starlette": "serve",
    "ray": "ray",
    "faiss": "scale",
}


def missing_dependency_line(exc: ImportError) -> str:
    """One line for an optional dependency that is not installed: the package and the extra
    that installs it (torch: pinned first, so that pip does not pick a build). An ImportError
    raised with its own message (it already says what to install) keeps that message."""
    name = (exc.name or "").split(".")[0]
    if not name or exc.msg != f"No module named {exc.name!r}":
        return error_line(exc)
    extra = EXTRAS.get(name)
    if extra is None:
        return f"needs the Python package {name!r}, which is not installed"
    if name == "torch":
        return (
            "needs 'torch', which is not installed: install the torch build you want first "
            "(e.g. pip install torch --index-url https://download.pytorch.org/whl/cpu), then "
            f"pip install 'crossknn[{extra}]'"
        )
    return f"needs {name!r}, which is not installed: pip install 'crossknn[{extra}]'"


def error_line(exc: BaseException) -> str:
    """One line for a user error: an OSError names its file(s) and what went wrong, a KeyError
    its message without quotes; control characters (from user input echoed back) escaped."""
    if isinstance(exc, OSError) and exc.strerror and exc.filename is not None:
        text = f"{exc.filename}: {exc.strerror}"
        if exc.filename2 is not None:
            text += f" ({exc.filename2})"
    elif isinstance(exc, OSError) and exc.strerror:
        text = exc.strerror
    elif isinstance(exc, KeyError) and len(exc.args) == 1:
        text = str(exc.args[0])
    else:
        text = str(exc) or type(exc).__name__
    return terminal_safe(" ".join(text.splitlines()))


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    try:
        return int(args._run(args) or 0)
    except (ValueError, OSError, KeyError) as exc:
        # user errors, unreadable or unwritable files, a full disk: one clear line, no traceback
        print(f"crossknn {args.command}: error: {error_line(exc)}", file=sys.stderr)
        return 2
    except ImportError as exc:
        if (exc.name or "").split(".")[0] == "crossknn":
            raise  # a module of crossknn itself: a bug, keep the traceback
        # an optional dependency that is not installed: one line naming what to install
        print(f"crossknn {args.command}: error: {missing_dependency_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"crossknn {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
