"""An independent evaluator of the filter language, written from docs/filters.md alone ("Item
fields" and "The filter language"), row by row in plain Python. It shares no code with
:mod:`crossknn.filters` or :mod:`crossknn.metadata` (and imports nothing from crossknn): the
differential fuzz (tests/filter_fuzz.py, bench/filter_fuzz_bench.py) holds the engine's allow
mask against it, so a disagreement is a bug in one of the two or in the docs.

    fields, rows = table(records, ids)      # Invalid when build would refuse the items
    allowed = evaluate(spec, fields, rows, ids)  # list of bool; Invalid when a filter is refused
"""

from __future__ import annotations

import math
import re

__all__ = ["Invalid", "date_ms", "evaluate", "table"]

RESERVED = ("id", "_id", "text", "title")  # an item's own keys: never fields
LOGIC = ("$and", "$or", "$not")
EQUALITY = ("$eq", "$ne", "$in", "$nin", "$exists")
RANGE = ("$gt", "$gte", "$lt", "$lte")
OPERATORS = {
    "string": EQUALITY,
    "list": EQUALITY,
    "bool": EQUALITY,
    "number": EQUALITY + RANGE,
    "date": EQUALITY + RANGE,
    "id": ("$eq", "$ne", "$in", "$nin"),
}
MAX_DEPTH = 32
MAX_CONDITIONS = 256
MAX_VALUES = 100_000

_DATE = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})"
    r"(?:[T ]([0-9]{2}):([0-9]{2})(?::([0-9]{2})(?:\.([0-9]{1,6}))?)?"
    r"(Z|([+-])([0-9]{2}):?([0-9]{2}))?)?"
)


class Invalid(Exception):
    """The docs say this table or filter is refused."""


# ---- dates ----------------------------------------------------------------------------------


def _leap(y: int) -> bool:
    return y % 4 == 0 and (y % 100 != 0 or y % 400 == 0)


def _days_before_year(y: int) -> int:
    """Days from 0001-01-01 to y-01-01 (proleptic Gregorian calendar)."""
    p = y - 1
    return p * 365 + p // 4 - p // 100 + p // 400


_MONTH_DAYS = (31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)
_EPOCH_DAYS = _days_before_year(1970)  # 1970-01-01 as days since 0001-01-01


def date_ms(s) -> int | None:
    """Milliseconds since 1970-01-01T00:00Z of a date as the docs define one; None if it is
    not one."""
    if not isinstance(s, str):
        return None
    m = _DATE.fullmatch(s)
    if m is None:
        return None
    y, mo, d = int(m[1]), int(m[2]), int(m[3])
    h = int(m[4] or 0)
    mi = int(m[5] or 0)
    sec = int(m[6] or 0)
    frac_ms = int((m[7] or "").ljust(6, "0")) // 1000  # finer digits dropped
    if not (1 <= y <= 9999 and 1 <= mo <= 12):
        return None
    month_days = 29 if mo == 2 and _leap(y) else _MONTH_DAYS[mo - 1]
    if not (1 <= d <= month_days and h <= 23 and mi <= 59 and sec <= 59):
        return None
    offset_min = 0
    if m[9] is not None:
        oh, om = int(m[10]), int(m[11])
        if oh > 23 or om > 59:  # under 24 hours, minutes as a clock has them
            return None
        offset_min = (oh * 60 + om) * (1 if m[9] == "+" else -1)
    days = _days_before_year(y) + sum(_MONTH_DAYS[: mo - 1]) + (mo > 2 and _leap(y)) + d - 1
    local = (((days - _EPOCH_DAYS) * 24 + h) * 60 + mi) * 60 + sec
    return (local - offset_min * 60) * 1000 + frac_ms


# ---- items ----------------------------------------------------------------------------------


def _valid_text(s: str) -> bool:
    return not any(0xD800 <= ord(c) <= 0xDFFF for c in s)


def _flatten(record: dict) -> dict:
    """One item's fields: every key but the reserved ones, nested objects as dotted names,
    null missing; Invalid for two keys giving one name, a name starting with '$'."""
    out: dict = {}
    names: set = set()

    def walk(obj: dict, prefix: str) -> None:
        for key, value in obj.items():
            name = prefix + key
            if isinstance(value, dict):
                walk(value, name + ".")
                continue
            if name in names:
                raise Invalid(f"two keys give the field {name!r}")
            names.add(name)
            if value is not None:
                out[name] = value

    walk({k: v for k, v in record.items() if k not in RESERVED}, "")
    for name in out:
        if name.startswith("$") or not _valid_text(name):
            raise Invalid(f"field name {name!r}")
    return out


def _kind(v) -> str:
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, (int, float)):
        if isinstance(v, int) and abs(v) >= 2**64 or isinstance(v, float) and not math.isfinite(v):
            raise Invalid(f"number {v!r}")
        return "number"
    if isinstance(v, str):
        if not _valid_text(v):
            raise Invalid("a lone surrogate")
        return "string"
    if isinstance(v, list):
        if not all(isinstance(x, str) and _valid_text(x) for x in v):
            raise Invalid("a list of non-strings")
        return "list"
    raise Invalid(f"a {type(v).__name__}")


