"""A real ``crossknn serve`` for the tests: one way to start it, wait for it and stop it.

A :class:`Server` is the command in a subprocess on a free 127.0.0.1 port (the index, its flags,
the log level, an API key, extra environment), ready once ``/readyz`` answers 200, stopped by its
PID (SIGTERM, then SIGKILL). Its output goes to a log file; when a test fails, the tail of the
log of every server that ran during it is added to the report (tests/conftest.py).

A test module declares its servers as fixtures (``server = served("--timeout-s", "4")``: one per
module, over the index of the module's ``env`` fixture), or starts one for a single test
(``with serving(env, "--workers", "2") as s:``). Its index comes from :func:`index_env` (the
Python API) or :func:`cli_index_env` (``crossknn build``). Imported like shared_fixtures (tests/
is on sys.path); httpx and prometheus_client are imported where they are used (serve extra).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import pytest

# a loaded 2-core machine takes minutes to open the models of a server (several start at once)
READY_S = 240.0
# a quick build for a corpus of a few dozen items (seconds): the flags of `crossknn build`
QUICK_BUILD = ("--calibration-queries", "2", "--calibration-items", "4", "--quiet")
TOPICS = ("dates and times", "compression", "email", "shell commands", "csv files")
# what the tests ask an index of standard library docstrings (crossknn.demo_corpus)
QUERIES = [
    "parse a date string into a datetime object",
    "compress data with gzip",
    "send an email through an SMTP server",
    "run a shell command and capture its output",
    "read a CSV file row by row",
    "create a temporary directory",
    "encode bytes as base64",
    "sort a list in place",
    "open a network socket",
    "format a number with thousands separators",
]

_STARTED: list[Server] = []  # every server of this session, for the failure report


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_key(path: Path, key: str) -> Path:
    """An API key file as an operator writes one: the key and a newline, mode 600."""
    path.write_text(key + "\n")
    path.chmod(0o600)
    return path


class Server:
    """``crossknn serve INDEX --port P [--log-level L] *flags``, running and ready.

    ``url``, ``port``, ``pid``, ``proc`` (the Popen), ``log_path``, ``headers`` (the
    Authorization header of ``api_key``, else empty). ``program`` replaces ``python -m
    crossknn.cli`` (e.g. the console script); ``log_level=None`` leaves the flag out; ``environ``
    is added to this process's environment."""

    def __init__(
        self,
        index: str | os.PathLike,
        *flags: str,
        logs: Path,
        log_level: str | None = "warning",
        api_key: str | None = None,
        environ: Mapping[str, str] | None = None,
        program: tuple[str, ...] = (sys.executable, "-m", "crossknn.cli"),
        ready_s: float = READY_S,
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.headers: dict[str, str] = {}
        cmd = [*program, "serve", str(index), "--port", str(self.port), *flags]
        if log_level is not None:
            cmd += ["--log-level", log_level]
        if api_key is not None:
            key_file = write_key(logs / f"key-{self.port}", api_key)
            cmd += ["--api-key-file", str(key_file)]
            self.headers = {"Authorization": f"Bearer {api_key}"}
        self.log_path = logs / f"server-{self.port}.log"
        self.stopped_at: float | None = None
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(environ or {})}
            )
        _STARTED.append(self)
        try:
            self.wait_ready(ready_s)
        except BaseException:
            self.stop()
            raise

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_ready(self, seconds: float) -> None:
        """Until ``/readyz`` answers 200; the log's tail if the server exits or times out."""
        import httpx

        end = time.monotonic() + seconds
        # one client for every poll, no proxies or certificates: loopback HTTP
        with httpx.Client(timeout=2, trust_env=False) as http:
            while True:
                try:
                    if http.get(self.url + "/readyz").status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                if self.proc.poll() is not None:
                    raise RuntimeError(
                        f"crossknn serve exited with {self.proc.returncode} before it was ready:"
                        f"\n{self.output()[-3000:]}"
                    )
                if time.monotonic() > end:
                    raise TimeoutError(f"{self.url} not ready in {seconds:.0f} s:\n{self.tail()}")
                time.sleep(0.1)

    def samples(self, name: str | None = None, **labels: str) -> list:
        """The ``/metrics`` samples (prometheus_client's) named ``name`` with these labels."""
        import httpx
        from prometheus_client.parser import text_string_to_metric_families

        text = httpx.get(self.url + "/metrics", headers=self.headers, timeout=30).text
        return [
            s
            for fam in text_string_to_metric_families(text)
            for s in fam.samples
            if name in (None, s.name) and all(s.labels.get(k) == v for k, v in labels.items())
        ]

    def metric(self, name: str, **labels: str) -> float:
        """The sum of the samples of ``name`` with these labels (0 if there are none)."""
        return sum(s.value for s in self.samples(name, **labels))

    def metrics(self) -> dict[str, float]:
        """Every sample, by its name and its labels as JSON: ``'crossknn_requests_total{"path":
        "/search", "status": "200"}'``."""
        return {
            s.name + (json.dumps(s.labels, sort_keys=True) if s.labels else ""): s.value
            for s in self.samples()
        }

    def stop(self) -> int:
        """SIGTERM by PID, SIGKILL after 120 s; the exit status."""
        if self.proc.poll() is None:
            os.kill(self.pid, signal.SIGTERM)
            try:
                self.proc.wait(120)
            except subprocess.TimeoutExpired:
                os.kill(self.pid, signal.SIGKILL)
                self.proc.wait(30)
        if self.stopped_at is None:
            self.stopped_at = time.time()
        return self.proc.returncode

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.output().splitlines()[-lines:])


