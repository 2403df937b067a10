import json

import pytest

from crossknn.data import item_text, load_corpus
from crossknn.demo_corpus import _parsed, stdlib_docstrings


def _write(tmp_path, lines):
    p = tmp_path / "c.jsonl"
    p.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return p


def test_item_text_convention():
    assert item_text("", "body") == "body"
    assert item_text("Title", "Title and body") == "Title and body"
    assert item_text("Title", "body") == "Title body"
    assert item_text(None, "body") == "body"


def test_load_jsonl_ids_and_titles(tmp_path):
    p = _write(
        tmp_path,
        [
            json.dumps({"id": "a", "text": "alpha"}),
            "",
            json.dumps({"_id": 7, "title": "T", "text": "seven"}),
        ],
    )
    c = load_corpus(p)
    assert c.ids == ["a", "7"]
    assert c.texts == ["alpha", "T seven"]


@pytest.mark.parametrize(
    "bad, message",
    [
        ("{not json", r":2: not valid JSON"),
        (json.dumps({"text": "no id"}), r":2: missing 'id'"),
        (json.dumps({"id": "b", "text": 3}), r":2: 'text'"),
        (json.dumps({"id": "b", "text": "  "}), r":2: item 'b' has an empty text"),
        (json.dumps({"id": "a", "text": "dup"}), r":2: duplicate id 'a'"),
        (json.dumps([1, 2]), r":2: expected a JSON object"),
    ],
)
def test_malformed_lines_name_the_line(tmp_path, bad, message):
    p = _write(tmp_path, [json.dumps({"id": "a", "text": "ok"}), bad])
    with pytest.raises(ValueError, match=message):
        load_corpus(p)


def test_empty_and_missing(tmp_path):
    empty = tmp_path / "e.jsonl"
    empty.write_text("\n\n", encoding="utf-8")
    with pytest.raises(ValueError, match="empty"):
        load_corpus(empty)
    with pytest.raises(FileNotFoundError, match="corpus not found"):
        load_corpus(tmp_path / "nope.jsonl")
    with pytest.raises(FileNotFoundError, match="no corpus.jsonl"):
        load_corpus(tmp_path)


def test_beir_folder(shared_dir):
    c = load_corpus(shared_dir / "data" / "cisi")
    assert len(c) == 1460
    assert c.ids[0] == "1"


def test_stdlib_docstrings_deterministic_subset():
    full = stdlib_docstrings()
    assert len(full) > 1000
    assert all(len(t) >= 80 for t in full.texts)
    sub = stdlib_docstrings(max_items=500)
    assert len(sub) == 500
    _parsed.cache_clear()  # the library parsed again from source: the same subset
    assert sub.ids == stdlib_docstrings(max_items=500).ids
    assert set(sub.ids) <= set(full.ids)
    assert "json.dumps" in full.ids
