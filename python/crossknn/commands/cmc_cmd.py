"""``crossknn cmc``: train, export and evaluate CMC (comparing multiple candidates)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from crossknn.cmc.data import beir_data, matrix_data
from crossknn.cmc.evaluate import qrels_metrics, rank_cmc, rank_de
from crossknn.cmc.export import export_onnx
from crossknn.cmc.runtime import DEFAULT_CANDIDATES, CmcReranker
from crossknn.commands._common import config_from
from crossknn.eval import EvalConfig, evaluate, format_table
from crossknn.outputs import check_output_file, check_output_folder


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
