"""Pseudo-queries cut from item texts: what a build without train queries fills ``auto``'s rows
with (and calibrates the CE score scale on when it reads no row)."""

from __future__ import annotations

import re

import numpy as np

from crossknn.corpus.pseudo_keywords import keyword_queries
from crossknn.data import Corpus

__all__ = ["PSEUDO_KINDS", "SPAN_WORDS", "auto_pseudo_queries", "pseudo_queries"]

PSEUDO_KINDS = ("first", "sentence", "keywords", "spans", "mix", "passage")
# the lengths of the "spans" kind, in turn: from a topic of two words to a claim or a question
SPAN_WORDS = (2, 3, 4, 6, 8, 12, 16)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def _sentences(text: str) -> list[str]:
    return [t for t in _SENTENCE_END.split(text) if t.split()] or [text]


def pseudo_queries(
    corpus: Corpus, n: int, *, seed: int = 0, words: int = 10, kind: str = "first"
) -> list[str]:
    """``n`` short pseudo-queries from random items (seeded), one per item.

    ``kind="first"``: the item's first ``words`` words (with a title, mostly the title);
    ``"sentence"``: one seeded random sentence of the item other than its first (the first when
    it has only one), clipped to ``words`` + 2 words; ``"keywords"``: one-word topic queries
    (:func:`crossknn.corpus.pseudo_keywords.keyword_queries`; fewer than ``n`` when the corpus
    runs out of distinct words); ``"spans"``: the opening words of a seeded random sentence of
    the item, :data:`SPAN_WORDS` long in turn (2 to 16 words: topics, titles, claims);
    ``"mix"``: a third each of keywords, first words and sentences, interleaved; ``"passage"``:
    ``words`` words of the item from the start of a seeded random sentence on (into the next
    sentences; fewer where the item ends first), a query as long as the examples. Distinct
    queries only (fewer than ``n`` when the corpus gives fewer).
    """
    if kind not in PSEUDO_KINDS:
        raise ValueError(f"pseudo-query kind must be one of {PSEUDO_KINDS}; got {kind!r}")
    if kind == "keywords":
        return keyword_queries(corpus.texts, n, seed=seed)
    if kind == "mix":
        parts = [
            auto_pseudo_queries(corpus, -(-n // 3), seed=seed, kind="keywords"),
            pseudo_queries(corpus, -(-n // 3), seed=seed, words=words),
            pseudo_queries(corpus, -(-n // 3), seed=seed, words=words, kind="sentence"),
        ]
        return list(dict.fromkeys(q for trio in zip(*parts, strict=False) for q in trio))[:n]
    if kind == "passage":
        rng = np.random.default_rng([int(seed), 77])
        picks = rng.choice(len(corpus), size=min(n, len(corpus)), replace=False)
        out = []
        for i in sorted(picks.tolist()):
            sents = [t.split() for t in _sentences(corpus.texts[i])]
            left = np.cumsum([len(t) for t in sents][::-1])[::-1]  # words from each sentence on
            starts = np.flatnonzero(left >= words)  # those that fill a passage, else the first
            start = int(starts[rng.integers(starts.size)]) if starts.size else 0
            out.append(" ".join([w for t in sents[start:] for w in t][:words]))
        return list(dict.fromkeys(out))
    if kind == "spans":
        rng = np.random.default_rng([int(seed), 55])
        picks = rng.choice(len(corpus), size=min(n, len(corpus)), replace=False)
        out = []
        for j, i in enumerate(picks.tolist()):
            sents = _sentences(corpus.texts[i])
            pick = sents[int(rng.integers(len(sents)))].split()
            out.append(" ".join(pick[: SPAN_WORDS[j % len(SPAN_WORDS)]]))
        return list(dict.fromkeys(out))
    rng = np.random.default_rng(seed)
    picks = rng.choice(len(corpus), size=min(n, len(corpus)), replace=False)
    if kind == "first":
        return [" ".join(corpus.texts[i].split()[:words]) for i in sorted(picks.tolist())]
    out = []
    for i in sorted(picks.tolist()):
        sents = _sentences(corpus.texts[i])
        pick = sents[1 + int(rng.integers(len(sents) - 1))] if len(sents) > 1 else sents[0]
        out.append(" ".join(pick.split()[: words + 2]))
    return out


def auto_pseudo_queries(
    corpus: Corpus, n: int, *, seed: int = 0, kind: str = "keywords", words: int = 10
) -> list[str]:
    """The pseudo-queries of ``auto``'s rows when no train queries are given: ``n`` queries of
    ``kind`` (:func:`pseudo_queries`), filled up with first-words queries when the corpus gives
    fewer (keywords: fewer distinct words than ``n``)."""
    qs = pseudo_queries(corpus, n, seed=seed, kind=kind, words=words)
    if len(qs) < n:
        seen = set(qs)
        qs += [q for q in pseudo_queries(corpus, n, seed=seed) if q not in seen][: n - len(qs)]
    return qs
