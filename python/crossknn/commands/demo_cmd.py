"""``crossknn demo``: the main job on a corpus every machine has, with the embedded model.

Builds (once, cached) an index over the docstrings of the installed Python standard library the
way ``crossknn build`` does (DE vectors, CE calibration, ``auto``'s rows of pseudo-queries; the
demo spends ``--index-rows`` rows' worth of CE calls on them, where a default build spends one
row per 100 items), then answers a few example queries on the default path: ``auto`` with a
budget of CE calls, printing for each query the results, the method and the rounds that ran, the
CE calls spent and the time. ``--exact`` then (after the results are printed) also scores every
item for those queries, with a bar by pairs, and prints the recall of the CE's exact top-k; the
exact rows are cached beside the index (``search --exact`` shares them).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np

from crossknn.ce import cache_root
from crossknn.ce.models import (
    DEFAULT_CE,
    DEFAULT_DE,
    default_cross_encoder,
    default_dual_encoder,
    minilm_checkpoint_dir,
)
from crossknn.commands._numbers import positive_int
from crossknn.commands._printing import print_hits, query_line, quiet_notes, terminal_safe
from crossknn.corpus.build import build_corpus_index
from crossknn.corpus_folder import open_index
from crossknn.demo_corpus import stdlib_docstrings
from crossknn.exact_cache import ExactScores
from crossknn.searcher import Searcher
from crossknn.topk import exact_top_k

# measured by bench/beir_bench.py (bench/results/beir_ndcg.json); README "The embedded CE"
ZERO_SHOT_NOTE = """
note: the embedded CE (minilm-l6-joint: all-MiniLM-L6-v2, a bi-encoder, run as a joint
cross-encoder) is a zero-shot demonstration model. crossknn finds its top-k faithfully, but it
ranks worse than the DE alone: nDCG@10 on 30 test queries, DE alone vs the CE reranking the DE
top-100 vs AXN at B=100: NFCorpus 0.386 / 0.222 / 0.211, SciFact 0.646 / 0.332 / 0.335.
Use your own trained CE (crossknn export needs the 'export' extra):
  crossknn export HF_DIR MY_CE            # a Hugging Face cross-encoder folder -> ONNX
  crossknn build CORPUS INDEX --model MY_CE
  crossknn search INDEX --beir DIR --run run.trec --metrics metrics.json"""

# the default of --max-items, for a quick run (the docs' walk test sets it)
ITEMS_ENV = "CROSSKNN_DEMO_ITEMS"
# auto's index of the demo: rows' worth of CE calls (half a minute of CE time on 2 CPU cores)
DEMO_ROWS = 2
# the demo corpus: an evenly spaced subset of the docstrings (the same on every run), sized so
# that the whole demo from an empty cache takes well under a minute on 2 quiet CPU cores
DEMO_ITEMS = 1500

EXAMPLE_QUERIES = [
    "parse a date string into a datetime object",
    "compress data with gzip and write it to a file",
    "send an email message through an SMTP server",
    "run a shell command and capture its output",
]


def _items_from_env() -> int | None:
    value = os.environ.get(ITEMS_ENV, "").strip()
    if not value:
        return None
    try:
        return positive_int(value)
    except argparse.ArgumentTypeError as exc:
        raise ValueError(f"${ITEMS_ENV}: {exc}") from None


def _step(text: str) -> float:
    """Print what starts now (its line ends when :func:`_done` prints its time)."""
    print(text, end=" ... ", flush=True)
    return time.perf_counter()


def _done(t: float, what: str = "done") -> None:
    print(f"{what} in {time.perf_counter() - t:.1f} s", flush=True)


def _models():
    """The embedded CE and DE, a line each: their ONNX graphs are built on first use."""
    t = _step(f"models: the embedded CE {DEFAULT_CE} (its ONNX graph is built on first use)")
    ce = default_cross_encoder()
    _done(t, "ready")
    t = _step(f"models: the embedded DE {DEFAULT_DE} (the same weights as a dual encoder)")
    de = default_dual_encoder(show_progress_bar=False)
    _done(t, "ready")
    return ce, de


def run(args: argparse.Namespace) -> int:
    minilm_checkpoint_dir()  # the embedded model's weights: one line saying how to install them
    quiet_notes()  # the truncation note would break the bars' lines: the index line says it
    if args.max_items is None:
        args.max_items = _items_from_env() or DEMO_ITEMS

    t0 = time.perf_counter()
    t = _step(f"corpus: reading the docstrings of the Python {sys.version.split()[0]} stdlib")
    corpus = stdlib_docstrings(max_items=args.max_items)
    _done(t, f"{len(corpus):,} docstrings")
    key = hashlib.sha256("\0".join(corpus.ids).encode()).hexdigest()[:12]
    root = Path(args.cache_dir) if args.cache_dir else cache_root() / "demo"
    name = f"stdlib-py{sys.version_info[0]}{sys.version_info[1]}-{len(corpus)}-{key}"
    index_dir = root / f"{name}-r{args.index_rows}"
    ce, de = _models()
    index = None
    if (index_dir / "index.json").is_file() and not args.rebuild:
        try:
            index = open_index(index_dir)
            print(f"index: {terminal_safe(index_dir)} (cached)")
        except (ValueError, OSError) as exc:
            print(f"cached index unusable ({terminal_safe(exc)}); rebuilding", file=sys.stderr)
            shutil.rmtree(index_dir)
    if index is None:
        if args.rebuild and index_dir.exists():
            shutil.rmtree(index_dir)
        calls = args.index_rows * len(corpus)
        what = (
            f"auto's index from {args.index_rows} rows' worth of CE calls ({calls:,}) on "
            "pseudo-queries cut from the docstrings"
            if calls
            else "no auto index (--index-rows 0)"
        )
        print(
            f"index: building {terminal_safe(index_dir)}: dual-encoder vectors, CE score "
            f"calibration, {what} (texts longer than the models' {ce.max_length} tokens are "
            "cut to it)",
            flush=True,
        )
        t = time.perf_counter()
        index = build_corpus_index(
            corpus, index_dir, ce=ce, de=de, progress=not args.quiet, index_calls=calls or None
        )
        print(f"index: built in {time.perf_counter() - t:.1f} s, {index.ce_calls:,} CE calls")

    if args.budget is None:
        args.budget = max(min(100, len(corpus) // 2), min(args.k, len(corpus)))
    searcher = Searcher(index, ce=ce, de=de, method=args.method, rounds=args.rounds)
    queries = args.query or EXAMPLE_QUERIES
    default = "" if args.method else ", the default"
    print(
        f"\nsearch: method {searcher.method}{default}; budget {args.budget} CE calls per query "
        f"({args.budget / len(corpus):.1%} of the corpus), top-{args.k}",
        flush=True,
    )
    hits = []
    for i, q in enumerate(queries, start=1):  # one at a time: its line, then its answer
        print(query_line(q, str(i)), flush=True)
        h = searcher.search([q], k=args.k, budget=args.budget, query_ids=[str(i)])[0]
        print_hits([h], header=False)
        sys.stdout.flush()
        hits.append(h)
    if args.exact:
        _exact_check(searcher, hits, args, index_dir / "exact")
    else:
        print(
            f"\n(crossknn demo --exact also scores all {len(corpus)} items per query with the "
            f"CE and prints the Top-{args.k}-Recall@{args.budget})"
        )
    print(f"\ntotal time {time.perf_counter() - t0:.1f} s")
    print(ZERO_SHOT_NOTE)
    return 0


def _exact_check(searcher, hits, args, cache_dir: Path) -> None:
    """Score every item for each query (a bar by pairs, rows cached like ``search --exact``)
    and print each query's and the mean Top-k-Recall of the search against the exact top-k."""
    n = searcher.n_items
    print(f"\nexact check: {n} CE calls per query ({len(hits)} queries; cached rows are reused)")
    exact = ExactScores(
        searcher.exact_scores,
        n,
        items_key=searcher.index.info.get("items_sha256", ""),
        model_key=str(getattr(searcher.ce, "model_hash", "")),
        cache_dir=cache_dir,
        score_items=lambda q, idx: searcher.ce.score(q, idx),
    )
    rows = exact.rows([h.query for h in hits], progress=not args.quiet)
    for h, row in zip(hits, rows, strict=True):
        top = exact_top_k(row, min(args.k, n)).astype(np.int64)
        h.exact_ids = [searcher.corpus.ids[j] for j in top]
        h.exact_scores = row[top].astype(np.float32)
        h.recall = len(set(h.indices.tolist()) & set(top.tolist())) / len(top)
        missed = ", ".join(terminal_safe(i) for i in h.missed_ids) or "none"
        print(f"  {terminal_safe(h.query)[:60]}: recall {h.recall:.2f} (missed: {missed})")
    mean = sum(h.recall for h in hits) / len(hits)
    print(
        f"mean Top-{args.k}-Recall@{args.budget} vs the exact CE top-{args.k}: {mean:.3f} "
        f"over {len(hits)} queries (exact search costs {n} CE calls per query)"
    )
