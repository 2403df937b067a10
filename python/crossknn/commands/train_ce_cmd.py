"""``crossknn train-ce DATA OUT_DIR``: fine-tune a [CLS] or [EMB] cross-encoder, export it."""

from __future__ import annotations

import argparse

from crossknn.commands._common import add_shared, config_from
from crossknn.commands._numbers import fraction, positive_float, positive_int
from crossknn.outputs import check_output_folder

HELP = "fine-tune a cross-encoder ([CLS] head or [EMB] dot product) and export it as a model"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("data", help="a BEIR folder, or JSONL with 'query', 'item', 'label' per line")
    p.add_argument("out_dir", help="the model folder to write (empty, or a run to --resume)")
    p.add_argument(
        "--base",
        metavar="DIR",
        help="Hugging Face encoder folder (default: the embedded all-MiniLM-L6-v2 weights)",
    )
    p.add_argument(
        "--de",
        metavar="DIR",
        help="exported dual encoder that mines the hard "
        "negatives (default: the embedded minilm-l6-de)",
    )
    p.add_argument(
        "--kind",
        choices=["cls", "emb"],
        default="emb",
        help="cls: linear head on [CLS]; emb: dot product of the pooled query and "
        "item segments of one joint pass (default emb)",
    )
    p.add_argument("--split", default="train", help="qrels split to train on (default train)")
    p.add_argument(
        "--negatives",
        type=positive_int,
        default=30,
        help="hard negatives: the DE top-N minus the positives (default 30)",
    )
    p.add_argument(
        "--negatives-skip",
        type=int,
        default=0,
        metavar="M",
        help="draw hard negatives from DE ranks M+1..N only: with many unlabelled positives "
        "per query (NFCorpus) the DE's first ranks are often relevant (default 0)",
    )
    p.add_argument(
        "--group-size",
        type=positive_int,
        default=8,
        help="items per query and step: 1 positive + negatives (default 8)",
    )
    p.add_argument(
        "--random-negatives",
        type=int,
        default=2,
        help="random corpus items among a group's negatives (default 2)",
    )
    p.add_argument("--loss", choices=["bce", "listwise", "distill"], default="listwise")
    p.add_argument(
        "--teacher",
        metavar="DIR",
        help="score-matrix or CE folder whose scores --loss distill follows",
    )
    p.add_argument("--max-steps", type=positive_int, default=None)
    p.add_argument("--epochs", type=positive_float, default=1.0)
    p.add_argument(
        "--max-minutes",
        type=positive_float,
        default=None,
        help="training time budget; the best dev checkpoint is exported",
    )
    p.add_argument("--batch-size", type=positive_int, default=4, help="queries per micro-batch")
    p.add_argument(
        "--grad-accum",
        type=positive_int,
        default=1,
        help="micro-batches per optimizer step (default 1)",
    )
    p.add_argument("--lr", type=positive_float, default=2e-5)
    p.add_argument(
        "--head-lr",
        type=positive_float,
        default=1e-3,
        help="learning rate of the [CLS] kind's new classifier head (default 1e-3)",
    )
    p.add_argument("--max-length", type=positive_int, default=128, help="tokens per pair")
    p.add_argument(
        "--dev-fraction",
        type=fraction,
        default=0.1,
        help="share of the train queries held out for model selection (default 0.1)",
    )
    p.add_argument("--dev-queries", type=positive_int, default=100, help="at most this many")
    p.add_argument("--eval-every", type=positive_int, default=50, help="steps between dev evals")
    p.add_argument(
        "--patience",
        type=positive_int,
        default=5,
        help="dev evals without gain before stopping early (default 5)",
    )
    add_shared(p, "seed", "checkpoint_every")
    p.add_argument("--resume", action="store_true", help="continue from the last checkpoint")
    p.add_argument(
        "--work-dir",
        metavar="DIR",
        default=None,
        help="checkpoints, mined negatives, trained weights (default OUT_DIR.train beside "
        "OUT_DIR); removed when the model is exported unless --keep-checkpoints",
    )
    p.add_argument(
        "--keep-checkpoints",
        action="store_true",
        help="keep the work folder after a successful run",
    )
    p.add_argument("--threads", type=positive_int, default=None, help="torch threads")
    p.add_argument("--int8", action="store_true", help="also export an int8 variant")
    p.add_argument(
        "--bf16",
        action="store_true",
        help="mixed precision (bfloat16 autocast; float32 weights and export): about 2x faster "
        "steps on CPUs with AVX512-BF16/AMX and on GPUs",
    )
    p.add_argument("--cache-dir", default=None, help="where the embedded models are cached")
    p.add_argument("--no-progress", action="store_true")


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
