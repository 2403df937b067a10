"""``crossknn refine INDEX_DIR --queries LOG``: re-fit auto's index on the logged queries."""

from __future__ import annotations

import argparse
import sys

from crossknn.ce.folders import open_index_models
from crossknn.commands._common import (
    add_model_arguments,
    model_options,
    nonneg_float,
    nonneg_int,
    plural,
    provider_line,
    terminal_safe,
)
from crossknn.corpus.refine import refine_index
from crossknn.corpus_folder import open_index

HELP = "re-fit an index's auto rows on the queries a service answered (a --log-queries log)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("index_dir", help="index directory from 'crossknn build'")
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
    p.add_argument("--seed", type=nonneg_int, default=0)
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    add_model_arguments(p, precision_default=None)


def run(args: argparse.Namespace) -> int:
    index = open_index(args.index_dir)
    ce, de = open_index_models(
        index,
        model=args.model,
        de_model=args.de_model,
        precision=args.precision,
        de_precision=args.de_precision,
        **model_options(args),
    )
    if not args.quiet:
        print(terminal_safe(provider_line(ce, de)), file=sys.stderr)
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
