"""``crossknn train-ce DATA OUT_DIR``: fine-tune a [CLS] or [EMB] cross-encoder, export it."""

from __future__ import annotations

import argparse

from crossknn.commands._common import config_from
from crossknn.outputs import check_output_folder


def run(args: argparse.Namespace) -> int:
    # crossknn.train imports torch (export extra)
    from crossknn.train import TrainConfig, train_cross_encoder

    inputs = [("DATA", args.data), ("--base", args.base), ("--de", args.de)]
    inputs += [("--teacher", args.teacher), ("--cache-dir", args.cache_dir)]
    check_output_folder(args.out_dir, kind="model", inputs=inputs, foreign=False)
    cfg = config_from(TrainConfig, args)  # the options are named as its fields
    rec = train_cross_encoder(
        args.data,
        args.out_dir,
        cfg,
        base=args.base,
        de=args.de,
        teacher=args.teacher,
        resume=args.resume,
        cache_dir=args.cache_dir,
        progress=not args.no_progress,
        work_dir=args.work_dir,
        keep_checkpoints=args.keep_checkpoints,
    )
    q = rec["queries"]
    print(
        f"trained {args.kind} CE: {rec['steps']} steps in {rec['train_s']:.0f}s "
        f"({rec['stopped']}); {q['train']} train / {q['dev']} dev queries, skipped {q['skipped']}; "
        f"selected step {rec['selected_step']} (dev nDCG@10 {rec['dev_ndcg@10']}) -> {args.out_dir}"
    )
    return 0
