"""A Hugging Face BERT cross-encoder opened without torch: a light install (``make demo``, no
torch) exports a ``*ForSequenceClassification`` folder or Hub model with numpy + onnx
(crossknn.ce.bert_folder), and its scores equal the PyTorch model's. Torch runs here only to
make the tiny checkpoint and its reference logits; the child processes have none."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from shared_fixtures import lazy_importorskip

torch = lazy_importorskip("torch")
transformers = lazy_importorskip("transformers")

from crossknn.ce.bert_onnx import build_bert_graph  # noqa: E402
from shared_fixtures import tiny_bert, torch_cls_logits  # noqa: E402

PAIRS = [
    ("what is information retrieval", "Information retrieval finds unstructured material."),
    ("library classification", "The Dewey Decimal Classification is used by libraries."),
    ("short", "A document about automatic abstracting, longer than the query by far."),
]


@pytest.mark.parametrize("num_labels", [1, 3])
def test_the_cls_graph_equals_the_torch_model(tmp_path, num_labels):
    import onnxruntime as ort

    ckpt = tiny_bert(tmp_path / "ce", num_labels=num_labels, seed=num_labels)
    entries = build_bert_graph(ckpt, tmp_path / "model.onnx", kind="cls-ce")
    assert entries["output"] == "logits" and entries["num_labels"] == num_labels
    tok = transformers.AutoTokenizer.from_pretrained(str(ckpt))
    enc = tok([q for q, _ in PAIRS], [d for _, d in PAIRS], padding=True, return_tensors="np")
    sess = ort.InferenceSession(str(tmp_path / "model.onnx"), providers=["CPUExecutionProvider"])
    feeds = {k: enc[k].astype(np.int64) for k in entries["inputs"]}
    (got,) = sess.run(["logits"], feeds)
    want = torch_cls_logits(ckpt, PAIRS, max_length=512)
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)


# a child without torch or transformers (as after make demo)
NO_TORCH = """
import json, sys
for name in ("torch", "transformers"):
    sys.modules[name] = None
import crossknn
ce = crossknn.CrossEncoder(sys.argv[1])
print(json.dumps({"scores": ce.predict(json.loads(sys.argv[2])).tolist(),
                  "dir": str(ce.model_dir), "activation": ce.activation}))
"""


def test_a_folder_opens_without_torch_with_the_torch_models_scores(tmp_path):
    ckpt = tiny_bert(tmp_path / "my-ce", seed=1)
    env = {**os.environ, "CROSSKNN_CACHE": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1"}
    out = subprocess.run(
        [sys.executable, "-c", NO_TORCH, str(ckpt), json.dumps(PAIRS)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.splitlines()[-1])
    want = 1 / (1 + np.exp(-torch_cls_logits(ckpt, PAIRS, max_length=512)[:, 0]))
    np.testing.assert_allclose(got["scores"], want, atol=1e-5, rtol=0)
    assert got["activation"] == "sigmoid"
    folder = Path(got["dir"])
    assert folder.name.startswith("hf-ce-cls-") and folder.name.endswith("b1")
    manifest = json.loads((folder / "crossknn_model.json").read_text(encoding="utf-8"))
    assert manifest["exported_with"]["builder"].startswith("crossknn.ce.bert_onnx")
    assert "torch" not in manifest["exported_with"]
