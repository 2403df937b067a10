"""Keyword pseudo-queries: short topic queries (one word) made from the corpus itself.

Real search queries are often a topic, not a sentence (NFCorpus's queries have a median of two
words: "melatonin", "thyroid health"), and a topic is relevant to many items, so its CE row
spreads over a group of items instead of peaking on the one item a title was taken from. Each
keyword query here is the word of a seeded random item's opening (mostly its title) with the
largest TF-IDF weight in the whole item (TF-IDF fitted on the items; alphabetic words of three
letters or more, English stop words out), among words that occur in at least ``min_df`` items (a
topic shared by several items) and at most ``max_df`` of them (not a generic word); each word is
used once, so the queries are distinct. An item whose opening has no such word gives no query and
the next seeded item is tried.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["keyword_queries"]

OPENING_WORDS = 12  # the part of an item a keyword is taken from (mostly its title)


def keyword_queries(
    texts: Sequence[str],
    n: int,
    *,
    seed: int = 0,
    min_df: int = 2,
    max_df: float = 0.05,
    opening_words: int = OPENING_WORDS,
) -> list[str]:
    """``n`` distinct one-word keyword queries (fewer only when the corpus runs out of terms)."""
    # scikit-learn: slow to import, only the keyword pseudo-queries need it
    from sklearn.feature_extraction.text import TfidfVectorizer

    texts = [str(t) for t in texts]
    if n < 0:
        raise ValueError(f"need n >= 0 keyword queries; got {n}")
    if not texts or n == 0:
        return []
    # the df bounds need a corpus of a few items; a tiny one keeps every term
    # (max_df as a count of at least min_df items, so that a corpus of a few dozen items keeps
    # its words shared by min_df items)
    lo, hi = (min_df, max(int(max_df * len(texts)), min_df)) if len(texts) >= 20 else (1, 1.0)
    vec = TfidfVectorizer(
        token_pattern=r"(?u)\b[^\W\d_]{3,}\b",
        stop_words="english",
        min_df=lo,
        max_df=hi,
        sublinear_tf=True,
    )
    try:
        W = vec.fit_transform(texts).tocsr()
    except ValueError:  # no word survives the bounds (a corpus of stop words)
        return []
    vocab = vec.vocabulary_
    analyze = vec.build_analyzer()
    rng = np.random.default_rng([int(seed), 4242])
    used: set[str] = set()
    out: list[str] = []
    for i in rng.permutation(len(texts)).tolist():
        if len(out) == n:
            break
        opening = " ".join(texts[i].split()[:opening_words])
        terms = [t for t in dict.fromkeys(analyze(opening)) if t in vocab and t not in used]
        if not terms:
            continue
        # the word the item weighs most (TF-IDF over the whole item); ties to the earlier one
        row = W.getrow(i)
        weight = dict(zip(row.indices.tolist(), row.data.tolist(), strict=True))
        best = max(terms, key=lambda t: (weight.get(vocab[t], 0.0), -terms.index(t)))
        used.add(best)
        out.append(best)
    return out
