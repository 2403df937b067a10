"""``crossknn refine INDEX_DIR --queries LOG``: re-fit auto's index on the logged queries."""

from __future__ import annotations

import argparse

from crossknn.commands._common import add_model_arguments, add_shared, index_models
from crossknn.commands._numbers import nonneg_float, nonneg_int
from crossknn.commands._printing import plural
from crossknn.corpus.refine import refine_index
from crossknn.corpus_folder import open_index

HELP = "re-fit an index's auto rows on the queries a service answered (a --log-queries log)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_shared(p, "index_dir")
    p.add_argument(
        "--queries",
        required=True,
        metavar="LOG",
        help="query log written by 'crossknn serve/search --log-queries LOG'",
    )
    b = p.add_mutually_exclusive_group()
    b.add_argument(
        "--index-calls",
        type=nonneg_int,
        metavar="C",
        help="CE entries the new rows may read (default: the budget the index was built with)",
    )
    b.add_argument(
        "--index-minutes",
        type=nonneg_float,
        metavar="MIN",
        help="spend about MIN minutes of CE time (speed measured on a small batch)",
    )
    add_shared(p, "seed", "quiet")
    add_model_arguments(p, precision_default=None)


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
