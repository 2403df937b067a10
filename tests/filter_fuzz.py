"""A differential fuzz of the filter language: random (item table, filter) pairs from the grammar
of docs/filters.md, the engine's allow mask (the path a Searcher takes: ``flatten`` per item,
``ItemMetadata.from_records``, the index arrays and back, ``parse_filter(...).mask(...)``)
against the independent evaluator of tests/filter_oracle.py. Used by
tests/test_filter_fuzz_small.py (a few hundred cases) and bench/filter_bench.py fuzz (10^5).

Tables have 5-40 items and 1-6 fields of every kind (strings with NULs, spaces and non-ASCII,
numbers near 2**53 and 2**64, booleans, dates in every documented form with offsets, lists of
strings with empty lists, nested objects), values missing (absent or null); a few tables are ones
``build`` refuses (mixed kinds, a '$' name, two keys of one name, a lone surrogate, an integer
beyond 64 bits). Filters nest $and / $or / $not up to 4 levels, use every operator on every kind
(``id`` included), values drawn from the column (hits) or not, and some are invalid (an unknown
field or operator, a value of another kind, null, an empty list, a bad date, ...): the engine
must refuse exactly the filters the docs refuse.
"""

from __future__ import annotations

import random
from collections import Counter
from datetime import datetime, timedelta, timezone

import numpy as np

import filter_oracle as oracle
from crossknn.filters import FilterError, parse_filter
from crossknn.metadata import ItemMetadata, flatten

__all__ = ["engine_mask", "random_filter", "random_table", "run"]

STRINGS = [
    "en", "de", "fr", "", " ", "a", "a ", "a\0", "a\0\0", "b", "é", "e\u0301", "日本",
    "x" * 40, "2024-01-01", "true", "1", "null", "$eq", "a.b", "Zz", "z",
]  # fmt: skip
NUMBERS = [
    0, 1, -1, 2, 3, 7, -3, 0.5, -0.0, 2.5, 1e-300, 1e300, -1e300, 2**53, 2**53 + 1, 2**63,
    2**64 - 1, -(2**64 - 1), 123456789.125, 3.0,
]  # fmt: skip
OFFSETS = [0, 60, -60, 330, -330, 345, 23 * 60 + 59, -(23 * 60 + 59), 720, -480]
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
IDS = ["x y", "é", "0", "a\0", "D1", "d"]


# ---- dates in their documented forms --------------------------------------------------------


def _instant(rng: random.Random) -> int:
    """A UTC instant (ms), mostly near 2024, sometimes at the ends of years 1..9999."""
    r = rng.random()
    if r < 0.1:
        day = rng.choice([0, 3_652_058])  # 0001-01-01, 9999-12-31 (days since 0001-01-01)
        base = datetime(1, 1, 1, tzinfo=timezone.utc) + timedelta(days=day)
        ms = int((base - EPOCH) / timedelta(milliseconds=1))
        return ms + rng.choice([0, 12 * 3_600_000, 86_399_999])
    if r < 0.2:
        return int(rng.uniform(-1e13, 1e13))  # years ~1653..2286
    day = rng.randrange(0, 60) * 86_400_000 + 1_704_067_200_000  # 2024-01-01 ..
    return day + rng.choice([0, 0, 3_600_000, 43_200_000, rng.randrange(86_400_000)])


