"""Qdrant's filter form beside the MongoDB form (crossknn.filters): every case of the filter fuzz
(tests/filter_fuzz.py) rendered in Qdrant's form (``must`` / ``should`` / ``must_not``, ``key`` +
``match`` / ``range``, ``is_null``, ``is_empty``, ``has_id``) allows the same items as its MongoDB
twin and is refused exactly when the twin is; is_empty on lists, the docs' examples side by side
and the constructs that have no meaning here (refused naming them)."""

from __future__ import annotations

import random

import pytest

import filter_fuzz
import filter_oracle as oracle
from crossknn.filters import FilterError, parse_filter

_RANGE = {"$gt": "gt", "$gte": "gte", "$lt": "lt", "$lte": "lte"}


def to_qdrant(spec, fields: dict, rng: random.Random):
    """The Qdrant-form twin of a MongoDB-form filter (valid or not: an invalid construct becomes
    one that Qdrant's form refuses too)."""
    if not isinstance(spec, dict):
        return spec
    conds = []
    for key, value in spec.items():
        if key in ("$and", "$or"):
            subs = [to_qdrant(v, fields, rng) for v in value] if isinstance(value, list) else value
            conds.append({"must" if key == "$and" else "should": subs})
        elif key == "$not":
            conds.append({"must_not": [to_qdrant(value, fields, rng)]})
        elif key.startswith("$"):
            conds.append({key.lstrip("$"): value})  # an unknown condition: refused
        else:
            conds.extend(_field(key, value, fields, rng))
    if len(conds) == 1 and "key" not in conds[0] and rng.random() < 0.5:
        only = conds[0]
        if set(only) <= {"must", "should", "must_not"}:
            return only  # a lone nested filter stands as the filter
    return {"must": conds if rng.random() < 0.8 or len(conds) > 1 else conds[0]}


def _field(name: str, cond, fields: dict, rng: random.Random) -> list:
    if not isinstance(cond, dict):
        return [_match(name, "value", cond, rng)]
    if not cond:
        return [{"key": name}]  # no condition: refused
    out = []
    bounds = {}
    for op, v in cond.items():
        if op in _RANGE:
            bounds[_RANGE[op]] = v
        elif op == "$eq":
            out.append(_match(name, "value", v, rng))
        elif op == "$ne":
            out.append({"must_not": [_match(name, "value", v, rng)]})
        elif op == "$in":
            out.append(
                {"has_id": v}
                if name == "id" and rng.random() < 0.5
                else {"key": name, "match": {"any": v}}
            )
        elif op == "$nin":
            out.append(
                {"must_not": [{"has_id": v}]}
                if name == "id" and rng.random() < 0.5
                else {"key": name, "match": {"except": v}}
            )
        elif op == "$exists" and isinstance(v, bool):
            kind = fields.get(name, "id")
            absent = {
                "is_empty" if kind != "list" and rng.random() < 0.5 else "is_null": {"key": name}
            }
            out.append({"must_not": [absent]} if v else absent)
        else:
            out.append({"key": name, "match": {op.lstrip("$"): v}})  # unknown or malformed
    if bounds:
        out.append({"key": name, "range": bounds})
    return out


def _match(name: str, how: str, v, rng: random.Random) -> dict:
    if name == "id" and how == "value" and rng.random() < 0.5 and isinstance(v, str):
        return {"has_id": [v]}
    return {"key": name, "match": {how: v}}


def _mask(spec, meta, ids):
    try:
        return filter_fuzz.engine_mask(spec, meta, ids)
    except FilterError:
        return None


@pytest.mark.parametrize("seed", [64, 2026])
def test_every_fuzz_case_in_qdrant_form_allows_what_its_mongo_twin_allows(seed):
    rng = random.Random(seed)
    cases = refused = differing = 0
    mismatches = []
    while cases < 300:
        records, ids, pools = filter_fuzz.random_table(rng)
        try:
            fields, _rows = oracle.table(records, ids)
            meta = filter_fuzz.engine_meta(records, ids)
        except (oracle.Invalid, ValueError):
            continue
        for _ in range(10):
            spec = filter_fuzz.random_filter(rng, fields, pools, ids)
            twin = to_qdrant(spec, fields, rng)
            cases += 1
            want, got = _mask(spec, meta, ids), _mask(twin, meta, ids)
            refused += want is None
            differing += want is not None and 0 < sum(want) < len(want)
            if want != got and len(mismatches) < 3:
                mismatches.append((spec, twin, want, got))
    assert not mismatches, mismatches
    assert refused > 10 and differing > 50, (refused, differing)


RECORDS = [
    {"lang": "en", "year": 2021, "published": "2021-03-04", "tags": ["covid", "trial"]},
    {"lang": "de", "year": 2018, "published": "2024-02-01T00:00:00+05:30", "tags": []},
    {"lang": None, "author": {"org": "acme"}, "summary": "s"},
]
IDS = ["d1", "d7", "d9"]


@pytest.fixture(scope="module")
def meta():
    return filter_fuzz.engine_meta(RECORDS, IDS)


