"""``crossknn search INDEX_DIR "query"``: the CE's top-k on a budget of CE calls."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from crossknn.commands._common import nonneg_int, positive_int, print_hits
from crossknn.searcher import METHODS

HELP = "search an index built by 'crossknn build' with the cross-encoder on a budget"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("index_dir", help="index directory from 'crossknn build'")
    p.add_argument("query", nargs="*", help="query text(s); or use --queries")
    p.add_argument(
        "--queries",
        metavar="FILE",
        help="read queries from FILE (text lines or JSONL with 'text'); '-' = stdin",
    )
    p.add_argument(
        "-k", "--k", type=positive_int, default=10, help="results per query (default 10)"
    )
    p.add_argument(
        "--budget", type=positive_int, default=100, help="CE calls per query (default 100)"
    )
    p.add_argument(
        "--method",
        choices=METHODS,
        help="search method (default: auto when the index was built with --index-calls, else axn)",
    )
    p.add_argument(
        "--rounds", type=positive_int, default=5, help="rounds of adaptive methods (default 5)"
    )
    p.add_argument("--seed", type=nonneg_int, default=0)
    p.add_argument(
        "--exact",
        action="store_true",
        help="also score every item with the CE and report Top-k-Recall@budget",
    )
    p.add_argument(
        "--precision",
        choices=("fp32", "int8"),
        default="fp32",
        help="CE/DE precision (an index is tied to the model it was built with)",
    )
    p.add_argument(
        "--cmc-model",
        metavar="DIR",
        help="a CMC model (crossknn cmc export) to rerank the DE candidates of the first round",
    )
    p.add_argument(
        "--cmc-candidates",
        type=positive_int,
        default=512,
        metavar="K",
        help="DE candidates CMC reranks (default 512)",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


def run(args: argparse.Namespace) -> int:
    from crossknn.data import read_queries
    from crossknn.searcher import Searcher

    queries = list(args.query)
    if args.queries:
        queries += read_queries(args.queries)
    if not queries:
        raise ValueError("no query given: pass query text(s) or --queries FILE ('-' = stdin)")
    searcher = Searcher(
        args.index_dir,
        method=args.method,
        rounds=args.rounds,
        precision=args.precision,
        cmc_model=args.cmc_model,
        cmc_candidates=args.cmc_candidates,
    )
    # exact CE rows are kept under INDEX_DIR/exact (keyed by query, items and CE hash)
    hits = searcher.search(
        queries,
        k=args.k,
        budget=args.budget,
        seed=args.seed,
        exact=args.exact,
        exact_cache=Path(args.index_dir) / "exact",
        progress=args.exact and not args.json,
    )
    if args.json:
        json.dump(
            {
                "method": searcher.method,
                "k": args.k,
                "budget": args.budget,
                "hits": [h.to_dict() for h in hits],
            },
            sys.stdout,
            indent=2,
        )
        print()
    else:
        print_hits(hits)
        if args.exact:
            mean = sum(h.recall for h in hits) / len(hits)
            print(f"\nmean Top-{args.k}-Recall@{args.budget}: {mean:.3f} over {len(hits)} queries")
    return 0
