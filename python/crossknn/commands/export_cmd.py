"""``crossknn export HF_DIR OUT_DIR``: a Hugging Face checkpoint folder to a crossknn model folder.

``--kind cls`` (a ``*ForSequenceClassification`` [CLS] cross-encoder), ``--kind emb`` (a bare
encoder used as an [EMB] cross-encoder, ANNCUR's joint encoding) or ``--kind de`` (a dual
encoder, mean pooling, e.g. a sentence-transformers folder); inferred from ``config.json`` when
left out (a bare encoder is then an [EMB] CE).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
import time
from pathlib import Path

from crossknn.ce.export import checkpoint_hash, export_cross_encoder, export_dual_encoder
from crossknn.ce.folders import infer_kind, st_layout
from crossknn.commands._printing import terminal_safe
from crossknn.outputs import check_output_folder


def run(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    with export_steps_shown(t0, quiet=getattr(args, "quiet", False)):
        return _run(args, t0)


def _run(args: argparse.Namespace, t0: float) -> int:
    check_output_folder(args.out_dir, kind="model", inputs=[("HF_DIR", args.hf_dir)], foreign=False)
    out = Path(args.out_dir)
    if not args.overwrite and out.is_dir() and any(out.iterdir()):
        # the library's message names overwrite=True; a CLI user has the flag
        raise FileExistsError(f"{out} exists and is not empty (pass --overwrite to replace it)")
    src = Path(args.hf_dir)
    if not src.exists():
        raise FileNotFoundError(f"checkpoint folder not found: {src}")
    kind = args.kind
    layout = st_layout(src) if kind == "de" else None
    hf_dir = layout["hf_dir"] if layout else src
    checkpoint_hash(hf_dir)  # names a missing config or weights file first
    kind = kind or infer_kind(hf_dir)
    limit = _positions(hf_dir)
    common = {
        "quantize": args.int8,
        "optimize": args.optimize,
        "model_id": args.model_id or src.resolve().name,
        "overwrite": args.overwrite,
    }
    if kind == "de":
        max_length = args.max_length or min(layout["max_length"] or 256, limit)
        m = export_dual_encoder(hf_dir, args.out_dir, max_length=max_length, **common)
    else:
        max_length = args.max_length or min(512, limit)
        m = export_cross_encoder(
            hf_dir,
            args.out_dir,
            kind="cls" if kind == "cls" else "joint",
            max_length=max_length,
            **common,
        )
    print(
        f"exported {src} -> {args.out_dir}: {m['kind']} {m['model_id']!r}, variants "
        f"{sorted(m['variants'])}, max_length {m['max_length']}, {time.perf_counter() - t0:.1f} s"
    )
    return 0


def _positions(hf_dir) -> int:
    config = json.loads((hf_dir / "config.json").read_text(encoding="utf-8"))
    return int(config.get("max_position_embeddings", 512))


class _StepLines:
    """A logging handler printing each export step with the time since the start (stderr)."""

    def __init__(self, t0: float) -> None:
        class Handler(logging.Handler):
            def emit(self, record) -> None:
                msg = terminal_safe(record.getMessage())
                print(f"export [{time.perf_counter() - t0:6.1f} s] {msg}", file=sys.stderr)

        self.handler = Handler()


def export_steps_shown(t0: float, *, quiet: bool = False):
    """While an export runs, print its steps (loading, tracing, int8, fidelity) as they start:
    the export takes a minute or more on a CPU and was silent."""
    if quiet:
        return contextlib.nullcontext()
    logger = logging.getLogger("crossknn.ce.export.stages")

    @contextlib.contextmanager
    def shown():
        lines = _StepLines(t0)
        old = logger.level
        logger.addHandler(lines.handler)
        logger.setLevel(logging.INFO)
        try:
            yield
        finally:
            logger.removeHandler(lines.handler)
            logger.setLevel(old)

    return shown()
