"""Item metadata: the fields of each item other than its id and text (a tenant, a language, a
date, tags), kept column by column beside an index's other arrays and versioned with them.

``crossknn build`` and ``crossknn add`` keep every other field of an item's JSON line; a filter
(:mod:`crossknn.filters`) reads the columns. One column per field, its kind read from the values
(``null`` is a missing value; nested objects are flattened to dotted names: ``{"author": {"name":
"x"}}`` is the field ``author.name``):

- ``string``: strings. Arrays (``meta<j>_<part>``): ``codes`` int32 (N,), -1 missing, and the
  sorted distinct values as UTF-8 (``dict_bytes`` uint8, ``dict_offsets`` int64).
- ``date``: ISO 8601 strings (``2024-05-01``, ``2024-05-01T12:30:00Z``, with an offset), when
  every value of the field is one (a time without an offset is UTC). ``ms`` int64, milliseconds
  since 1970-01-01 UTC, INT64_MIN missing.
- ``number``: numbers, compared as 64-bit floats. ``values`` float64, NaN missing.
- ``bool``: true / false. ``values`` int8, -1 missing.
- ``strings``: lists of strings (tags; an empty list is present). ``offsets`` int64 (N + 1),
  ``codes`` int32, ``present`` int8, and the dictionary.

A field whose values mix kinds (numbers and strings, a list and a string) is refused with the
field and the first item of the other kind. ``params["metadata"]`` lists the fields (name, kind,
column number) in name order.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import numpy as np

__all__ = [
    "KINDS",
    "MAX_FIELDS",
    "RESERVED",
    "Column",
    "ItemMetadata",
    "flatten",
    "parse_date",
]

KINDS = ("string", "date", "number", "bool", "strings")
RESERVED = ("id", "_id", "text", "title")  # an item's own keys, never metadata fields
MAX_FIELDS = 256
MAX_NAME = 128
MISSING_MS = np.iinfo(np.int64).min
PARAMS_KEY = "metadata"
_DATE = re.compile(
    r"^\d{4}-\d{2}-\d{2}([T ]\d{2}:\d{2}(:\d{2}(\.\d{1,6})?)?(Z|[+-]\d{2}:?\d{2})?)?$"
)
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def parse_date(value: Any) -> int | None:
    """Milliseconds since 1970-01-01 UTC of an ISO 8601 date or date-time string (a time without
    an offset is UTC); None when ``value`` is not one."""
    if not isinstance(value, str) or not _DATE.match(value):
        return None
    try:
        dt = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    delta = dt - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1000 + delta.microseconds // 1000


def flatten(record: Mapping, *, where: str = "item") -> dict[str, Any]:
    """An item's metadata fields: every key but ``id``/``_id``/``text``/``title``, nested objects
    flattened to dotted names, ``null`` dropped (a missing value)."""
    out: dict[str, Any] = {}

    def walk(obj: Mapping, prefix: str) -> None:
        for key, value in obj.items():
            if not isinstance(key, str) or not key:
                raise ValueError(f"{where}: a metadata field needs a non-empty name; got {key!r}")
            name = f"{prefix}{key}"
            if isinstance(value, Mapping):
                walk(value, name + ".")
            elif value is not None:
                out[name] = value

    walk({k: v for k, v in record.items() if k not in RESERVED}, "")
    return out


def _kind_of(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "strings"
    return type(value).__name__


def _dictionary(values: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    data = [v.encode("utf-8") for v in values]
    offsets = np.zeros(len(data) + 1, np.int64)
    np.cumsum([len(b) for b in data], out=offsets[1:])
    return np.frombuffer(b"".join(data), np.uint8).copy(), offsets


@dataclass
class Column:
    """One field's values for every item (see the module docstring for the arrays)."""

    name: str
    kind: str
    arrays: dict[str, np.ndarray]
    _dict: list[str] | None = field(default=None, repr=False)

    @property
    def dictionary(self) -> list[str]:
        """The sorted distinct strings (kinds string and strings)."""
        if self._dict is None:
            raw = np.asarray(self.arrays["dict_bytes"], np.uint8).tobytes()
            off = np.asarray(self.arrays["dict_offsets"], np.int64)
            self._dict = [raw[a:b].decode("utf-8") for a, b in zip(off[:-1], off[1:], strict=True)]
        return self._dict

    def codes_of(self, values: Sequence[str]) -> np.ndarray:
        """The codes of ``values`` that the dictionary holds (the others match no item)."""
        d = self.dictionary
        idx = np.searchsorted(d, list(values)) if d else np.zeros(len(values), np.int64)
        return np.asarray(
            [int(i) for i, v in zip(idx, values, strict=True) if i < len(d) and d[int(i)] == v],
            np.int64,
        )

    def value(self, i: int) -> Any:
        """Item ``i``'s value as it was given (a date as its ISO form in UTC), None if missing."""
        a = self.arrays
        if self.kind == "string":
            c = int(a["codes"][i])
            return None if c < 0 else self.dictionary[c]
        if self.kind == "strings":
            if not a["present"][i]:
                return None
            lo, hi = int(a["offsets"][i]), int(a["offsets"][i + 1])
            return [self.dictionary[int(c)] for c in a["codes"][lo:hi]]
        if self.kind == "number":
            v = float(a["values"][i])
            return None if np.isnan(v) else (int(v) if v.is_integer() and abs(v) < 2**53 else v)
        if self.kind == "bool":
            v = int(a["values"][i])
            return None if v < 0 else bool(v)
        ms = int(a["ms"][i])
        if ms == MISSING_MS:
            return None
        dt = datetime.fromtimestamp(ms / 1000, tz=timezone.utc)
        return dt.isoformat(timespec="milliseconds").replace("+00:00", "Z")

    def take(self, rows: np.ndarray) -> Column:
        a = self.arrays
        if self.kind == "strings":
            lo, hi = np.asarray(a["offsets"])[rows], np.asarray(a["offsets"])[rows + 1]
            parts = [np.asarray(a["codes"])[x:y] for x, y in zip(lo, hi, strict=True)]
            offsets = np.zeros(len(rows) + 1, np.int64)
            np.cumsum(hi - lo, out=offsets[1:])
            codes = np.concatenate(parts).astype(np.int32) if parts else np.zeros(0, np.int32)
            present = np.ascontiguousarray(np.asarray(a["present"])[rows])
            new = {**a, "offsets": offsets, "codes": codes, "present": present}
        else:
            part = {"string": "codes", "date": "ms"}.get(self.kind, "values")
            new = {**a, part: np.ascontiguousarray(np.asarray(a[part])[rows])}
        return Column(self.name, self.kind, new, self._dict)