@contextmanager
def serving(env: Mapping, *flags: str, **options) -> Iterator[Server]:
    """A :class:`Server` over ``env["index_dir"]``, its log in ``env["root"]``, stopped at the
    end of the block."""
    server = Server(env["index_dir"], *flags, logs=Path(env["root"]), **options)
    try:
        yield server
    finally:
        server.stop()


def served(*flags: str, **options):
    """A module-scoped fixture: a :class:`Server` with these flags over the module's ``env``."""

    @pytest.fixture(scope="module")
    def fixture(env):
        with serving(env, *flags, **options) as server:
            yield server

    return fixture


def failure_report(since: float) -> list[tuple[str, str]]:
    """Report sections (title, log tail) of the servers running at ``since`` or started after
    (time.time()): what a failing test shows besides its assertion."""
    return [
        (f"crossknn serve {s.url} (pid {s.pid}) log tail", s.tail())
        for s in _STARTED
        if s.stopped_at is None or s.stopped_at >= since
    ]


# -- indexes the served tests build -------------------------------------------------------------


def index_env(tmp_path_factory, name: str, corpus, **build) -> dict:
    """A folder ``name`` with an index of ``corpus`` built by the Python API (small calibration,
    no progress bars; ``build`` adds or overrides keywords): ``{"root", "index_dir", "index"}``
    (the last the built ``CorpusIndex``)."""
    import crossknn

    root = tmp_path_factory.mktemp(name)
    opts = {"calibration_queries": 4, "calibration_items": 16, "progress": False, **build}
    index = crossknn.build_corpus_index(corpus, root / "idx", **opts)
    return {"root": root, "index_dir": root / "idx", "index": index}


def topic_rows(n: int) -> list[dict]:
    """``n`` short documents ``d0``.. over five topics: a corpus whose index builds in seconds."""
    return [
        {"id": f"d{i}", "text": f"document {i} about {TOPICS[i % len(TOPICS)]} and more {i}"}
        for i in range(n)
    ]


def cli_index_env(tmp_path_factory, name: str, rows: list[dict]) -> dict:
    """A folder ``name`` with ``rows`` as ``c.jsonl`` and their index built by ``crossknn build``
    (:data:`QUICK_BUILD`): ``{"root", "corpus", "index_dir"}``."""
    from crossknn.cli import main

    root = tmp_path_factory.mktemp(name)
    corpus = root / "c.jsonl"
    corpus.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    assert main(["build", str(corpus), str(root / "idx"), *QUICK_BUILD]) == 0
    return {"root": root, "corpus": corpus, "index_dir": root / "idx"}


def run_cli(*argv, text: bool = True, timeout: float = 300) -> subprocess.CompletedProcess:
    """``python -m crossknn.cli *argv`` in a subprocess, its output captured (``text=False``:
    bytes, for argv and output that are not UTF-8)."""
    cmd = [sys.executable, "-m", "crossknn.cli", *argv]
    return subprocess.run(cmd, capture_output=True, text=text, timeout=timeout)