def _render(ms: int, rng: random.Random) -> str:
    """``ms`` as one of the documented forms (some lose precision: that is a new instant)."""
    for offset in (rng.choice(OFFSETS), 0, -(23 * 60 + 59), 23 * 60 + 59):
        try:  # the local time at this offset, if it is within years 1..9999
            local = EPOCH + timedelta(milliseconds=ms + offset * 60_000)
            local.replace(tzinfo=None).isoformat()
            break
        except OverflowError:
            continue
    else:
        return "9999-12-31T23:59:59.999-23:59"
    form = rng.randrange(9)
    if form == 0 and offset == 0:
        return local.strftime("%Y-%m-%d")
    sep = rng.choice("T ")
    hm = local.strftime(f"%Y-%m-%d{sep}%H:%M")
    sec = local.strftime(":%S")
    digits = rng.randint(1, 6)
    frac = f".{local.microsecond:06d}"[: digits + 1]
    time = hm if form == 1 else hm + sec if form in (2, 3) else hm + sec + frac
    if offset == 0:
        zone = rng.choice(["Z", "+00:00", "-00:00", "+0000", ""])
    else:
        sign = "+" if offset > 0 else "-"
        h, m = divmod(abs(offset), 60)
        zone = f"{sign}{h:02d}{rng.choice([':', ''])}{m:02d}"
    if zone == "" and offset != 0:
        zone = "Z"
    return time + zone


BAD_DATES = [
    "2024-13-01", "2023-02-29", "1900-02-29", "2024-04-31", "2024-05-01T24:00", "2024-05-01T12:60",
    "2024-05-01T12:00:60", "2024-05-01T12:00+24:00", "2024-05-01T12:00+05:60", "0000-01-01",
    "2024-5-01", "2024-05-01T1:00", "2024-05-01T12", "2024-05-01T12:00:00.1234567",
    "2024-05-01Z", "2024-05-01t12:00", "yesterday", "2024-05-01T12:00:00,5", "20240501",
    "2024-05-01T12:00z", "٢٠٢٤-05-01", "2024-05-01\n", " 2024-05-01",
]  # fmt: skip


# ---- tables ---------------------------------------------------------------------------------


def _column(kind: str, rng: random.Random) -> list:
    """A pool of values of one kind."""
    if kind == "string":
        return rng.sample(STRINGS, rng.randint(1, 8)) + [f"s{rng.randrange(5)}"]
    if kind == "number":
        return rng.sample(NUMBERS, rng.randint(1, 6)) + [rng.randint(-5, 5), rng.random()]
    if kind == "bool":
        return [True, False]
    if kind == "date":
        instants = [_instant(rng) for _ in range(rng.randint(1, 6))]
        return [_render(ms, rng) for ms in instants for _ in range(2)]
    if kind == "datestring":  # dates and one string: a string field
        return _column("date", rng) + [rng.choice(STRINGS)]
    words = _column("string", rng)
    return [rng.sample(words, min(len(words), rng.randint(0, 3))) for _ in range(6)]


def random_table(rng: random.Random) -> tuple[list[dict], list[str], dict]:
    """(records as JSON lines give them, item ids, field name -> pool of values)."""
    n = rng.randint(5, 40)
    ids = [f"d{i}" for i in range(n)]
    for j, odd in enumerate(rng.sample(IDS, rng.randint(0, 3))):
        ids[j] = odd
    rng.shuffle(ids)
    pools: dict[str, list] = {}
    for j in range(rng.randint(1, 6)):
        kind = rng.choice(["string", "number", "bool", "date", "list", "datestring"])
        name = rng.choice([f"f{j}", f"f{j}", f"g.f{j}", f"n{j}.x.y", f"f {j}", f"é{j}"])
        pools[name] = _column(kind, rng)
    records = []
    for iid in ids:
        rec: dict = {"text": "t"}
        if rng.random() < 0.5:
            rec["id"] = iid
        for name, pool in pools.items():
            p_missing = 0.2 if name[-1] in "02468" else 0.05
            r = rng.random()
            if r < p_missing / 2:
                continue
            value = None if r < p_missing else rng.choice(pool)
            keys = name.split(".") if "." in name and rng.random() < 0.8 else [name]
            node = rec
            for key in keys[:-1]:
                node = node.setdefault(key, {})
                if not isinstance(node, dict):
                    break
            else:
                node[keys[-1]] = list(value) if isinstance(value, list) else value
        records.append(rec)
    if rng.random() < 0.04:
        _spoil(records, rng)
    return records, ids, pools


