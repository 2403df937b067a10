"""The server's log lines: ``TIME LOGGER: message``, never the logger's name twice.

crossknn's messages start with their logger's name (``crossknn.ce: ...``) so that a warning
read without a configured format (Python's last-resort handler prints the message alone) still
says where it comes from; under ``crossknn serve``'s format, which names the logger, that
prefix is dropped.
"""

from __future__ import annotations

import logging

__all__ = ["FORMAT", "ServeFormatter", "configure"]

FORMAT = "%(asctime)s %(name)s: %(message)s"


class ServeFormatter(logging.Formatter):
    """:data:`FORMAT`, with a message's leading ``NAME: `` dropped when NAME is its logger's
    name or the name of a package above it (``crossknn.ce`` for ``crossknn.ce.runtime``), dotted
    or spelled as a command (``crossknn serve: ...`` from the ``crossknn.serve`` logger)."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        head, sep, rest = record.message.partition(": ")
        name = head.replace(" ", ".")
        if sep and head and (record.name == name or record.name.startswith(name + ".")):
            record = logging.makeLogRecord({**record.__dict__, "message": rest})
        return super().formatMessage(record)


def configure(level: str) -> None:
    """The root logger at ``level`` with one stderr handler in :data:`FORMAT` (as
    ``logging.basicConfig`` sets it, which does nothing when the root has a handler)."""
    handler = logging.StreamHandler()
    handler.setFormatter(ServeFormatter(FORMAT))
    logging.basicConfig(level=level.upper(), handlers=[handler])
