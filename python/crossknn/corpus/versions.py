"""Index versions: ``refine``, ``add`` and ``remove`` write a new version beside the old one.

A corpus index folder records its version and history in ``index.json``'s ``info``::

    "version": 4,
    "history": [{"version": 2, "op": "refine", "time": ..., "key": "...", ...}, ...]

(an index without them is version 1, as ``crossknn build`` writes it). A new version's changed
arrays are written under names of their own (``NAME.vN.npy``; the item texts ``items.vN.jsonl``)
beside the current files, which stay untouched; its ``index.json`` is written to a temporary file
and renamed over the old one: that rename is the commit. Until it, the folder is the previous
version, whole and searchable (a process killed anywhere leaves it so); after it, the new one.
Files only the previous version listed are removed after the commit (a ``serve`` that still has
them open keeps reading them: Linux keeps an unlinked file alive while it is open). Files of a
version that never committed are overwritten by the next attempt, or removed after the next
commit. Writers hold the folder's ``.lock`` (as ``build`` does): a second writer is refused.

Each history entry carries a ``key`` (a fingerprint of the operation's inputs): rerunning a
command whose version already committed finds its key in the last entry and does nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from crossknn.corpus_folder import ITEMS_FILE, CorpusIndex
from crossknn.fileio import (
    atomic_save_npy,
    atomic_write_bytes,
    atomic_write_json,
    folder_lock,
    sha256_array,
    sha256_bytes,
)
from crossknn.index.files import (
    FORMAT,
    FORMAT_VERSION,
    HASH_KEY,
    check_params,
    fsync_dir,
    meta_hash,
)

__all__ = [
    "HISTORY_KEEP",
    "WORK_DIR",
    "already_applied",
    "clean_work",
    "index_lock",
    "index_version",
    "items_jsonl",
    "write_version",
]

WORK_DIR = Path(".build") / "lifecycle"  # resumable work of refine / add / remove
HISTORY_KEEP = 200  # history entries kept in index.json (the oldest are dropped)
_VERSIONED = re.compile(r"^[A-Za-z0-9_-]+\.v\d+\.npy$|^items\.v\d+\.jsonl$")


def index_version(index: CorpusIndex | Mapping) -> int:
    """The version of a corpus index (1 when it records none: a fresh build)."""
    info = index.info if isinstance(index, CorpusIndex) else index
    v = info.get("version", 1)
    return int(v) if isinstance(v, int) and not isinstance(v, bool) and v >= 1 else 1


@contextlib.contextmanager
def index_lock(path: str | os.PathLike) -> Iterator[Path]:
    """The writer's lock of the index folder ``path`` (``.lock``) for the ``with`` block; a path
    that is not an index folder is one line (FileNotFoundError) and nothing is created there."""
    path = Path(path)
    if not (path / "index.json").is_file():
        what = "no such folder" if not path.exists() else "not an index (no index.json)"
        raise FileNotFoundError(f"{path}: {what}; expected an index folder from crossknn build")
    with folder_lock(path / ".lock", what=f"index folder {path}", create=False) as lock:
        yield lock


def already_applied(index: CorpusIndex, key: str) -> int | None:
    """The version whose last history entry has ``key`` (the same operation, already done)."""
    hist = index.info.get("history") or []
    if hist and isinstance(hist[-1], dict) and hist[-1].get("key") == key:
        return index_version(index)
    return None


def items_jsonl(ids, texts) -> bytes:
    lines = [
        json.dumps({"id": i, "text": t}, ensure_ascii=False)
        for i, t in zip(ids, texts, strict=True)
    ]
    return ("\n".join(lines) + "\n").encode("utf-8")


def write_version(
    index: CorpusIndex,
    *,
    changed: Mapping[str, np.ndarray | None],
    params: Mapping[str, Any],
    op: Mapping[str, Any],
    ce_calls_added: int = 0,
    items: bytes | None = None,
) -> int:
    """Commits version ``v + 1`` of ``index`` (its folder; the caller holds the lock).

    ``changed``: arrays to write (``None``: drop the array); every other array is kept as is
    (same file). ``items``: the new ``items.jsonl`` content (None: unchanged). ``op``: the
    history entry (``op``, ``key`` and what it did). Returns the new version."""
    path = Path(index.path)
    meta_path = path / "index.json"
    doc = json.loads(meta_path.read_bytes().decode("utf-8"))
    new_v = index_version(index) + 1
    arrays = dict(doc["arrays"])
    for name, arr in changed.items():
        if arr is None:
            arrays.pop(name, None)
            continue
        arr = np.ascontiguousarray(np.asarray(arr))
        fname = f"{name}.v{new_v}.npy"
        atomic_save_npy(path / fname, arr)
        arrays[name] = {
            "file": fname,
            "dtype": arr.dtype.str,
            "shape": list(arr.shape),
            "sha256": sha256_array(arr),
        }
    info = dict(doc["info"])
    if items is not None:
        fname = f"items.v{new_v}.jsonl"
        atomic_write_bytes(path / fname, items)
        info["items_file"] = fname
        info["items_sha256"] = sha256_bytes(items)
    hist = list(info.get("history") or [])
    hist.append({"version": new_v, "time": round(time.time(), 3), **dict(op)})
    info["history"] = hist[-HISTORY_KEEP:]
    info["version"] = new_v
    new = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "kind": doc["kind"],
        "arrays": arrays,
        "models": doc["models"],
        "params": dict(params),
        "ce_calls": int(doc["ce_calls"]) + int(ce_calls_added),
        "info": info,
    }
    check_params(new, meta_path)
    new[HASH_KEY] = meta_hash(new)
    fsync_dir(path)  # the new files are on disk before index.json names them
    atomic_write_json(meta_path, new)  # the commit: one rename
    fsync_dir(path)
    _collect(path, doc, new)
    return new_v


def _files(doc: Mapping) -> set[str]:
    names = {e["file"] for e in doc["arrays"].values()}
    names.add(doc["info"].get("items_file", ITEMS_FILE))
    return names


def _collect(path: Path, old: Mapping, new: Mapping) -> None:
    """Removes the files only the previous version listed, and versioned files of attempts that
    never committed."""
    _unlink_unlisted(path, _files(new), _files(old))


def collect_superseded(path: str | os.PathLike) -> None:
    """What a run killed between its commit and its clean-up left: the files the committed
    version supersedes (an array's or the item texts' unversioned file where the version lists a
    versioned one) and versioned files it does not list. A rerun that finds its operation
    applied calls it, so the folder is that of an uninterrupted run."""
    path = Path(path)
    doc = json.loads((path / "index.json").read_bytes().decode("utf-8"))
    gone = {f"{name}.npy" for name, e in doc["arrays"].items() if e["file"] != f"{name}.npy"}
    if doc["info"].get("items_file", ITEMS_FILE) != ITEMS_FILE:
        gone.add(ITEMS_FILE)
    _unlink_unlisted(path, _files(doc), gone)


def _unlink_unlisted(path: Path, keep: set[str], gone: set[str]) -> None:
    """Removes the files of ``path`` in ``gone`` or named as versioned files, unless in
    ``keep``."""
    for f in path.iterdir():
        if f.name in keep or not f.is_file():
            continue
        if f.name in gone or _VERSIONED.match(f.name):
            try:
                os.unlink(f)
            except FileNotFoundError:
                pass


def clean_work(path, name: str) -> None:
    """Removes an operation's work folder (``.build/lifecycle/NAME``) and the empty folders
    above it."""
    work = Path(path) / WORK_DIR / name
    shutil.rmtree(work, ignore_errors=True)
    for p in (work.parent, work.parent.parent):
        try:
            p.rmdir()  # only when empty
        except OSError:
            break
