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
  since 1970-01-01 UTC (finer fractions dropped), INT64_MIN missing.
- ``number``: numbers, compared as 64-bit floats (an integer beyond 64 bits, ``|v| >= 2**64``,
  is refused). ``values`` float64, NaN missing.
- ``bool``: true / false. ``values`` int8, -1 missing.
- ``strings``: lists of strings (tags; an empty list is present). ``offsets`` int64 (N + 1),
  ``codes`` int32, ``present`` int8, and the dictionary.

A field whose values mix kinds (numbers and strings, a list and a string) is refused with the
field and the first item of each kind; so is a name that starts with ``$`` (a filter reads it as
an operator) and two keys that flatten to one name (``{"a.b": 1, "a": {"b": 2}}``).
:meth:`ItemMetadata.extended` appends new items' fields to stored columns (``crossknn add``):
a stored field keeps its kind and its values (a date field refuses a string that is no date).
``params["metadata"]`` lists the fields (name, kind, column number) in name order.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
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
    r"\d{4}-\d{2}-\d{2}([T ]\d{2}:\d{2}(:\d{2}(\.\d{1,6})?)?(Z|[+-]\d{2}:?[0-5]\d)?)?", re.ASCII
)
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_NAIVE_EPOCH = datetime(1970, 1, 1)
_DAY_MS = 86_400_000
_MAX_INT = 2**64  # integers at least this large (in magnitude) are refused: beyond 64 bits
_KIND_NAMES = {"strings": "list of strings"}


def kind_name(kind: str) -> str:
    """A kind as a message says it (``strings``: "list of strings")."""
    return _KIND_NAMES.get(kind, kind)


def number_problem(value: Any) -> str | None:
    """Why a JSON number is not one a field or filter holds (None: it is one): an integer beyond
    64 bits or a float that is not finite."""
    if isinstance(value, int) and not isinstance(value, bool):
        if -_MAX_INT < value < _MAX_INT:
            return None
        digits = int(value.bit_length() * 0.30103) + 1
        return f"an integer of about {digits} digits (at most 64 bits: |value| < 2**64)"
    if isinstance(value, float) and not np.isfinite(value):
        return f"float {value!r}"
    return None


