"""Issue 64, the filter language and stored metadata (crossknn.filters, crossknn.metadata, the
metadata part of ``crossknn add``): huge integers, strings padded to the longest one, ``add``
rewriting a date field, a date beyond year 9999 after its offset, and the small cases (a trailing
NUL, colliding and ``$`` names, a lone surrogate, the wording of errors). Each test failed on the
code before the fix."""

from __future__ import annotations

import json
import tracemalloc

import numpy as np
import pytest

from crossknn.cli import main
from crossknn.corpus.edit import add_items
from crossknn.corpus_folder import open_index
from crossknn.data import Corpus, load_corpus
from crossknn.filters import FilterError, parse_filter
from crossknn.metadata import ItemMetadata, flatten, parse_date
from lifecycle_stubs import StubCE, StubDE, build, corpus

BIG = 2**64


def _meta(records, ids=None):
    ids = ids or [f"d{i}" for i in range(len(records))]
    return ItemMetadata.from_records([flatten(r) for r in records], ids=ids), ids


def _mask(spec, meta, ids):
    return parse_filter(spec, meta.fields).mask(meta, ids)


def _index(tmp_path, records):
    c = corpus(len(records))
    out = tmp_path / "idx"
    build(out, Corpus(c.ids, c.texts, c.source, [flatten(r) for r in records]))
    return out


def _add(path, ids, records):
    texts = [f"w1 w2 w3 {i}" for i in ids]
    return add_items(path, Corpus(ids, texts, "new", records), ce=StubCE(), de=StubDE())


# ---- 3. integers beyond 64 bits -----------------------------------------------------------


@pytest.mark.parametrize(
    "spec",
    [
        {"year": BIG},
        {"year": {"$in": [1, -BIG]}},
        {"year": {"$lt": 10**400}},
        '{"year": 18446744073709551616}',
        json.dumps({"year": {"$gte": 0}}).replace(
            "0", "9" * 5000
        ),  # beyond Python's int-from-text limit
    ],
    ids=["2**64", "-2**64 in $in", "400 digits", "text 2**64", "text 5000 digits"],
)
def test_an_integer_beyond_64_bits_in_a_filter_is_a_filter_error(spec):
    meta, _ = _meta([{"year": 2020}, {"year": 2021}])
    with pytest.raises(FilterError, match=r"^filter(\.year)?.*(64 bits|int|digits)") as err:
        parse_filter(spec, meta.fields)
    assert "\n" not in str(err.value) and len(str(err.value)) < 200
    # the largest 64-bit integer is a number like any other (compared as a 64-bit float)
    assert not _mask({"year": BIG - 1}, *_meta([{"year": 2020}])).any()


def test_an_integer_beyond_64_bits_in_item_metadata_is_refused_with_field_and_item(tmp_path):
    with pytest.raises(ValueError, match=r"field 'n' of item 'b' is not a finite number.*digits"):
        _meta([{"n": 1}, {"n": 10**400}], ["a", "b"])
    out = _index(tmp_path, [{"n": i} for i in range(30)])
    with pytest.raises(ValueError, match=r"field 'n' of item 'x1' is not a finite number"):
        _add(out, ["x1"], [{"n": -(10**400)}])


def test_cli_filter_with_a_huge_integer_is_one_line(tmp_path, capsys, monkeypatch):
    from crossknn.commands import _common

    out = _index(tmp_path, [{"year": 2000 + i} for i in range(30)])
    monkeypatch.setattr(_common, "open_index_models", None)  # refused before the models
    for value in (str(BIG), "9" * 400):
        flt = json.dumps({"year": {"$gte": 0}}).replace("0", value)
        assert main(["search", str(out), "w1", "--filter", flt, "--quiet"]) == 2
        err = capsys.readouterr().err.strip()
        assert "filter.year.$gte: expected a number; got an integer of about" in err
        assert "Traceback" not in err and len(err.splitlines()) == 1


# ---- 4. no fixed-width arrays of the longest string ---------------------------------------


def _peak_mb(fn) -> float:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()


def test_a_long_string_in_in_costs_its_length_not_values_times_length():
    meta, ids = _meta([{"tenant": f"t{i}"} for i in range(50)])
    values = [f"v{i}" for i in range(2000)] + ["x" * 20_000, "t7"]
    f = parse_filter({"tenant": {"$in": values}}, meta.fields)
    # was: a '<U20000' array of 2002 values, 160 MB
    peak = _peak_mb(lambda: f.mask(meta, ids))
    assert peak < 8, f"{peak:.1f} MB for a 60 KB $in list"
    assert np.flatnonzero(f.mask(meta, ids)).tolist() == [7]


