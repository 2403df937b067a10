"""``crossknn build CORPUS INDEX_DIR``: index a user's corpus for ``crossknn search``."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

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


def read_queries(path: str) -> list[str]:
    """Queries from a file: JSONL with 'text' per line, or plain text, one query per line."""
    import sys

    if path == "-":
        lines = sys.stdin.read().splitlines()
        src = "stdin"
    else:
        p = Path(path)
        if not p.is_file():
            raise FileNotFoundError(f"queries file not found: {p}")
        lines = p.read_text(encoding="utf-8").splitlines()
        src = str(p)
    out = []
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        if line.lstrip().startswith("{"):
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{src}:{lineno}: not valid JSON ({exc.msg})") from None
            text = rec.get("text") if isinstance(rec, dict) else None
            if not isinstance(text, str) or not text.strip():
                raise ValueError(f"{src}:{lineno}: a JSON query line needs a non-empty 'text'")
            out.append(text)
        else:
            out.append(line.strip())
    if not out:
        raise ValueError(f"{src}: no queries found")
    return out


def run(args: argparse.Namespace) -> int:
    from crossknn.corpus_index import build_corpus_index
    from crossknn.data import load_corpus

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
