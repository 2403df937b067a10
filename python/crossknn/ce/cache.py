"""The crossknn cache directory (exported default models, fp16 graphs, negatives, CMC data)."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_root"]


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """The cache directory: ``cache_dir``, else ``$CROSSKNN_CACHE``, else ``~/.cache/crossknn``."""
    if cache_dir is not None:
        return Path(cache_dir)
    env = os.environ.get("CROSSKNN_CACHE")
    if env:
        return Path(env)
    return Path.home() / ".cache" / "crossknn"
