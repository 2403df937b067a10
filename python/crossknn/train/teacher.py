"""Teachers for the distill loss: a score-matrix folder or an exported CE folder.

A score matrix covers only its own queries and items: training with it keeps the queries that
are rows of the matrix and draws every negative from its columns (the others are counted as
skipped). A CE folder scores any pair (ONNX Runtime, the group's pairs in one call).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from crossknn.ce import OnnxCrossEncoder
from crossknn.matrix import load_score_matrix

__all__ = ["open_teacher", "MatrixTeacher", "CeTeacher"]


class MatrixTeacher:
    def __init__(self, folder: Path) -> None:
        self.m = load_score_matrix(folder)
        self.rows = {q: r for r, q in enumerate(self.m.query_ids)}
        self.cols = {d: c for c, d in enumerate(self.m.item_ids)}
        self.name = str(folder)

    def restrict(self, ex):
        """``ex`` reduced to the matrix's queries, with item indices mapped to its columns."""
        keep = [r for r, q in enumerate(ex.query_ids) if q in self.rows]
        if not keep:
            raise ValueError(f"teacher {self.name}: none of the training queries is a row of it")
        col_of = np.array([self.cols.get(i, -1) for i in ex.item_ids], dtype=np.int64)
        self.item_col = col_of
        if (col_of < 0).all():
            raise ValueError(f"teacher {self.name}: none of the corpus items is a column of it")
        out = ex.subset(np.array(keep))
        out.skipped = dict(ex.skipped)
        if len(keep) < len(ex):
            out.skipped["not a row of the teacher matrix"] = len(ex) - len(keep)
        self.query_row = np.array([self.rows[q] for q in out.query_ids], dtype=np.int64)
        return out

    @property
    def item_pool(self) -> np.ndarray:
        """Item indices the teacher can score (negatives are drawn from these)."""
        return np.flatnonzero(self.item_col >= 0)

    def scores(self, qi: np.ndarray, ii: np.ndarray, ex) -> np.ndarray:
        return self.m.scores[self.query_row[qi], self.item_col[ii]].astype(np.float32)


class CeTeacher:
    def __init__(self, folder: Path, threads: int | None) -> None:
        self.ce = OnnxCrossEncoder(folder, threads=threads)
        self.name = str(folder)

    def restrict(self, ex):
        return ex

    item_pool = None

    def scores(self, qi: np.ndarray, ii: np.ndarray, ex) -> np.ndarray:
        pairs = [(ex.query_texts[q], ex.item_texts[i]) for q, i in zip(qi, ii, strict=True)]
        return self.ce.predict(pairs)


def open_teacher(folder, threads: int | None = None):
    """A :class:`MatrixTeacher` (``scores.npy`` present) or a :class:`CeTeacher`."""
    folder = Path(folder)
    if (folder / "scores.npy").is_file():
        return MatrixTeacher(folder)
    if (folder / "crossknn_model.json").is_file():
        return CeTeacher(folder, threads)
    raise FileNotFoundError(
        f"teacher {folder}: expected a score-matrix folder (scores.npy) or an exported CE folder "
        "(crossknn_model.json)"
    )
