"""Score-matrix folders (``shared/BENCHMARKS.md`` format): load, save, splits, identity.

A folder holds ``scores.npy`` (float32, queries x items, exact CE scores), ``query_ids.json``,
``item_ids.json``, ``splits.json`` (train/test rows), optional ``de_queries.npy`` /
``de_items.npy`` and ``meta.json``, which is written last and marks the folder complete: it is
removed before any other file is replaced, and a folder without it does not load.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from crossknn.fileio import atomic_save_npy, atomic_write_bytes, read_json, sha256_file

__all__ = [
    "DATA_ENV",
    "ScoreMatrix",
    "load_score_matrix",
    "make_splits",
    "matrix_identity",
    "save_score_matrix",
]

DATA_ENV = "CROSSKNN_DATA"


@dataclass
class ScoreMatrix:
    """A score-matrix folder: exact CE scores, ids, train/test rows, DE vectors, meta."""

    path: Path
    scores: np.ndarray  # float32 (n_queries, n_items)
    query_ids: list[str]
    item_ids: list[str]
    train: np.ndarray  # int64 row indices
    test: np.ndarray  # int64 row indices
    meta: dict
    de_queries: np.ndarray | None = None
    de_items: np.ndarray | None = None

    @property
    def n_queries(self) -> int:
        return self.scores.shape[0]

    @property
    def n_items(self) -> int:
        return self.scores.shape[1]

    def corpus_dir(self, corpus: str | Path | None = None) -> Path:
        """The BEIR folder of this matrix: ``corpus`` if given, else ``shared/data/<dataset>``."""
        if corpus is not None:
            return Path(corpus)
        name = self.meta.get("dataset")
        if not name:
            raise ValueError(f"{self.path}/meta.json names no 'dataset'; pass --corpus DIR")
        for root in _data_roots(self.path):
            if (root / str(name)).is_dir():
                return root / str(name)
        raise FileNotFoundError(
            f"the corpus of {self.path} ({name!r}) was not found in "
            f"{', '.join(str(r) for r in _data_roots(self.path))}; pass --corpus DIR or set "
            f"{DATA_ENV}"
        )


def _data_roots(matrix_dir: Path) -> list[Path]:
    """Where a matrix's corpus is looked up by its dataset name: the folders in
    ``$CROSSKNN_DATA`` (``os.pathsep``-separated), then ``data/`` beside the matrices folder
    (the layout ``ROOT/matrices/NAME`` + ``ROOT/data/DATASET``)."""
    roots = [Path(p) for p in os.environ.get(DATA_ENV, "").split(os.pathsep) if p]
    return roots + [Path(matrix_dir).resolve().parent.parent / "data"]


def _load_json(path: Path):
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing")
    return read_json(path)


def load_score_matrix(folder: str | Path, *, mmap: bool = False) -> ScoreMatrix:
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"score-matrix folder {folder} does not exist")
    p = folder / "scores.npy"
    if not p.is_file():
        raise FileNotFoundError(f"{folder} is not a score-matrix folder: scores.npy is missing")
    scores = np.load(p, mmap_mode="r" if mmap else None, allow_pickle=False)
    if scores.ndim != 2:
        raise ValueError(f"{p}: expected a 2-D matrix (queries x items); got shape {scores.shape}")
    if not mmap:
        scores = np.ascontiguousarray(scores, np.float32)
    nq, ni = scores.shape
    qids = [str(x) for x in _load_json(folder / "query_ids.json")]
    iids = [str(x) for x in _load_json(folder / "item_ids.json")]
    if len(qids) != nq or len(iids) != ni:
        raise ValueError(
            f"{folder}: scores.npy is {nq}x{ni} but query_ids.json has {len(qids)} ids and "
            f"item_ids.json has {len(iids)}"
        )
    splits = _load_json(folder / "splits.json")
    rows = {}
    for name in ("train", "test"):
        if name not in splits:
            raise ValueError(f"{folder}/splits.json has no {name!r} list")
        r = np.asarray(splits[name], np.int64).ravel()
        if r.size and (r.min() < 0 or r.max() >= nq):
            raise ValueError(f"{folder}/splits.json: {name} row out of range for {nq} rows")
        rows[name] = r
    if np.intersect1d(rows["train"], rows["test"]).size:
        raise ValueError(f"{folder}/splits.json: train and test rows overlap")
    if not (folder / "meta.json").is_file():
        raise FileNotFoundError(
            f"{folder} is not a complete score-matrix folder: meta.json is missing "
            "(an interrupted write? rerun the command that made it)"
        )
    meta = _load_json(folder / "meta.json")
    de = {}
    for name, n in (("de_queries", nq), ("de_items", ni)):
        f = folder / f"{name}.npy"
        if f.is_file():
            a = np.load(f, allow_pickle=False)
            if a.ndim != 2 or a.shape[0] != n:
                raise ValueError(f"{f}: expected {n} rows (one per {name[3:-1]}); got {a.shape}")
            de[name] = np.ascontiguousarray(a, np.float32)
    if len(de) == 2 and de["de_queries"].shape[1] != de["de_items"].shape[1]:
        raise ValueError(
            f"{folder}: DE query dim {de['de_queries'].shape[1]} != "
            f"item dim {de['de_items'].shape[1]}"
        )
    return ScoreMatrix(folder, scores, qids, iids, rows["train"], rows["test"], meta, **de)


def make_splits(n_rows: int, n_test: int, seed: int) -> dict:
    """Train/test rows: a seeded permutation, the first ``n_rows - n_test`` rows are train."""
    n_test = max(0, min(n_test, n_rows // 2))
    perm = np.random.default_rng(seed).permutation(n_rows)
    n_train = n_rows - n_test
    return {
        "train": sorted(int(x) for x in perm[:n_train]),
        "test": sorted(int(x) for x in perm[n_train:]),
    }


def save_score_matrix(
    folder: str | os.PathLike,
    scores: np.ndarray,
    query_ids: list[str],
    item_ids: list[str],
    splits: dict,
    meta: dict,
    *,
    de_queries: np.ndarray | None = None,
    de_items: np.ndarray | None = None,
) -> Path:
    """Write a score-matrix folder, every file atomically and ``meta.json`` last.

    An existing ``meta.json`` is removed first (and DE files this matrix does not have), so a
    write killed half-way leaves a folder that refuses to load, never a mixed one that loads."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    _unlink_durably(folder / "meta.json")
    for name, arr in (("de_queries", de_queries), ("de_items", de_items)):
        if arr is None:
            _unlink_durably(folder / f"{name}.npy")

    def dump(name, obj, indent=None):
        atomic_write_bytes(folder / name, (json.dumps(obj, indent=indent) + "\n").encode())

    if de_queries is not None:
        atomic_save_npy(folder / "de_queries.npy", np.asarray(de_queries, np.float32))
    if de_items is not None:
        atomic_save_npy(folder / "de_items.npy", np.asarray(de_items, np.float32))
    atomic_save_npy(folder / "scores.npy", np.asarray(scores, np.float32))
    dump("query_ids.json", list(query_ids))
    dump("item_ids.json", list(item_ids))
    dump("splits.json", splits)
    dump("meta.json", meta, indent=1)  # last: its presence marks a complete matrix
    return folder


