"""The CE/DE interface and its two backends (ONNX Runtime, PyTorch): both satisfy the protocols of
crossknn.ce.interface, score alike (torch fp32 = ONNX fp32 to 1e-4 on CPU, on the embedded
[EMB]-CE and on a tiny [CLS]-CE made here), open the same model folder as the same model (an index
built on ONNX is searched on torch), and go through one registry (``--backend``)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from shared_fixtures import lazy_importorskip

torch = lazy_importorskip("torch")
transformers = lazy_importorskip("transformers")

from crossknn.ce.backends import BACKENDS, get_backend  # noqa: E402
from crossknn.ce.folders import model_record, open_cross_encoder, open_dual_encoder  # noqa: E402
from crossknn.ce.interface import (  # noqa: E402
    CrossEncoder,
    DualEncoder,
    ModelInfo,
    is_model,
    missing_members,
    protocol_members,
)
from crossknn.ce.runtime import OnnxCrossEncoder, OnnxDualEncoder  # noqa: E402
from crossknn.ce.torch_backend import TorchCrossEncoder, TorchDualEncoder  # noqa: E402
from crossknn.cli import main  # noqa: E402
from crossknn.data import Corpus  # noqa: E402
from crossknn.scorers import MatrixScorer  # noqa: E402

pytestmark = pytest.mark.slow

WORDS = (
    "parse date time string format zone library catalog index citation retrieval query "
    "document search ranking relevance paper journal author abstract title subject system user "
    "information science data model text word vector score evaluation precision recall book"
).split()


def _texts(n: int, lo: int, hi: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, int(rng.integers(lo, hi)))) for _ in range(n)]


def _tiny_hf(folder: Path, *, classifier: bool, seed: int) -> Path:
    """A tiny randomly initialised BERT ([CLS] classifier or bare encoder) with a WordPiece
    tokenizer over WORDS, saved as a Hugging Face folder."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    vocab = {w: i for i, w in enumerate(special + sorted(set(WORDS)))}
    tok = Tokenizer(models.WordPiece(vocab=vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])],
    )
    config = transformers.BertConfig(
        vocab_size=len(vocab),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
        num_labels=1,
    )
    torch.manual_seed(seed)
    cls = transformers.BertForSequenceClassification if classifier else transformers.BertModel
    folder.mkdir(parents=True)
    cls(config).eval().save_pretrained(str(folder))
    transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
        sep_token="[SEP]", mask_token="[MASK]",
    ).save_pretrained(str(folder))  # fmt: skip
    return folder


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("backends")
    mp = pytest.MonkeyPatch()
    mp.setenv("CROSSKNN_CACHE", str(root / "cache"))
    yield {
        "root": root,
        "cls": _tiny_hf(root / "tiny-cls", classifier=True, seed=0),
        "de": _tiny_hf(root / "tiny-de", classifier=False, seed=1),
    }
    mp.undo()


@pytest.fixture(scope="module")
def embedded():
    onnx = open_cross_encoder(None, threads=2)
    tch = open_cross_encoder(None, backend="torch", threads=2)
    yield onnx, tch
    tch.close()


def _pairs(seed: int) -> list[tuple[str, str]]:
    qs, ds = _texts(12, 1, 8, seed), _texts(12, 0, 160, seed + 1)  # empty and truncated items
    return [(q, d) for q in qs for d in ds[:6]]


# -- the interface -----------------------------------------------------------------------------
def test_protocol_members_name_everything_callers_use():
    ce = protocol_members(CrossEncoder)
    for name in ("set_items", "score", "score_batch", "predict", "rank", "close", "warmup"):
        assert ce[name] == "method", name
    for name in ("n_items", "model_id", "model_hash", "source", "kind", "model_dir", "backend"):
        assert ce[name] == "data", name
    for name in ("precision", "provider", "batch_size", "max_batch_tokens", "max_length"):
        assert ce[name] == "data", name
    assert protocol_members(DualEncoder)["encode"] == "method"
    assert protocol_members(DualEncoder)["dim"] == "data"


def test_both_backends_satisfy_the_protocols(embedded, tiny):
    onnx, tch = embedded
    for ce, cls in ((onnx, OnnxCrossEncoder), (tch, TorchCrossEncoder)):
        assert isinstance(ce, cls) and isinstance(ce, CrossEncoder) and is_model(ce)
        assert missing_members(ce, CrossEncoder) == []
    assert (onnx.backend, tch.backend) == ("onnx", "torch")
    for backend, cls in (("onnx", OnnxDualEncoder), ("torch", TorchDualEncoder)):
        de = open_dual_encoder(tiny["de"], backend=backend)
        assert isinstance(de, cls) and isinstance(de, DualEncoder)
        assert missing_members(de, DualEncoder) == [] and not isinstance(de, CrossEncoder)
    # a bare scorer is a Scorer, not a model; a member of the wrong kind is named
    m = MatrixScorer(np.zeros((2, 3)))
    assert not is_model(m) and not isinstance(m, CrossEncoder)
    assert "model_hash (data)" in missing_members(m, CrossEncoder)

    class WrongKind:
        close = "not a method"

    assert "close (method)" in missing_members(WrongKind(), ModelInfo)


