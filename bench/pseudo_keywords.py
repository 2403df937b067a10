"""Keyword pseudo-queries of a corpus as a query file (issue 29, item 2: the next generator).

Writes ``--n`` one-word topic queries (``crossknn.index.pseudo_keywords.keyword_queries``: the
word of a seeded random item's opening that the item weighs most by TF-IDF, shared by a few
items) as JSONL (``_id``, ``text``), the input of ``bench/pseudo_rows.py``::

    python bench/pseudo_keywords.py --corpus ../shared/data/nfcorpus \\
        --item-ids ../shared/matrices/nfcorpus-minilm-gpu/item_ids.json \\
        --n 334 --out .gpu-data/pseudo_keywords.jsonl

The item order (``--item-ids``) only matters for the seeded choice of items, so the file is the
same wherever the corpus lies.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from crossknn.index.pseudo_keywords import keyword_queries


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", required=True, type=Path, help="BEIR folder or corpus.jsonl")
    ap.add_argument("--item-ids", type=Path, help="JSON list: the item order (default corpus)")
    ap.add_argument("--n", type=int, required=True, help="number of queries")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True, type=Path, help="JSONL to write")
    args = ap.parse_args(argv)
    from crossknn.data import load_corpus

    c = load_corpus(args.corpus)
    texts = list(c.texts)
    if args.item_ids is not None:
        pos = {i: n for n, i in enumerate(c.ids)}
        ids = json.loads(args.item_ids.read_text())
        missing = [i for i in ids if i not in pos]
        if missing:
            raise KeyError(f"{len(missing)} of --item-ids are not in the corpus: {missing[0]!r}")
        texts = [c.texts[pos[i]] for i in ids]
    qs = keyword_queries(texts, args.n, seed=args.seed)
    if len(qs) < args.n:
        print(f"only {len(qs)} distinct keywords in this corpus", file=sys.stderr)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        for j, q in enumerate(qs):
            f.write(json.dumps({"_id": f"pseudo-keywords-{j}", "text": q}) + "\n")
    print(f"{len(qs)} keyword queries -> {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
