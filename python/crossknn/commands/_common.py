"""Options shared by several commands (the same name and meaning on each): a table of single
options, the model, round and job option groups, and opening an index's models with them."""

from __future__ import annotations

import argparse
import dataclasses

from crossknn.ce.folders import RUN_PRECISIONS, open_index_models
from crossknn.ce.runtime import PROVIDERS
from crossknn.commands._numbers import nonneg_float, nonneg_int, positive_int
from crossknn.commands._printing import say_providers
from crossknn.jobs import JobOptions

__all__ = [
    "SHARED",
    "add_job_arguments",
    "add_model_arguments",
    "add_round_arguments",
    "add_shared",
    "config_from",
    "index_models",
    "job_options",
    "model_choice",
    "model_options",
]

# options that mean the same on every command that takes them: name -> (flags, add_argument's
# keywords); a command adds them with add_shared(parser, name, ...)
SHARED: dict[str, tuple[tuple[str, ...], dict]] = {
    "index_dir": (("index_dir",), {"help": "index directory from 'crossknn build'"}),
    "quiet": (("--quiet",), {"action": "store_true", "help": "no progress bars"}),
    "seed": (("--seed",), {"type": nonneg_int, "default": 0}),
    "json": (("--json",), {"action": "store_true", "help": "print JSON instead of a table"}),
    "k": (
        ("-k", "--k"),
        {"type": positive_int, "default": 10, "help": "results per query (default 10)"},
    ),
    "budget": (
        ("--budget",),
        {"type": positive_int, "default": 100, "help": "CE calls per query (default 100)"},
    ),
    "checkpoint_every": (
        ("--checkpoint-every",),
        {"type": positive_int, "default": 50, "metavar": "STEPS"},
    ),
    # the MIPS index of a query's rounds; its help says what auto means on the command (build:
    # the one to build, search and serve: the one to scan)
    "round_index": (
        ("--round-index",),
        {"choices": ("auto", "exact", "ivf", "hnsw"), "default": "auto"},
    ),
}


def add_shared(p, *names: str, **given) -> None:
    """The options ``names`` of :data:`SHARED`, in this order, to ``p`` (a parser or a group);
    ``given``: add_argument's keywords of one option that its command states (its help)."""
    if given and len(names) != 1:
        raise ValueError(f"keywords {sorted(given)} are for one option; got {len(names)}")
    for name in names:
        flags, keywords = SHARED[name]
        p.add_argument(*flags, **{**keywords, **given})


def add_model_arguments(
    p: argparse.ArgumentParser,
    *,
    de: bool = True,
    precision_default: str | None = "fp32",
    batch_size: bool = True,
    verbose: bool = False,
    backend: bool = True,
    models: bool = True,
    batch_tokens: bool = True,
) -> None:
    """The model options, with the same names and meaning on every command: ``--model``,
    ``--de-model``, ``--precision`` (the CE's), ``--de-precision``, ``--provider``,
    ``--threads``, ``--batch-size``, ``--max-batch-tokens`` (and ``--verbose``: print a quantized
    CE's recorded fidelity, :func:`fidelity_line`). ``models=False`` leaves out ``--model`` and
    ``--de-model`` (a command that declares its own), ``batch_tokens=False`` ``--max-batch-tokens``
    (a command whose scorers do not take it)."""
    g = p.add_argument_group("models")
    if models:
        g.add_argument(
            "--model",
            metavar="DIR",
            help="the cross-encoder: a crossknn model folder (crossknn export) or a Hugging Face "
            "folder (exported into the cache on first use); default: "
            + ("the embedded minilm-l6-joint" if precision_default else "the index's CE"),
        )
    if models and de:
        g.add_argument(
            "--de-model",
            metavar="DIR",
            help="the dual encoder (first stage): a crossknn model folder, or a "
            "sentence-transformers / Hugging Face folder (mean pooling); default: "
            + ("the embedded minilm-l6-de" if precision_default else "the index's DE"),
        )
    default_text = f"default {precision_default}" if precision_default else "default: the index's"
    g.add_argument(
        "--precision",
        choices=RUN_PRECISIONS,
        default=precision_default,
        help=f"the CE's precision ({default_text}); fp16 runs the fp32 graph in half precision "
        "on a GPU provider (cuda, tensorrt), int8 ones run on the CPU provider",
    )
    if de:
        g.add_argument(
            "--de-precision",
            choices=RUN_PRECISIONS,
            default=precision_default,
            help=f"the dual encoder's precision ({default_text})",
        )
    if verbose:
        g.add_argument(
            "--verbose",
            action="store_true",
            help="print a quantized CE's fidelity to fp32 recorded at export (stderr)",
        )
    g.add_argument(
        "--provider",
        choices=PROVIDERS,
        default="auto",
        help="ONNX Runtime execution provider (default auto: the first whose session opens, "
        "TensorRT where its libraries load, then CUDA, then CPU; GPU ones need pip install "
        "'crossknn[gpu]'); cuda/tensorrt are strict: an error where they do not run",
    )
    g.add_argument(
        "--threads",
        type=positive_int,
        default=None,
        metavar="N",
        help="CE/DE threads (default: all cores)",
    )
    if backend:  # crossknn.ce.backends; model_options passes it on
        g.add_argument(
            "--backend",
            choices=("onnx", "torch"),
            default="onnx",
            help="what runs the CE and DE: onnx (ONNX Runtime, default) or torch (PyTorch, "
            "CPU or CUDA: --provider auto|cpu|cuda)",
        )
    if batch_size:
        g.add_argument(
            "--batch-size",
            type=positive_int,
            default=None,
            metavar="N",
            help="CE pairs per session run at most (default 16 on the CPU, 512 on a GPU)",
        )
    if not batch_tokens:
        return
    g.add_argument(
        "--max-batch-tokens",
        type=positive_int,
        default=None,
        metavar="T",
        help="padded tokens per CE/DE session run at most (default 2048 for the CE on the CPU, "
        "65536 on a GPU: one session run per round)",
    )