def _build_column(name: str, values: list[Any], items: Sequence[str]) -> Column:
    """The column of one field from every item's value (None: missing)."""
    n = len(values)
    kinds: dict[str, int] = {}
    for i, v in enumerate(values):
        if v is not None:
            kinds.setdefault(_kind_of(v), i)
    if len(kinds) > 1:
        (k1, i1), (k2, i2) = sorted(kinds.items(), key=lambda t: t[1])[:2]
        raise ValueError(
            f"metadata field {name!r} mixes kinds: {k1} (item {items[i1]!r}) and {k2} (item "
            f"{items[i2]!r}); give every item's {name!r} one kind (string, number, bool, date "
            "or a list of strings)"
        )
    kind = next(iter(kinds), "string")
    if kind not in ("string", "number", "bool", "strings"):
        i = kinds[kind]
        raise ValueError(
            f"metadata field {name!r} of item {items[i]!r} is a {kind}; fields hold strings, "
            "numbers, booleans, dates (ISO 8601 strings), lists of strings or nested objects"
        )
    if kind == "string":
        ms = [parse_date(v) if v is not None else MISSING_MS for v in values]
        if all(m is not None for m in ms) and any(v is not None for v in values):
            return Column(name, "date", {"ms": np.asarray(ms, np.int64)})
        distinct = sorted({v for v in values if v is not None})
        code = {v: j for j, v in enumerate(distinct)}
        codes = np.asarray([-1 if v is None else code[v] for v in values], np.int32)
        b, off = _dictionary(distinct)
        return Column(name, kind, {"codes": codes, "dict_bytes": b, "dict_offsets": off})
    if kind == "number":
        arr = np.asarray([np.nan if v is None else float(v) for v in values], np.float64)
        bad = ~np.isfinite(arr) & ~np.asarray([v is None for v in values])
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ValueError(f"metadata field {name!r} of item {items[i]!r} is not a finite number")
        return Column(name, kind, {"values": arr})
    if kind == "bool":
        arr = np.asarray([-1 if v is None else int(v) for v in values], np.int8)
        return Column(name, kind, {"values": arr})
    for i, v in enumerate(values):
        if v is not None and not all(isinstance(x, str) for x in v):
            raise ValueError(
                f"metadata field {name!r} of item {items[i]!r}: a list field holds strings; got "
                f"{v[:3]!r}"
            )
    distinct = sorted({x for v in values if v is not None for x in v})
    code = {v: j for j, v in enumerate(distinct)}
    lens = [0 if v is None else len(v) for v in values]
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(lens, out=offsets[1:])
    codes = np.asarray([code[x] for v in values if v is not None for x in v], np.int32)
    b, off = _dictionary(distinct)
    present = np.asarray([v is not None for v in values], np.int8)
    arrays = {"offsets": offsets, "codes": codes, "present": present}
    return Column(name, kind, {**arrays, "dict_bytes": b, "dict_offsets": off})


