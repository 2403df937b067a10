"""The embedded default CE (minilm-l6-joint) and dual encoder on ONNX Runtime.

One export per test module, into a temporary cache directory (about 10 s).
"""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path

import numpy as np
import pytest

from crossknn.ce import (
    DEFAULT_CE,
    DEFAULT_DE,
    OnnxCrossEncoder,
    available_providers,
    default_cross_encoder,
    default_dual_encoder,
    ensure_model,
)
from crossknn.ce.manifest import MANIFEST
from shared_fixtures import copy_models

pytestmark = pytest.mark.slow  # the tests that read data carry the data marker (conftest)

MATRIX = "matrices/cisi-minilm"


def _item_text(rec: dict) -> str:
    title, text = rec.get("title") or "", rec.get("text") or ""
    return text if (not title or text.startswith(title)) else f"{title} {text}"


@pytest.fixture(scope="module")
def cisi(shared_dir: Path):
    mdir = shared_dir / MATRIX
    item_ids = json.loads((mdir / "item_ids.json").read_text())
    query_ids = json.loads((mdir / "query_ids.json").read_text())
    corpus, queries = {}, {}
    with (shared_dir / "data/cisi/corpus.jsonl").open(encoding="utf-8") as fh:
        for line in fh:
            rec = json.loads(line)
            corpus[rec["_id"]] = _item_text(rec)
    with (shared_dir / "data/cisi/queries.jsonl").open(encoding="utf-8") as fh:
        for line in fh:
            rec = json.loads(line)
            queries[rec["_id"]] = rec["text"]
    return {
        "items": [corpus[i] for i in item_ids],
        "queries": [queries[q] for q in query_ids],
        "scores": np.load(mdir / "scores.npy"),
        "de_items": np.load(mdir / "de_items.npy"),
        "de_queries": np.load(mdir / "de_queries.npy"),
    }


@pytest.fixture(scope="module")
def cache(tmp_path_factory, model_cache) -> Path:
    """This module's own cache (its tests damage and rebuild entries), starting from copies of
    the run's exported models."""
    return copy_models(model_cache, tmp_path_factory.mktemp("crossknn-cache"))


@pytest.fixture(scope="module")
def ce(cache, cisi) -> OnnxCrossEncoder:
    return default_cross_encoder(cache_dir=cache, items=cisi["items"], threads=2)


def test_default_ce_reproduces_the_shared_matrix(ce, cisi):
    rng = np.random.default_rng(4)
    n_q, n_i = cisi["scores"].shape
    q = rng.integers(0, n_q, size=40)
    i = rng.integers(0, n_i, size=40)
    got = np.concatenate(
        [ce.score(cisi["queries"][a], np.array([b])) for a, b in zip(q, i, strict=True)]
    )
    np.testing.assert_allclose(got, cisi["scores"][q, i], atol=1e-4, rtol=0)
    # the same pairs through score_batch (one sorted run over several queries) and predict
    rows = [ce.score_batch([cisi["queries"][a] for a in q[:8]], [np.array([b]) for b in i[:8]])]
    np.testing.assert_allclose(
        np.concatenate(rows[0]), cisi["scores"][q[:8], i[:8]], atol=1e-4, rtol=0
    )
    pairs = [(cisi["queries"][a], cisi["items"][b]) for a, b in zip(q[8:16], i[8:16], strict=True)]
    np.testing.assert_allclose(
        ce.predict(pairs), cisi["scores"][q[8:16], i[8:16]], atol=1e-4, rtol=0
    )


def test_default_ce_identity(ce, cisi):
    assert ce.model_id == DEFAULT_CE
    assert len(ce.model_hash) == 64
    assert ce.n_items == len(cisi["items"])
    assert ce.max_length == 128 and ce.kind == "joint-ce"
    assert ce.provider == "CPUExecutionProvider"
    assert "CPUExecutionProvider" in available_providers()


