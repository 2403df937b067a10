"""Pseudo-queries cut from item texts: what a build without train queries calibrates the CE
score scale on and fills ``auto``'s rows with."""

from __future__ import annotations

import re

import numpy as np

from crossknn.corpus.pseudo_keywords import keyword_queries
from crossknn.data import Corpus

__all__ = ["PSEUDO_KINDS", "auto_pseudo_queries", "pseudo_queries"]

PSEUDO_KINDS = ("first", "sentence", "keywords")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def pseudo_queries(
    corpus: Corpus, n: int, *, seed: int = 0, words: int = 10, kind: str = "first"
) -> list[str]:
    """``n`` short pseudo-queries from random items (seeded), one per item.

    ``kind="first"``: the item's first ``words`` words (with a title, mostly the title);
    ``"sentence"``: one seeded random sentence of the item other than its first (the first when
    it has only one), clipped to ``words`` + 2 words; ``"keywords"``: one-word topic queries
    (:func:`crossknn.corpus.pseudo_keywords.keyword_queries`; fewer than ``n`` when the corpus
    runs out of distinct words). Used to calibrate the CE score scale and as the rows of
    ``auto``'s index when the user gives no train queries.
    """
    if kind not in PSEUDO_KINDS:
        raise ValueError(f"pseudo-query kind must be one of {PSEUDO_KINDS}; got {kind!r}")
    if kind == "keywords":
        return keyword_queries(corpus.texts, n, seed=seed)
    rng = np.random.default_rng(seed)
    picks = rng.choice(len(corpus), size=min(n, len(corpus)), replace=False)
    if kind == "first":
        return [" ".join(corpus.texts[i].split()[:words]) for i in sorted(picks.tolist())]
    out = []
    for i in sorted(picks.tolist()):
        sents = [t for t in _SENTENCE_END.split(corpus.texts[i]) if t.split()]
        pick = sents[1 + int(rng.integers(len(sents) - 1))] if len(sents) > 1 else sents[0]
        out.append(" ".join(pick.split()[: words + 2]))
    return out


def auto_pseudo_queries(corpus: Corpus, n: int, *, seed: int = 0) -> list[str]:
    """The pseudo-queries of ``auto``'s rows when no train queries are given: ``n`` keyword
    queries, filled up with first-words queries when the corpus has fewer distinct keywords (on
    NFCorpus 167 keyword rows were within 0.019 of dense ADACUR, title rows within 0.033;
    docs/search.md)."""
    qs = pseudo_queries(corpus, n, seed=seed, kind="keywords")
    if len(qs) < n:
        seen = set(qs)
        qs += [q for q in pseudo_queries(corpus, n, seed=seed) if q not in seen][: n - len(qs)]
    return qs