def test_a_long_stored_value_does_not_slow_every_filter_on_its_field():
    recs = [{"tags": [f"g{i}", f"h{i % 7}"]} for i in range(300)] + [{"tags": ["y" * 100_000]}]
    meta, ids = _meta(recs)
    f = parse_filter({"tags": {"$in": ["g5", "h3", "zz"]}}, meta.fields)
    assert len(meta.columns["tags"].dictionary) == 308  # read once per index, not per filter
    # was: the 601-string dictionary as a '<U100000' array, 240 MB, on every filter
    peak = _peak_mb(lambda: f.mask(meta, ids))
    assert peak < 8, f"{peak:.1f} MB for one filter"
    want = {5} | {i for i in range(300) if i % 7 == 3}
    assert set(np.flatnonzero(f.mask(meta, ids)).tolist()) == want


# ---- 6. add keeps a date field a date field -----------------------------------------------


def _published(i):
    return "2021-03-04T10:00:00+05:30" if i == 0 else f"2020-01-{1 + i % 28:02d}"


def test_add_refuses_a_string_in_a_date_field_and_never_rewrites_stored_dates(tmp_path):
    out = _index(tmp_path, [{"published": _published(i)} for i in range(30)])
    before = np.asarray(open_index(out).metadata.columns["published"].arrays["ms"]).copy()
    with pytest.raises(
        ValueError, match=r"'published' mixes kinds: date \(item 'd0'\) and string \(item 'n2'\)"
    ):
        _add(out, ["n1", "n2"], [{"published": "2022-02-02"}, {"published": "unknown"}])
    _add(out, ["n1", "n2"], [{"published": "2022-02-02T00:00:00-01:00"}, {"lang": "en"}])
    index = open_index(out)
    meta, ids = index.metadata, index.corpus.ids
    assert meta.fields["published"] == "date" and meta.fields["lang"] == "string"
    np.testing.assert_array_equal(meta.columns["published"].arrays["ms"][:30], before)
    for spec in ("2021-03-04T10:00:00+05:30", "2021-03-04T04:30:00Z"):
        assert np.flatnonzero(_mask({"published": spec}, meta, ids)).tolist() == [0]
    late = _mask({"published": {"$gt": "2022-02-02T00:59:59Z"}}, meta, ids)
    assert [ids[j] for j in np.flatnonzero(late)] == ["n1"]
    assert meta.records()[31] == {"lang": "en"}


def test_add_keeps_a_string_field_that_holds_dates_a_string_field(tmp_path):
    out = _index(tmp_path, [{"when": "soon" if i == 3 else "2020-01-01"} for i in range(30)])
    _add(out, ["n1"], [{"when": "2021-01-01"}])
    index = open_index(out)
    assert index.metadata.fields["when"] == "string"
    assert index.metadata.records()[-1] == {"when": "2021-01-01"}


# ---- 7. a date whose UTC year is 10000 ----------------------------------------------------


def test_a_date_beyond_year_9999_in_utc_is_stored_read_back_and_blocks_nothing(tmp_path):
    late = "9999-12-31T23:59:59-23:59"  # 10000-01-01T23:58:59Z
    out = _index(tmp_path, [{"published": late if i == 0 else "2020-05-05"} for i in range(30)])
    _add(out, ["n1"], [{"published": "2021-01-01"}])  # was: "year 10000 is out of range"
    _add(out, ["n2"], [{"published": "0001-01-01T00:00:00+23:59"}])  # 0000-12-31 in UTC
    index = open_index(out)
    recs = index.metadata.records()
    assert parse_date(recs[0]["published"]) == parse_date(late)
    assert parse_date(recs[-1]["published"]) == parse_date("0001-01-01T00:00:00+23:59")
    ids = index.corpus.ids
    got = _mask({"published": {"$gte": late}}, index.metadata, ids)
    assert np.flatnonzero(got).tolist() == [0]
    again = ItemMetadata.from_records(recs, ids=ids)  # what it reads back is what it stored
    np.testing.assert_array_equal(
        again.columns["published"].arrays["ms"], index.metadata.columns["published"].arrays["ms"]
    )


# ---- 12. the small cases ------------------------------------------------------------------