def parse_date(value: Any) -> int | None:
    """Milliseconds since 1970-01-01 UTC of an ISO 8601 date or date-time string (a time without
    an offset is UTC); None when ``value`` is not one."""
    if not isinstance(value, str) or not _DATE.fullmatch(value):
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
    flattened to dotted names, ``null`` dropped (a missing value). Two keys that give one name
    (``{"a.b": 1, "a": {"b": 2}}``) are refused."""
    out: dict[str, Any] = {}
    paths: dict[str, tuple] = {}  # name -> the keys that gave it
    iid = record.get("id", record.get("_id"))
    if iid is not None:
        where = f"{where}: item {iid!r}"

    def walk(obj: Mapping, keys: tuple) -> None:
        for key, value in obj.items():
            if not isinstance(key, str) or not key:
                raise ValueError(f"{where}: a metadata field needs a non-empty name; got {key!r}")
            path = (*keys, key)
            name = ".".join(path)
            if isinstance(value, Mapping):
                walk(value, path)
                continue
            if name in paths:
                a, b = (" -> ".join(repr(k) for k in p) for p in (paths[name], path))
                raise ValueError(
                    f"{where}: the keys {a} and {b} both give the metadata field {name!r}; "
                    "rename one"
                )
            paths[name] = path
            if value is not None:
                out[name] = value

    walk({k: v for k, v in record.items() if k not in RESERVED}, ())
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


def _utf8(s: str, what: str) -> bytes:
    try:
        return s.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"{what} holds {s[exc.start]!r} at character {exc.start} (a lone surrogate, not "
            "valid Unicode); expected valid UTF-8 text"
        ) from None


def _dictionary(values: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    data = [v.encode("utf-8") for v in values]
    offsets = np.zeros(len(data) + 1, np.int64)
    np.cumsum([len(b) for b in data], out=offsets[1:])
    return np.frombuffer(b"".join(data), np.uint8).copy(), offsets


def _mixed(name: str, k1: str, i1: str, k2: str, i2: str) -> ValueError:
    return ValueError(
        f"metadata field {name!r} mixes kinds: {kind_name(k1)} (item {i1!r}) and "
        f"{kind_name(k2)} (item {i2!r}); give every item's {name!r} one kind (string, number, "
        "bool, date or a list of strings)"
    )


def _iso(ms: int) -> str:
    """The ISO 8601 form of a date: UTC, or (a UTC year beyond 1..9999, which an offset can give)
    at the offset -23:59 / +23:59 that brings it back into range; :func:`parse_date` reads it."""
    for shift, suffix in ((0, "Z"), (-1, "-23:59"), (1, "+23:59")):
        try:
            dt = _NAIVE_EPOCH + timedelta(milliseconds=ms + shift * (_DAY_MS - 60_000))
        except OverflowError:
            continue
        return dt.isoformat(timespec="milliseconds") + suffix
    raise ValueError(f"a stored date of {ms} ms since 1970 is beyond years 1..9999")


@dataclass
class Column:
    """One field's values for every item (see the module docstring for the arrays)."""

    name: str
    kind: str
    arrays: dict[str, np.ndarray]
    _dict: list[str] | None = field(default=None, repr=False)
    _codes: dict[str, int] | None = field(default=None, repr=False)

    @property
    def dictionary(self) -> list[str]:
        """The sorted distinct strings (kinds string and strings)."""
        if self._dict is None:
            raw = np.asarray(self.arrays["dict_bytes"], np.uint8).tobytes()
            off = np.asarray(self.arrays["dict_offsets"], np.int64).tolist()
            self._dict = [raw[a:b].decode("utf-8") for a, b in zip(off[:-1], off[1:], strict=True)]
        return self._dict

    def codes_of(self, values: Sequence[str]) -> np.ndarray:
        """The codes of ``values`` that the dictionary holds (the others match no item): a hash
        look-up, time and memory in proportion to the values and the dictionary."""
        if self._codes is None:
            self._codes = {v: j for j, v in enumerate(self.dictionary)}
        codes = self._codes
        return np.fromiter((codes[v] for v in values if v in codes), np.int64)

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
        return None if ms == MISSING_MS else _iso(ms)

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
        return Column(self.name, self.kind, new, self._dict, self._codes)

    def first_present(self) -> int | None:
        """The first item that has a value (None: none has)."""
        a = self.arrays
        have = {
            "string": lambda: np.asarray(a["codes"]) >= 0,
            "strings": lambda: np.asarray(a["present"]) > 0,
            "number": lambda: ~np.isnan(np.asarray(a["values"])),
            "bool": lambda: np.asarray(a["values"]) >= 0,
            "date": lambda: np.asarray(a["ms"]) != MISSING_MS,
        }[self.kind]()
        hit = np.flatnonzero(have)
        return int(hit[0]) if hit.size else None

    def concat(self, other: Column) -> Column:
        """This column's items, then ``other``'s (the same kind; dictionaries merged)."""
        a, b = self.arrays, other.arrays
        if self.kind in ("number", "bool", "date"):
            part = "ms" if self.kind == "date" else "values"
            return Column(self.name, self.kind, {part: np.concatenate([a[part], b[part]])})
        distinct = sorted(set(self.dictionary) | set(other.dictionary))
        code = {v: j for j, v in enumerate(distinct)}
        codes = []
        for c in (self, other):  # old code -> merged code; -1 (missing) to the last entry, -1
            remap = np.asarray([code[v] for v in c.dictionary] + [-1], np.int32)
            codes.append(remap[np.asarray(c.arrays["codes"], np.int64)])
        dict_bytes, dict_offsets = _dictionary(distinct)
        new = {"codes": np.concatenate(codes).astype(np.int32)}
        if self.kind == "strings":
            off_a, off_b = np.asarray(a["offsets"], np.int64), np.asarray(b["offsets"], np.int64)
            new["offsets"] = np.concatenate([off_a, off_b[1:] + off_a[-1]])
            new["present"] = np.concatenate([a["present"], b["present"]]).astype(np.int8)
        new.update(dict_bytes=dict_bytes, dict_offsets=dict_offsets)
        return Column(self.name, self.kind, new, distinct, code)


def _missing(name: str, kind: str, n: int) -> Column:
    """A column of ``n`` items without the field."""
    if kind == "date":
        return Column(name, kind, {"ms": np.full(n, MISSING_MS, np.int64)})
    if kind in ("number", "bool"):
        v = np.full(n, np.nan) if kind == "number" else np.full(n, -1, np.int8)
        return Column(name, kind, {"values": v})
    b, off = _dictionary([])
    arrays = {"codes": np.full(n if kind == "string" else 0, -1, np.int32)}
    if kind == "strings":
        arrays.update(offsets=np.zeros(n + 1, np.int64), present=np.zeros(n, np.int8))
    return Column(name, kind, {**arrays, "dict_bytes": b, "dict_offsets": off})


