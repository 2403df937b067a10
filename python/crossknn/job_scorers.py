"""A CE as the scorer of an offline job, in this process or on Ray actors.

An ONNX Runtime session cannot be pickled, so a Ray job gets a :class:`crossknn.jobs.LazyScorer`
that opens its own session in each actor; the identity is read once here so the job can be
fingerprinted without opening the model again. A Hugging Face folder is exported (into the cache)
here, once, before any actor starts.
"""

from __future__ import annotations

from typing import Any

from crossknn.ce import OnnxCrossEncoder
from crossknn.ce.folders import open_cross_encoder, resolve_model
from crossknn.jobs import LazyScorer

__all__ = ["ce_scorer", "embedded_ce_scorer"]


def _open_ce(
    items: list[str] | None,
    threads: int | None,
    batch_size: int,
    model_dir: str | None = None,
    precision: str = "fp32",
    provider: str = "auto",
):
    opts = {"threads": threads, "batch_size": batch_size, "provider": provider}
    if model_dir is None:  # the embedded CE (any run precision: fp16 runs its fp32 graph)
        return open_cross_encoder(None, items=items, precision=precision, **opts)
    return OnnxCrossEncoder(model_dir, items=items, precision=precision, **opts)


def ce_scorer(
    item_texts: list[str],
    *,
    model: str | None = None,
    precision: str = "fp32",
    provider: str = "auto",
    threads: int | None,
    batch_size: int,
    lazy: bool,
) -> Any:
    """The CE of ``model`` (a crossknn or Hugging Face folder; ``None``: the embedded one) over
    ``item_texts``; ``lazy=True`` (for Ray): a picklable stand-in with one intra-op thread per
    actor unless ``threads`` says otherwise."""
    model_dir = None if model is None else str(resolve_model(model, precision=precision))
    if not lazy:
        return _open_ce(item_texts, threads, batch_size, model_dir, precision, provider)

    # identity only, on the CPU (fp16 runs the fp32 graph: its identity)
    probe = _open_ce(
        None, 1, batch_size, model_dir, "fp32" if precision == "fp16" else precision, "cpu"
    )
    return LazyScorer(
        _open_ce,
        item_texts,
        threads or 1,
        batch_size,
        model_dir,
        precision,
        provider,
        model_id=probe.model_id,
        model_hash=probe.model_hash,
        n_items=len(item_texts),
    )


def embedded_ce_scorer(
    item_texts: list[str], *, threads: int | None, batch_size: int, lazy: bool
) -> Any:
    """The embedded CE over ``item_texts`` (see :func:`ce_scorer`)."""
    return ce_scorer(item_texts, threads=threads, batch_size=batch_size, lazy=lazy)