def _spoil(records: list[dict], rng: random.Random) -> None:
    """One change ``build`` refuses (or, for a few, the docs allow: the oracle says which)."""
    rec = rng.choice(records)
    how = rng.randrange(7)
    if how == 0:
        rec["mixed"] = 1
        rng.choice(records)["mixed"] = "one"
    elif how == 1:
        rec["tags2"] = ["a", 3]
    elif how == 2:
        rec[rng.choice(["$gt", "$and", "$x"])] = 1
    elif how == 3:
        rec["a.b"], rec["a"] = 1, {"b": rng.choice([2, None])}
    elif how == 4:
        rec["bad"] = rng.choice(["x\ud800", ["ok", "\udfff"]])
    elif how == 5:
        rec["big"] = rng.choice([2**64, -(2**64), 10**400, 2**64 - 1, float("inf")])
    else:
        rec["flag"] = True
        rng.choice(records)["flag"] = 0


# ---- filters --------------------------------------------------------------------------------


OPS_BY_KIND = {k: list(v) for k, v in oracle.OPERATORS.items()}
ALL_OPS = sorted(set(oracle.EQUALITY + oracle.RANGE))


def _wrong_value(rng: random.Random):
    return rng.choice(
        [None, 1, 2.5, True, "x", [], ["a"], {}, {"$eq": 1}, 2**64, -(2**70), float("nan"),
         float("inf"), rng.choice(BAD_DATES)]
    )  # fmt: skip


def _value(kind: str, pool: list, rng: random.Random, ids: list):
    """A value of the field's kind, often one the column holds."""
    if kind == "id":
        return rng.choice(ids + ["nope", "D1", "d1 "])
    if rng.random() < 0.03:
        return _wrong_value(rng)
    hit = rng.random() < 0.65
    if kind == "list":
        words = [w for v in pool if isinstance(v, list) for w in v] or STRINGS
        return rng.choice(words if hit else STRINGS)
    if kind == "date":
        ms = [oracle.date_ms(v) for v in pool if oracle.date_ms(v) is not None]
        if hit and ms:
            return _render(rng.choice(ms) + rng.choice([0, 0, 0, 1, -1]), rng)
        return _render(_instant(rng), rng)
    if kind == "number":
        if hit:
            return rng.choice([v for v in pool if not isinstance(v, bool)] or NUMBERS)
        return rng.choice(NUMBERS + [rng.uniform(-10, 10), rng.randint(-10, 10)])
    if kind == "bool":
        return rng.random() < 0.5
    strings = [v for v in pool if isinstance(v, str)]
    return rng.choice(strings if hit and strings else STRINGS)


def _condition(name: str, kind: str, pool: list, rng: random.Random, ids: list):
    ops = OPS_BY_KIND[kind]
    if rng.random() < 0.25:
        return _value(kind, pool, rng, ids)  # shorthand equality
    if rng.random() < 0.02:
        return rng.choice([{}, [1], {"$regex": "a"}, {"$exists": 1}, {"$in": "a"}])
    cond = {}
    for _ in range(rng.choice([1, 1, 1, 2, 2, 3])):
        op = rng.choice(ALL_OPS) if rng.random() < 0.03 else rng.choice(ops)
        if op == "$exists":
            cond[op] = rng.random() < 0.5
        elif op in ("$in", "$nin"):
            cond[op] = [_value(kind, pool, rng, ids) for _ in range(rng.randint(0, 4))]
        else:
            cond[op] = _value(kind, pool, rng, ids)
    return cond


def random_filter(rng: random.Random, fields: dict, pools: dict, ids: list, depth: int = 0):
    """A filter over the table's fields (``fields``: name -> kind, as the docs read them)."""
    spec: dict = {}
    for _ in range(rng.choice([1, 1, 1, 2, 2, 3])):
        r = rng.random()
        if depth < 4 and r < 0.18:
            key = rng.choice(["$and", "$or"])
            n = rng.choice([1, 2, 2, 3]) if rng.random() > 0.01 else 0
            spec[key] = [random_filter(rng, fields, pools, ids, depth + 1) for _ in range(n)]
        elif depth < 4 and r < 0.26:
            spec["$not"] = random_filter(rng, fields, pools, ids, depth + 1)
        elif r < 0.27:
            spec[rng.choice(["$xor", "$nor", "lang2", "$eq"])] = 1
        else:
            name = rng.choice(sorted(fields) + ["id"])
            kind = "id" if name == "id" else fields[name]
            spec[name] = _condition(name, kind, pools.get(name, []), rng, ids)
    return spec


