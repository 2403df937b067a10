"""What several commands do with their parsed options (declared in ``commands.toml``): the
model options, an index's models, job options, a dataclass or keywords from options of the same
name."""

from __future__ import annotations

import argparse
import dataclasses

from crossknn.ce.folders import open_index_models
from crossknn.commands._printing import say_providers
from crossknn.jobs import JobOptions

__all__ = [
    "as_named",
    "config_from",
    "forward",
    "index_models",
    "job_options",
    "model_choice",
    "model_options",
]


def model_options(args: argparse.Namespace) -> dict:
    """The model options as :func:`crossknn.ce.folders.open_cross_encoder` keywords (provider,
    threads, batch size, backend, token budget)."""
    return {
        "provider": args.provider,
        "threads": args.threads,
        "batch_size": getattr(args, "batch_size", None),
        "backend": getattr(args, "backend", None),
        "max_batch_tokens": getattr(args, "max_batch_tokens", None),
    }


def model_choice(args: argparse.Namespace) -> dict:
    """Which CE and DE, at which precisions: ``--model``, ``--de-model``, ``--precision`` and
    ``--de-precision``."""
    return forward(args, "model", "de_model", "precision", "de_precision")


def forward(args: argparse.Namespace, *names: str) -> dict:
    """The options ``names`` as keywords of the same names (a command passing its options on)."""
    return {name: getattr(args, name) for name in names}


def as_named(args: argparse.Namespace, *names: str) -> list[tuple[str, object]]:
    """``(name, value)`` of the arguments ``names`` as a user writes them (``"--item-vectors"``,
    or a positional's metavar such as ``"INDEX_DIR"``): the files a command reads, named in its
    errors."""
    out = []
    for name in names:
        attr = name[2:] if name.startswith("--") else name.lower()
        out.append((name, getattr(args, attr.replace("-", "_"))))
    return out


def config_from(cls, args: argparse.Namespace, **given):
    """The dataclass ``cls`` from the options named as its fields (a field without an option keeps
    its default) and ``given`` (a field whose value is computed, or whose option is named
    otherwise)."""
    fields = [f.name for f in dataclasses.fields(cls)]
    named = {name: getattr(args, name) for name in fields if hasattr(args, name)}
    return cls(**{**named, **given})


def index_models(args: argparse.Namespace, index):
    """The CE and DE an index records, opened with the model options (a precision not given: the
    index's); which provider each runs on is printed to stderr unless ``--quiet``."""
    ce, de = open_index_models(index, **model_choice(args), **model_options(args))
    say_providers(args, ce, de)
    return ce, de


def job_options(args: argparse.Namespace) -> JobOptions:
    """The :class:`JobOptions` of the job options (shards, Ray, progress)."""
    return JobOptions(
        shard_pairs=args.shard_pairs,
        backend="ray" if args.ray else "local",
        progress=not args.quiet,
        ray_address=args.ray_address,
        ray_workers=args.ray_workers,
        ray_gpus_per_worker=args.ray_gpus,
        keep_job=args.keep_job,
    )
