"""``crossknn index cur|mf SOURCE OUT_DIR``: build an offline index (resumable, optionally on Ray).

SOURCE is either a score-matrix folder (``scores.npy`` ...: the CE is the precomputed matrix, for
experiments) or a BEIR folder (the embedded CE and DE run on the texts).

- ``cur``: dense anchor rows R = CE(train queries, all items) for ANNCUR/ADACUR.
- ``mf``: the AXN sparse matrix G (k_d items per train query or k_d train queries per item) and
  its factorization into item embeddings (transductive or inductive), with the loss curve.
"""

from __future__ import annotations

import argparse

from crossknn.commands._common import forward, job_options
from crossknn.index import build_cur_index, build_mf_index
from crossknn.index.mf_entries import tfidf_vectors
from crossknn.index.source import open_index_source
from crossknn.outputs import check_output_folder


def run(args: argparse.Namespace) -> int:
    check_output_folder(args.out_dir, kind="index", inputs=[("SOURCE", args.source)])
    options = job_options(args)
    s = open_index_source(
        args.source,
        **forward(args, "n_train", "split", "seed", "threads"),
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
        vectors=vectors,
        **forward(args, "k_d", "per", "strategy", "mode", "epochs", "lr", "batch_size"),
        **forward(args, "weight_decay", "normalize", "seed"),
        **common,
    )
    curve = res.loss_curve
    print(
        f"wrote MF index {args.out_dir} ({args.mode}): items {idx['items'].shape}, "
        f"{idx.ce_calls} CE calls, fit {res.seconds:.1f} s"
    )
    print("loss (MSE on G) by epoch: " + " ".join(f"{x:.4g}" for x in curve))
    return 0