def test_registry_errors_are_one_line(tiny):
    assert set(BACKENDS) >= {"onnx", "torch"} and get_backend(None).name == "onnx"
    with pytest.raises(ValueError, match=r"backend must be one of \('onnx', 'torch'.*got 'tf'"):
        open_cross_encoder(None, backend="tf")
    cache = tiny["root"] / "cache" / "models"
    before = sorted(p.name for p in cache.iterdir()) if cache.is_dir() else []
    with pytest.raises(ValueError, match="backend 'torch' runs precision fp32; got 'int8'"):
        open_cross_encoder(tiny["cls"], backend="torch", precision="int8")
    after = sorted(p.name for p in cache.iterdir()) if cache.is_dir() else []
    assert after == before  # refused before any export
    with pytest.raises(ValueError, match="dtype must be one of"):
        open_cross_encoder(tiny["cls"], backend="torch", dtype="fp8")


# -- scores ------------------------------------------------------------------------------------
def test_embedded_joint_ce_scores_equal_onnx_fp32(embedded):
    onnx, tch = embedded
    assert (tch.model_id, tch.model_hash, tch.kind) == (onnx.model_id, onnx.model_hash, onnx.kind)
    assert (tch.precision, tch.dtype, tch.provider) == ("fp32", "fp32", "cpu")
    pairs = _pairs(0)
    a, b = onnx.predict(pairs), tch.predict(pairs)
    assert a.shape == b.shape == (len(pairs),)
    assert np.max(np.abs(a - b)) < 1e-4
    assert tch.predict(pairs[3]) == pytest.approx(float(a[3]), abs=1e-4)  # one pair: its score
    items = _texts(40, 0, 120, 5)
    for ce in (onnx, tch):
        ce.set_items(items)
    qs = _texts(4, 1, 6, 6)
    ids = [np.arange(40)[::-1], np.array([3, 3, 0]), np.zeros(0, np.int64), np.arange(0, 40, 7)]
    for x, y in zip(onnx.score_batch(qs, ids), tch.score_batch(qs, ids), strict=True):
        assert x.shape == y.shape and np.allclose(x, y, atol=1e-4, rtol=0)
    assert np.allclose(onnx.score(qs[0], ids[0]), tch.score(qs[0], ids[0]), atol=1e-4, rtol=0)
    ra, rb = onnx.rank(qs[1], items, top_k=10), tch.rank(qs[1], items, top_k=10)
    assert [r["corpus_id"] for r in ra][:5] == [r["corpus_id"] for r in rb][:5]
    # one rank for both backends (crossknn.ce.model_base): top_k 0 is none, as in ST
    assert onnx.rank(qs[1], items, top_k=0) == tch.rank(qs[1], items, top_k=0) == []
    with pytest.raises(ValueError, match="top_k must be None or an int >= 0"):
        tch.rank(qs[1], items, top_k=-1)
    with pytest.raises(TypeError, match="position 1"):
        tch.predict([("q", "d"), ("q",)])


def test_tiny_cls_ce_and_de_equal_onnx_fp32(tiny):
    pairs = _pairs(10)
    onnx = open_cross_encoder(tiny["cls"])
    tch = open_cross_encoder(tiny["cls"], backend="torch")
    assert tch.kind == "cls-ce" and tch.model_hash == onnx.model_hash
    assert tch.model_dir == onnx.model_dir and tch.source == onnx.source == str(tiny["cls"])
    for act in (True, False):  # sigmoid of the logit, and the raw logit
        a = onnx.predict(pairs, apply_activation=act)
        b = tch.predict(pairs, apply_activation=act)
        assert np.max(np.abs(a - b)) < 1e-4
    texts = _texts(30, 0, 80, 11)
    de_o, de_t = open_dual_encoder(tiny["de"]), open_dual_encoder(tiny["de"], backend="torch")
    vo, vt = de_o.encode(texts), de_t.encode(texts)
    assert vo.shape == vt.shape == (30, 32) and np.max(np.abs(vo - vt)) < 1e-4
    assert np.allclose(np.linalg.norm(vt, axis=1), 1.0, atol=1e-5)


def test_half_precision_compute_on_cpu(tiny):
    pairs = _pairs(20)
    ref = open_cross_encoder(tiny["cls"], backend="torch").predict(pairs, apply_activation=False)
    for dtype, tol in (("bf16", 0.1), ("fp16", 0.02)):
        ce = open_cross_encoder(tiny["cls"], backend="torch", dtype=dtype)
        assert ce.dtype == dtype and ce.precision == "fp32"  # the weights' identity is unchanged
        got = ce.predict(pairs, apply_activation=False)
        assert got.dtype == np.float32 and np.max(np.abs(got - ref)) < tol
        assert np.max(np.abs(got - ref)) > 0  # it really computed in half precision


