"""Item metadata (crossknn.metadata) and filtered search (crossknn.filters): the columns a build
keeps, add / remove / compaction carry them, the filter language against a plain-Python reference,
and Searcher / CLI searches that never score or return an item outside the filter, with removed
items (tombstones) a mask too."""

from __future__ import annotations

import json

import numpy as np
import pytest

from crossknn.cli import main
from crossknn.corpus.edit import add_items, remove_items
from crossknn.corpus_folder import open_index
from crossknn.data import Corpus, load_corpus
from crossknn.filters import FilterError, parse_filter
from crossknn.metadata import ItemMetadata, flatten, parse_date
from crossknn.searcher import Searcher
from lifecycle_stubs import StubCE, StubDE, build, corpus, queries

LANGS = ["en", "de", "fr"]


def meta_corpus(n: int = 120, seed: int = 0) -> Corpus:
    """The stub corpus with metadata of every kind, some values missing."""
    c = corpus(n, seed=seed)
    rng = np.random.default_rng(seed + 7)
    meta = []
    for i in range(n):
        m = {
            "lang": LANGS[i % 3],
            "year": int(2000 + i % 25),
            "tenant": f"t{i % 5}",
            "published": f"2024-0{1 + i % 9}-1{i % 10}",
            "open": bool(i % 2),
            "tags": [f"g{j}" for j in range(i % 4)],
            "author": {"name": f"a{i % 7}"},
        }
        if i % 11 == 0:
            del m["year"]
        if i % 13 == 0:
            del m["tags"]
        if rng.random() < 0.1:
            m["score"] = float(rng.random())
        meta.append(flatten(m))
    return Corpus(c.ids, c.texts, c.source, meta)


# ---- a plain-Python reference of the language --------------------------------------------


def _ref(spec, rec: dict, iid: str) -> bool:
    ops = {
        "$eq": lambda v, x: v is not None and (x in v if isinstance(v, list) else v == x),
        "$ne": lambda v, x: not (v is not None and (x in v if isinstance(v, list) else v == x)),
        "$in": lambda v, xs: v is not None and any(ops["$eq"](v, x) for x in xs),
        "$nin": lambda v, xs: not (v is not None and any(ops["$eq"](v, x) for x in xs)),
        "$gt": lambda v, x: v is not None and v > x,
        "$gte": lambda v, x: v is not None and v >= x,
        "$lt": lambda v, x: v is not None and v < x,
        "$lte": lambda v, x: v is not None and v <= x,
        "$exists": lambda v, x: (v is not None) == x,
    }
    ok = True
    for key, cond in spec.items():
        if key == "$and":
            ok &= all(_ref(s, rec, iid) for s in cond)
        elif key == "$or":
            ok &= any(_ref(s, rec, iid) for s in cond)
        elif key == "$not":
            ok &= not _ref(cond, rec, iid)
        else:
            v = iid if key == "id" else rec.get(key)
            if key == "published" and v is not None:
                v = parse_date(v)
            conds = cond if isinstance(cond, dict) else {"$eq": cond}
            for op, x in conds.items():
                if key == "published" and op != "$exists":
                    x = [parse_date(y) for y in x] if isinstance(x, list) else parse_date(x)
                ok &= ops[op](v, x)
    return ok


FILTERS = [
    {"lang": "en"},
    {"lang": {"$ne": "en"}},
    {"tenant": {"$in": ["t1", "t3", "nope"]}},
    {"tenant": {"$nin": ["t1", "t3"]}},
    {"year": {"$gte": 2010, "$lt": 2020}},
    {"year": {"$ne": 2005}},
    {"year": {"$in": [2001, 2002]}},
    {"year": {"$exists": False}},
    {"published": {"$gte": "2024-03-01", "$lte": "2024-06-15T00:00:00Z"}},
    {"open": True},
    {"tags": "g2"},
    {"tags": {"$in": ["g0", "g3"]}},
    {"tags": {"$nin": ["g1"]}},
    {"tags": {"$exists": True}},
    {"author.name": {"$in": ["a1", "a2"]}},
    {"$or": [{"lang": "de"}, {"year": {"$lt": 2003}}]},
    {"$not": {"lang": "fr"}, "open": False},
    {"$and": [{"tenant": "t2"}, {"$or": [{"tags": "g1"}, {"tags": {"$exists": False}}]}]},
    {"id": {"$in": ["d1", "d5", "d99", "zz"]}},
    {"id": {"$ne": "d0"}, "lang": "en"},
    {"score": {"$gt": 0.5}},
]


