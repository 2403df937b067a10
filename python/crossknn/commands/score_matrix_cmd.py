"""``crossknn score-matrix DATASET_DIR OUT_DIR``: exact CE scores of chosen queries x all items.

Writes the score-matrix format of docs/data.md: scores.npy, query_ids.json,
item_ids.json, splits.json, de_queries.npy, de_items.npy, meta.json. The CE work runs as a
resumable sharded job in ``OUT_DIR/.job`` (rerun the same command to resume; ``--ray`` to run the
shards on a Ray cluster); the matrix files are written when every shard is done.
"""

from __future__ import annotations

import argparse

from crossknn.commands._common import (
    add_job_arguments,
    add_model_arguments,
    job_options,
    model_choice,
)
from crossknn.commands._numbers import nonneg_int, positive_int
from crossknn.score_matrix_job import build_score_matrix

HELP = "exact CE score matrix of a BEIR folder's queries x items (docs/data.md), resumable"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "dataset_dir",
        metavar="DATASET_DIR",
        help="BEIR folder (corpus.jsonl, queries.jsonl, qrels/)",
    )
    p.add_argument("out_dir", metavar="OUT_DIR", help="output folder (created; resumable)")
    sel = p.add_argument_group("query selection (default: all queries, in file order)")
    sel.add_argument("--split", help="only queries that appear in qrels/SPLIT.tsv")
    sel.add_argument(
        "--n-queries",
        type=positive_int,
        help="a seeded random sample of N queries (kept in file order)",
    )
    sel.add_argument("--query-ids", help="comma-separated query ids (in this order)")
    sel.add_argument(
        "--n-items",
        type=positive_int,
        help="only the first N items of the corpus (a quick check; default all)",
    )
    p.add_argument(
        "--n-test",
        type=positive_int,
        default=50,
        help="rows in the test split of splits.json (default 50, at most half the rows)",
    )
    p.add_argument(
        "--seed",
        type=nonneg_int,
        default=0,
        help="seed of the query sample and the split (default 0)",
    )
    add_model_arguments(p, backend=False, batch_tokens=False)  # the job's scorers: ONNX Runtime
    p.add_argument("--no-de", action="store_true", help="skip the DE vectors")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace a finished matrix of other inputs in OUT_DIR (refused otherwise)",
    )
    add_job_arguments(p)


def run(args: argparse.Namespace) -> int:
    stats = build_score_matrix(
        args.dataset_dir,
        args.out_dir,
        split=args.split,
        n_queries=args.n_queries,
        query_ids=args.query_ids,
        n_items=args.n_items,
        n_test=args.n_test,
        seed=args.seed,
        threads=args.threads,
        batch_size=args.batch_size or 16,
        provider=args.provider,
        **model_choice(args),
        de=not args.no_de,
        options=job_options(args),
        overwrite=args.overwrite,
    )
    if not args.quiet:
        print(
            f"wrote {args.out_dir}: {stats['n_queries']} queries x {stats['n_items']} items "
            f"({stats['pairs']} pairs scored now, {stats['pairs_per_s']:.1f} pairs/s)"
        )
    return 0
