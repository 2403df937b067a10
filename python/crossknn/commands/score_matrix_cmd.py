"""``crossknn score-matrix DATASET_DIR OUT_DIR``: exact CE scores of chosen queries x all items.

Writes the score-matrix format of docs/data.md: scores.npy, query_ids.json,
item_ids.json, splits.json, de_queries.npy, de_items.npy, meta.json. The CE work runs as a
resumable sharded job in ``OUT_DIR/.job`` (rerun the same command to resume; ``--ray`` to run the
shards on a Ray cluster); the matrix files are written when every shard is done.
"""

from __future__ import annotations

import argparse

from crossknn.commands._common import forward, job_options, model_choice
from crossknn.score_matrix_job import build_score_matrix


def run(args: argparse.Namespace) -> int:
    stats = build_score_matrix(
        args.dataset_dir,
        args.out_dir,
        **forward(args, "split", "n_queries", "query_ids", "n_items", "n_test", "seed", "threads"),
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