@pytest.mark.parametrize("spec", FILTERS, ids=[json.dumps(f)[:40] for f in FILTERS])
def test_filters_match_the_reference(spec):
    c = meta_corpus()
    meta = ItemMetadata.from_records(c.metadata, ids=c.ids)
    got = parse_filter(spec, meta.fields).mask(meta, c.ids)
    want = np.array([_ref(spec, r, i) for r, i in zip(c.metadata, c.ids, strict=True)])
    np.testing.assert_array_equal(got, want)


def test_metadata_kinds_round_trip_through_index_arrays():
    c = meta_corpus()
    meta = ItemMetadata.from_records(c.metadata, ids=c.ids)
    assert meta.fields == {
        "author.name": "string",
        "lang": "string",
        "open": "bool",
        "published": "date",
        "score": "number",
        "tags": "strings",
        "tenant": "string",
        "year": "number",
    }
    arrays, spec = meta.to_index()
    back = ItemMetadata.from_index(arrays, {"metadata": spec}, len(c))
    recs = back.records()
    assert recs[1]["lang"] == "de" and recs[1]["tags"] == ["g0"] and "year" not in recs[0]
    assert recs[3]["published"] == "2024-04-13T00:00:00.000Z"
    assert recs[4]["tags"] == [] and "tags" not in recs[13]  # an empty list is present
    assert ItemMetadata.from_records(recs, ids=c.ids).fields == meta.fields
    part = back.take(np.array([5, 0]))
    assert part.records()[0] == recs[5] and part.records()[1] == recs[0]


def test_mixed_kinds_and_bad_values_are_refused_with_the_field_and_item():
    with pytest.raises(ValueError, match=r"'year' mixes kinds: number \(item 'a'\) and string"):
        ItemMetadata.from_records([{"year": 2020}, {"year": "x"}], ids=["a", "b"])
    with pytest.raises(ValueError, match="a list field holds strings"):
        ItemMetadata.from_records([{"t": [1, 2]}], ids=["a"])
    with pytest.raises(ValueError, match="is not a finite number"):
        ItemMetadata.from_records([{"v": float("inf")}], ids=["a"])


@pytest.mark.parametrize(
    "spec,where",
    [
        ({"lang2": "en"}, r"filter\.lang2: unknown field 'lang2' \(the index's fields: "),
        ({"year": {"$gte": "x"}}, r"filter\.year\.\$gte: expected a number; got str 'x'"),
        ({"lang": {"$gt": "a"}}, r"filter\.lang\.\$gt: \$gt does not apply to a string field"),
        ({"$or": []}, r"filter\.\$or: expected a non-empty list"),
        ({"$or": [{"lang": 1}]}, r"filter\.\$or\[0\]\.lang: expected a string; got int 1"),
        ({"lang": ["en"]}, r"filter\.lang: a list is not a value here"),
        ({"published": {"$lt": "yesterday"}}, r"expected an ISO 8601 date"),
        ({"$xor": []}, r"unknown operator '\$xor'"),
        ({"lang": {"$regex": "e"}}, r"unknown operator '\$regex'"),
        ({}, r"an empty filter object"),
        ({"id": {"$gt": "a"}}, r"\$gt does not apply to a id field"),
        ("[1]", r"filter: expected an object"),
        ("{", r"filter: not valid JSON"),
        ({"$or": [{"lang": "en"}] * 300}, r"more than 256 conditions in one filter"),
        ({"year": float("nan")}, r"expected a number; got float nan"),
    ],
)
def test_bad_filters_say_where_and_what(spec, where):
    c = meta_corpus(30)
    meta = ItemMetadata.from_records(c.metadata, ids=c.ids)
    with pytest.raises(FilterError, match=where):
        parse_filter(spec, meta.fields)


