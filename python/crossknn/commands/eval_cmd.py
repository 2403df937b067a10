"""``crossknn eval``: Top-k-Recall@B of search methods on a score-matrix folder."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from crossknn.commands._numbers import (
    fraction,
    nonneg_float,
    nonneg_int,
    positive_float,
    positive_int,
)
from crossknn.eval import FIRSTS, EvalConfig, evaluate, format_table, plot_curves, write_json
from crossknn.index import load_index
from crossknn.index.mf import mf_score_map, query_embeddings
from crossknn.matrix import load_score_matrix
from crossknn.outputs import check_output_file
from crossknn.search import DEFAULT_MIX, METHODS


def _open_fraction(text: str) -> float:
    value = fraction(text)
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1); got {text!r}")
    return value


HELP = "Top-k-Recall@B of search methods on a precomputed CE score matrix (table, JSON, curves)."


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("matrix", metavar="MATRIX_DIR", help="score-matrix folder (docs/data.md)")
    p.add_argument(
        "--method",
        action="append",
        required=True,
        choices=sorted(METHODS),
        metavar="NAME",
        help=f"method to run (repeatable): {', '.join(METHODS)}",
    )
    p.add_argument(
        "--budget",
        action="append",
        type=positive_int,
        required=True,
        metavar="B",
        help="CE-call budget per query (repeatable)",
    )
    p.add_argument(
        "--k",
        action="append",
        type=positive_int,
        required=True,
        metavar="K",
        help="top-k to recall (repeatable; only k <= B is evaluated)",
    )
    p.add_argument(
        "--rounds",
        action="append",
        type=positive_int,
        metavar="R",
        help="rounds of adaptive methods (default 5; auto: the index's own; repeatable)",
    )
    p.add_argument(
        "--first",
        action="append",
        choices=FIRSTS,
        metavar="NAME",
        help="first stage: random (default), de, tfidf, bm25, cmc (repeatable)",
    )
    p.add_argument(
        "--cmc-model",
        metavar="DIR",
        help="trained CMC model directory for --first cmc (crossknn cmc train)",
    )
    p.add_argument(
        "--cmc-candidates",
        type=positive_int,
        metavar="K",
        help="DE candidates CMC reranks for --first cmc (default 512)",
    )
    p.add_argument("--seed", type=nonneg_int, default=0, help="seed (default 0)")
    p.add_argument("--json", required=True, metavar="OUT.json", help="write the rows here")
    p.add_argument(
        "--plot", metavar="OUT.png", help="recall-vs-cost curves (default: next to --json, .png)"
    )
    p.add_argument("--no-plot", action="store_true", help="do not draw curves")
    p.add_argument(
        "--corpus",
        metavar="DIR",
        help="BEIR folder with the texts (tfidf/bm25; default: the matrix's dataset under "
        "$CROSSKNN_DATA, or data/<dataset> beside the matrix's parent folder)",
    )
    p.add_argument(
        "--split",
        type=_open_fraction,
        metavar="F",
        help="fixed anchor fraction of B for anncur/adacur-split (default: chosen on "
        "dev train rows per B and k)",
    )
    p.add_argument(
        "--paper",
        action="store_true",
        help="papers' final ranking: split methods rerank only the retrieved items",
    )
    p.add_argument(
        "--temperature",
        type=positive_float,
        help="fixed adacur-softmax temperature in units of a query's CE score spread "
        "(default: chosen on dev train rows per B and k)",
    )
    p.add_argument(
        "--ridge", type=nonneg_float, help="least-squares ridge (default: method default)"
    )
    p.add_argument(
        "--mix",
        type=fraction,
        default=DEFAULT_MIX,
        help=f"AXN lambda: weight of the DE query vector (default {DEFAULT_MIX})",
    )
    p.add_argument(
        "--item-vectors",
        metavar="V.npy",
        help="AXN item vectors (N x d .npy; default the matrix's de_items.npy)",
    )
    p.add_argument(
        "--index",
        metavar="MF_DIR",
        help="AXN over a sparse-MF index directory (its item embeddings, query "
        "embeddings of the DE vectors and CE score normalization); it must be "
        "built from train rows only",
    )
    p.add_argument(
        "--index-calls",
        type=nonneg_int,
        metavar="C",
        help="auto: train CE entries its index may read (default 10%% of |train| x N)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    _check_outputs(args)
    m = load_score_matrix(args.matrix)
    _check_de_vectors(m, args.matrix)
    V = P = smap = axn_calls = None
    if args.item_vectors and args.index:
        raise ValueError("give either --item-vectors or --index, not both")
    if args.item_vectors:
        try:
            V = np.load(args.item_vectors, allow_pickle=False)
        except (ValueError, EOFError) as exc:
            raise ValueError(f"{args.item_vectors}: not a .npy array file ({exc})") from None
        if not isinstance(V, np.ndarray):
            raise ValueError(f"{args.item_vectors}: not a .npy array file (an .npz archive?)")
    if args.index:
        index = load_index(args.index)
        if index.kind != "mf":
            raise ValueError(
                f"--index must be a sparse-MF index (kind 'mf') for axn; "
                f"{args.index} is kind {index.kind!r}"
            )
        V = np.asarray(index["items"], np.float32)
        if m.de_queries is not None:
            P = np.asarray(query_embeddings(index, m.de_queries), np.float32)
        smap = mf_score_map(index)
        axn_calls = int(index.ce_calls)
    if V is not None and (V.ndim != 2 or V.shape[0] != m.n_items):
        raise ValueError(f"AXN item vectors must be ({m.n_items}, d); got {V.shape}")
    cfg = EvalConfig(
        methods=list(dict.fromkeys(args.method)),
        budgets=sorted(set(args.budget)),
        ks=sorted(set(args.k)),
        rounds=sorted(set(args.rounds or [5])),
        auto_rounds=sorted(set(args.rounds)) if args.rounds else None,
        firsts=list(dict.fromkeys(args.first or ["random"])),
        seed=args.seed,
        split=args.split,
        final="retrieved" if args.paper else "all",
        temperature=args.temperature,
        ridge=args.ridge,
        mix=args.mix,
        item_vectors=V,
        query_vectors=P,
        score_map=smap,
        corpus=args.corpus,
        index_calls=args.index_calls,
        axn_index_calls=axn_calls,
        extra={"cmc_model": args.cmc_model, "cmc_candidates": args.cmc_candidates}
        if "cmc" in (args.first or [])
        else {},
    )
    rows = evaluate(m, cfg, progress=not args.quiet)
    print(format_table(rows))
    meta = {
        "matrix": str(args.matrix),
        "dataset": m.meta.get("dataset"),
        "n_items": m.n_items,
        "n_train": int(m.train.size),
        "n_test": int(m.test.size),
        "seed": args.seed,
        "split": "dev" if args.split is None else args.split,
        "final": cfg.final,
        "mix": args.mix,
        "temperature": "dev" if args.temperature is None else args.temperature,
    }
    write_json(rows, args.json, meta=meta)
    print(f"wrote {args.json}")
    if not args.no_plot and rows:
        png = args.plot or str(Path(args.json).with_suffix(".png"))
        plot_curves(
            rows,
            png,
            title=f"{m.meta.get('dataset', '')} ({m.n_items} items, {m.test.size} test queries)",
        )
        print(f"wrote {png}")
    return 0


def _check_outputs(args) -> None:
    """No output file over an input or a file of an index, matrix or model folder (the plot's
    default path next to --json included)."""
    inputs = [
        ("MATRIX", args.matrix),
        ("--item-vectors", args.item_vectors),
        ("--index", args.index),
        ("--corpus", args.corpus),
        ("--cmc-model", args.cmc_model),
    ]
    check_output_file(args.json, option="--json", inputs=inputs)
    if not args.no_plot:
        png = args.plot or str(Path(args.json).with_suffix(".png"))
        check_output_file(png, option="--plot", inputs=inputs, others=[("--json", args.json)])


def _check_de_vectors(m, matrix) -> None:
    """The matrix's DE vectors are finite and small enough that their dot products (the DE
    scores) fit float32: otherwise one line naming the file and the row."""
    limit = float(np.finfo(np.float32).max)
    norms = {}
    for name, arr, ids in (
        ("de_queries", m.de_queries, m.query_ids),
        ("de_items", m.de_items, m.item_ids),
    ):
        if arr is None:
            continue
        a = np.asarray(arr, np.float64)
        finite = np.isfinite(a).all(axis=1)
        if not finite.all():
            r = int(np.flatnonzero(~finite)[0])
            raise ValueError(f"{matrix}/{name}.npy: row {r} ({ids[r]!r}) has inf or NaN values")
        n = np.sqrt(np.einsum("ij,ij->i", a, a))
        norms[name] = (n, ids)
    if len(norms) == 2:
        (nq, qids), (ni, _) = norms["de_queries"], norms["de_items"]
        top = float(ni.max(initial=0.0))
        if float(nq.max(initial=0.0)) * top > limit:
            r = int(np.argmax(nq))
            raise ValueError(
                f"{matrix}/de_queries.npy: row {r} ({qids[r]!r}) has norm {nq[r]:.3g}; with item "
                f"vectors of norm up to {top:.3g} its DE scores overflow float32 "
                f"(max {limit:.3g}): DE vectors must be of moderate size (e.g. L2-normalized)"
            )
