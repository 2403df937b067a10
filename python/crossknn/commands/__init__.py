"""Sub-commands of the ``crossknn`` CLI, one module each.

Every command, its options and their help are declared in ``commands.toml`` (built into parsers
by :mod:`crossknn.commands.declared`); a command's module defines ``run(args) -> int``.
"""