# ---- built indexes: build, add, remove, search -------------------------------------------


@pytest.fixture
def idx(tmp_path):
    out = tmp_path / "idx"
    build(out, meta_corpus())
    return out


def _searcher(path, ce=None):
    return Searcher(open_index(path), ce=ce or StubCE(), de=StubDE())


class Recording(StubCE):
    def __init__(self):
        super().__init__()
        self.pairs = []

    def score_batch(self, queries, items_list):
        for q, its in zip(queries, items_list, strict=True):
            self.pairs += [(q, self.items[int(i)]) for i in np.asarray(its).ravel()]
        return super().score_batch(queries, items_list)


def test_build_keeps_the_fields_and_search_stays_within_the_filter(idx):
    index = open_index(idx)
    assert index.metadata.fields["lang"] == "string" and "meta0_codes" in index.arrays
    ce = Recording()
    s = _searcher(idx, ce)
    allowed_texts = {
        t
        for t, r in zip(s.corpus.texts, index.metadata.records(), strict=True)
        if r.get("lang") == "en" and r.get("year", 0) >= 2010
    }
    qs = queries(6)
    for method in s.methods:
        ce.pairs.clear()
        hits = s.search(
            qs, k=5, budget=30, method=method, filter={"lang": "en", "year": {"$gte": 2010}}
        )
        assert ce.pairs and all(t in allowed_texts for _, t in ce.pairs), method
        for h in hits:
            assert h.allowed == len(allowed_texts) and len(h.ids) == 5
            assert all(t in allowed_texts for t in h.texts)
    # at most B allowed: exact, one call each; fewer than k: all of them
    few = s.search(qs[0], k=5, budget=30, filter={"id": {"$in": ["d3", "d4", "d9"]}}, exact=True)
    assert few.ids == few.exact_ids  # every allowed item scored: the exact order
    assert set(few.ids) == {"d3", "d4", "d9"} and few.ce_calls == 3 and few.allowed == 3
    assert few.recall == 1.0 and len(few.exact_ids) == 3
    ids = s.search(qs[0], k=5, budget=30, ids=["d1", "d2", "d7", "d8", "d10", "d11", "nope"])
    assert set(ids.ids) <= {"d1", "d2", "d7", "d8", "d10", "d11"} and ids.ce_calls == 6
    per_query = s.search(qs[:2], k=3, budget=30, filter=[{"lang": "fr"}, None])
    assert per_query[0].allowed == 40 and per_query[1].allowed is None


def test_add_remove_and_compaction_carry_the_metadata(idx):
    new = Corpus(
        ["n1", "n2"],
        ["w1 w2 w3 n1", "w4 w5 n2"],
        "new",
        [{"lang": "pt", "rank": 3}, {"lang": "en"}],
    )
    add_items(idx, new, ce=StubCE(), de=StubDE())
    index = open_index(idx)
    recs = index.metadata.records()
    assert recs[-2] == {"lang": "pt", "rank": 3} and recs[-1] == {"lang": "en"}
    assert index.metadata.fields["rank"] == "number" and "rank" not in recs[0]
    s = _searcher(idx)
    assert s.search(queries(1)[0], k=3, budget=20, filter={"lang": "pt"}).ids == ["n1"]
    with pytest.raises(ValueError, match="'lang' mixes kinds"):
        add_items(idx, Corpus(["n3"], ["x y"], "", [{"lang": 7}]), ce=StubCE(), de=StubDE())
    # remove 30% (tombstones), then most (compaction): the fields follow the items
    gone = [f"d{i}" for i in range(0, 120, 3)]
    remove_items(idx, gone)
    remove_items(idx, [f"d{i}" for i in range(120) if i % 3], compact_at=0.5)
    index = open_index(idx)
    assert index.corpus.ids == ["n1", "n2"] and "tombstones" not in index.arrays
    assert index.metadata.records() == [{"lang": "pt", "rank": 3}, {"lang": "en"}]


