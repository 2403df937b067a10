"""Pieces shared by several commands: job options, printing hits, text safe for a terminal."""

from __future__ import annotations

import argparse
import re
import sys

from crossknn.ce.fidelity import fidelity_record
from crossknn.ce.folders import RUN_PRECISIONS
from crossknn.ce.runtime import PROVIDERS
from crossknn.jobs import JobOptions

__all__ = [
    "add_job_arguments",
    "add_model_arguments",
    "fidelity_line",
    "model_options",
    "fraction",
    "job_options",
    "nonneg_float",
    "nonneg_int",
    "positive_float",
    "plan_text",
    "plural",
    "positive_int",
    "print_hits",
    "provider_line",
    "terminal_safe",
]

# C0 and C1 control characters (ESC, BEL, CSI ...) and DEL; newlines and tabs included: one hit
# is one line. Also the bidirectional controls (U+061C, U+200E/F, U+202A-202E, U+2066-2069: a
# U+202E makes the rest of a line read right to left, so a printed id or score can lie) and lone
# surrogates (undecodable bytes of a command line, which a UTF-8 terminal cannot print)
_CONTROL = re.compile(
    r"[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]"
)


def terminal_safe(text: str) -> str:
    """``text`` with every control character shown as an escape (``\\x1b``, ``\\u202e``), so a
    hostile corpus cannot move the cursor, clear the screen, retitle the window or reorder what
    is printed after it."""
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), str(text))


def _number(text: str, kind, what: str):
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}; got {text!r}") from None
    if kind is float and value != value or value in (float("inf"), float("-inf")):
        raise argparse.ArgumentTypeError(f"expected {what}; got {text!r}")
    return value


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    value = _number(text, int, "an integer >= 1")
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1; got {text!r}")
    return value


def nonneg_int(text: str) -> int:
    """argparse type: an integer >= 0."""
    value = _number(text, int, "an integer >= 0")
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0; got {text!r}")
    return value


def fraction(text: str) -> float:
    """argparse type: a number in [0, 1]."""
    value = _number(text, float, "a number in [0, 1]")
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1]; got {text!r}")
    return value


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0."""
    value = _number(text, float, "a number > 0")
    if not value > 0.0:
        raise argparse.ArgumentTypeError(f"expected a number > 0; got {text!r}")
    return value


def nonneg_float(text: str) -> float:
    """argparse type: a finite number >= 0."""
    value = _number(text, float, "a number >= 0")
    if not value >= 0.0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0; got {text!r}")
    return value


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
    p.add_argument(
        "--round-index",
        choices=("auto", "exact", "ivf", "hnsw"),
        default="auto",
        help="rounds through the index's MIPS index (auto: the one it has) or exact",
    )
    p.add_argument(
        "--shards",
        type=nonneg_int,
        default=0,
        metavar="S",
        help="item shards over S Ray actors, each scanning its block of items (default 0: none)",
    )


def fidelity_line(ce) -> str | None:
    """What the export measured for a quantized CE (its manifest's fidelity record), one line;
    None for fp32 (``--verbose``)."""
    precision = ce.precision  # a crossknn.ce.interface.CrossEncoder
    if precision == "fp32":
        return None

    try:
        rec = fidelity_record(ce.model_dir, precision)
    except ValueError as exc:
        return f"# {precision}: {exc}"
    f = rec.get("fidelity")
    if not f:
        return f"# {precision} = {rec['recipe']}: no fidelity measured at export"
    cal = rec.get("calibration", {})
    kept = rec.get("fp32_groups")
    return (
        f"# {precision} = {rec['recipe']} vs fp32 on {cal.get('pairs', '?')} calibration pairs "
        f"({cal.get('queries', '?')} queries): top-10 agreement {f['top10_agreement']:.3f}, "
        f"Spearman on the top candidates {f['spearman_top']:.3f}, max |diff| "
        f"{f['max_abs_diff']:.4f}" + (f"; fp32 groups {', '.join(kept)}" if kept else "")
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


def provider_line(*models) -> str:
    """Which execution provider and precision each model runs on, one line for stderr (with
    ``--provider auto`` the provider is the first whose session opened)."""
    parts = []
    for m in models:
        if m is None or not hasattr(m, "provider"):
            continue
        role = "DE" if getattr(m, "kind", "") == "dual-encoder" else "CE"
        parts.append(f"{role} {getattr(m, 'model_id', '?')} ({m.precision}) on {m.provider}")
    return "# " + "; ".join(parts)


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


def plural(n: int, noun: str, nouns: str | None = None) -> str:
    """``1 item``, ``2 items``: a count with its noun (``nouns``: an irregular plural)."""
    return f"{n:,} {noun if n == 1 else nouns or noun + 's'}"


def plan_text(plan: dict) -> str:
    """What a search ran, in a few words: ``auto, 30 rounds (10 + 29 x 3 CE calls)``: the
    method, its rounds and the CE calls each round asked for (``Searcher.plan_info``)."""
    sizes = [int(n) for n in plan.get("plan", [])]
    runs: list[list[int]] = []
    for n in sizes:
        if runs and runs[-1][0] == n:
            runs[-1][1] += 1
        else:
            runs.append([n, 1])
    steps = " + ".join(f"{c} x {n}" if c > 1 else f"{n}" for n, c in runs)
    rounds = int(plan.get("rounds", len(sizes)))
    return f"{plan['method']}, {plural(rounds, 'round')} ({steps} CE calls)"


def print_hits(hits, *, texts: bool = True, file=None, width: int = 70) -> None:
    """Hits as aligned columns: rank (``*`` = not in the exact top-k), CE score, id, a snippet
    of ``width`` characters (whitespace folded, control characters escaped)."""
    file = file or sys.stdout
    for h in hits:
        qid = f"[{terminal_safe(h.qid)}] " if getattr(h, "qid", None) is not None else ""
        print(f"\nquery {qid}{terminal_safe(h.query)}", file=file)
        ids = [terminal_safe(i) for i in h.ids]
        id_width = min(max(map(len, ids), default=2), 32)
        for r, (i, s, t) in enumerate(zip(ids, h.scores, h.texts, strict=False), start=1):
            mark = ""
            if h.exact_ids is not None:
                mark = " " if h.ids[r - 1] in h.exact_ids else "*"
            text = " ".join(t.split())
            text = text if len(text) <= width else text[: width - 3] + "..."
            tail = "  " + terminal_safe(text) if texts else ""
            print(f"  {r:>3}{mark} {s:+9.4f}  {i:<{id_width}}{tail}", file=file)
        ran = f"{plan_text(h.plan)}; " if getattr(h, "plan", None) else ""
        line = (
            f"  {ran}CE calls {h.ce_calls}; time CE {h.seconds_ce:.2f} s, "
            f"other {h.seconds_other:.2f} s"
        )
        if h.recall is not None:
            line += f"; Top-{len(h.exact_ids)}-Recall vs exact CE: {h.recall:.2f}"
            line += " (* = not in the exact top-k)"
        if getattr(h, "allowed", None) is not None:
            line += f"; {h.allowed} items allowed"
            if h.allowed <= len(h.ids):
                line += " (every one of them is here)"
        print(line, file=file)
