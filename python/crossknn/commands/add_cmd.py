"""``crossknn add INDEX_DIR ITEMS.jsonl``: add items to an index without a rebuild."""

from __future__ import annotations

import argparse

from crossknn.commands._common import index_models
from crossknn.commands._printing import plural
from crossknn.corpus.edit import add_items
from crossknn.corpus_folder import open_index
from crossknn.data import load_corpus


def run(args: argparse.Namespace) -> int:
    items = load_corpus(args.items)
    index = open_index(args.index_dir)
    ce, de = index_models(args, index)
    r = add_items(args.index_dir, items, ce=ce, de=de, progress=not args.quiet)
    if r["already"]:
        print(f"index {args.index_dir}: these items were added already (version {r['version']})")
        return 0
    print(
        f"index {args.index_dir}: version {r['version']}: {plural(r['added'], 'item')} added, "
        f"{r['ce_calls']:,} CE calls, {r['seconds']:.1f} s"
    )
    return 0