def test_default_dual_encoder_matches_shared_vectors(cache, cisi):
    de = default_dual_encoder(cache_dir=cache, threads=2)
    assert de.model_id == DEFAULT_DE and de.dim == 384
    rng = np.random.default_rng(1)
    qi = rng.choice(len(cisi["queries"]), 8, replace=False)
    ii = rng.choice(len(cisi["items"]), 24, replace=False)
    got_q = de.encode([cisi["queries"][k] for k in qi], batch_size=3)
    got_i = de.encode([cisi["items"][k] for k in ii])
    np.testing.assert_allclose(got_q, cisi["de_queries"][qi], atol=1e-4, rtol=0)
    np.testing.assert_allclose(got_i, cisi["de_items"][ii], atol=1e-4, rtol=0)
    np.testing.assert_allclose(np.linalg.norm(got_i, axis=1), 1.0, atol=1e-5)
    assert de.encode([]).shape == (0, 384)


def test_joint_ce_parity_with_pytorch_at_256(cache, cisi):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from crossknn.ce.models import minilm_checkpoint_dir

    src = minilm_checkpoint_dir()
    tok = transformers.AutoTokenizer.from_pretrained(str(src), local_files_only=True)
    model = transformers.AutoModel.from_pretrained(
        str(src), local_files_only=True, attn_implementation="eager"
    ).eval()
    rng = np.random.default_rng(7)
    qs = [cisi["queries"][k] for k in rng.integers(0, len(cisi["queries"]), 12)]
    ds = [cisi["items"][k] for k in rng.integers(0, len(cisi["items"]), 12)]
    enc = tok(
        qs,
        ds,
        truncation="longest_first",
        max_length=256,
        padding=True,
        return_tensors="pt",
        return_special_tokens_mask=True,
    )
    special = enc.pop("special_tokens_mask").bool()
    with torch.no_grad():
        h = model(**enc).last_hidden_state
    keep = enc["attention_mask"].bool() & ~special
    qm = (keep & (enc["token_type_ids"] == 0)).unsqueeze(-1).float()
    dm = (keep & (enc["token_type_ids"] == 1)).unsqueeze(-1).float()
    q = torch.nn.functional.normalize((h * qm).sum(1) / qm.sum(1), dim=-1)
    d = torch.nn.functional.normalize((h * dm).sum(1) / dm.sum(1), dim=-1)
    ref = (q * d).sum(-1).numpy()
    ce256 = OnnxCrossEncoder(ensure_model(cache_dir=cache), max_length=256, threads=2)
    np.testing.assert_allclose(
        ce256.predict(list(zip(qs, ds, strict=True))), ref, atol=1e-4, rtol=0
    )


@pytest.mark.parametrize("batch_size", [1, 5, 64])
def test_results_in_input_order_for_any_batching(ce, cisi, batch_size):
    q = cisi["queries"][3]
    items = np.array([17, 3, 900, 3, 1459, 0, 250, 251, 252, 17, 640])
    want = cisi["scores"][3, items]
    got = ce.score(q, items)
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)
    pairs = [(q, cisi["items"][k]) for k in items]
    np.testing.assert_allclose(ce.predict(pairs, batch_size=batch_size), want, atol=1e-4, rtol=0)


