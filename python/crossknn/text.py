"""What counts as an empty text: one rule for queries (``/search``, ``/rerank``) and items
(``crossknn add``).

A text is blank when it holds nothing but whitespace and characters that carry no word of their
own: controls (NUL...), format characters (zero-width spaces and joiners, U+FEFF, bidi marks),
separators, unassigned and private-use code points, and combining marks with no letter to sit on
(U+0301 COMBINING ACUTE ACCENT, U+034F COMBINING GRAPHEME JOINER, the variation selectors
U+FE0F..., a Thai vowel sign U+0E31 alone). The models see such a text as an empty one: every
score of it is the same, and a logged query of it would feed ``refine`` a row of nothing.
"""

from __future__ import annotations

import unicodedata

__all__ = ["BLANK_CATEGORIES", "is_blank"]

# Unicode general categories that are no word: controls, format characters, separators,
# unassigned, private use, and the marks (nonspacing, spacing combining, enclosing)
BLANK_CATEGORIES = frozenset(("Cc", "Cf", "Zs", "Zl", "Zp", "Cn", "Co", "Mn", "Mc", "Me"))


def is_blank(text: str) -> bool:
    """True when ``text`` holds nothing but whitespace, invisible characters and combining marks
    (``"\\u200b"``, ``"\\u0000"``, NBSP, ``"\\u0301"``, ``"\\ufe0f"``...): an empty text."""
    return all(c.isspace() or unicodedata.category(c) in BLANK_CATEGORIES for c in text)
