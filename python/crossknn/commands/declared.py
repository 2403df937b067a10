"""The ``crossknn`` parsers, built from ``commands.toml`` (the command line as data: every command,
its options and their help). A command's module is imported only when it runs."""

from __future__ import annotations

import argparse
import functools
import importlib
from pathlib import Path

import tomllib

from crossknn.commands import _numbers

__all__ = ["SPEC_FILE", "add_arguments", "add_commands", "spec"]

SPEC_FILE = Path(__file__).with_name("commands.toml")

# the names a `type` may take
TYPES = {"int": int, "float": float, **{n: getattr(_numbers, n) for n in _numbers.__all__}}
ACTIONS = {"boolean_optional": argparse.BooleanOptionalAction}
# keys of an argument that are not add_argument's
LAYOUT = ("flags", "use", "group", "exclusive", "exclusive_required")


@functools.cache
def spec() -> dict:
    """The parsed ``commands.toml``: ``options`` (shared ones by name) and ``commands``."""
    with open(SPEC_FILE, "rb") as f:
        return tomllib.load(f)


def _argument(arg: dict) -> tuple[list[str], dict]:
    """An argument's flags and add_argument keywords (a shared option's, with the command's own
    keywords over them)."""
    if "use" in arg:
        try:
            shared = spec()["options"][arg["use"]]
        except KeyError:
            raise ValueError(f"{SPEC_FILE.name}: no [options.{arg['use']}]") from None
        arg = {**shared, **arg}
    kw = {k: v for k, v in arg.items() if k not in LAYOUT}
    if "type" in kw:
        kw["type"] = TYPES[kw["type"]]
    if "action" in kw:
        kw["action"] = ACTIONS.get(kw["action"], kw["action"])
    if isinstance(kw.get("metavar"), list):
        kw["metavar"] = tuple(kw["metavar"])
    return arg["flags"], kw


def add_arguments(p: argparse.ArgumentParser, *path: str) -> None:
    """The arguments of the command ``path`` (e.g. ``"serve"``, ``"index", "cur"``) to ``p``."""
    cmd = {"commands": spec()["commands"]}
    for name in path:
        cmd = cmd["commands"][name]
    _fill(p, cmd)


def _fill(p: argparse.ArgumentParser, cmd: dict) -> None:
    groups = {title: p.add_argument_group(title) for title in cmd.get("groups", ())}
    exclusive: dict[int, argparse._MutuallyExclusiveGroup] = {}
    for arg in cmd["args"]:
        if "subcommands" in arg:
            sub = p.add_subparsers(
                dest=arg["subcommands"], metavar=arg.get("metavar"), required=arg["required"]
            )
            for name, child in cmd["commands"].items():
                _fill(_parser(sub, name, child), child)
            continue
        where = groups[arg["group"]] if "group" in arg else p
        if "exclusive" in arg:
            n = arg["exclusive"]
            if n not in exclusive:
                req = bool(arg.get("exclusive_required"))
                exclusive[n] = where.add_mutually_exclusive_group(required=req)
            where = exclusive[n]
        flags, kw = _argument(arg)
        where.add_argument(*flags, **kw)


def _parser(sub, name: str, cmd: dict) -> argparse.ArgumentParser:
    description = cmd.get("description", cmd["help"]) or None
    return sub.add_parser(name, help=cmd["help"], description=description)


def _run(module: str, args: argparse.Namespace) -> int:
    return importlib.import_module(f"crossknn.commands.{module}").run(args)


def add_commands(sub) -> None:
    """Every command of the spec to ``sub`` (the top parser's subparsers), each running its
    module's ``run(args)``."""
    for name, cmd in spec()["commands"].items():
        p = _parser(sub, name, cmd)
        _fill(p, cmd)
        p.set_defaults(_run=functools.partial(_run, cmd["module"]))
