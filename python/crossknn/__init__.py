"""crossknn: k-nearest-neighbor search with cross-encoders on a small budget of CE calls."""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