# -- identity across backends: an index built on ONNX, searched on torch ----------------------
def test_index_built_on_onnx_is_searched_on_torch(tiny):
    from crossknn.corpus.build import build_corpus_index
    from crossknn.searcher import Searcher

    texts = _texts(40, 4, 30, 30)
    corpus = Corpus([f"d{i}" for i in range(40)], texts, "tiny")
    ce, de = open_cross_encoder(tiny["cls"]), open_dual_encoder(tiny["de"])
    out = tiny["root"] / "index"
    build_corpus_index(corpus, out, ce=ce, de=de, progress=False, calibration_queries=4)
    rec = json.loads((out / "index.json").read_text())["info"]["models"]["ce"]
    assert rec["backend"] == "onnx" and rec["model_hash"] == ce.model_hash
    qs = _texts(3, 2, 6, 31)
    s_onnx = Searcher(out)
    s_torch = Searcher(out, backend="torch")
    assert s_torch.ce.backend == s_torch.de.backend == "torch"
    assert model_record(s_torch.ce) == {**model_record(s_onnx.ce), "backend": "torch"}
    for a, b in zip(
        s_onnx.search(qs, k=5, budget=12), s_torch.search(qs, k=5, budget=12), strict=True
    ):
        assert a.ids == b.ids and np.allclose(a.scores, b.scores, atol=1e-4, rtol=0)


def test_cli_backend_flag(tiny, tmp_path, capsys):
    path = tmp_path / "corpus.jsonl"
    texts = _texts(15, 3, 20, 40)
    path.write_text(
        "".join(json.dumps({"id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(texts))
    )
    runs = {}
    for backend in ("onnx", "torch"):
        argv = ["rank", "date format", "--corpus", str(path), "--model", str(tiny["cls"])]
        assert main([*argv, "--backend", backend, "--json", "--top-k", "15"]) == 0
        runs[backend] = json.loads(capsys.readouterr().out)
    o, t = runs["onnx"], runs["torch"]
    assert t["provider"] == "cpu" and o["provider"] == "CPUExecutionProvider"
    assert t["model_hash"] == o["model_hash"]
    so = {r["id"]: r["score"] for r in o["results"]}
    st = {r["id"]: r["score"] for r in t["results"]}
    assert so.keys() == st.keys() and max(abs(so[k] - st[k]) for k in so) < 1e-4
    with pytest.raises(SystemExit):
        main(["rank", "q", "--corpus", str(path), "--backend", "jax"])
    assert "invalid choice: 'jax'" in capsys.readouterr().err


def test_overlapped_tokenizing_equals_one_pass_on_both_backends(tiny, monkeypatch):
    """``predict`` with the documents tokenized slice by slice in a second thread (a GPU's
    default, forced here; slices of 3 documents) gives the one-pass scores on either backend,
    activation on and off, empty and truncated documents among them."""
    import crossknn.ce.model_base as mb

    monkeypatch.setattr(mb, "OVERLAP_DOCS", 3)
    qs, ds = _texts(4, 1, 8, 5), _texts(11, 0, 160, 6)
    pairs = [(qs[i % 4], ds[(3 * i) % 11]) for i in range(30)]  # 11 documents: 4 slices
    for backend in ("onnx", "torch"):
        ce = open_cross_encoder(tiny["cls"], backend=backend)
        for act in (True, False):
            ce.overlap_tokenize = False
            want = ce.predict(pairs, batch_size=2, apply_activation=act)
            ce.overlap_tokenize = True
            got = ce.predict(pairs, batch_size=2, apply_activation=act)
            np.testing.assert_allclose(got, want, atol=1e-5, rtol=0, err_msg=backend)


def test_an_embedded_export_outliving_its_environment_runs_on_torch(embedded, tmp_path):
    """The model cache outlives the virtual environment that exported the embedded CE (its
    manifest records a checkpoint path that is gone): the torch backend runs the installed
    embedded checkpoint when its weights hash as recorded, and still refuses any other."""
    import shutil

    from crossknn.ce.manifest import MANIFEST
    from crossknn.ce.models import minilm_checkpoint_dir

    onnx, _ = embedded
    moved = tmp_path / "model"
    shutil.copytree(onnx.model_dir, moved)
    manifest = json.loads((moved / MANIFEST).read_text())
    manifest["source"]["path"] = str(tmp_path / "gone-venv" / "model")
    (moved / MANIFEST).write_text(json.dumps(manifest))
    tch = TorchCrossEncoder(moved, threads=1)
    try:
        assert tch.source == str(minilm_checkpoint_dir())
        pairs = _pairs(1)[:4]
        assert np.max(np.abs(tch.predict(pairs) - onnx.predict(pairs))) < 1e-4
    finally:
        tch.close()
    manifest["source"]["sha256"] = "0" * 64  # other weights than the installed ones
    (moved / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(FileNotFoundError, match="which is not there"):
        TorchCrossEncoder(moved, threads=1)
