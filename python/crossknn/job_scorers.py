"""The embedded CE as the scorer of an offline job, in this process or on Ray actors.

An ONNX Runtime session cannot be pickled, so a Ray job gets a :class:`crossknn.jobs.LazyScorer`
that opens its own session in each actor; the identity is read once here so the job can be
fingerprinted without opening the model again.
"""

from __future__ import annotations

from typing import Any

__all__ = ["embedded_ce_scorer"]


def _open_embedded_ce(items: list[str], threads: int | None, batch_size: int):
    from crossknn.ce import default_cross_encoder

    return default_cross_encoder(items=items, threads=threads, batch_size=batch_size)


def embedded_ce_scorer(
    item_texts: list[str], *, threads: int | None, batch_size: int, lazy: bool
) -> Any:
    """The embedded CE over ``item_texts``; ``lazy=True`` (for Ray): a picklable stand-in with
    one intra-op thread per actor unless ``threads`` says otherwise."""
    if not lazy:
        return _open_embedded_ce(item_texts, threads, batch_size)
    from crossknn.ce import default_cross_encoder
    from crossknn.jobs import LazyScorer

    probe = default_cross_encoder()  # identity only; the workers open their own sessions
    return LazyScorer(
        _open_embedded_ce,
        item_texts,
        threads or 1,
        batch_size,
        model_id=probe.model_id,
        model_hash=probe.model_hash,
        n_items=len(item_texts),
    )