def test_a_stored_value_with_a_trailing_nul_matches():
    meta, ids = _meta(
        [{"s": "a\0", "l": ["b\0"]}, {"s": "a", "l": ["b"]}, {"s": "a\0\0", "l": ["b", "b\0"]}]
    )
    assert _mask({"s": "a\0"}, meta, ids).tolist() == [True, False, False]
    assert _mask({"s": {"$in": ["a\0\0", "zz"]}}, meta, ids).tolist() == [False, False, True]
    assert _mask({"s": {"$ne": "a"}}, meta, ids).tolist() == [True, False, True]
    assert _mask({"l": "b\0"}, meta, ids).tolist() == [True, False, True]


def test_keys_that_flatten_to_one_field_name_are_refused_naming_both(tmp_path):
    with pytest.raises(ValueError, match=r"item 'x': the keys 'a.b' and 'a' -> 'b' both give"):
        flatten({"id": "x", "a.b": 1, "a": {"b": 2}})
    p = tmp_path / "c.jsonl"
    p.write_text(json.dumps({"id": "d1", "text": "t", "a": {"b": 2}, "a.b": None}) + "\n")
    with pytest.raises(ValueError, match=r"c.jsonl:1: item 'd1': the keys 'a' -> 'b' and 'a.b'"):
        load_corpus(p)


@pytest.mark.parametrize("name", ["$gt", "$and", "$x.y"])
def test_a_field_name_starting_with_dollar_is_refused_at_build_and_add(tmp_path, name):
    records = [{"lang": "en"}, {"lang": "de"}]
    nested = {"$x": {"y": 1}} if name == "$x.y" else {name: 1}
    with pytest.raises(ValueError, match=rf"field '\{name}' of item 'd1' starts with '\$'"):
        _meta([records[0], {**records[1], **nested}])
    out = _index(tmp_path, [{"lang": "en"}] * 30)
    with pytest.raises(ValueError, match=rf"field '\{name}' of item 'n1' starts with '\$'"):
        _add(out, ["n1"], [flatten(nested)])


def test_a_lone_surrogate_in_metadata_names_the_field_and_the_item(tmp_path):
    p = tmp_path / "c.jsonl"
    lines = [
        {"id": "d0", "text": "a b", "lang": "en"},
        {"id": "d1", "text": "c d", "lang": "en", "tags": ["ok", "x\ud800y"]},
    ]
    p.write_text("\n".join(json.dumps(r) for r in lines) + "\n")  # "\ud800" escaped: valid JSON
    c = load_corpus(p)
    with pytest.raises(ValueError, match=r"field 'tags' of item 'd1' holds '\\ud800' at char"):
        ItemMetadata.from_records(c.metadata, ids=c.ids)
    with pytest.raises(ValueError, match=r"metadata field of item 'd1' holds '\\udc00'"):
        _meta([{"ok": 1}, {"k\udc00": 1}])


@pytest.mark.parametrize(
    "spec,want",
    [
        ({"lang": None}, r"filter\.lang: null is not a value .* use \{'\$exists': false\}"),
        ({"lang": {"$in": ["en", None]}}, r"filter\.lang\.\$in\[1\]: null is not a value"),
        ({"$and": []}, r"filter\.\$and: expected a non-empty list of filters; got an empty list"),
        ({"tags": {"$gt": "a"}}, r"\$gt does not apply to a list of strings field"),
    ],
)
def test_errors_say_what_to_do(spec, want):
    meta, _ = _meta([{"lang": "en", "tags": ["a"]}])
    with pytest.raises(FilterError, match=want) as err:
        parse_filter(spec, meta.fields)
    assert "None" not in str(err.value) and "strings field" not in str(err.value).replace(
        "list of strings field", ""
    )


def test_an_offset_with_60_or_more_minutes_is_no_date():
    """Found by the differential fuzz (tests/filter_fuzz.py): '+05:60' read as +06:00."""
    assert parse_date("2024-05-01T12:00+05:60") is None
    assert parse_date("2024-05-01T12:00+0575") is None
    assert parse_date("2024-05-01T12:00+05:59") == parse_date("2024-05-01T06:01Z")
    meta, _ = _meta([{"published": "2024-05-01"}])
    with pytest.raises(FilterError, match=r"filter\.published\.\$lt: expected an ISO 8601 date"):
        parse_filter({"published": {"$lt": "2024-05-01T12:00+05:60"}}, meta.fields)