# ---- the two sides --------------------------------------------------------------------------


def engine_meta(records: list[dict], ids: list[str]) -> ItemMetadata:
    """The metadata an index stores for these items, as a Searcher reads it back."""
    meta = ItemMetadata.from_records([flatten(r) for r in records], ids=ids)
    arrays, params = meta.to_index()
    return ItemMetadata.from_index(arrays, {"metadata": params} if params else {}, len(ids))


def engine_mask(spec, meta: ItemMetadata, ids: list[str]) -> list[bool]:
    """The allow mask of the filter: what ``Searcher.filter_mask`` computes."""
    return np.asarray(parse_filter(spec, meta.fields).mask(meta, ids), bool).tolist()


def _kinds(meta: ItemMetadata) -> dict:
    return {k: "list" if v == "strings" else v for k, v in meta.fields.items()}


def _operators(spec, fields: dict) -> Counter:
    """How often each (field kind, operator) and logic operator appears in a valid filter."""
    out: Counter = Counter()
    for key, value in spec.items():
        if key in ("$and", "$or"):
            out[key] += 1
            for sub in value:
                out.update(_operators(sub, fields))
        elif key == "$not":
            out[key] += 1
            out.update(_operators(value, fields))
        else:
            kind = "id" if key == "id" else fields[key]
            for op in value if isinstance(value, dict) else ["$eq (short)"]:
                out[f"{kind} {op}"] += 1
    return out


def run(cases: int, seed: int, *, filters_per_table: int = 10, keep: int = 5) -> dict:
    """Runs ``cases`` (table, filter) pairs; counts and the first ``keep`` mismatches."""
    rng = random.Random(seed)
    stats: Counter = Counter()
    mismatches: list = []

    def miss(what, **info):
        stats["mismatches"] += 1
        if len(mismatches) < keep:
            mismatches.append({"what": what, **{k: repr(v) for k, v in info.items()}})

    while stats["cases"] < cases:
        records, ids, pools = random_table(rng)
        stats["tables"] += 1
        try:
            fields, rows = oracle.table(records, ids)
        except oracle.Invalid:
            fields = None
        try:
            meta = engine_meta(records, ids)
        except ValueError as exc:
            meta, error = None, exc
        if (fields is None) != (meta is None):
            miss("table", records=records, oracle=fields, engine=meta or error)
            continue
        if fields is None:
            stats["tables_refused"] += 1
            continue
        if _kinds(meta) != fields:
            miss("kinds", records=records, oracle=fields, engine=meta.fields)
            continue
        for kind in fields.values():
            stats[f"field_{kind}"] += 1
        for _ in range(filters_per_table):
            if stats["cases"] >= cases:
                break
            spec = random_filter(rng, fields, pools, ids)
            stats["cases"] += 1
            try:
                want = oracle.evaluate(spec, fields, rows, ids)
            except oracle.Invalid:
                want = None
            try:
                got = engine_mask(spec, meta, ids)
            except FilterError:
                got = None
            except Exception as exc:  # anything else is a crash: a mismatch
                miss("crash", spec=spec, records=records, error=exc)
                continue
            if got != want:
                miss("mask", spec=spec, records=records, oracle=want, engine=got)
            elif want is None:
                stats["refused"] += 1
            else:
                stats["allowed_items"] += sum(want)
                stats["items"] += len(want)
                stats["some_but_not_all"] += 0 < sum(want) < len(want)
                stats.update(_operators(spec, fields))
    return {**dict(stats), "first_mismatches": mismatches}
