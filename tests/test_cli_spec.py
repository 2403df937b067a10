"""The command line as data (crossknn/commands/commands.toml): the file is whole (every name it
uses resolves), the choices and defaults it states equal the code's constants they stand for, and
building the parsers imports no command module."""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys

import pytest

from crossknn.cli import build_parser
from crossknn.commands import declared


def _commands(cmds: dict, path=()):
    for name, cmd in cmds.items():
        yield (*path, name), cmd
        yield from _commands(cmd.get("commands", {}), (*path, name))


def test_every_name_the_spec_uses_resolves():
    spec = declared.spec()
    for path, cmd in _commands(spec["commands"]):
        groups = cmd.get("groups", [])
        assert cmd["help"], path
        if len(path) == 1:
            mod = importlib.import_module(f"crossknn.commands.{cmd['module']}")
            assert callable(mod.run), path
        for arg in cmd["args"]:
            if "subcommands" in arg:
                assert cmd.get("commands"), path
                continue
            if "use" in arg:
                assert arg["use"] in spec["options"], (path, arg)
            full = {**spec["options"].get(arg.get("use"), {}), **arg}
            assert full.get("flags"), (path, arg)
            assert full.get("type", "int") in declared.TYPES, (path, full)
            assert full.get("group", groups[0] if groups else None) in groups or not groups, path
            unknown = set(full) - {
                *declared.LAYOUT,
                *("action", "dest", "nargs", "const", "type", "choices", "default"),
                *("required", "metavar", "help"),
            }
            assert not unknown, (path, unknown)


def test_a_shared_option_is_used_by_two_commands_at_least():
    spec = declared.spec()
    uses = [a.get("use") for _, c in _commands(spec["commands"]) for a in c["args"]]
    once = [name for name in spec["options"] if uses.count(name) < 2]
    assert not once, f"[options.*] used by fewer than two commands: {once}"


def _action(*path_and_flag: str) -> argparse.Action:
    *path, flag = path_and_flag
    p = build_parser()
    for name in path:
        sub = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction))
        p = sub.choices[name]
    return next(a for a in p._actions if flag in a.option_strings)


def _precisions():
    from crossknn.ce.folders import RUN_PRECISIONS

    return list(RUN_PRECISIONS)


def _providers():
    from crossknn.ce.runtime import PROVIDERS

    return list(PROVIDERS)


def _search_methods():
    from crossknn.searcher import METHODS

    return list(METHODS)


def _registry_methods():
    from crossknn.search.registry import names

    return list(names())


def _eval_methods():
    from crossknn.search import METHODS

    return sorted(METHODS)


def _firsts():
    from crossknn.eval import FIRSTS

    return list(FIRSTS)


# (command path..., flag) -> the code constant its choices stand for
CHOICES = [
    (("search", "--method"), _search_methods),
    (("demo", "--method"), _search_methods),
    (("serve", "--method"), _registry_methods),
    (("eval", "--method"), _eval_methods),
    (("eval", "--first"), _firsts),
    *(((cmd, "--precision"), _precisions) for cmd in ("search", "build", "serve", "score-matrix")),
    (("build", "--de-precision"), _precisions),
    *(((cmd, "--provider"), _providers) for cmd in ("search", "build", "serve", "rank")),
]


@pytest.mark.parametrize("where,constant", CHOICES, ids=[" ".join(w) for w, _ in CHOICES])
def test_choices_equal_the_code_constant(where, constant):
    assert list(_action(*where).choices) == constant()


def test_defaults_and_their_help_equal_the_code_constants():
    from crossknn.cmc.runtime import DEFAULT_CANDIDATES
    from crossknn.commands.demo_cmd import DEMO_ROWS, ITEMS_ENV
    from crossknn.corpus.edit import COMPACT_AT
    from crossknn.search import DEFAULT_MIX, METHODS

    a = _action("remove", "--compact-at")
    assert a.default == COMPACT_AT and f"(default {COMPACT_AT})" in a.help
    a = _action("eval", "--mix")
    assert a.default == DEFAULT_MIX and f"(default {DEFAULT_MIX})" in a.help
    a = _action("demo", "--index-rows")
    assert a.default == DEMO_ROWS and f"default {DEMO_ROWS};" in a.help
    assert f"${ITEMS_ENV}" in _action("demo", "--max-items").help
    assert f"default {DEFAULT_CANDIDATES})" in _action("cmc", "eval", "--candidates").help
    assert ", ".join(METHODS) in _action("eval", "--method").help


def test_building_the_parsers_imports_no_command_module():
    code = (
        "import sys\n"
        "from crossknn.cli import build_parser\n"
        "build_parser().format_help()\n"
        "print(sorted(m for m in sys.modules if m.startswith('crossknn.commands.')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    loaded = eval(out)  # a printed list of module names
    assert not [m for m in loaded if m.endswith("_cmd")], loaded
