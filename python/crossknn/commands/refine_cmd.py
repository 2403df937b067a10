"""``crossknn refine INDEX_DIR --queries LOG``: re-fit auto's index on the logged queries."""

from __future__ import annotations

import argparse

from crossknn.commands._common import index_models
from crossknn.commands._printing import plural
from crossknn.corpus.refine import refine_index
from crossknn.corpus_folder import open_index


def run(args: argparse.Namespace) -> int:
    index = open_index(args.index_dir)
    ce, de = index_models(args, index)
    r = refine_index(
        args.index_dir,
        args.queries,
        ce=ce,
        de=de,
        index_calls=args.index_calls,
        index_minutes=args.index_minutes,
        seed=args.seed,
        progress=not args.quiet,
        quiet=args.quiet,
    )
    if r.already:
        print(f"index {args.index_dir}: already refined on this log (version {r.version})")
        return 0
    logged = plural(r.logged_queries, "distinct query", "distinct queries")
    print(
        f"index {args.index_dir}: version {r.previous} -> {r.version}: "
        f"{plural(r.rows, 'auto row')} ({r.real_rows} of logged queries, {logged} in the log), "
        f"{r.index_calls:,} entries read, {r.ce_calls:,} CE calls ({r.log_entries_used:,} "
        f"entries from the log), {r.seconds:.1f} s"
    )
    return 0
