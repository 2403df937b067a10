"""Files written so that a reader never sees half of them: atomic writes, ``.npy`` and JSON bytes.

Every file crossknn writes (index arrays, ``index.json``, job shards and manifests, score
matrices, eval results) goes through :func:`atomic_write_bytes`: a temp file in the same folder,
fsync, ``os.replace``. A killed process leaves either the old file or the whole new one.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "atomic_save_npy",
    "atomic_write_bytes",
    "atomic_write_json",
    "json_bytes",
    "npy_bytes",
    "read_json",
    "sha256_array",
    "sha256_bytes",
    "sha256_file",
]


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see either the old file or the whole new one."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def npy_bytes(arr: np.ndarray) -> bytes:
    """``arr`` in ``.npy`` format (C order, never pickled)."""
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(arr), allow_pickle=False)
    return buf.getvalue()


def atomic_save_npy(path: str | os.PathLike, arr: np.ndarray) -> None:
    atomic_write_bytes(path, npy_bytes(arr))


def json_bytes(obj: Any) -> bytes:
    """Canonical JSON: indented, keys sorted, NaN/inf refused, newline at the end (so save ->
    load -> save is byte-identical)."""
    return (json.dumps(obj, indent=2, sort_keys=True, allow_nan=False) + "\n").encode()


def atomic_write_json(path: str | os.PathLike, obj: Any) -> None:
    atomic_write_bytes(path, json_bytes(obj))


def read_json(path: str | os.PathLike) -> Any:
    """The JSON document in ``path``; a parse error names the file, line and column."""
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"{path}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})"
        ) from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text (byte {exc.start})") from None


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | os.PathLike, *, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def sha256_array(arr: np.ndarray, *, chunk: int = 1 << 24) -> str:
    """Hash of an array's bytes in C order (read in chunks: no full copy of a memory map)."""
    h = hashlib.sha256()
    flat = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
    for s in range(0, flat.size, chunk):
        h.update(flat[s : s + chunk])
    return h.hexdigest()
