"""Griffe extension for the Python reference: instance attributes without a docstring left out.

mkdocstrings lists every ``self.NAME = ...`` of a class as an attribute, with the line that
sets it (``V = np.ascontiguousarray(...)``): implementation, not API. Attributes a class
documents (a docstring below the assignment) and class attributes (dataclass fields, constants)
stay.
"""

from __future__ import annotations

from typing import Any

import griffe


class UndocumentedInstanceAttributes(griffe.Extension):
    """Drops a class's undocumented instance attributes once its members are known."""

    def on_class_members(self, *, cls: griffe.Class, **kwargs: Any) -> None:
        for name, member in list(cls.members.items()):
            if member.is_alias or not member.is_attribute:
                continue
            if "instance-attribute" in member.labels and not member.docstring:
                cls.del_member(name)
