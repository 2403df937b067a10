"""``crossknn index cur|mf SOURCE OUT_DIR``: build an offline index (resumable, optionally on Ray).

SOURCE is either a score-matrix folder (``scores.npy`` ...: the CE is the precomputed matrix, for
experiments) or a BEIR folder (the embedded CE and DE run on the texts).

- ``cur``: dense anchor rows R = CE(train queries, all items) for ANNCUR/ADACUR.
- ``mf``: the AXN sparse matrix G (k_d items per train query or k_d train queries per item) and
  its factorization into item embeddings (transductive or inductive), with the loss curve.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from crossknn.commands._job_args import add_job_arguments, init_ray

HELP = (
    "build a CUR (dense anchor rows) or sparse-MF (AXN) index from a score matrix or a BEIR folder"
)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("source", metavar="SOURCE", help="score-matrix folder or BEIR folder")
    p.add_argument("out_dir", metavar="OUT_DIR", help="index directory to write")
    p.add_argument(
        "--n-train",
        type=int,
        help="train (anchor) queries: a seeded sample of this many (default: all train "
        "rows of a matrix; 100 queries of a BEIR folder)",
    )
    p.add_argument("--split", help="BEIR source: draw train queries from qrels/SPLIT.tsv only")
    p.add_argument("--seed", type=int, default=0, help="seed of every sample (default 0)")
    p.add_argument("--threads", type=int, help="CE intra-op threads (BEIR source)")
    p.add_argument("--batch-size-ce", type=int, default=16, help="CE batch size (BEIR source)")
    add_job_arguments(p)


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="index_kind", metavar="KIND", required=True)
    cur = sub.add_parser(
        "cur",
        help="dense anchor rows R (train queries x all items)",
        description="dense anchor rows R (train queries x all items) for ANNCUR/ADACUR",
    )
    _common(cur)
    mf = sub.add_parser(
        "mf",
        help="AXN sparse matrix G + matrix factorization",
        description="AXN sparse matrix G + matrix factorization (item embeddings)",
    )
    _common(mf)
    mf.add_argument(
        "--k-d",
        type=int,
        required=True,
        help="items per train query (--per query) or train queries per item (--per item)",
    )
    mf.add_argument("--per", choices=("query", "item"), default="query")
    mf.add_argument(
        "--strategy",
        choices=("topk", "uniform"),
        default="topk",
        help="observed entries: top-k_d by --retriever, or uniform (default topk)",
    )
    mf.add_argument(
        "--retriever",
        choices=("de", "tfidf"),
        default="de",
        help="ranking for --strategy topk (default de)",
    )
    mf.add_argument("--mode", choices=("transductive", "inductive"), default="inductive")
    mf.add_argument("--epochs", type=int, default=20)
    mf.add_argument("--lr", type=float, default=0.005)
    mf.add_argument("--batch-size", type=int, default=256, help="MF training batch (pairs)")
    mf.add_argument("--weight-decay", type=float, default=0.0)
    mf.add_argument(
        "--normalize",
        action="store_true",
        help="map CE scores to the DE score range (alpha, beta) before fitting",
    )


@dataclass
class Source:
    scorer: Any  # Scorer protocol
    queries: list  # scorer query objects of the train queries
    query_ids: list[str]
    query_texts: list[str] | None
    item_texts: Any  # callable -> list[str] (loaded lazily: only TF-IDF needs it)
    de_queries: np.ndarray | None
    de_items: Any  # callable -> np.ndarray
    ce: dict
    de: dict | None
    info: dict


def _sample(pool: list[int], n: int | None, seed: int, what: str) -> list[int]:
    if n is None or n == len(pool):
        return list(pool)
    if not 1 <= n <= len(pool):
        raise ValueError(f"--n-train must be in [1, {len(pool)}] ({what}); got {n}")
    pick = np.random.default_rng(seed).choice(len(pool), n, replace=False)
    return [pool[i] for i in sorted(pick)]


def open_source(args: argparse.Namespace) -> Source:
    src = Path(args.source)
    if (src / "scores.npy").is_file():
        from crossknn.data import load_beir, load_score_matrix
        from crossknn.index.files import matrix_identity
        from crossknn.scorers import MatrixScorer

        m = load_score_matrix(src, mmap=True)
        rows = _sample(
            [int(r) for r in m.train], args.n_train, args.seed, "train rows of the matrix"
        )
        if m.de_items is None or m.de_queries is None:
            raise FileNotFoundError(f"{src} has no de_queries.npy/de_items.npy (needed for MF)")
        ce_id, de_id = matrix_identity(src)
        return Source(
            scorer=MatrixScorer(np.asarray(m.scores)),
            queries=rows,
            query_ids=[m.query_ids[r] for r in rows],
            query_texts=None,
            item_texts=lambda: load_beir(m.corpus_dir()).items_in_order(m.item_ids),
            de_queries=np.asarray(m.de_queries)[rows],
            de_items=lambda: np.asarray(m.de_items),
            ce=ce_id,
            de=de_id,
            info={"source": "matrix", "matrix": src.resolve().name, "train_rows": rows},
        )
    if (src / "corpus.jsonl").is_file():
        from crossknn.ce import default_cross_encoder, default_dual_encoder
        from crossknn.commands.score_matrix_cmd import _ce_factory
        from crossknn.data import load_beir
        from crossknn.jobs import LazyScorer

        corpus = load_beir(src)
        pool = list(range(len(corpus.query_ids)))
        if args.split:
            if args.split not in corpus.qrels:
                raise ValueError(f"--split {args.split!r}: no qrels/{args.split}.tsv in {src}")
            keep = set(corpus.qrels[args.split])
            pool = [i for i in pool if corpus.query_ids[i] in keep]
        n = args.n_train if args.n_train is not None else min(100, len(pool))
        qpos = _sample(pool, n, args.seed, "queries available")
        texts = [corpus.query_texts[i] for i in qpos]
        if args.ray:
            probe = default_cross_encoder()
            scorer = LazyScorer(
                _ce_factory,
                corpus.item_texts,
                args.threads or 1,
                args.batch_size_ce,
                model_id=probe.model_id,
                model_hash=probe.model_hash,
                n_items=len(corpus.item_texts),
            )
        else:
            scorer = _ce_factory(corpus.item_texts, args.threads, args.batch_size_ce)
        de = default_dual_encoder(threads=args.threads)
        cache: dict = {}

        def de_items():
            if "v" not in cache:
                cache["v"] = de.encode(corpus.item_texts, show_progress_bar=not args.quiet)
            return cache["v"]

        return Source(
            scorer=scorer,
            queries=texts,
            query_ids=[corpus.query_ids[i] for i in qpos],
            query_texts=texts,
            item_texts=lambda: corpus.item_texts,
            de_queries=de.encode(texts) if args.index_kind == "mf" else None,
            de_items=de_items,
            ce={"model_id": scorer.model_id, "model_hash": scorer.model_hash},
            de={"model_id": de.model_id, "model_hash": de.model_hash},
            info={"source": "beir", "dataset": src.resolve().name},
        )
    raise FileNotFoundError(
        f"{src} is neither a score-matrix folder (scores.npy) nor a BEIR folder (corpus.jsonl)"
    )


def run(args: argparse.Namespace) -> int:
    from crossknn.index import build_cur_index, build_mf_index

    s = open_source(args)
    init_ray(args)
    common = dict(
        query_ids=s.query_ids,
        ce=s.ce,
        de=s.de,
        shard_pairs=args.shard_pairs,
        backend="ray" if args.ray else "local",
        progress=not args.quiet,
        ray_workers=args.ray_workers,
        ray_gpus_per_worker=args.ray_gpus,
        info=s.info,
        keep_job=args.keep_job,
    )
    if args.index_kind == "cur":
        idx = build_cur_index(args.out_dir, s.scorer, s.queries, **common)
        print(
            f"wrote CUR index {args.out_dir}: R {idx['R'].shape[0]} x {idx['R'].shape[1]}, "
            f"{idx.ce_calls} CE calls"
        )
        return 0
    vectors = None
    if args.strategy == "topk" and args.retriever == "tfidf":
        from crossknn.index.mf import tfidf_vectors

        if s.query_texts is None:
            from crossknn.data import load_beir, load_score_matrix

            m = load_score_matrix(args.source, mmap=True)
            corpus = load_beir(m.corpus_dir())
            s.query_texts = corpus.queries_in_order(s.query_ids)
        vectors = tfidf_vectors(s.query_texts, s.item_texts())
    idx, res = build_mf_index(
        args.out_dir,
        s.scorer,
        s.queries,
        de_queries=s.de_queries,
        de_items=s.de_items(),
        k_d=args.k_d,
        per=args.per,
        strategy=args.strategy,
        vectors=vectors,
        mode=args.mode,
        epochs=args.epochs,
        lr=args.lr,
        batch_size=args.batch_size,
        weight_decay=args.weight_decay,
        normalize=args.normalize,
        seed=args.seed,
        **common,
    )
    curve = res.loss_curve
    print(
        f"wrote MF index {args.out_dir} ({args.mode}): items {idx['items'].shape}, "
        f"{idx.ce_calls} CE calls, fit {res.seconds:.1f} s"
    )
    print("loss (MSE on G) by epoch: " + " ".join(f"{x:.4g}" for x in curve))
    return 0
