"""Which model made a number: the ``{"model_id", "model_hash"}`` identity of a CE or DE.

Indexes record the identity of the models they were built with, and scoring jobs fold it into
their fingerprint, so nothing computed with one model is ever reused with another.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["ModelMismatchError", "model_identity"]


class ModelMismatchError(ValueError):
    """The index was built with another CE/DE than the one given at search time."""


def model_identity(model: Any, *, require_hash: bool = True) -> dict | None:
    """``{"model_id", "model_hash"}`` of a model or scorer object (its ``model_id`` /
    ``model_hash`` attributes) or of a dict with those keys; ``None`` for ``None``.

    ``require_hash``: an index needs a content hash to refuse other models later, so by default
    an object without one is an error; a scoring job fingerprints whatever it is given.
    """
    if model is None:
        return None
    if isinstance(model, Mapping):
        mid, mhash = model.get("model_id"), model.get("model_hash")
    else:
        mid, mhash = getattr(model, "model_id", None), getattr(model, "model_hash", None)
    if mhash is None and require_hash:
        raise ValueError(
            f"a model identity needs a content hash (model_hash); "
            f"got {type(model).__name__} without one"
        )
    return {
        "model_id": None if mid is None else str(mid),
        "model_hash": None if mhash is None else str(mhash),
    }
