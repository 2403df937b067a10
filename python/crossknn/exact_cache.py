"""Exact CE scores of a query against every item, cached on disk (the ground truth of ``--exact``).

Scoring every item costs N CE calls per query, so the rows are kept as ``.npy`` files named by a
hash of (the index's items hash, the CE's hash, the query text): a row is reused only for the same
items, model and query. A cached file that does not load as a float32 row of the right length is
scored again.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from crossknn.fileio import atomic_save_npy
from crossknn.topk import exact_top_k

__all__ = ["ExactScores"]


class ExactScores:
    """``rows(queries)``: full CE score rows; ``top_k(queries, k)``: the exact top-k of each
    (ties to the lower index). ``score_row(query) -> (N,)`` runs the CE; ``cache_dir`` (optional)
    keeps the rows."""

    def __init__(
        self,
        score_row: Callable[[str], np.ndarray],
        n_items: int,
        *,
        items_key: str,
        model_key: str,
        cache_dir: str | os.PathLike | None = None,
        score_items: Callable[[str, np.ndarray], np.ndarray] | None = None,
        chunk: int = 512,
    ) -> None:
        self.score_row, self.n_items = score_row, int(n_items)
        # score_items(query, item indices): a row is scored in chunks and the bar moves by pairs
        self.score_items, self.chunk = score_items, max(1, int(chunk))
        self.items_key, self.model_key = items_key, model_key
        self.cache_dir = None if cache_dir is None else Path(cache_dir)

    def path(self, query: str) -> Path | None:
        if self.cache_dir is None:
            return None
        key = hashlib.sha256(
            (self.items_key + "\0" + self.model_key + "\0" + query).encode()
        ).hexdigest()[:24]
        return self.cache_dir / f"exact-{key}.npy"

    def _cached(self, path: Path | None) -> np.ndarray | None:
        if path is None or not path.is_file():
            return None
        try:
            s = np.load(path, allow_pickle=False)
        except (ValueError, OSError, EOFError):
            return None  # corrupt, truncated or not a plain array: score the row again
        if s.shape != (self.n_items,) or not np.issubdtype(s.dtype, np.floating):
            return None
        return s

    def row(self, query: str, bar=None) -> np.ndarray:
        """The query's full row: cached, else scored (and kept); ``bar`` moves by pairs."""
        path = self.path(query)
        s = self._cached(path)
        if s is not None:
            if bar is not None:
                bar.update(self.n_items)
            return s
        if self.score_items is None:
            s = np.asarray(self.score_row(query), np.float32)
            if bar is not None:
                bar.update(self.n_items)
        else:
            parts = []
            for lo in range(0, self.n_items, self.chunk):
                idx = np.arange(lo, min(lo + self.chunk, self.n_items), dtype=np.int64)
                parts.append(np.asarray(self.score_items(query, idx), np.float32))
                if bar is not None:
                    bar.update(len(idx))
            s = np.concatenate(parts)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_save_npy(path, s)
        return s

    def top_k(self, queries: Sequence[str], *, k: int, progress: bool = False) -> list[np.ndarray]:
        return [exact_top_k(row, k).astype(np.int64) for row in self.rows(queries, progress)]

    def rows(self, queries: Sequence[str], progress: bool = False) -> list[np.ndarray]:
        """The full score row of each query (progress by pairs, cached rows count at once)."""
        qs = list(queries)
        out = []
        total = len(qs) * self.n_items
        with tqdm(total=total, desc="exact CE", unit="pair", disable=not progress) as bar:
            for q in qs:
                out.append(self.row(q, bar))
        return out