def table(records: list, ids: list) -> tuple[dict, list]:
    """(field name -> kind, one dict per item of its values as compared: numbers as floats,
    dates as milliseconds); Invalid when ``build`` refuses the items."""
    flat = [_flatten(r) for r in records]
    kinds: dict = {}
    for row in flat:
        for name, v in row.items():
            kinds.setdefault(name, set()).add(_kind(v))
    fields = {}
    for name, ks in kinds.items():
        if len(ks) > 1:
            raise Invalid(f"field {name!r} mixes {sorted(ks)}")
        (kind,) = ks
        if kind == "string" and all(date_ms(r[name]) is not None for r in flat if name in r):
            kind = "date"
        fields[name] = kind
    rows = []
    for row in flat:
        rows.append(
            {
                name: float(v)
                if fields[name] == "number"
                else date_ms(v)
                if fields[name] == "date"
                else v
                for name, v in row.items()
            }
        )
    return fields, rows


# ---- filters --------------------------------------------------------------------------------


def _value(kind: str, v):
    """A filter value as compared; Invalid when it does not have the field's kind."""
    if v is None:
        raise Invalid("null")
    if kind in ("string", "list", "id"):
        if not isinstance(v, str):
            raise Invalid("not a string")
        return v
    if kind == "number":
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise Invalid("not a number")
        if isinstance(v, int) and abs(v) >= 2**64 or isinstance(v, float) and not math.isfinite(v):
            raise Invalid("not a finite 64-bit number")
        return float(v)
    if kind == "bool":
        if not isinstance(v, bool):
            raise Invalid("not a boolean")
        return v
    ms = date_ms(v)
    if ms is None:
        raise Invalid("not a date")
    return ms


def _holds(have, x) -> bool:
    """Equality: a missing value holds nothing; a list holds its strings."""
    if have is None:
        return False
    return x in have if isinstance(have, list) else have == x


def _condition(name: str, kind: str, op: str, x):
    """A predicate over (row, id) for one operator."""

    def get(row, iid):
        return iid if kind == "id" else row.get(name)

    if op == "$eq":
        return lambda row, iid: _holds(get(row, iid), x)
    if op == "$ne":
        return lambda row, iid: not _holds(get(row, iid), x)
    if op == "$in":
        return lambda row, iid: any(_holds(get(row, iid), y) for y in x)
    if op == "$nin":
        return lambda row, iid: not any(_holds(get(row, iid), y) for y in x)
    if op == "$exists":
        return lambda row, iid: (get(row, iid) is not None) == x
    compare = {
        "$gt": lambda a: a > x,
        "$gte": lambda a: a >= x,
        "$lt": lambda a: a < x,
        "$lte": lambda a: a <= x,
    }[op]
    return lambda row, iid: get(row, iid) is not None and compare(get(row, iid))


class _Compiler:
    def __init__(self, fields: dict) -> None:
        self.fields = fields
        self.conditions = 0

    def node(self, spec, depth: int):
        if depth > MAX_DEPTH:
            raise Invalid("too deep")
        if not isinstance(spec, dict) or not spec:
            raise Invalid("not a non-empty object")
        parts = []
        for key, value in spec.items():
            if key in ("$and", "$or"):
                if not isinstance(value, list) or not value:
                    raise Invalid(f"{key} needs a non-empty list")
                subs = [self.node(s, depth + 1) for s in value]
                if key == "$and":
                    parts.append(lambda row, iid, subs=subs: all(p(row, iid) for p in subs))
                else:
                    parts.append(lambda row, iid, subs=subs: any(p(row, iid) for p in subs))
            elif key == "$not":
                sub = self.node(value, depth + 1)
                parts.append(lambda row, iid, sub=sub: not sub(row, iid))
            elif key.startswith("$"):
                raise Invalid(f"operator {key} where a field goes")
            else:
                parts.extend(self.field(key, value))
        return lambda row, iid: all(p(row, iid) for p in parts)

    def field(self, name: str, cond) -> list:
        self.conditions += 1
        if self.conditions > MAX_CONDITIONS:
            raise Invalid("too many conditions")
        if name == "id":
            kind = "id"
        elif name in self.fields:
            kind = self.fields[name]
        else:
            raise Invalid(f"unknown field {name!r}")
        if isinstance(cond, list):
            raise Invalid("a list as a value")
        if not isinstance(cond, dict):
            return [_condition(name, kind, "$eq", _value(kind, cond))]
        if not cond:
            raise Invalid("an empty condition")
        out = []
        for op, v in cond.items():
            if op not in OPERATORS[kind]:
                raise Invalid(f"{op} on a {kind} field")
            if op == "$exists":
                if not isinstance(v, bool):
                    raise Invalid("$exists needs true or false")
                x = v
            elif op in ("$in", "$nin"):
                if not isinstance(v, list) or len(v) > MAX_VALUES:
                    raise Invalid(f"{op} needs a list")
                x = [_value(kind, y) for y in v]
            else:
                x = _value(kind, v)
            out.append(_condition(name, kind, op, x))
        return out


def evaluate(spec, fields: dict, rows: list, ids: list) -> list[bool]:
    """Which items the filter ``spec`` allows; Invalid when the docs say it is refused."""
    predicate = _Compiler(fields).node(spec, 0)
    return [bool(predicate(row, iid)) for row, iid in zip(rows, ids, strict=True)]