def add_round_arguments(p: argparse.ArgumentParser) -> None:
    """``--round-index`` and ``--shards``: what a query's rounds scan (search and serve)."""
    add_shared(
        p,
        "round_index",
        help="rounds through the index's MIPS index (auto: the one it has) or exact",
    )
    p.add_argument(
        "--shards",
        type=nonneg_int,
        default=0,
        metavar="S",
        help="item shards over S Ray actors, each scanning its block of items (default 0: none)",
    )


def model_options(args: argparse.Namespace) -> dict:
    """The :func:`crossknn.ce.folders.open_cross_encoder` options of
    :func:`add_model_arguments` (provider, threads, batch size, token budget)."""
    return {
        "provider": args.provider,
        "threads": args.threads,
        "batch_size": getattr(args, "batch_size", None),
        "backend": getattr(args, "backend", None),
        "max_batch_tokens": getattr(args, "max_batch_tokens", None),
    }


def model_choice(args: argparse.Namespace) -> dict:
    """Which CE and DE, at which precisions: ``model``, ``de_model``, ``precision`` and
    ``de_precision`` of :func:`add_model_arguments` (``models=True``, ``de=True``)."""
    return {
        "model": args.model,
        "de_model": args.de_model,
        "precision": args.precision,
        "de_precision": args.de_precision,
    }


def config_from(cls, args: argparse.Namespace, **given):
    """The dataclass ``cls`` from the options named as its fields (a field without an option keeps
    its default) and ``given`` (a field whose value is computed, or whose option is named
    otherwise)."""
    fields = [f.name for f in dataclasses.fields(cls)]
    named = {name: getattr(args, name) for name in fields if hasattr(args, name)}
    return cls(**{**named, **given})


def index_models(args: argparse.Namespace, index):
    """The CE and DE an index records, opened with the options of :func:`add_model_arguments`
    (``precision_default=None``: the index's unless given); which provider each runs on is
    printed to stderr unless ``--quiet``."""
    ce, de = open_index_models(index, **model_choice(args), **model_options(args))
    say_providers(args, ce, de)
    return ce, de


def add_job_arguments(p: argparse.ArgumentParser) -> None:
    """Shards, Ray and progress options of a :class:`crossknn.jobs.ScoreJob`."""
    p.add_argument(
        "--shard-pairs", type=positive_int, default=2048, help="pairs per shard file (default 2048)"
    )
    p.add_argument("--ray", action="store_true", help="score the shards as Ray actors (ray.init())")
    p.add_argument("--ray-address", help="Ray cluster address (default: start or join a local one)")
    p.add_argument(
        "--ray-workers", type=positive_int, help="Ray actors (default: the cluster's CPUs)"
    )
    p.add_argument(
        "--ray-gpus",
        type=nonneg_float,
        default=0.0,
        help="GPUs each Ray actor reserves (e.g. 1 on a GPU cluster; default 0)",
    )
    p.add_argument("--keep-job", action="store_true", help="keep OUT_DIR/.job after finishing")
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def job_options(args: argparse.Namespace) -> JobOptions:
    """The :class:`JobOptions` of the arguments added by :func:`add_job_arguments`."""
    return JobOptions(
        shard_pairs=args.shard_pairs,
        backend="ray" if args.ray else "local",
        progress=not args.quiet,
        ray_address=args.ray_address,
        ray_workers=args.ray_workers,
        ray_gpus_per_worker=args.ray_gpus,
        keep_job=args.keep_job,
    )
