"""The comparison operators the framework filter languages write as symbols (``==``, ``>=``,
``in`` ...), with crossknn's name for each (:mod:`crossknn.filters`): the part of their operator
tables that :mod:`~crossknn.integrations.haystack_filters` and
:mod:`~crossknn.integrations.llamaindex_filters` share."""

from __future__ import annotations

__all__ = ["SYMBOLS"]

SYMBOLS = {
    "==": "$eq",
    "!=": "$ne",
    ">": "$gt",
    ">=": "$gte",
    "<": "$lt",
    "<=": "$lte",
    "in": "$in",
}
