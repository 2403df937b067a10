"""``crossknn index cur|mf SOURCE OUT_DIR``: build an offline index (resumable, optionally on Ray).

SOURCE is either a score-matrix folder (``scores.npy`` ...: the CE is the precomputed matrix, for
experiments) or a BEIR folder (the embedded CE and DE run on the texts).

- ``cur``: dense anchor rows R = CE(train queries, all items) for ANNCUR/ADACUR.
- ``mf``: the AXN sparse matrix G (k_d items per train query or k_d train queries per item) and
  its factorization into item embeddings (transductive or inductive), with the loss curve.
"""

from __future__ import annotations

import argparse

from crossknn.commands._common import add_job_arguments, job_options
from crossknn.index import build_cur_index, build_mf_index
from crossknn.index.mf_entries import tfidf_vectors
from crossknn.index.source import open_index_source
from crossknn.outputs import check_output_folder

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


def run(args: argparse.Namespace) -> int:
    check_output_folder(args.out_dir, kind="index", inputs=[("SOURCE", args.source)])
    options = job_options(args)
    s = open_index_source(
        args.source,
        n_train=args.n_train,
        split=args.split,
        seed=args.seed,
        threads=args.threads,
        batch_size=args.batch_size_ce,
        lazy=args.ray,
        progress=options.progress,
    )
    options.init_ray()
    common = dict(query_ids=s.query_ids, ce=s.ce, de=s.de, options=options, info=s.info)
    if args.index_kind == "cur":
        idx = build_cur_index(args.out_dir, s.scorer, s.queries, **common)
        print(
            f"wrote CUR index {args.out_dir}: R {idx['R'].shape[0]} x {idx['R'].shape[1]}, "
            f"{idx.ce_calls} CE calls"
        )
        return 0
    vectors = None
    if args.strategy == "topk" and args.retriever == "tfidf":
        vectors = tfidf_vectors(s.query_texts(), s.item_texts())
    idx, res = build_mf_index(
        args.out_dir,
        s.scorer,
        s.queries,
        de_queries=s.de_queries(),
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
