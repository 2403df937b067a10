"""The differential fuzz of the filter language (tests/filter_fuzz.py), a few hundred cases with a
fixed seed: the engine's allow mask against the evaluator written from docs/filters.md
(tests/filter_oracle.py). bench/filter_bench.py fuzz runs 10^5."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import filter_fuzz
import filter_oracle as oracle


@pytest.mark.parametrize("seed", [64, 2026])
def test_the_engine_agrees_with_the_docs_evaluator(seed):
    got = filter_fuzz.run(300, seed, keep=3)
    assert got.get("mismatches", 0) == 0, got["first_mismatches"]
    assert got["cases"] == 300 and got["refused"] > 0 and got["some_but_not_all"] > 50
    for kind in ("string", "number", "bool", "date", "list"):
        assert got[f"field_{kind}"] > 0, kind


def test_the_evaluator_reads_the_docs_examples():
    records = [
        {"lang": "en", "year": 2021, "published": "2021-03-04", "tags": ["covid", "trial"]},
        {"lang": "de", "year": 2018, "published": "2024-02-01T00:00:00+05:30", "tags": []},
        {"lang": None, "author": {"org": "acme"}, "summary": "s"},
    ]
    ids = ["d1", "d7", "d9"]
    fields, rows = oracle.table(records, ids)
    assert fields == {
        "lang": "string",
        "year": "number",
        "published": "date",
        "tags": "list",
        "author.org": "string",
        "summary": "string",
    }
    cases = [
        ({"lang": "en"}, [True, False, False]),
        ({"lang": {"$ne": "en"}}, [False, True, True]),
        ({"year": {"$gte": 2019, "$lt": 2024}}, [True, False, False]),
        ({"published": {"$gte": "2024-01-31T18:30:00Z"}}, [False, True, False]),
        ({"published": {"$gt": "2024-01-31T18:30:00Z"}}, [False, False, False]),
        ({"tags": "covid"}, [True, False, False]),
        ({"tags": {"$exists": True}}, [True, True, False]),
        ({"$or": [{"lang": "en"}, {"lang": "de"}]}, [True, True, False]),
        ({"$not": {"lang": "de"}}, [True, False, True]),
        ({"id": {"$in": ["d1", "d7"]}}, [True, True, False]),
        ({"year": {"$nin": [2018]}}, [True, False, True]),
    ]
    for spec, want in cases:
        assert oracle.evaluate(spec, fields, rows, ids) == want, spec
    for bad in ({"lang": None}, {"$and": []}, {"tags": {"$gt": "a"}}, {"year": 2**64}):
        with pytest.raises(oracle.Invalid):
            oracle.evaluate(bad, fields, rows, ids)
    assert oracle.date_ms("1970-01-01T00:00:00.0019+00:01") == -60_000 + 1


def test_the_evaluator_shares_no_code_with_the_engine():
    tree = ast.parse((Path(__file__).parent / "filter_oracle.py").read_text())
    imported = {
        n.module if isinstance(n, ast.ImportFrom) else a.name
        for n in ast.walk(tree)
        if isinstance(n, (ast.Import, ast.ImportFrom))
        for a in n.names
    }
    assert imported <= {"__future__", "math", "re"}, imported