def test_overlapped_tokenizing_scores_equal_the_one_pass_and_the_matrix(ce, cisi, monkeypatch):
    """On a GPU ``predict`` and ``rank`` tokenize the next slice of documents in a second thread
    while the device runs the pairs of the slice before; forced on here, with slices of 7
    documents: the same scores, in input order (queries and documents repeated, slices uneven)."""
    import crossknn.ce.model_base as mb

    monkeypatch.setattr(mb, "OVERLAP_DOCS", 7)
    rng = np.random.default_rng(4)
    qi = rng.integers(0, 5, 40)
    di = rng.integers(0, 30, 40)  # about 25 distinct documents: four slices, the last short
    pairs = [(cisi["queries"][q], cisi["items"][d]) for q, d in zip(qi, di, strict=True)]
    want = cisi["scores"][qi, di]
    threads = []
    real = ce._documents_store

    def spy(documents, queries):
        threads.append(threading.current_thread().name)
        return real(documents, queries)

    monkeypatch.setattr(ce, "_documents_store", spy)
    monkeypatch.setattr(ce, "overlap_tokenize", False)
    one_pass = ce.predict(pairs, batch_size=4)
    assert threads == [threading.current_thread().name]
    threads.clear()
    monkeypatch.setattr(ce, "overlap_tokenize", True)
    got = ce.predict(pairs, batch_size=4, show_progress_bar=True)
    n_docs = len(set(di))
    assert len(threads) == -(-n_docs // 7)
    assert all(t.startswith("crossknn-tokenize") for t in threads)
    np.testing.assert_allclose(got, one_pass, atol=1e-5, rtol=0)
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)
    # rank: one query, 20 documents in three slices
    threads.clear()
    hits = ce.rank(cisi["queries"][5], cisi["items"][:20], batch_size=4)
    assert len(threads) == 3
    order = np.argsort(-cisi["scores"][5, :20], kind="stable")
    assert [h["corpus_id"] for h in hits][:5] == list(order[:5])
    # a document the tokenizer refuses, in a later slice: the error reaches the caller
    bad = pairs[:30] + [("q", "x\udcff")]
    with pytest.raises(ValueError, match="not valid UTF-8"):
        ce.predict(bad, batch_size=4)
    # a slice is never smaller than a batch: batches of 64 pairs, 25 documents, one pass
    threads.clear()
    np.testing.assert_allclose(ce.predict(pairs, batch_size=64), one_pass, atol=1e-5, rtol=0)
    assert len(threads) == 1


def test_token_budget_bounds_batches(cache, cisi, monkeypatch):
    small = OnnxCrossEncoder(ensure_model(cache_dir=cache), batch_size=64, max_batch_tokens=300)
    small.set_items(cisi["items"][:30])
    seen = []
    real = small._s.run

    def spy(feeds):
        seen.append(feeds["input_ids"].shape)
        return real(feeds)

    monkeypatch.setattr(small._s, "run", spy)
    got = small.score(cisi["queries"][0], np.arange(30))
    np.testing.assert_allclose(got, cisi["scores"][0, :30], atol=1e-4, rtol=0)
    assert sum(s[0] for s in seen) == 30
    assert all(s[0] * s[1] <= 300 or s[0] == 1 for s in seen)
    widths = [s[1] for s in seen]
    assert widths == sorted(widths, reverse=True)  # longest first, padded per batch


def test_rank_sorted_with_corpus_ids(ce, cisi):
    docs = cisi["items"][:25]
    hits = ce.rank(cisi["queries"][5], docs, top_k=5, return_documents=True)
    want = np.argsort(-cisi["scores"][5, :25], kind="stable")[:5]
    assert [h["corpus_id"] for h in hits] == list(want)
    assert [h["score"] for h in hits] == sorted((h["score"] for h in hits), reverse=True)
    assert hits[0]["text"] == docs[want[0]]
    assert len(ce.rank(cisi["queries"][5], docs)) == 25
    assert ce.rank("q", []) == []