def _unlink_durably(path: Path) -> None:
    """Remove ``path`` (if there) and fsync its folder, so the removal is on disk before any
    later write."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        return
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def matrix_identity(matrix_dir: str | os.PathLike) -> tuple[dict, dict | None]:
    """(CE identity, DE identity) of a score-matrix folder, for indexes built from it.

    A matrix written by ``crossknn score-matrix`` records the real models (``meta.json`` keys
    ``ce`` and ``de_model``); for other matrices (e.g. ``shared/matrices/cisi-minilm``) the CE is
    the matrix itself: ``model_id`` is meta's ``model`` and ``model_hash`` the sha256 of
    ``scores.npy`` (resp. ``de_items.npy`` for the DE).
    """
    d = Path(matrix_dir)
    meta_path = d / "meta.json"
    meta = read_json(meta_path) if meta_path.is_file() else {}
    ce = meta.get("ce")
    if not (isinstance(ce, dict) and ce.get("model_hash")):
        ce = {
            "model_id": str(meta.get("model", d.name)),
            "model_hash": "scores.npy:" + sha256_file(d / "scores.npy"),
        }
    de = meta.get("de_model")
    if not (isinstance(de, dict) and de.get("model_hash")):
        de = None
        if (d / "de_items.npy").is_file():
            de = {
                "model_id": str(meta.get("de", "de")),
                "model_hash": "de_items.npy:" + sha256_file(d / "de_items.npy"),
            }
    return ce, de