def _build_column(
    name: str, values: list[Any], items: Sequence[str], *, dates: bool = True
) -> Column:
    """The column of one field from every item's value (None: missing); ``dates=False`` keeps
    strings that are all dates a string field."""
    n = len(values)
    kinds: dict[str, int] = {}
    for i, v in enumerate(values):
        if v is not None:
            kinds.setdefault(_kind_of(v), i)
    if len(kinds) > 1:
        (k1, i1), (k2, i2) = sorted(kinds.items(), key=lambda t: t[1])[:2]
        raise _mixed(name, k1, items[i1], k2, items[i2])
    kind = next(iter(kinds), "string")
    if kind not in ("string", "number", "bool", "strings"):
        i = kinds[kind]
        raise ValueError(
            f"metadata field {name!r} of item {items[i]!r} is a {kind}; fields hold strings, "
            "numbers, booleans, dates (ISO 8601 strings), lists of strings or nested objects"
        )
    if kind == "string":
        ms = [parse_date(v) if v is not None else MISSING_MS for v in values]
        if dates and all(m is not None for m in ms) and any(v is not None for v in values):
            return Column(name, "date", {"ms": np.asarray(ms, np.int64)})
        distinct = sorted({v for v in values if v is not None})
        code = {v: j for j, v in enumerate(distinct)}
        _check_text(name, distinct, values, items)
        codes = np.asarray([-1 if v is None else code[v] for v in values], np.int32)
        b, off = _dictionary(distinct)
        return Column(name, kind, {"codes": codes, "dict_bytes": b, "dict_offsets": off})
    if kind == "number":
        for i, v in enumerate(values):
            why = None if v is None else number_problem(v)
            if why is not None:
                raise ValueError(
                    f"metadata field {name!r} of item {items[i]!r} is not a finite number: got "
                    f"{why}"
                )
        arr = np.asarray([np.nan if v is None else float(v) for v in values], np.float64)
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
    _check_text(name, distinct, values, items)
    code = {v: j for j, v in enumerate(distinct)}
    lens = [0 if v is None else len(v) for v in values]
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(lens, out=offsets[1:])
    codes = np.asarray([code[x] for v in values if v is not None for x in v], np.int32)
    b, off = _dictionary(distinct)
    present = np.asarray([v is not None for v in values], np.int8)
    arrays = {"offsets": offsets, "codes": codes, "present": present}
    return Column(name, kind, {**arrays, "dict_bytes": b, "dict_offsets": off})


def _check_text(name: str, distinct: Sequence[str], values: Sequence, items: Sequence[str]):
    """Every string of a field is valid UTF-8 (no lone surrogate): else the field and item."""
    for s in distinct:
        try:
            s.encode("utf-8")
        except UnicodeEncodeError:
            i = next(i for i, v in enumerate(values) if v == s or isinstance(v, list) and s in v)
            _utf8(s, f"metadata field {name!r} of item {items[i]!r}")


def _check_count(names: Sequence[str]) -> None:
    if len(names) > MAX_FIELDS:
        raise ValueError(
            f"the items have {len(names)} metadata fields; at most {MAX_FIELDS} are kept "
            f"(first fields: {names[:5]})"
        )


def _check_names(names: Sequence[str], records: Sequence[Mapping | None], items: Sequence[str]):
    """Field names a filter can name: not starting with ``$``, valid UTF-8, not too long."""
    for name in names:
        if not name.startswith("$") and len(name) <= MAX_NAME and name.isprintable():
            continue  # (a printable name is valid UTF-8)
        item = next(items[i] for i, r in enumerate(records) if r and name in r)
        if name.startswith("$"):
            raise ValueError(
                f"metadata field {name!r} of item {item!r} starts with '$', which a filter reads "
                "as an operator; rename the field"
            )
        _utf8(name, f"the name of a metadata field of item {item!r}")
        if len(name) > MAX_NAME:
            raise ValueError(
                f"metadata field name {name[:40]!r}... of item {item!r} is over {MAX_NAME} chars"
            )


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
        _check_count(names)
        _check_names(names, records, items)
        cols = {
            name: _build_column(name, [(r or {}).get(name) for r in records], items)
            for name in names
        }
        return cls(cols, n)

    def extended(
        self, records: Sequence[Mapping | None], *, ids: Sequence[str], new_ids: Sequence[str]
    ) -> ItemMetadata:
        """These items' columns, then new items' (``records``, as :meth:`from_records` takes
        them; ``ids`` this metadata's items, ``new_ids`` the new ones, to name items in errors).
        A stored field keeps its kind and values: a new value of another kind is refused (a
        date field takes dates only), a field new items lack is missing for them."""
        n = len(records)
        new = [str(i) for i in new_ids]
        names = sorted({k for r in records if r for k in r})
        every = sorted(set(names) | set(self.columns))
        _check_count(every)
        _check_names(sorted(set(names) - set(self.columns)), records, new)
        cols: dict[str, Column] = {}
        for name in every:
            old = self.columns.get(name)
            values = [(r or {}).get(name) for r in records]
            if old is None:
                col = _build_column(name, values, new)
                cols[name] = _missing(name, col.kind, self.n_items).concat(col)
                continue
            if name not in names:
                cols[name] = old.concat(_missing(name, old.kind, n))
                continue
            first = old.first_present()
            if first is None:  # no stored item has the field: the new values decide its kind
                col = _build_column(name, values, new)
                cols[name] = _missing(name, col.kind, self.n_items).concat(col)
                continue
            col = _build_column(name, values, new, dates=old.kind == "date")
            if col.kind != old.kind:
                j = next(
                    i
                    for i, v in enumerate(values)
                    if v is not None and (old.kind != "date" or parse_date(v) is None)
                )
                raise _mixed(name, old.kind, str(ids[first]), col.kind, new[j])
            cols[name] = old.concat(col)
        return ItemMetadata(cols, self.n_items + n)

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
