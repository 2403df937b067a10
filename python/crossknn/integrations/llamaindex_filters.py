"""LlamaIndex's ``MetadataFilters`` in crossknn's filter language (:mod:`crossknn.filters`).

One operator table, as ``llama-index-vector-stores-qdrant`` has one:

====================================  ===============================================
``FilterOperator``                    crossknn
====================================  ===============================================
``EQ`` ``NE`` ``GT`` ``GTE``          ``$eq`` ``$ne`` ``$gt`` ``$gte``
``LT`` ``LTE``                        ``$lt`` ``$lte``
``IN`` ``NIN``                        ``$in`` ``$nin``
``ANY`` (a list field holds any of)   ``$in``
``ALL`` (it holds all of)             ``$and`` of one equality per value
``CONTAINS`` (a list field holds it)  an equality on the list field
``IS_EMPTY`` (no value)               ``{"$exists": false}``
``TEXT_MATCH``, ``TEXT_MATCH_...``    refused: substring matching
====================================  ===============================================

``FilterCondition.AND`` / ``OR`` are ``$and`` / ``$or``; ``NOT`` is LlamaIndex's "none of the
filters match": ``{"$not": {"$or": [...]}}``. ``MetadataFilters`` nest. With the index's field
kinds known (``fields``), ``CONTAINS`` on a string field (a substring test there) and
``IS_EMPTY`` on a list field (crossknn keeps an empty list as a value) are refused too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from crossknn.integrations.filter_operators import SYMBOLS

__all__ = ["FilterTranslationError", "OPERATORS", "translate"]

OPERATORS = {**SYMBOLS, "nin": "$nin", "any": "$in"}
REFUSED = {"text_match": "substring matching", "text_match_insensitive": "substring matching"}


class FilterTranslationError(ValueError):
    """A LlamaIndex filter construct with no equivalent in crossknn's filter language."""


def _refuse(where: str, what: str, why: str) -> FilterTranslationError:
    return FilterTranslationError(
        f"LlamaIndex filter {where}: {what} ({why}) has no crossknn equivalent; crossknn compares "
        "whole metadata values (docs/filters.md)"
    )


def _value(x: Any) -> str:
    return str(getattr(x, "value", x))


def translate(
    filters: Any, fields: Mapping[str, str] | None = None, where: str = "filters"
) -> dict[str, Any] | None:
    """``filters`` (``MetadataFilters``, a single ``MetadataFilter`` or None) as a crossknn
    filter; None when it holds no filter. :class:`FilterTranslationError` for a construct with
    no equivalent."""
    if filters is None:
        return None
    if hasattr(filters, "filters"):
        parts = [
            p
            for i, f in enumerate(filters.filters)
            if (p := translate(f, fields, f"{where}[{i}]")) is not None
        ]
        if not parts:
            return None
        cond = _value(filters.condition or "and").lower()
        if cond == "not":
            return {"$not": parts[0] if len(parts) == 1 else {"$or": parts}}
        if cond not in ("and", "or"):
            raise FilterTranslationError(f"LlamaIndex filter {where}: unknown condition {cond!r}")
        return parts[0] if len(parts) == 1 else {f"${cond}": parts}
    if not hasattr(filters, "key"):
        raise FilterTranslationError(
            f"LlamaIndex filter {where}: expected MetadataFilters or MetadataFilter; got "
            f"{type(filters).__name__}"
        )
    return _one(
        filters.key, _value(filters.operator), filters.value, fields, f"{where}.{filters.key}"
    )


def _one(key: str, op: str, value: Any, fields, where: str) -> dict[str, Any]:
    kind = (fields or {}).get(key)
    if op in REFUSED:
        raise _refuse(where, f"FilterOperator.{op.upper()}", REFUSED[op])
    if op in ("in", "nin", "any"):
        vals = list(value) if isinstance(value, (list, tuple)) else [value]
        return {key: {OPERATORS[op]: vals}}
    if op in OPERATORS:
        return {key: {OPERATORS[op]: value}}
    if op == "all":
        vals = list(value) if isinstance(value, (list, tuple)) else [value]
        if not vals:
            raise FilterTranslationError(f"LlamaIndex filter {where}: ALL of an empty list")
        parts = [{key: v} for v in vals]
        return parts[0] if len(parts) == 1 else {"$and": parts}
    if op == "contains":
        if kind == "string":
            raise _refuse(where, "FilterOperator.CONTAINS on a string field", "substring matching")
        return {key: value}
    if op == "is_empty":
        if kind == "strings":
            raise _refuse(
                where,
                "FilterOperator.IS_EMPTY on a list field",
                "an empty list is a value in crossknn",
            )
        return {key: {"$exists": False}}
    raise FilterTranslationError(f"LlamaIndex filter {where}: unknown operator {op!r}")
