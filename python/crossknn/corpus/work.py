"""Resumable work of a corpus index's jobs (build, add, refine): a work folder keyed by its
inputs, and DE item vectors encoded in chunks that a rerun after a kill picks up."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from crossknn.fileio import atomic_save_npy, atomic_write_json, fingerprint, read_json, sha256_texts
from crossknn.identity import model_identity

__all__ = ["encode_resumable", "fresh_work_dir", "model_fingerprint"]


def model_fingerprint(model: Any) -> dict:
    """What a model's outputs depend on: its identity, max length, precision (and type)."""
    ident = model_identity(model, require_hash=False)
    return {
        **ident,
        "type": type(model).__name__,
        "max_length": getattr(model, "max_length", None),
        "precision": getattr(model, "precision", None),
    }


def fresh_work_dir(folder: Path, key: dict, what: str) -> None:
    """Make ``folder`` hold resumable state for ``key`` only: state of other inputs (or of
    unknown inputs) is discarded, saying so on stderr; ``folder/key.json`` records the key
    (removed before the stale state, written after it is gone)."""
    key_path = folder / "key.json"
    fp = fingerprint(key)
    folder.mkdir(parents=True, exist_ok=True)
    try:
        old = read_json(key_path).get("fingerprint")
    except (OSError, ValueError, AttributeError):
        old = None
    if old == fp:
        return
    stale = [p for p in folder.iterdir() if p.name != "key.json"]
    if stale:
        print(
            f"crossknn: {folder}: discarding the {what} of an earlier build with different "
            "inputs (corpus, model or settings changed)",
            file=sys.stderr,
        )
    # the new key first: from here on, whatever is in the folder belongs to it
    _remove(key_path)
    for p in stale:
        _remove(p)
    atomic_write_json(key_path, {"fingerprint": fp, "key": key})


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        try:
            path.unlink()
        except FileNotFoundError:
            pass


def encode_resumable(
    de, texts: list[str], work: Path, *, chunk: int = 1024, progress: bool = True, ids=None
) -> np.ndarray:
    """DE vectors of ``texts``, encoded in chunks saved atomically under ``work`` (resumable).

    The chunks are keyed by a fingerprint of the item ids and texts, the DE (identity, max
    length, precision) and the chunk size: chunks of other inputs are discarded, never reused."""
    key = {
        "what": "de_items",
        "de": model_fingerprint(de),
        "chunk": int(chunk),
        "n": len(texts),
        "ids_sha256": None if ids is None else sha256_texts(map(str, ids)),
        "texts_sha256": sha256_texts(texts),
    }
    fresh_work_dir(work, key, "DE vectors")
    n_chunks = (len(texts) + chunk - 1) // chunk
    parts = []
    with tqdm(total=len(texts), desc="encode items (DE)", unit="item", disable=not progress) as bar:
        for c in range(n_chunks):
            lo, hi = c * chunk, min(len(texts), (c + 1) * chunk)
            path = work / f"de_{c:06d}_{lo}_{hi}.npy"
            arr = None
            if path.is_file():
                try:
                    arr = np.load(path, allow_pickle=False)
                except (ValueError, OSError, EOFError):
                    arr = None
                if arr is not None and (arr.shape != (hi - lo, de.dim) or arr.dtype != np.float32):
                    arr = None
            if arr is None:
                arr = np.asarray(de.encode(texts[lo:hi]), np.float32)
                atomic_save_npy(path, arr)
            parts.append(arr)
            bar.update(hi - lo)
    return np.concatenate(parts) if parts else np.empty((0, de.dim), np.float32)
