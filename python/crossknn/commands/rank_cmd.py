"""``crossknn rank "query" --corpus FILE.jsonl``: CE-score a whole corpus, print the top k."""

from __future__ import annotations

import argparse
import json
import sys

from crossknn.ce.folders import open_cross_encoder
from crossknn.commands._common import model_options
from crossknn.commands._printing import say_fidelity, terminal_safe
from crossknn.data import load_corpus


def run(args: argparse.Namespace) -> int:
    if not args.query.strip():
        raise ValueError("the query is empty")
    corpus = load_corpus(args.corpus)
    precision = "int8" if args.int8 else args.precision
    try:
        ce = open_cross_encoder(
            args.model,
            precision=precision,
            show_progress_bar=args.progress,
            **model_options(args),
        )
    except ImportError as exc:  # the embedded model cannot be built without the export extra
        print(f"crossknn rank: error: {terminal_safe(exc)}", file=sys.stderr)
        return 2
    say_fidelity(args, ce)
    hits = ce.rank(args.query, corpus.texts, top_k=min(args.top_k, len(corpus)), doc_ids=corpus.ids)
    rows = [
        {
            "rank": r + 1,
            "id": h["id"],
            "score": h["score"],
            "text": corpus.texts[h["corpus_id"]],
        }
        for r, h in enumerate(hits)
    ]
    if args.json:
        out = {
            "query": args.query,
            "model_id": ce.model_id,
            "model_hash": ce.model_hash,
            "precision": ce.precision,
            "provider": ce.provider,
            "n_items": len(corpus),
            "results": rows,
        }
        json.dump(out, sys.stdout, indent=1)
        sys.stdout.write("\n")
        return 0
    print(
        terminal_safe(
            f"# {ce.model_id} ({ce.precision}, {ce.provider}); {len(corpus)} items scored"
        )
    )
    ids = [terminal_safe(r["id"]) for r in rows]
    width = max(map(len, ids)) if rows else 2
    for r, rid in zip(rows, ids, strict=True):
        text = " ".join(r["text"].split())
        text = text if len(text) <= 80 else text[:77] + "..."
        print(f"{r['rank']:>3}  {r['score']:+.4f}  {rid:<{width}}  {terminal_safe(text)}")
    return 0
