"""Sub-commands of the ``crossknn`` CLI, one module each.

A command module defines ``HELP`` (one line), ``add_arguments(parser)`` and
``run(args) -> int``. Register it in :data:`crossknn.cli.COMMANDS`.
"""
