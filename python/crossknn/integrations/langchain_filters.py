"""LangChain's filters in crossknn's filter language (:mod:`crossknn.filters`).

LangChain has two filter idioms, and a retriever takes both:

- the MongoDB-style dict of its vector stores (Chroma, PGVector, MongoDB Atlas, Pinecone), which
  crossknn's language already is: ``{"lang": "en"}``, ``{"year": {"$gte": 2020}}``,
  ``{"$and": [...]}``, ``{"$or": [...]}``, ``$eq $ne $gt $gte $lt $lte $in $nin $exists``, plus
  ``$between: [lo, hi]`` (PGVector: ``$gte lo`` and ``$lte hi``) and a field-level ``$not``
  (``{"year": {"$not": {"$gt": 5}}}``: ``{"$not": {"year": {"$gt": 5}}}``);
- the self-query IR of ``langchain_core.structured_query`` (``Comparison``, ``Operation``):
  ``eq ne gt gte lt lte in nin`` and ``and or not``.

Refused, in one line naming the construct: pattern and text matching (``$like``, ``$ilike``,
``$regex``, ``$text``, ``$contains``, the IR's ``like`` and ``contain``), array operators
(``$all``, ``$elemMatch``, ``$size``), ``$where`` and a callable filter (crossknn filters run
inside the engine, on its metadata columns).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["REFUSED", "translate"]

_SAME = ("$eq", "$ne", "$gt", "$gte", "$lt", "$lte", "$in", "$nin", "$exists")
# what LangChain's stores accept and crossknn cannot express, and why
REFUSED = {
    "$like": "pattern matching",
    "$ilike": "pattern matching",
    "$regex": "pattern matching",
    "$text": "full-text matching",
    "$contains": "substring matching",
    "$all": "an array operator",
    "$elemMatch": "an array operator",
    "$size": "an array operator",
    "$where": "code",
    "like": "pattern matching",
    "contain": "substring matching",
}
_IR = {
    "eq": "$eq",
    "ne": "$ne",
    "gt": "$gt",
    "gte": "$gte",
    "lt": "$lt",
    "lte": "$lte",
    "in": "$in",
    "nin": "$nin",
}


class FilterTranslationError(ValueError):
    """A LangChain filter construct with no equivalent in crossknn's filter language."""


def _refuse(where: str, what: str, why: str) -> FilterTranslationError:
    return FilterTranslationError(
        f"LangChain filter {where}: {what} ({why}) has no crossknn equivalent; crossknn compares "
        "whole metadata values (docs/filters.md)"
    )


def translate(spec: Any, where: str = "filter") -> dict[str, Any] | None:
    """``spec`` (a dict, a ``structured_query`` ``FilterDirective`` or None) as a crossknn
    filter; :class:`FilterTranslationError` for a construct that has none."""
    if spec is None:
        return None
    if callable(spec) and not isinstance(spec, Mapping):
        raise _refuse(where, "a callable filter", "Python code run per document")
    if isinstance(spec, Mapping):
        return _dict(spec, where)
    if hasattr(spec, "accept") and (hasattr(spec, "comparator") or hasattr(spec, "operator")):
        return _directive(spec, where)
    raise FilterTranslationError(
        f"LangChain filter {where}: expected a dict or a langchain_core.structured_query "
        f"Comparison/Operation; got {type(spec).__name__}"
    )


def _dict(spec: Mapping, where: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    extra: list[dict[str, Any]] = []  # field-level $not parts, and-ed with the rest
    for key, value in spec.items():
        at = f"{where}.{key}"
        if key in ("$and", "$or"):
            if not isinstance(value, list):
                out[key] = value  # crossknn's parser says what is wrong
            else:
                out[key] = [_dict(v, f"{at}[{i}]") if isinstance(v, Mapping) else v
                            for i, v in enumerate(value)]  # fmt: skip
        elif key == "$not":
            out[key] = _dict(value, at) if isinstance(value, Mapping) else value
        elif isinstance(key, str) and key.startswith("$"):
            if key in REFUSED:
                raise _refuse(at, key, REFUSED[key])
            out[key] = value  # unknown here: crossknn's parser names it
        elif isinstance(value, Mapping):
            cond, nots = _condition(key, value, at)
            if cond:
                out[key] = cond
            extra.extend(nots)
        else:
            out[key] = value
    if not extra:
        return out
    parts = ([out] if out else []) + extra
    return parts[0] if len(parts) == 1 else {"$and": parts}


def _condition(name: str, cond: Mapping, where: str) -> tuple[dict, list]:
    out: dict[str, Any] = {}
    nots: list[dict[str, Any]] = []
    for op, value in cond.items():
        at = f"{where}.{op}"
        if op in _SAME:
            out[op] = value
        elif op == "$between":
            if not isinstance(value, (list, tuple)) or len(value) != 2:
                raise FilterTranslationError(
                    f"LangChain filter {at}: expected [low, high]; got {value!r:.60}"
                )
            out["$gte"], out["$lte"] = value[0], value[1]
        elif op == "$not":
            inner = value if isinstance(value, Mapping) else {"$eq": value}
            sub, subnots = _condition(name, inner, at)
            nots.append({"$not": {name: sub} if not subnots else {"$and": [{name: sub}, *subnots]}})
        elif op in REFUSED:
            raise _refuse(at, op, REFUSED[op])
        else:
            out[op] = value  # unknown here: crossknn's parser names it
    return out, nots


def _directive(node: Any, where: str) -> dict[str, Any]:
    if hasattr(node, "comparator"):
        comp = getattr(node.comparator, "value", node.comparator)
        at = f"{where}.{node.attribute}"
        if comp in REFUSED:
            raise _refuse(at, f"Comparator.{str(comp).upper()}", REFUSED[comp])
        if comp not in _IR:
            raise FilterTranslationError(f"LangChain filter {at}: unknown comparator {comp!r}")
        value = node.value
        if comp in ("in", "nin") and not isinstance(value, (list, tuple)):
            value = [value]
        return {node.attribute: {_IR[comp]: list(value) if isinstance(value, tuple) else value}}
    op = getattr(node.operator, "value", node.operator)
    parts = [_directive(a, f"{where}.{op}[{i}]") for i, a in enumerate(node.arguments)]
    if op == "not":
        return {"$not": parts[0] if len(parts) == 1 else {"$and": parts}}
    if op not in ("and", "or"):
        raise FilterTranslationError(f"LangChain filter {where}: unknown operator {op!r}")
    return parts[0] if len(parts) == 1 else {f"${op}": parts}
