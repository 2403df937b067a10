"""``crossknn cmc``: train, export and evaluate CMC (comparing multiple candidates)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from crossknn.cmc.data import beir_data, matrix_data
from crossknn.cmc.evaluate import qrels_metrics, rank_cmc, rank_de
from crossknn.cmc.export import export_onnx
from crossknn.cmc.runtime import DEFAULT_CANDIDATES, CmcReranker
from crossknn.commands._common import add_shared, config_from
from crossknn.eval import EvalConfig, evaluate, format_table
from crossknn.outputs import check_output_file, check_output_folder

HELP = "CMC, a trained intermediate reranker over DE vectors: train, export (ONNX), eval."


def _source(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument(
        "--matrix",
        metavar="DIR",
        help="score-matrix folder: distill to the CE's scores (its train rows)",
    )
    g.add_argument(
        "--beir",
        metavar="DIR",
        help="BEIR folder: gold labels from qrels (vectors encoded once with the "
        "embedded DE and cached)",
    )
    p.add_argument("--train-split", default="train", help="qrels split to train on (--beir)")
    p.add_argument("--test-split", default="test", help="qrels split to evaluate on (--beir)")
    p.add_argument(
        "--cache",
        metavar="DIR",
        help="cache for models and encoded vectors (default $CROSSKNN_CACHE or ~/.cache/crossknn)",
    )
    add_shared(p, "quiet")


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="cmc_command", metavar="SUBCOMMAND", required=True)

    t = sub.add_parser("train", help="train a CMC model (checkpoints, resume) and export ONNX")
    _source(t)
    t.add_argument("--out", required=True, metavar="DIR", help="model directory")
    t.add_argument("--k", type=int, default=64, help="training candidates per query (64)")
    t.add_argument(
        "--top-fraction",
        type=float,
        default=0.5,
        help="share of the K that are the DE's top items; the rest are sampled "
        "from the DE's score distribution (0.5)",
    )
    t.add_argument("--pool", type=int, default=1024, help="DE pool the negatives come from")
    t.add_argument("--epochs", type=int, default=20)
    t.add_argument("--batch-size", type=int, default=8)
    t.add_argument("--lr", type=float, default=3e-4)
    t.add_argument("--lambda-ce", type=float, default=0.9, help="weight of the target loss")
    t.add_argument("--lambda-kl", type=float, default=0.1, help="weight of KL(CMC || retriever)")
    t.add_argument(
        "--target-temperature",
        type=float,
        default=0.3,
        help="CE-score target softmax temperature (standardized scores)",
    )
    t.add_argument(
        "--width",
        type=int,
        default=128,
        help="attention width (0: the vectors' dim; default 128, for CPU training)",
    )
    t.add_argument("--layers", type=int, default=2)
    t.add_argument("--heads", type=int, default=4)
    t.add_argument("--dropout", type=float, default=0.1)
    add_shared(t, "seed", "checkpoint_every")
    t.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (default 1: small matrices, more threads mostly wait)",
    )
    t.add_argument(
        "--no-resume", action="store_true", help="start over even if DIR/checkpoint.pt exists"
    )

    e = sub.add_parser("export", help="(re-)export DIR/model.pt to DIR/model.onnx")
    e.add_argument("model", metavar="DIR")

    v = sub.add_parser(
        "eval",
        help="DE vs BE->CMC: CE top-k recall (--matrix) or nDCG@10 / "
        "recall@100 against qrels (--beir)",
    )
    v.add_argument("model", metavar="DIR", help="trained CMC model directory")
    _source(v)
    v.add_argument(
        "--candidates",
        type=int,
        action="append",
        metavar="K",
        help=f"DE candidates CMC reranks (repeatable; default {DEFAULT_CANDIDATES})",
    )
    v.add_argument(
        "--method",
        action="append",
        metavar="NAME",
        help="search methods for --matrix (repeatable; default rnr)",
    )
    v.add_argument(
        "--budget",
        type=int,
        action="append",
        metavar="B",
        help="CE budgets for --matrix (default 50 100 200)",
    )
    v.add_argument(
        "--k",
        type=int,
        action="append",
        metavar="K",
        help="top-k for --matrix (default 1 10 50 100)",
    )
    v.add_argument("--json", metavar="OUT.json", help="write the rows here")


def _data(args):
    if args.matrix:
        return matrix_data(args.matrix)
    return beir_data(
        args.beir,
        args.cache,
        train_split=args.train_split,
        test_split=args.test_split,
        progress=not args.quiet,
    )


def _require_torch(what: str) -> None:
    try:
        import torch  # noqa: F401
    except ModuleNotFoundError:
        raise ValueError(
            f"crossknn cmc {what} needs torch and onnx (the 'export' extra; install "
            "a pinned CPU torch first, see constraints.txt)"
        ) from None


def _inputs(args) -> list:
    return [("--matrix", args.matrix), ("--beir", args.beir), ("--cache", args.cache)]


def _train(args) -> int:
    check_output_folder(args.out, kind="CMC model", inputs=_inputs(args), foreign=False)
    _require_torch("train")
    # crossknn.cmc.model and .train import torch (export extra)
    from crossknn.cmc.model import CmcConfig
    from crossknn.cmc.train import TrainConfig, train

    data = _data(args)
    # the options are named as the configs' fields
    cfg = config_from(TrainConfig, args)
    mcfg = config_from(CmcConfig, args, dim=data.dim, width=min(args.width, data.dim))
    info = train(
        data,
        args.out,
        model_cfg=mcfg,
        cfg=cfg,
        resume=not args.no_resume,
        progress=not args.quiet,
        threads=args.threads,
    )
    path = export_onnx(args.out)
    print(
        f"trained {data.name} ({data.target} target, {info['data']['n_train_queries']} "
        f"queries, {info['steps']} steps) in {info['train_seconds']:.1f} s; "
        f"final epoch loss {info['final_epoch_loss']:.4f}"
    )
    print(f"wrote {path}")
    return 0


def _eval(args) -> int:
    if args.json:
        check_output_file(args.json, option="--json", inputs=[("DIR", args.model), *_inputs(args)])
    reranker = CmcReranker(args.model)
    ks_cand = sorted(set(args.candidates or [DEFAULT_CANDIDATES]))
    rows: list[dict] = []
    if args.matrix:
        methods = list(dict.fromkeys(args.method or ["rnr"]))
        budgets = sorted(set(args.budget or [50, 100, 200]))
        ks = sorted(set(args.k or [1, 10, 50, 100]))
        rows += evaluate(
            args.matrix,
            EvalConfig(methods=methods, budgets=budgets, ks=ks, firsts=["de"]),
            progress=not args.quiet,
        )
        print(format_table(rows))
        for kc in ks_cand:
            got = evaluate(
                args.matrix,
                EvalConfig(
                    methods=methods,
                    budgets=budgets,
                    ks=ks,
                    firsts=["cmc"],
                    extra={"cmc_model": reranker, "cmc_candidates": kc},
                ),
                progress=not args.quiet,
            )
            for r in got:
                r["cmc_candidates"] = kc
            rows += got
            print(f"\nBE -> CMC over K={kc} DE candidates:")
            print(format_table(got))
    else:
        data = _data(args)
        test = data.test.tolist()
        if not test:
            raise ValueError(f"{args.beir}: no {args.test_split} queries with relevant items")
        rows.append({"ranker": "de", **qrels_metrics(rank_de(data, test, 100), test, data)})
        for kc in ks_cand:
            ranked = rank_cmc(data, test, 100, reranker, kc)
            rows.append(
                {"ranker": "cmc", "cmc_candidates": kc, **qrels_metrics(ranked, test, data)}
            )
        print(f"{'ranker':<10}{'K':>6}{'nDCG@10':>10}{'R@100':>9}{'queries':>9}")
        for r in rows:
            print(
                f"{r['ranker']:<10}{r.get('cmc_candidates', ''):>6}{r['ndcg@10']:>10.4f}"
                f"{r['recall@100']:>9.4f}{r['n_queries']:>9}"
            )
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"model": str(args.model), "rows": rows}, indent=1))
        print(f"wrote {args.json}")
    return 0


def run(args: argparse.Namespace) -> int:
    if args.cmc_command == "train":
        return _train(args)
    if args.cmc_command == "export":
        _require_torch("export")

        print(f"wrote {export_onnx(args.model)}")
        return 0
    return _eval(args)