def test_bad_input(ce, cache):
    with pytest.raises(TypeError, match="position 1"):
        ce.set_items(["ok", 3])
    with pytest.raises(TypeError, match="position 0"):
        ce.predict([("q", None)])
    with pytest.raises(TypeError, match="query must be a string"):
        ce.score(3, np.array([0]))
    with pytest.raises(IndexError, match="item index 5000 out of range for 1460"):
        ce.score("q", np.array([1, 5000]))
    with pytest.raises(IndexError, match="-1"):
        ce.score("q", np.array([-1]))
    with pytest.raises(TypeError, match="integer array"):
        ce.score("q", np.array([0.5]))
    with pytest.raises(ValueError, match="differ in length"):
        ce.score_batch(["a", "b"], [np.array([0])])
    assert ce.rank("q", ["a"], top_k=0) == []  # as sentence-transformers' CrossEncoder.rank
    with pytest.raises(ValueError, match="top_k"):
        ce.rank("q", ["a"], top_k=-1)
    assert ce.predict([]).shape == (0,)
    assert ce.score("q", np.array([], dtype=np.int64)).shape == (0,)
    assert ce.score_batch([], []) == []
    # score_batch checks each query's ids (a plain empty list is no float) and ranges them at once
    got = ce.score_batch(["q", "r", "s"], [[3, 1], [], np.array([2])])
    assert [g.shape for g in got] == [(2,), (0,), (1,)]
    np.testing.assert_allclose(got[0], ce.score("q", np.array([3, 1])), atol=1e-6)
    assert [g.shape for g in ce.score_batch(["q", "r"], [[], []])] == [(0,), (0,)]
    with pytest.raises(TypeError, match="integer array"):
        ce.score_batch(["q", "r"], [[1], [0.5]])
    with pytest.raises(TypeError, match="1-D integer array"):
        ce.score_batch(["q"], [np.zeros((2, 2), np.int64)])
    with pytest.raises(IndexError, match="item index 5000 out of range for 1460"):
        ce.score_batch(["q", "r"], [[1], [5000]])
    # documented: an empty segment pools to the zero vector -> score 0.0
    np.testing.assert_array_equal(ce.predict([("", "a text"), ("a query", "")]), [0.0, 0.0])
    fresh = OnnxCrossEncoder(ensure_model(cache_dir=cache))
    with pytest.raises(ValueError, match="set_items"):
        fresh.score("q", np.array([0]))
    assert fresh.n_items == 0
    with pytest.raises(ValueError, match="fp16"):
        OnnxCrossEncoder(ensure_model(cache_dir=cache), fp16=True, provider="cpu")
    for bad in (4, 513, "128", 128.0):
        with pytest.raises(ValueError, match="max_length must be an int in"):
            OnnxCrossEncoder(ensure_model(cache_dir=cache), max_length=bad)
    with pytest.raises(ValueError, match="batch_size"):
        OnnxCrossEncoder(ensure_model(cache_dir=cache), batch_size=0)
    with pytest.raises(ValueError, match="provider"):
        OnnxCrossEncoder(ensure_model(cache_dir=cache), provider="gpu")
    if "CUDAExecutionProvider" not in available_providers():
        with pytest.raises(RuntimeError, match="CUDAExecutionProvider"):
            OnnxCrossEncoder(ensure_model(cache_dir=cache), provider="cuda")


def test_truncation_warns_once(cache, caplog):
    fresh = OnnxCrossEncoder(ensure_model(cache_dir=cache))
    long = "information retrieval " * 200
    with caplog.at_level(logging.WARNING, logger="crossknn.ce"):
        a = fresh.predict([("q", long)])
        b = fresh.predict([("q", long + " more words")])
    assert len(caplog.records) == 1 and "truncated" in caplog.records[0].getMessage()
    np.testing.assert_allclose(a, b, atol=1e-6)  # the tail beyond max_length is cut


def test_overlapped_call_warns_once_counting_every_slice(cache, caplog, monkeypatch):
    import crossknn.ce.model_base as mb

    monkeypatch.setattr(mb, "OVERLAP_DOCS", 2)
    fresh = OnnxCrossEncoder(ensure_model(cache_dir=cache))
    fresh.overlap_tokenize = True
    long = "information retrieval " * 200
    docs = [f"{long}{i}" if i % 2 == 0 else f"short {i}" for i in range(8)]  # 4 slices of 2
    with caplog.at_level(logging.WARNING, logger="crossknn.ce"):
        fresh.predict([("q", d) for d in docs], batch_size=2)
    assert len(caplog.records) == 1
    assert caplog.records[0].getMessage().startswith("crossknn.ce: 4 input(s) longer")