def test_tombstones_are_a_mask_no_call_no_short_answer(tmp_path):
    """75% removed (no compaction): every search returns min(k, live) hits and no removed item
    is scored or returned (the issue's 150 of 200 removed, -k 10 --budget 30)."""
    out = tmp_path / "idx"
    c = corpus(200)
    build(out, c)
    dead = set(c.ids[i] for i in range(200) if i % 4)
    remove_items(out, sorted(dead), compact_at=1.0)
    ce = Recording()
    s = _searcher(out, ce)
    dead_texts = {t for i, t in zip(c.ids, c.texts, strict=True) if i in dead}
    for budget, k in ((30, 10), (10, 10), (60, 50), (100, 60)):
        ce.pairs.clear()
        hits = s.search(queries(8), k=k, budget=budget)
        assert all(len(h.ids) == min(k, 50) for h in hits), (budget, k)
        assert not dead & {i for h in hits for i in h.ids}
        assert not any(t in dead_texts for _, t in ce.pairs)


def test_cli_filter_and_ids_and_per_query_filters(idx, tmp_path, capsys, monkeypatch):
    import crossknn.commands.search_cmd as search_cmd

    class CE(StubCE):
        provider = "CPUExecutionProvider"  # what --json reports

    monkeypatch.setattr(search_cmd, "open_index_models", lambda *a, **k: (CE(), StubDE()))
    common = ["--budget", "20", "-k", "4", "--json", "--quiet"]
    assert main(["search", str(idx), "w1 w2", "--filter", '{"tenant": "t1"}', *common]) == 0
    out = json.loads(capsys.readouterr().out)
    index = open_index(idx)
    t1 = {
        i
        for i, r in zip(index.corpus.ids, index.metadata.records(), strict=True)
        if r["tenant"] == "t1"
    }
    assert {r["id"] for r in out["hits"][0]["results"]} <= t1
    assert out["hits"][0]["allowed"] == len(t1)
    qf = tmp_path / "q.jsonl"
    qf.write_text(
        json.dumps({"text": "w1 w3", "filter": {"lang": "de"}})
        + "\n"
        + json.dumps({"text": "w2 w4"})
        + "\n"
    )
    ids = tmp_path / "ids.txt"
    ids.write_text("d1\nd4\nd7\nd10\nd13\nd16\n")
    assert main(["search", str(idx), "--queries", str(qf), "--ids", str(ids), *common]) == 0
    out = json.loads(capsys.readouterr().out)
    got = [{r["id"] for r in h["results"]} for h in out["hits"]]
    de = {
        i
        for i, r in zip(index.corpus.ids, index.metadata.records(), strict=True)
        if r["lang"] == "de"
    }
    assert got[0] <= de & {"d1", "d4", "d7", "d10", "d13", "d16"} and got[1] <= {
        "d1",
        "d4",
        "d7",
        "d10",
        "d13",
        "d16",
    }
    monkeypatch.setattr(search_cmd, "open_index_models", None)  # refused before the models
    assert main(["search", str(idx), "w1", "--filter", '{"tenantt": "t1"}', *common]) == 2
    err = capsys.readouterr().err
    assert "filter.tenantt: unknown field 'tenantt' (the index's fields: author.name" in err


def test_a_jsonl_corpus_keeps_its_other_fields(tmp_path):
    p = tmp_path / "c.jsonl"
    p.write_text(
        json.dumps({"id": "a", "text": "x", "lang": "en", "meta": {"year": 2020}})
        + "\n"
        + json.dumps({"_id": "b", "title": "T", "text": "y", "lang": None})
        + "\n"
    )
    c = load_corpus(p)
    assert c.metadata == [{"lang": "en", "meta.year": 2020}, {}]
    p.write_text(json.dumps({"id": "a", "text": "x"}) + "\n")
    assert load_corpus(p).metadata is None
