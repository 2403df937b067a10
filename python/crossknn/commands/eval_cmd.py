"""``crossknn eval``: Top-k-Recall@B of search methods on a score-matrix folder."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from crossknn.commands._common import as_named
from crossknn.eval import EvalConfig, evaluate, format_table, plot_curves, write_json
from crossknn.index import load_index
from crossknn.index.mf import mf_score_map, query_embeddings
from crossknn.matrix import load_score_matrix
from crossknn.outputs import check_output_file


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
    inputs = as_named(args, "MATRIX", "--item-vectors", "--index", "--corpus", "--cmc-model")
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
