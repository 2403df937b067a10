"""Shared fixtures, and the one rule for tests that need real data.

A test that reads real data (BEIR folders, score matrices) asks for the ``shared_dir`` fixture and
carries the ``data`` marker (added here to every test that asks for ``shared_dir``). The data root
holds ``data/<name>`` (BEIR folders) and ``matrices/<name>`` (score matrices), see docs/data.md:
a ``$CROSSKNN_DATA`` folder that has ``data/`` (or is that ``data/`` folder); if the variable is
not set, ``../shared`` beside the checkout. Without it, every data
test is skipped for one reason (one line in the summary); with ``CI=true`` a data test that
cannot find its data fails instead, so CI runs all of them.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest

# the test workers share the cores: ONNX Runtime's threads sleep between runs instead of
# spin-waiting (crossknn.ce.spinning; tests/test_spinning.py); the subprocesses inherit it
os.environ.setdefault("CROSSKNN_ORT_SPINNING", "0")

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
TEST_TIMES = REPO / "bench" / "results" / "test_times.json"

HOW_TO_GET_DATA = (
    "no test data: set CROSSKNN_DATA to a folder holding data/<name> (BEIR layout: corpus.jsonl, "
    "queries.jsonl, qrels/test.tsv) and matrices/<name>, or put it at ../shared beside the "
    "checkout (docs/data.md)"
)


def data_root() -> Path | None:
    """The test data root (holding ``data/`` and ``matrices/``); None if there is none."""
    from crossknn.data import data_roots

    for root in data_roots() or [SHARED]:  # a CROSSKNN_DATA that is set is the only place
        if (root / "data").is_dir():
            return root
        if root.name == "data" and root.is_dir():
            return root.parent
    return None


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


def pytest_collection_modifyitems(config, items):
    """Every test that asks for ``shared_dir`` carries the ``data`` marker (and only those).
    In a parallel run (pytest-xdist), the test files are put in order of their measured time,
    longest first (:func:`file_seconds`), so that the workers, each taking the next whole file
    as it finishes one (:func:`pytest_xdist_make_scheduler`), end together."""
    for item in items:
        if "shared_dir" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.data)
        elif item.get_closest_marker("data") is not None:
            raise pytest.UsageError(
                f"{item.nodeid} is marked 'data' but does not ask for the shared_dir fixture"
            )
    if os.environ.get("PYTEST_XDIST_WORKER"):  # every worker sorts alike: the same collection
        seconds = file_seconds()
        unknown = sorted(seconds.values())[len(seconds) // 2] if seconds else 0.0  # the median
        items.sort(key=lambda item: -seconds.get(item.nodeid.split("::")[0], unknown))


def pytest_xdist_make_scheduler(config, log):
    """``--dist loadgroup``, by whole test files: a worker takes a test file at a time (its module
    fixtures built once), and the tests marked ``xdist_group(NAME)`` form one unit with NAME
    across files (``ray``: the tests that start a local Ray cluster, one at a time)."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class FileScheduling(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            if nodeid.rfind("@") > nodeid.rfind("]"):  # an xdist_group's tests
                return nodeid.split("@")[-1]
            return nodeid.split("::", 1)[0]

    return FileScheduling(config, log)


