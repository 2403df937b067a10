"""What ``crossknn serve`` prints: the address it listens on, once its port is bound, and log
lines that name their logger once (``crossknn.ce: ...`` messages under the server's format)."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import time

import pytest

pytest.importorskip("fastapi")

from crossknn.serve.log_format import FORMAT, ServeFormatter  # noqa: E402
from test_reliability_build import build  # noqa: E402


def _line(name: str, msg: str, *args) -> str:
    record = logging.LogRecord(name, logging.WARNING, __file__, 1, msg, args, None)
    return ServeFormatter(FORMAT).format(record).split(" ", 2)[2]  # without the time


def test_a_message_that_names_its_logger_is_not_prefixed_twice():
    assert _line("crossknn.ce", "crossknn.ce: %d input(s) cut", 3) == "crossknn.ce: 3 input(s) cut"
    # a message naming a package above its logger keeps the logger's full name once
    assert (
        _line("crossknn.ce.runtime", "crossknn.ce: on %s", "cpu") == "crossknn.ce.runtime: on cpu"
    )
    # other prefixes are the message's own
    assert _line("uvicorn.error", "crossknn.ce: x") == "uvicorn.error: crossknn.ce: x"
    assert _line("crossknn.serve", "note: a: b") == "crossknn.serve: note: a: b"
    assert _line("crossknn.serve", "plain") == "crossknn.serve: plain"
    # the command's name as its messages to the terminal spell it
    assert _line("crossknn.serve", "crossknn serve: ready") == "crossknn.serve: ready"
    assert _line("crossknn.serve.app", "crossknn serve: ready") == "crossknn.serve.app: ready"
    assert _line("crossknn.ce", "crossknn serve: x") == "crossknn.ce: crossknn serve: x"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_prints_the_address_it_listens_on(tmp_path):
    build("A", tmp_path / "idx")
    port = _free_port()
    with subprocess.Popen(
        [sys.executable, "-m", "crossknn.cli", "serve", str(tmp_path / "idx")]
        + ["--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "CROSSKNN_CACHE": str(tmp_path / "cache")},
    ) as proc:
        try:
            deadline = time.monotonic() + 120
            line = ""
            while time.monotonic() < deadline and "listening" not in line:
                line = proc.stderr.readline()
                if not line and proc.poll() is not None:
                    break
            assert line.startswith(f"crossknn serve: listening on http://127.0.0.1:{port} "), line
            assert "/readyz" in line
        finally:
            proc.terminate()
            proc.wait(timeout=60)