def test_concurrent_callers_get_the_same_scores(ce, cisi):
    rng = np.random.default_rng(11)
    jobs = [(int(rng.integers(0, 112)), rng.choice(1460, 12, replace=False)) for _ in range(8)]
    results: dict[int, np.ndarray] = {}
    errors = []

    def work(k):
        try:
            q, items = jobs[k]
            results[k] = ce.score(cisi["queries"][q], items)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for k, (q, items) in enumerate(jobs):
        np.testing.assert_allclose(results[k], cisi["scores"][q, items], atol=1e-4, rtol=0)


def test_int8_tracks_fp32(model_cache_int8, cisi, ce):
    from scipy.stats import spearmanr

    # the int8 export of the run's cache (made once, also searched by tests/test_rescore.py)
    int8 = default_cross_encoder(cache_dir=model_cache_int8, precision="int8", items=cisi["items"])
    assert int8.precision == "int8" and int8.model_hash != ce.model_hash
    items = np.arange(0, 1460, 15)
    a = ce.score(cisi["queries"][9], items)
    b = int8.score(cisi["queries"][9], items)
    assert spearmanr(a, b).statistic > 0.95
    assert np.max(np.abs(a - b)) < 0.1
    # the export checked int8 against fp32 on its calibration set and recorded it
    from crossknn.ce import fidelity_record
    from crossknn.ce.quantize import DEFAULT_INT8

    rec = fidelity_record(ensure_model(precision="int8", cache_dir=model_cache_int8), "int8")
    assert rec["recipe"] == DEFAULT_INT8 and rec["calibration"]["pairs"] == 128
    assert 0.5 < rec["fidelity"]["top10_agreement"] <= 1.0
    assert 0 < rec["fidelity"]["max_abs_diff"] < 0.1


def test_cache_is_reused_and_damage_is_rebuilt(cache):
    path = ensure_model(DEFAULT_DE, cache_dir=cache)
    stamp = (path / MANIFEST).stat().st_mtime_ns
    assert ensure_model(DEFAULT_DE, cache_dir=cache) == path
    assert (path / MANIFEST).stat().st_mtime_ns == stamp
    # a half-written model file: the entry is set aside and rebuilt, never used
    with (path / "model.onnx").open("r+b") as fh:
        fh.truncate(1000)
    again = ensure_model(DEFAULT_DE, cache_dir=cache)
    assert again == path and (path / "model.onnx").stat().st_size > 1000
    assert any(p.name.startswith(path.name + ".broken") for p in path.parent.iterdir())
    leftovers = [p for p in path.parent.iterdir() if p.name.startswith(".tmp-")]
    assert leftovers == []


def test_cache_dir_from_environment(cache, monkeypatch):
    from crossknn.ce import cache_root

    monkeypatch.setenv("CROSSKNN_CACHE", str(cache))
    assert cache_root() == cache
    assert ensure_model() == ensure_model(cache_dir=cache)