class ItemMetadata:
    """Every item's metadata fields, as columns (empty: no field)."""

    def __init__(self, columns: Mapping[str, Column], n_items: int) -> None:
        self.columns = dict(sorted(columns.items()))
        self.n_items = int(n_items)

    def __len__(self) -> int:
        return self.n_items

    def __repr__(self) -> str:
        return f"ItemMetadata(n_items={self.n_items}, fields={self.fields})"

    @property
    def fields(self) -> dict[str, str]:
        """Field name -> kind."""
        return {name: c.kind for name, c in self.columns.items()}

    @classmethod
    def from_records(
        cls, records: Sequence[Mapping | None], *, ids: Sequence[str] | None = None
    ) -> ItemMetadata:
        """The columns of every item's fields (``records``: one flat mapping per item, as
        :func:`flatten` gives, or None for none); ``ids`` name items in errors."""
        n = len(records)
        items = [str(i) for i in ids] if ids is not None else [str(i) for i in range(n)]
        names = sorted({k for r in records if r for k in r})
        if len(names) > MAX_FIELDS:
            raise ValueError(
                f"the items have {len(names)} metadata fields; at most {MAX_FIELDS} are kept "
                f"(first fields: {names[:5]})"
            )
        for name in names:
            if len(name) > MAX_NAME:
                raise ValueError(f"metadata field name {name[:40]!r}... is over {MAX_NAME} chars")
        cols = {
            name: _build_column(name, [(r or {}).get(name) for r in records], items)
            for name in names
        }
        return cls(cols, n)

    def records(self) -> list[dict[str, Any]]:
        """One flat mapping per item (missing fields left out): the input of
        :meth:`from_records`."""
        out: list[dict[str, Any]] = [{} for _ in range(self.n_items)]
        for name, col in self.columns.items():
            for i in range(self.n_items):
                v = col.value(i)
                if v is not None:
                    out[i][name] = v
        return out

    def take(self, rows) -> ItemMetadata:
        rows = np.asarray(rows, np.int64)
        return ItemMetadata({name: c.take(rows) for name, c in self.columns.items()}, rows.size)

    def to_index(self) -> tuple[dict[str, np.ndarray], dict | None]:
        """(index arrays, ``params["metadata"]``) to store; ({}, None) without fields."""
        if not self.columns:
            return {}, None
        arrays, spec = {}, []
        for j, (name, col) in enumerate(self.columns.items()):
            spec.append({"name": name, "kind": col.kind, "column": j})
            for part, arr in col.arrays.items():
                arrays[f"meta{j}_{part}"] = np.ascontiguousarray(arr)
        return arrays, {"fields": spec}

    @classmethod
    def from_index(cls, arrays: Mapping[str, np.ndarray], params: Mapping, n_items: int):
        """The metadata of an index (no fields when its params record none)."""
        spec = (params or {}).get(PARAMS_KEY)
        if not spec:
            return cls({}, n_items)
        cols = {}
        for f in spec["fields"]:
            prefix = f"meta{int(f['column'])}_"
            parts = {k[len(prefix) :]: v for k, v in arrays.items() if k.startswith(prefix)}
            if f["kind"] not in KINDS or not parts:
                raise ValueError(
                    f"index metadata field {f['name']!r}: kind {f['kind']!r} with arrays "
                    f"{sorted(parts)} is not one this crossknn reads"
                )
            cols[f["name"]] = Column(f["name"], f["kind"], parts)
        return cls(cols, n_items)

    @staticmethod
    def array_names(arrays: Mapping) -> list[str]:
        """The index arrays that hold metadata (to replace or drop them all at once)."""
        return [k for k in arrays if re.match(r"^meta\d+_", k)]
