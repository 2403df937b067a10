"""``crossknn build CORPUS INDEX_DIR``: index a user's corpus for ``crossknn search``."""

from __future__ import annotations

import argparse
import time

HELP = "index a corpus (JSONL with id/text, or a BEIR folder) for crossknn search"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("corpus", help="JSONL file (id or _id, text, optional title) or a BEIR folder")
    p.add_argument("index_dir", help="output index directory (resumed if interrupted)")
    p.add_argument(
        "--train-queries",
        metavar="FILE",
        help="train queries: a text file (one per line) or a JSONL file with 'text'; "
        "used to calibrate CE scores, and with --cur to build CUR rows",
    )
    p.add_argument(
        "--cur",
        action="store_true",
        help="also score train queries x all items (dense CUR rows R) for "
        "adacur/anncur; costs len(train queries) x len(corpus) CE calls",
    )
    p.add_argument(
        "--calibration-queries",
        type=int,
        default=16,
        metavar="N",
        help="pseudo-queries for the CE score calibration when no train queries are "
        "given (default 16)",
    )
    p.add_argument(
        "--calibration-items",
        type=int,
        default=32,
        metavar="M",
        help="items scored per calibration query (default 32)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def run(args: argparse.Namespace) -> int:
    from crossknn.corpus_index import build_corpus_index
    from crossknn.data import load_corpus, read_queries

    t0 = time.perf_counter()
    corpus = load_corpus(args.corpus)
    train = read_queries(args.train_queries) if args.train_queries else None
    idx = build_corpus_index(
        corpus,
        args.index_dir,
        train_queries=train,
        cur=args.cur,
        calibration_queries=args.calibration_queries,
        calibration_items=args.calibration_items,
        seed=args.seed,
        progress=not args.quiet,
    )
    print(
        f"index {idx.path}: {len(corpus)} items, arrays {sorted(idx.arrays)}, "
        f"{idx.ce_calls} CE calls spent, {time.perf_counter() - t0:.1f} s"
    )
    return 0