# the pairs of docs/filters.md's side-by-side table, and what they allow
SIDE_BY_SIDE = [
    (
        {"must": [{"key": "lang", "match": {"value": "en"}}]},
        {"lang": "en"},
        [True, False, False],
    ),
    (
        {"must_not": [{"key": "lang", "match": {"value": "en"}}]},
        {"lang": {"$ne": "en"}},
        [False, True, True],
    ),
    (
        {"must": [{"key": "lang", "match": {"any": ["en", "de"]}}]},
        {"lang": {"$in": ["en", "de"]}},
        [True, True, False],
    ),
    (
        {"must": [{"key": "tags", "match": {"except": ["covid"]}}]},
        {"tags": {"$nin": ["covid"]}},
        [False, True, True],
    ),
    (
        {"must": [{"key": "year", "range": {"gte": 2019, "lt": 2024}}]},
        {"year": {"$gte": 2019, "$lt": 2024}},
        [True, False, False],
    ),
    (
        {"must": [{"key": "published", "range": {"gte": "2024-01-01"}}]},
        {"published": {"$gte": "2024-01-01"}},
        [False, True, False],
    ),
    (
        {
            "should": [
                {"key": "lang", "match": {"value": "en"}},
                {"key": "year", "range": {"lt": 2020}},
            ]
        },
        {"$or": [{"lang": "en"}, {"year": {"$lt": 2020}}]},
        [True, True, False],
    ),
    (
        {"must": [{"is_null": {"key": "summary"}}]},
        {"summary": {"$exists": False}},
        [True, True, False],
    ),
    (
        {"must_not": [{"is_empty": {"key": "lang"}}]},
        {"lang": {"$exists": True}},
        [True, True, False],
    ),
    (
        {"must": [{"has_id": ["d1", "d7"]}]},
        {"id": {"$in": ["d1", "d7"]}},
        [True, True, False],
    ),
]


@pytest.mark.parametrize("qdrant,mongo,allowed", SIDE_BY_SIDE)
def test_the_docs_pairs_allow_the_same_items(meta, qdrant, mongo, allowed):
    assert filter_fuzz.engine_mask(qdrant, meta, IDS) == allowed
    assert filter_fuzz.engine_mask(mongo, meta, IDS) == allowed


def test_the_docs_show_each_pair_side_by_side():
    import json
    from pathlib import Path

    page = (Path(__file__).parents[1] / "docs" / "filters.md").read_text(encoding="utf-8")
    for qdrant, mongo, _ in SIDE_BY_SIDE:
        row = f"| `{json.dumps(qdrant)}` | `{json.dumps(mongo)}` |"
        assert row in page, row


def test_is_empty_on_a_list_field_allows_an_empty_list_and_no_list(meta):
    # is_null: no value (null and absent are one); is_empty: no value or an empty list
    assert filter_fuzz.engine_mask({"must": [{"is_null": {"key": "tags"}}]}, meta, IDS) == [
        False,
        False,
        True,
    ]
    assert filter_fuzz.engine_mask({"must": [{"is_empty": {"key": "tags"}}]}, meta, IDS) == [
        False,
        True,
        True,
    ]


@pytest.mark.parametrize(
    "spec,where,named",
    [
        (
            {"must": [{"key": "lang", "match": {"text": "en"}}]},
            "filter.must[0].match.text",
            "match.text",
        ),
        (
            {"must": [{"key": "lang", "match": {"phrase": "en"}}]},
            "filter.must[0].match.phrase",
            "match.phrase",
        ),
        ({"must": [{"geo_radius": {"center": {}}}]}, "filter.must[0].geo_radius", "geo_radius"),
        (
            {"must": [{"key": "tags", "values_count": {"gt": 1}}]},
            "filter.must[0].values_count",
            "values_count",
        ),
        ({"must": [{"nested": {"key": "a", "filter": {}}}]}, "filter.must[0].nested", "nested"),
        ({"min_should": {"conditions": [], "min_count": 1}}, "filter.min_should", "min_should"),
        (
            {"must": [{"key": "tags[]", "match": {"value": "x"}}]},
            "filter.must[0].key",
            "[] projection",
        ),
        ({"should": [{"lang": "en"}]}, "filter.should[0].lang", "unknown condition key 'lang'"),
        (
            {"must": [{"key": "lang", "range": {"gt": "a"}}]},
            "filter.must[0].range.gt",
            "range does not apply to a string field",
        ),
        (
            {"must": [{"key": "year", "match": {"value": "x"}}]},
            "filter.must[0].match.value",
            "expected a number",
        ),
        (
            {"must": [{"key": "nope", "match": {"value": "x"}}]},
            "filter.must[0].key",
            "unknown field 'nope'",
        ),
        ({"must": []}, "filter.must", "empty list"),
        ({"must_not": [{"is_null": {"key": "id"}}]}, "filter.must_not[0].is_null", "id"),
    ],
)
def test_a_construct_without_meaning_here_is_refused_naming_it(meta, spec, where, named):
    with pytest.raises(FilterError) as err:
        parse_filter(spec, meta.fields)
    msg = str(err.value)
    assert msg.startswith(where + ": ") and named in msg, msg


def test_the_two_forms_in_one_object_are_refused_saying_so(meta):
    with pytest.raises(FilterError, match=r"^filter\.must: Qdrant's must beside MongoDB-form"):
        parse_filter({"lang": "en", "must": [{"has_id": ["d1"]}]}, meta.fields)
    # one form inside the other is fine: a Qdrant object in $and, as --filter meets a query's own
    spec = {"$and": [{"lang": {"$ne": "fr"}}, {"must": [{"has_id": ["d1", "d9"]}]}]}
    assert filter_fuzz.engine_mask(spec, meta, IDS) == [True, False, True]


def test_a_field_named_like_a_clause_is_the_field():
    records = [{"must": "a"}, {"must": "b"}]
    meta = filter_fuzz.engine_meta(records, ["x", "y"])
    assert filter_fuzz.engine_mask({"must": "a"}, meta, ["x", "y"]) == [True, False]
