"""Haystack 2's filters in crossknn's filter language (:mod:`crossknn.filters`).

A Haystack filter is a comparison ``{"field": "meta.lang", "operator": "==", "value": "en"}`` or
a logic node ``{"operator": "AND" | "OR" | "NOT", "conditions": [...]}``:

=======================================  ==========================================
Haystack                                 crossknn
=======================================  ==========================================
``"field": "meta.lang"`` (``"lang"``)    the metadata field ``lang``
``"field": "meta.a.b"``                  the field ``a.b`` (nested objects, flattened)
``"field": "id"``                        the item ids
``==`` ``!=``                            ``$eq`` ``$ne``
``==`` / ``!=`` with ``None``            ``{"$exists": false}`` / ``{"$exists": true}``
``>`` ``>=`` ``<`` ``<=``                ``$gt`` ``$gte`` ``$lt`` ``$lte``
``in`` ``not in``                        ``$in`` ``$nin``
``AND`` ``OR``                           ``$and`` ``$or``
``NOT`` (not all of the conditions)      ``{"$not": {"$and": [...]}}``
=======================================  ==========================================

A ``datetime`` value is sent as its ISO 8601 form. Refused, in one line: the fields ``content``,
``embedding``, ``sparse_embedding``, ``blob`` and ``score`` (crossknn filters the items' metadata
and ids, never their text or vectors), a range against ``None``, and unknown operators.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Mapping
from typing import Any

from crossknn.integrations.filter_operators import SYMBOLS

__all__ = ["COMPARISONS", "FilterTranslationError", "translate"]

COMPARISONS = {**SYMBOLS, "not in": "$nin"}
DOCUMENT_FIELDS = ("content", "embedding", "sparse_embedding", "blob", "score")


class FilterTranslationError(ValueError):
    """A Haystack filter construct with no equivalent in crossknn's filter language."""


def translate(filters: Mapping[str, Any] | None, where: str = "filters") -> dict[str, Any] | None:
    """``filters`` (Haystack's syntax, or None / empty) as a crossknn filter;
    :class:`FilterTranslationError` for a construct with no equivalent."""
    if not filters:
        return None
    if not isinstance(filters, Mapping):
        raise FilterTranslationError(
            f"Haystack filter {where}: expected a dict; got {type(filters).__name__}"
        )
    if "field" in filters:
        return _comparison(filters, where)
    op = filters.get("operator")
    conds = filters.get("conditions")
    if op not in ("AND", "OR", "NOT") or not isinstance(conds, list):
        raise FilterTranslationError(
            f"Haystack filter {where}: expected a comparison {{field, operator, value}} or "
            f"{{operator: AND/OR/NOT, conditions: [...]}}; got operator {op!r}"
        )
    if not conds:
        raise FilterTranslationError(f"Haystack filter {where}: {op} of no conditions")
    parts = [translate(c, f"{where}.conditions[{i}]") for i, c in enumerate(conds)]
    joined = parts[0] if len(parts) == 1 else {"$or" if op == "OR" else "$and": parts}
    return {"$not": joined} if op == "NOT" else joined


def _comparison(cond: Mapping[str, Any], where: str) -> dict[str, Any]:
    field, op = cond.get("field"), cond.get("operator")
    if "value" not in cond or op is None:
        raise FilterTranslationError(
            f"Haystack filter {where}: a comparison needs field, operator and value; got "
            f"{sorted(cond)}"
        )
    value = cond["value"]
    at = f"{where}[{field}]"
    if not isinstance(field, str) or not field:
        raise FilterTranslationError(f"Haystack filter {where}: field must be a non-empty string")
    if field.startswith("meta."):
        name = field[len("meta.") :]
    elif field in DOCUMENT_FIELDS:
        raise FilterTranslationError(
            f"Haystack filter {at}: the Document field {field!r} has no crossknn equivalent; "
            "crossknn filters the items' metadata (meta.*) and ids (id)"
        )
    else:
        name = field  # "id", or a legacy field name without "meta."
    if op not in COMPARISONS:
        raise FilterTranslationError(
            f"Haystack filter {at}: unknown operator {op!r}; expected one of "
            f"{', '.join(COMPARISONS)}"
        )
    if value is None:
        if op in ("==", "!="):
            return {name: {"$exists": op == "!="}}
        raise FilterTranslationError(
            f"Haystack filter {at}: {op} None has no crossknn equivalent (a range needs a value)"
        )
    if op in ("in", "not in"):
        if not isinstance(value, (list, tuple)):
            raise FilterTranslationError(
                f"Haystack filter {at}: {op!r} needs a list; got {type(value).__name__}"
            )
        return {name: {COMPARISONS[op]: [_plain(v) for v in value]}}
    return {name: {COMPARISONS[op]: _plain(value)}}


def _plain(v: Any) -> Any:
    return v.isoformat() if isinstance(v, (_dt.datetime, _dt.date)) else v
