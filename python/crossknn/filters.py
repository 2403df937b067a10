"""Filters on item metadata: which items a query may be given, in JSON, in the style of Qdrant's
and MongoDB's filters. A filter is an object; each key is a field (or ``$and``/``$or``/``$not``)
and every key must hold::

    {"lang": "en"}                                  equality ({"lang": {"$eq": "en"}})
    {"lang": {"$ne": "en"}}                         not equal (an item without the field is too)
    {"tenant": {"$in": ["acme", "globex"]}}         one of ($nin: none of)
    {"year": {"$gte": 2019, "$lt": 2024}}           ranges on numbers ($gt, $gte, $lt, $lte)
    {"published": {"$gte": "2024-01-01"}}           ... and on dates (ISO 8601 strings)
    {"tags": "covid"}                               a list field holds the value ($in: any of)
    {"summary": {"$exists": true}}                  the item has the field (false: it has not)
    {"$or": [{"lang": "en"}, {"lang": "de"}]}       $and, $or (a non-empty list), $not (a filter)
    {"id": {"$in": ["d1", "d7"]}}                   the item ids: an id allow-list

The same filters in Qdrant's form (an object of ``must`` / ``should`` / ``must_not`` lists) are
read into the same conditions, so a Qdrant filter and its MongoDB twin allow the same items::

    {"must": [{"key": "lang", "match": {"value": "en"}}]}          {"lang": "en"}
    {"must": [{"key": "tenant", "match": {"any": ["acme"]}}]}      {"tenant": {"$in": ["acme"]}}
    {"must": [{"key": "tenant", "match": {"except": ["acme"]}}]}   {"tenant": {"$nin": ["acme"]}}
    {"must": [{"key": "year", "range": {"gte": 2019, "lt": 2024}}]}  {"year": {"$gte": 2019, ...}}
    {"should": [A, B]}   {"$or": [A, B]};   {"must_not": [A, B]}   {"$not": {"$or": [A, B]}}
    {"must": [{"is_null": {"key": "summary"}}]}     {"summary": {"$exists": false}}
    {"must": [{"is_empty": {"key": "tags"}}]}       no field, or an empty list
    {"must": [{"has_id": ["d1", "d7"]}]}            {"id": {"$in": ["d1", "d7"]}}

A construct of Qdrant's that has no meaning here (``match.text``, ``geo_radius``, ``nested``,
``values_count``, ``min_should`` ...) is refused naming it.

A range or equality on an item without the field is false; ``$ne``/``$nin`` are true there
(MongoDB's rule). Values must have the field's kind (:mod:`crossknn.metadata`): strings for
string and list fields, numbers for number fields, ISO 8601 strings for dates, booleans for bool
fields. :func:`parse_filter` checks a filter against an index's fields and says where it is
wrong (``filter.$or[1].year.$gte: expected a number; got 'x'``); :meth:`Filter.mask` is the
items it allows.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from crossknn.metadata import (
    MISSING_MS,
    ItemMetadata,
    kind_name,
    number_problem,
    parse_date,
)

__all__ = ["ID_FIELD", "Filter", "FilterError", "filter_key", "parse_filter"]

ID_FIELD = "id"
MAX_DEPTH = 32
MAX_VALUES = 100_000  # values in one $in / $nin list
MAX_CONDITIONS = 256  # conditions in one filter (each reads a column once)
_LOGIC = ("$and", "$or", "$not")
_COMPARE = ("$eq", "$ne", "$in", "$nin", "$gt", "$gte", "$lt", "$lte", "$exists")
_RANGE = ("$gt", "$gte", "$lt", "$lte")
_OPS = {
    "string": ("$eq", "$ne", "$in", "$nin", "$exists"),
    "strings": ("$eq", "$ne", "$in", "$nin", "$exists"),
    "number": _COMPARE,
    "date": _COMPARE,
    "bool": ("$eq", "$ne", "$in", "$nin", "$exists"),
    "id": ("$eq", "$ne", "$in", "$nin"),
}


# Qdrant's form: its clauses, condition keys, match kinds (-> our operator), range bounds
_Q_CLAUSES = ("must", "should", "must_not", "min_should")
_Q_CONDITION = ("key", "match", "range", "is_empty", "is_null", "has_id")
_Q_MATCH = {"value": "$eq", "any": "$in", "except": "$nin"}
_Q_RANGE = {"gt": "$gt", "gte": "$gte", "lt": "$lt", "lte": "$lte"}
# Qdrant's constructs with no meaning here, and why
_Q_REFUSED = {
    "geo_radius": "there are no geo fields",
    "geo_bounding_box": "there are no geo fields",
    "geo_polygon": "there are no geo fields",
    "values_count": "a list field is matched by its values, not counted",
    "nested": "items have no arrays of objects (nested objects are dotted fields)",
    "has_vector": "every item has its vectors",
    "datetime_range": "use range with ISO 8601 dates on a date field",
    "filter": "write the nested filter itself (must, should, must_not) as the condition",
    "min_should": "should needs one of its conditions; write 'at least n of' with should of must",
}
_Q_REFUSED_MATCH = {
    "text": "there is no full-text index on item fields",
    "text_any": "there is no full-text index on item fields",
    "phrase": "there is no full-text index on item fields",
}


def _q_refused(name: str) -> str:
    why = _Q_REFUSED.get(name) or _Q_REFUSED_MATCH.get(name.removeprefix("match."))
    return f"Qdrant's {name} has no meaning here ({why})"


class FilterError(ValueError):
    """A filter that is not valid for the index; the message says where and what."""


@dataclass(frozen=True)
class _Cond:
    field: str
    kind: str
    op: str
    value: Any  # the parsed value(s): str, float, bool, int (date ms), tuple for $in/$nin


@dataclass(frozen=True)
class _Node:
    op: str  # "$and" | "$or" | "$not"
    parts: tuple


def filter_key(spec: Any) -> str:
    """A canonical string of a filter (equal filters, equal keys): for caching its mask."""
    return json.dumps(spec, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _type_name(v: Any) -> str:
    return "null" if v is None else type(v).__name__


def _short(v: Any, limit: int = 60) -> str:
    """A value as a message shows it: its repr, cut to ``limit`` characters (a huge integer by
    its size, never converted to text in full)."""
    if isinstance(v, int) and not isinstance(v, bool) and v.bit_length() > 200:
        return f"(an integer of about {int(v.bit_length() * 0.30103) + 1} digits)"
    text = repr(v)
    return text if len(text) <= limit else f"{text[: limit - 3]}..."


class _Parser:
    def __init__(self, fields: Mapping[str, str]) -> None:
        self.fields = dict(fields)
        self.conditions = 0

    def fail(self, where: str, msg: str):
        raise FilterError(f"{where}: {msg}")

    def node(self, spec: Any, where: str, depth: int):
        if depth > MAX_DEPTH:
            self.fail(where, f"nested deeper than {MAX_DEPTH} levels")
        if not isinstance(spec, Mapping):
            self.fail(where, f"expected an object {{field: condition}}; got {_type_name(spec)}")
        if not spec:
            self.fail(where, "an empty filter object; leave the filter out to allow every item")
        if self.is_qdrant(spec):
            return self.qdrant_filter(spec, where, depth)
        parts = []
        for key, value in spec.items():
            at = f"{where}.{key}"
            if key in ("$and", "$or"):
                if not isinstance(value, list):
                    self.fail(at, f"expected a non-empty list of filters; got {_type_name(value)}")
                if not value:
                    self.fail(at, "expected a non-empty list of filters; got an empty list")
                subs = [self.node(v, f"{at}[{i}]", depth + 1) for i, v in enumerate(value)]
                parts.append(_Node(key, tuple(subs)))
            elif key == "$not":
                parts.append(_Node("$not", (self.node(value, at, depth + 1),)))
            elif isinstance(key, str) and key.startswith("$"):
                self.fail(at, f"unknown operator {key!r} here; expected a field, $and, $or or $not")
            else:
                parts.extend(self.field(key, value, at))
        return parts[0] if len(parts) == 1 else _Node("$and", tuple(parts))

    def field(self, name: str, cond: Any, where: str) -> list:
        self.count(where)
        if name == ID_FIELD:
            kind = "id"
        elif name in self.fields:
            kind = self.fields[name]
        elif name in _Q_CLAUSES:
            self.fail(where, f"Qdrant's {name} beside MongoDB-form keys; write one object in "
                      "one form (a field inside must as key + match, or $and)")  # fmt: skip
        else:
            known = ", ".join(sorted(self.fields)) or "none"
            self.fail(where, f"unknown field {name!r} (the index's fields: {known}; and id)")
        if not isinstance(cond, Mapping):
            if isinstance(cond, list):
                self.fail(where, "a list is not a value here; use {'$in': [...]} for one of many")
            return [_Cond(name, kind, "$eq", self.value(kind, cond, where))]
        if not cond:
            self.fail(where, "an empty condition; expected operators such as {'$eq': value}")
        out = []
        for op, value in cond.items():
            at = f"{where}.{op}"
            if op not in _COMPARE:
                self.fail(at, f"unknown operator {op!r}; expected one of {', '.join(_COMPARE)}")
            out.append(self.op_cond(name, kind, op, value, at, op))
        return out

    def op_cond(self, name: str, kind: str, op: str, value: Any, at: str, label: str) -> _Cond:
        """One operator's condition on a field of ``kind`` (``label``: the operator as the
        filter wrote it, for the message)."""
        if op not in _OPS[kind]:
            self.fail(at, f"{label} does not apply to a {kind_name(kind)} field")
        if op == "$exists":
            if not isinstance(value, bool):
                self.fail(at, f"expected true or false; got {_type_name(value)}")
            return _Cond(name, kind, op, value)
        if op in ("$in", "$nin"):
            if not isinstance(value, list):
                self.fail(at, f"expected a list of values; got {_type_name(value)}")
            if len(value) > MAX_VALUES:
                self.fail(at, f"{len(value)} values; at most {MAX_VALUES}")
            vals = tuple(self.value(kind, v, f"{at}[{i}]") for i, v in enumerate(value))
            return _Cond(name, kind, op, vals)
        return _Cond(name, kind, op, self.value(kind, value, at))

    # ---- Qdrant's form: must / should / must_not over key + match / range, is_empty, is_null,
    # has_id and nested filters, read into the same _Node / _Cond tree as the MongoDB form

    def is_qdrant(self, spec: Mapping) -> bool:
        """An object whose keys are Qdrant's clauses (a field of that name wins: the index's)."""
        return all(k in _Q_CLAUSES and k not in self.fields for k in spec)

    def qdrant_filter(self, spec: Mapping, where: str, depth: int):
        parts = []
        for clause, value in spec.items():
            at = f"{where}.{clause}"
            if clause == "min_should":
                self.fail(at, _q_refused("min_should"))
            conds = [value] if isinstance(value, Mapping) else value
            if not isinstance(conds, list):
                self.fail(at, f"expected a list of conditions; got {_type_name(value)}")
            if not conds:
                self.fail(at, f"an empty list of conditions; leave {clause} out")
            subs = tuple(
                self.qdrant_condition(c, f"{at}[{i}]" if conds is value else at, depth + 1)
                for i, c in enumerate(conds)
            )
            if clause == "must":
                parts.extend(subs)
            elif clause == "should":
                parts.append(subs[0] if len(subs) == 1 else _Node("$or", subs))
            else:  # must_not: none of them
                parts.append(_Node("$not", (subs[0] if len(subs) == 1 else _Node("$or", subs),)))
        return parts[0] if len(parts) == 1 else _Node("$and", tuple(parts))

    def qdrant_condition(self, cond: Any, where: str, depth: int):
        if depth > MAX_DEPTH:
            self.fail(where, f"nested deeper than {MAX_DEPTH} levels")
        if not isinstance(cond, Mapping):
            self.fail(where, f"expected a condition object; got {_type_name(cond)}")
        if not cond:
            self.fail(where, "an empty condition; expected key with match or range, is_empty, "
                      "is_null, has_id or a filter (must, should, must_not)")  # fmt: skip
        if all(k in _Q_CLAUSES for k in cond):
            return self.qdrant_filter(cond, where, depth)
        for k in cond:
            if k in _Q_REFUSED:
                self.fail(f"{where}.{k}", _q_refused(k))
            if k not in _Q_CONDITION:
                self.fail(
                    f"{where}.{k}",
                    f"unknown condition key {_short(k)}; expected key with match or range, "
                    "is_empty, is_null, has_id or a filter (must, should, must_not)",
                )
        if "key" in cond:
            return self.qdrant_field(cond, where)
        if len(cond) != 1:
            self.fail(where, f"one condition per object; got {', '.join(map(str, cond))}")
        ((k, v),) = cond.items()
        at = f"{where}.{k}"
        if k == "has_id":
            if not isinstance(v, list):
                self.fail(at, f"expected a list of item ids; got {_type_name(v)}")
            return self.qdrant_cond(ID_FIELD, "$in", v, at)
        if k in ("is_empty", "is_null"):  # null and absent are one here: no value
            if not isinstance(v, Mapping) or set(v) != {"key"}:
                self.fail(at, f'expected {{"key": FIELD}}; got {_short(v)}')
            name, kind = self.field_kind(v["key"], f"{at}.key")
            if "$exists" not in _OPS[kind]:
                self.fail(at, f"{k} does not apply to the id (every item has one)")
            if k == "is_empty" and kind == "strings":
                self.count(at)
                return _Cond(name, kind, "$empty", True)
            return self.qdrant_cond(name, "$exists", False, at)
        self.fail(where, f"expected key with match or range; got {k!r} without key")

    def qdrant_field(self, cond: Mapping, where: str):
        """``{"key": FIELD, "match": {...}}`` and/or ``"range": {...}``."""
        extra = [k for k in cond if k not in ("key", "match", "range")]
        if extra:
            self.fail(f"{where}.{extra[0]}", f"{extra[0]} does not go with key; expected match "
                      "or range")  # fmt: skip
        if "match" not in cond and "range" not in cond:
            self.fail(where, "key without a condition; expected match or range")
        name, _kind = self.field_kind(cond["key"], f"{where}.key")
        out = []
        if "match" in cond:
            m, at = cond["match"], f"{where}.match"
            if not isinstance(m, Mapping) or len(m) != 1:
                self.fail(at, 'expected one of {"value": V}, {"any": [...]}, {"except": [...]}; '
                          f"got {_short(m)}")  # fmt: skip
            ((k, v),) = m.items()
            if k in _Q_REFUSED_MATCH:
                self.fail(f"{at}.{k}", _q_refused(f"match.{k}"))
            if k not in _Q_MATCH:
                self.fail(f"{at}.{k}", f"unknown match {_short(k)}; expected value, any or except")
            out.append(self.qdrant_cond(name, _Q_MATCH[k], v, f"{at}.{k}"))
        if "range" in cond:
            r, at = cond["range"], f"{where}.range"
            if not isinstance(r, Mapping) or not r:
                self.fail(at, f"expected an object of gt, gte, lt, lte; got {_short(r)}")
            for k, v in r.items():
                if k not in _Q_RANGE:
                    self.fail(f"{at}.{k}", f"unknown range bound {_short(k)}; expected gt, gte, "
                              "lt or lte")  # fmt: skip
                if v is not None:  # Qdrant's "no bound"
                    out.append(self.qdrant_cond(name, _Q_RANGE[k], v, f"{at}.{k}", "range"))
            if not any(v is not None for v in r.values()):
                self.fail(at, "a range without a bound")
        return out[0] if len(out) == 1 else _Node("$and", tuple(out))

    def field_kind(self, name: Any, where: str) -> tuple[str, str]:
        if not isinstance(name, str):
            self.fail(where, f"expected a field name; got {_type_name(name)} {_short(name)}")
        if name.endswith("[]"):
            self.fail(where, f"{name!r}: the [] projection has no meaning here (a list field "
                      "matches when one of its values does)")  # fmt: skip
        if name == ID_FIELD:
            return name, "id"
        if name not in self.fields:
            known = ", ".join(sorted(self.fields)) or "none"
            self.fail(where, f"unknown field {name!r} (the index's fields: {known}; and id)")
        return name, self.fields[name]

    def qdrant_cond(self, name: str, op: str, value: Any, where: str, label: str = "") -> _Cond:
        """One condition, checked as its MongoDB twin ``{name: {op: value}}`` is."""
        self.count(where)
        kind = "id" if name == ID_FIELD else self.fields[name]
        return self.op_cond(name, kind, op, value, where, label or where.rsplit(".", 1)[-1])

    def count(self, where: str) -> None:
        self.conditions += 1
        if self.conditions > MAX_CONDITIONS:
            self.fail(where, f"more than {MAX_CONDITIONS} conditions in one filter")

    def value(self, kind: str, v: Any, where: str):
        if v is None:
            self.fail(
                where,
                "null is not a value to compare with; use {'$exists': false} for the items "
                "without the field",
            )
        if kind in ("string", "strings", "id"):
            if not isinstance(v, str):
                self.fail(where, f"expected a string; got {_type_name(v)} {_short(v)}")
            return v
        if kind == "number":
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                self.fail(where, f"expected a number; got {_type_name(v)} {_short(v)}")
            why = number_problem(v)
            if why is not None:
                self.fail(where, f"expected a number; got {why}")
            return float(v)
        if kind == "bool":
            if not isinstance(v, bool):
                self.fail(where, f"expected true or false; got {_type_name(v)} {_short(v)}")
            return v
        ms = parse_date(v)
        if ms is None:
            self.fail(
                where,
                f"expected an ISO 8601 date ('2024-05-01', '2024-05-01T12:00:00Z'); got "
                f"{_type_name(v)} {_short(v)}",
            )
        return ms


@dataclass(frozen=True)
class Filter:
    """A parsed filter (:func:`parse_filter`): :meth:`mask` is the items it allows."""

    root: Any
    spec: Any

    @property
    def key(self) -> str:
        return filter_key(self.spec)

    def mask(self, meta: ItemMetadata, ids: Sequence[str]) -> np.ndarray:
        """Boolean (N,): the items of ``meta`` (with item ids ``ids``) the filter allows."""
        if len(ids) != meta.n_items:
            raise ValueError(f"{len(ids)} ids for {meta.n_items} items")
        id_index = None

        def ev(node) -> np.ndarray:
            nonlocal id_index
            if isinstance(node, _Node):
                if node.op == "$not":
                    return ~ev(node.parts[0])
                out = ev(node.parts[0])
                for p in node.parts[1:]:
                    out = (out & ev(p)) if node.op == "$and" else (out | ev(p))
                return out
            if node.kind == "id":
                if id_index is None:
                    id_index = {iid: j for j, iid in enumerate(ids)}
                return _id_cond(node, id_index, meta.n_items)
            return _cond(node, meta.columns[node.field], meta.n_items)

        return ev(self.root)


def _id_cond(c: _Cond, index: Mapping[str, int], n: int) -> np.ndarray:
    vals = c.value if isinstance(c.value, tuple) else (c.value,)
    hit = np.zeros(n, bool)
    hit[[index[v] for v in vals if v in index]] = True
    return ~hit if c.op in ("$ne", "$nin") else hit


def _cond(c: _Cond, col, n: int) -> np.ndarray:
    a = col.arrays
    if c.kind in ("string", "strings"):
        present = (
            np.asarray(a["codes"]) >= 0 if c.kind == "string" else np.asarray(a["present"]) > 0
        )
        if c.op == "$exists":
            return present if c.value else ~present
        if c.op == "$empty":  # Qdrant's is_empty on a list field: no list, or an empty one
            off = np.asarray(a["offsets"])
            return ~present | (off[1:] == off[:-1])
        vals = c.value if isinstance(c.value, tuple) else (c.value,)
        codes = col.codes_of(vals)
        if c.kind == "string":
            hit = np.isin(np.asarray(a["codes"]), codes)
        else:
            off = np.asarray(a["offsets"])
            member = np.isin(np.asarray(a["codes"]), codes).astype(np.int64)
            csum = np.concatenate([[0], np.cumsum(member)])
            hit = csum[off[1:]] > csum[off[:-1]]
        return ~hit if c.op in ("$ne", "$nin") else hit
    if c.kind == "bool":
        v = np.asarray(a["values"])
        present = v >= 0
        if c.op == "$exists":
            return present if c.value else ~present
        vals = c.value if isinstance(c.value, tuple) else (c.value,)
        hit = np.isin(v, [int(x) for x in vals])
        return ~hit if c.op in ("$ne", "$nin") else hit
    v = np.asarray(a["values"] if c.kind == "number" else a["ms"])
    present = ~np.isnan(v) if c.kind == "number" else v != MISSING_MS
    if c.op == "$exists":
        return present if c.value else ~present
    if c.op in ("$in", "$nin"):
        hit = np.isin(v, np.asarray(c.value, v.dtype)) & present
        return ~hit if c.op == "$nin" else hit
    x = np.asarray(c.value, v.dtype)
    with np.errstate(invalid="ignore"):
        hit = {
            "$eq": v == x,
            "$ne": v != x,
            "$gt": v > x,
            "$gte": v >= x,
            "$lt": v < x,
            "$lte": v <= x,
        }[c.op]
    return (hit & present) | (~present if c.op == "$ne" else np.zeros(n, bool))


def parse_filter(spec: Any, fields: Mapping[str, str], *, where: str = "filter") -> Filter:
    """A filter (a JSON object, or its text) checked against an index's fields (name -> kind,
    :attr:`crossknn.metadata.ItemMetadata.fields`); :class:`FilterError` says where it is
    wrong."""
    if isinstance(spec, (str, bytes)):
        try:
            spec = json.loads(spec)
        except json.JSONDecodeError as exc:
            raise FilterError(
                f"{where}: not valid JSON ({exc.msg} at character {exc.pos})"
            ) from None
        except ValueError as exc:  # an integer of more than 4300 digits
            raise FilterError(f"{where}: not a filter this reads ({str(exc)[:80]})") from None
    return Filter(_Parser(fields).node(spec, where, 0), spec)
