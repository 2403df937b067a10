"""The ``crossknn`` command line: a thin dispatcher over ``crossknn.commands.*``."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# name -> module under crossknn.commands (modules are imported lazily, so a
# command's heavy dependencies are only loaded when that command runs).
COMMANDS: dict[str, str] = {
    "eval": "eval_cmd",
    "rank": "rank_cmd",
    "score-matrix": "score_matrix_cmd",
    "index": "index_cmd",
    "build": "build_cmd",
    "search": "search_cmd",
    "demo": "demo_cmd",
    "cmc": "cmc_cmd",
    "serve": "serve_cmd",
}


def _available() -> dict[str, object]:
    mods = {}
    for name, mod in COMMANDS.items():
        try:
            mods[name] = importlib.import_module(f"crossknn.commands.{mod}")
        except ModuleNotFoundError as exc:
            if exc.name != f"crossknn.commands.{mod}":
                raise
    return mods


def build_parser() -> argparse.ArgumentParser:
    from crossknn import __version__

    parser = argparse.ArgumentParser(
        prog="crossknn",
        description="k-NN search with cross-encoders on a small budget of CE calls.",
    )
    parser.add_argument("--version", action="version", version=f"crossknn {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, mod in _available().items():
        p = sub.add_parser(name, help=mod.HELP, description=mod.HELP)
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    try:
        return int(args._run(args) or 0)
    except (ValueError, FileNotFoundError, KeyError) as exc:
        # user errors: one clear line, no traceback
        print(f"crossknn {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"crossknn {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