def test_rank_command(cache, tmp_path, monkeypatch, capsys):
    from crossknn.cli import main

    corpus = tmp_path / "c.jsonl"
    rows = [
        {"_id": "a", "title": "Cats", "text": "Cats are small domesticated felines kept as pets."},
        {"id": "b", "text": "The stock market fell sharply on Tuesday."},
        {"_id": "c", "title": "", "text": "Kittens and cats: caring for feline pets at home."},
    ]
    corpus.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    monkeypatch.setenv("CROSSKNN_CACHE", str(cache))
    assert main(["rank", "pet cats", "--corpus", str(corpus), "--top-k", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["model_id"] == DEFAULT_CE and out["provider"] == "CPUExecutionProvider"
    assert [r["id"] for r in out["results"]][0] in {"a", "c"} and len(out["results"]) == 2
    assert "b" not in [r["id"] for r in out["results"]]
    assert main(["rank", "pet cats", "--corpus", str(corpus)]) == 0
    table = capsys.readouterr().out
    assert "3 items scored" in table and table.count("\n") == 4
    assert main(["rank", "x", "--corpus", str(tmp_path / "missing.jsonl")]) == 2
    assert "not found" in capsys.readouterr().err
    model = ensure_model(cache_dir=cache)
    monkeypatch.setenv("CROSSKNN_CACHE", str(tmp_path / "empty-cache"))  # --model needs no cache
    assert main(["rank", "x", "--corpus", str(corpus), "--model", str(model), "--top-k", "1"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2
    assert not (tmp_path / "empty-cache").exists()


def test_runtime_needs_neither_torch_nor_transformers(cache):
    import subprocess
    import sys

    model = ensure_model(cache_dir=cache)
    code = (
        "import sys\n"
        "for m in ('torch', 'transformers', 'onnx', 'sentence_transformers'):\n"
        "    sys.modules[m] = None  # importing any of them now fails\n"
        "from crossknn.ce import OnnxCrossEncoder\n"
        f"ce = OnnxCrossEncoder({str(model)!r}, items=['cats are pets', 'stock prices'])\n"
        "print(ce.rank('pet cats', ['stock prices', 'cats are pets'])[0]['corpus_id'])\n"
        "print(ce.score('pet cats', [0, 1]).shape)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["1", "(2,)"]


def test_cuda_fp16_without_onnx_names_the_export_extra(cache, monkeypatch, tmp_path):
    # fp16 on CUDA converts the graph once, when no cached copy exists: the one run-time use
    # of onnx
    import sys

    from crossknn.ce import runtime

    gpu = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    monkeypatch.setattr(runtime, "available_providers", lambda: gpu)
    monkeypatch.setattr(runtime, "_preload_gpu_libraries", lambda: None)
    monkeypatch.setenv("CROSSKNN_CACHE", str(tmp_path))  # no cached fp16 copy there
    model = ensure_model(cache_dir=cache)
    for old in model.glob("model.fp16-*.onnx"):
        old.unlink()
    monkeypatch.setitem(sys.modules, "onnx", None)  # importing onnx now fails
    with pytest.raises(ImportError, match="needs the onnx package.*'export' extra.*tensorrt"):
        OnnxCrossEncoder(model, provider="cuda", precision="fp16")
    with pytest.raises(ImportError, match="needs the onnx package"):
        OnnxCrossEncoder(model, provider="cuda", fp16=True)


def test_fp16_conversion_keeps_io_types(cache):
    onnx = pytest.importorskip("onnx")
    from crossknn.ce.rewrite import to_fp16

    model = onnx.load_from_string(to_fp16(ensure_model(cache_dir=cache) / "model.onnx"))
    f16, f32 = onnx.TensorProto.FLOAT16, onnx.TensorProto.FLOAT
    assert any(t.data_type == f16 for t in model.graph.initializer)
    assert not any(t.data_type == f32 and len(t.dims) == 2 for t in model.graph.initializer)
    assert [o.type.tensor_type.elem_type for o in model.graph.output] == [f32]


def test_options_and_their_per_class_defaults(cache):
    from crossknn.ce import OnnxDualEncoder

    ce = OnnxCrossEncoder(ensure_model(cache_dir=cache), threads=1)
    assert (ce.batch_size, ce.max_batch_tokens, ce.max_length) == (16, 2048, 128)
    de = OnnxDualEncoder(ensure_model(DEFAULT_DE, cache_dir=cache), threads=1)
    assert (de.batch_size, de.max_batch_tokens, de.dim) == (32, 4096, 384)
    de = OnnxDualEncoder(ensure_model(DEFAULT_DE, cache_dir=cache), batch_size=3, max_length=64)
    assert (de.batch_size, de.max_batch_tokens, de.max_length) == (3, 4096, 64)
    with pytest.raises(TypeError, match="query_cache_size"):
        OnnxDualEncoder(ensure_model(DEFAULT_DE, cache_dir=cache), query_cache_size=4)
    with pytest.raises(TypeError, match="batchsize"):
        OnnxCrossEncoder(ensure_model(cache_dir=cache), batchsize=4)