def file_seconds() -> dict[str, float]:
    """Seconds each test file took in the newest measured run of the whole suite
    (bench/results/test_times.json, written by bench/test_times.py); empty if there is none."""
    try:
        runs = json.loads(TEST_TIMES.read_text(encoding="utf-8"))["runs"]
        run = runs.get("after") or runs["before"]
        return {name: float(row["seconds"]) for name, row in run["per_file"].items()}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def pytest_report_header(config):
    root = data_root()
    where = f"{root}" if root else "none (data tests are skipped; CI=true makes that a failure)"
    return f"crossknn test data: {where}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A data test skipped for want of data is reported at one place (this file), so that
    pytest's summary folds all of them into one line: ``SKIPPED [N] tests/conftest.py: ...``.
    A failed test shows the log tails of the ``crossknn serve`` processes that ran during it
    (tests/serve_fixture.py)."""
    outcome = yield
    rep = outcome.get_result()
    serve_fixture = sys.modules.get("serve_fixture")  # imported by the tests that serve
    if rep.failed and serve_fixture is not None:
        rep.sections += serve_fixture.failure_report(since=call.start)
    longrepr = rep.longrepr
    if rep.skipped and isinstance(longrepr, tuple) and HOW_TO_GET_DATA in str(longrepr[2]):
        rep.longrepr = (str(Path(__file__)), _SKIP_LINE, longrepr[2])


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    root = data_root()
    if root is None:
        if in_ci():
            pytest.fail(f"CI=true and {HOW_TO_GET_DATA}", pytrace=False)
        pytest.skip(HOW_TO_GET_DATA)
    return root


# the 0-based line of the skip above (pytest prints it 1-based)
_SKIP_LINE = next(
    n
    for n, line in enumerate(Path(__file__).read_text(encoding="utf-8").splitlines())
    if line.strip() == "pytest.skip(HOW_TO_GET_DATA)"
)


def run_tmp(tmp_path_factory) -> Path:
    """The temporary folder of this whole test run: the one pytest-xdist's workers share (each
    worker's own base folder sits inside it), or the session's base folder without workers."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@contextmanager
def run_lock(tmp_path_factory, name: str):
    """An exclusive lock held across the run's workers (an ``flock`` on a file of
    :func:`run_tmp`): what one worker makes inside it, the others wait for, then reuse."""
    with open(run_tmp(tmp_path_factory) / f".{name}.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory) -> Path:
    """One cache directory for the embedded models, exported once per test run: shared by the
    workers of a parallel run, the fp32 CE and DE exported by the first worker that asks while
    the others wait (the int8 copy: :func:`model_cache_int8`; the cache's atomic rename makes
    two exports of one model safe in any case)."""
    from crossknn.ce.models import DEFAULT_CE, DEFAULT_DE, ensure_model

    root = run_tmp(tmp_path_factory) / "crossknn-models"
    with run_lock(tmp_path_factory, "crossknn-models"):
        root.mkdir(exist_ok=True)
        for name in (DEFAULT_CE, DEFAULT_DE):
            ensure_model(name, cache_dir=root)
    return root


@pytest.fixture(scope="session")
def model_cache_int8(model_cache, tmp_path_factory) -> Path:
    """:func:`model_cache` with the embedded CE's int8 copy in it too (its export calibrates and
    checks fidelity: a minute or more), exported by the first worker that asks while the others
    wait."""
    from crossknn.ce.models import DEFAULT_CE, ensure_model

    with run_lock(tmp_path_factory, "crossknn-models"):
        ensure_model(DEFAULT_CE, precision="int8", cache_dir=model_cache)
    return model_cache


@pytest.fixture(scope="session")
def calibrated_auto_index(model_cache, tmp_path_factory) -> Path:
    """The index ``crossknn build`` makes of 120 made-up items with 4 calibration queries (its
    auto rows, rounds curve and early-stop table), built once per test run by the first worker
    that asks while the others wait; tests only read it."""
    from crossknn.cli import main
    from shared_fixtures import made_corpus

    n_items = 120
    root = run_tmp(tmp_path_factory) / "calibrated-auto"
    out = root / "idx"
    with run_lock(tmp_path_factory, "calibrated-auto"):
        if not (root / "done").is_file():
            shutil.rmtree(root, ignore_errors=True)
            root.mkdir()
            made_corpus(n_items, root / "corpus.jsonl")
            argv = ["build", str(root / "corpus.jsonl"), str(out), "--calibration-items", "8"]
            argv += ["--calibration-queries", "4", "--index-calls", str(5 * n_items), "--quiet"]
            with pytest.MonkeyPatch.context() as mp:
                mp.setenv("CROSSKNN_CACHE", str(model_cache))
                assert main(argv) == 0
            (root / "done").write_text("built\n")
    return out


@pytest.fixture(scope="module")
def model_env(model_cache) -> Path:
    """``$CROSSKNN_CACHE`` set to :func:`model_cache` for a whole test module (the subprocesses
    it starts inherit it); the module's tests and servers share the exported models."""
    mp = pytest.MonkeyPatch()
    mp.setenv("CROSSKNN_CACHE", str(model_cache))
    yield model_cache
    mp.undo()
