"""Index directories: ``index.json`` plus one ``.npy`` file per array (memory-mapped on load).

``index.json`` (written last, atomically, keys sorted, so save -> load -> save is byte-identical)::

    {"format": "crossknn-index", "format_version": 1, "kind": "cur" | "mf",
     "arrays": {NAME: {"file": "NAME.npy", "dtype": "float32", "shape": [...], "sha256": "..."}},
     "models": {"ce": {"model_id": ..., "model_hash": ...}, "de": {...} | null},
     "params": {...}, "ce_calls": int, "info": {...}}

Loading checks the format and version, the kind, every array's presence, header dtype/shape
and content hash, and (when given) that the CE/DE used at search time are the ones the index was
built with. No pickle: arrays are loaded with ``allow_pickle=False``; object dtypes are refused.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from crossknn.fileio import atomic_save_npy, atomic_write_json, sha256_array
from crossknn.identity import model_identity

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "Index",
    "IndexFormatError",
    "ModelMismatchError",
    "save_index",
    "load_index",
]

FORMAT = "crossknn-index"
FORMAT_VERSION = 1
_NAME_OK = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")


class IndexFormatError(ValueError):
    """The index directory is malformed, corrupt or of an unsupported version."""


class ModelMismatchError(ValueError):
    """The index was built with another CE/DE than the one given at search time."""


@dataclass
class Index:
    kind: str
    arrays: dict[str, np.ndarray]
    models: dict[str, dict | None]
    params: dict = field(default_factory=dict)
    ce_calls: int = 0
    info: dict = field(default_factory=dict)
    path: Path | None = None

    def __getitem__(self, name: str) -> np.ndarray:
        try:
            return self.arrays[name]
        except KeyError:
            raise KeyError(f"index has no array {name!r}; it has {sorted(self.arrays)}") from None

    def check_models(self, *, ce: Any = None, de: Any = None) -> None:
        """Raise :class:`ModelMismatchError` if ``ce``/``de`` differ from the ones recorded."""
        for role, given in (("ce", ce), ("de", de)):
            if given is None:
                continue
            want = model_identity(given)
            have = self.models.get(role)
            if have is None:
                raise ModelMismatchError(
                    f"index at {self.path} records no {role.upper()} model, but {want['model_id']} "
                    f"(hash {want['model_hash'][:12]}) was given"
                )
            if have["model_hash"] != want["model_hash"]:
                raise ModelMismatchError(
                    f"index at {self.path} was built with {role.upper()} {have['model_id']!r} "
                    f"(hash {have['model_hash'][:12]}), but search uses {want['model_id']!r} "
                    f"(hash {want['model_hash'][:12]}); rebuild the index with this model"
                )

    def save(self, path: str | os.PathLike) -> Path:
        return save_index(
            path,
            self.kind,
            self.arrays,
            ce=self.models.get("ce"),
            de=self.models.get("de"),
            params=self.params,
            ce_calls=self.ce_calls,
            info=self.info,
        )


def save_index(
    path: str | os.PathLike,
    kind: str,
    arrays: Mapping[str, np.ndarray],
    *,
    ce: Any,
    de: Any = None,
    params: Mapping | None = None,
    ce_calls: int = 0,
    info: Mapping | None = None,
) -> Path:
    """Write an index directory. Arrays first, ``index.json`` last (it marks the index complete)."""
    path = Path(path)
    if not kind or not isinstance(kind, str):
        raise ValueError(f"kind must be a non-empty string; got {kind!r}")
    if not arrays:
        raise ValueError("an index needs at least one array")
    path.mkdir(parents=True, exist_ok=True)
    entries = {}
    for name, arr in arrays.items():
        if not name or set(name) - _NAME_OK:
            raise ValueError(f"array name {name!r} must be made of letters, digits, '_' and '-'")
        arr = np.asarray(arr)
        if arr.dtype.hasobject or arr.dtype.kind not in "biuf":
            raise ValueError(f"array {name!r}: only numeric dtypes are stored; got {arr.dtype}")
        arr = np.ascontiguousarray(arr)
        atomic_save_npy(path / f"{name}.npy", arr)
        entries[name] = {
            "file": f"{name}.npy",
            "dtype": arr.dtype.str,
            "shape": list(arr.shape),
            "sha256": sha256_array(arr),
        }
    doc = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "kind": kind,
        "arrays": entries,
        "models": {"ce": model_identity(ce), "de": model_identity(de)},
        "params": dict(params or {}),
        "ce_calls": int(ce_calls),
        "info": dict(info or {}),
    }
    atomic_write_json(path / "index.json", doc)
    return path


def load_index(
    path: str | os.PathLike,
    *,
    kind: str | None = None,
    ce: Any = None,
    de: Any = None,
    mmap: bool = True,
    verify: bool = True,
) -> Index:
    """Load and validate an index directory (arrays memory-mapped unless ``mmap=False``).

    ``verify`` checks every array's sha256 (reads each file once); ``ce``/``de`` (a model or
    scorer with ``model_id``/``model_hash``, or such a dict) are compared with the recorded ones.
    """
    path = Path(path)
    meta_path = path / "index.json"
    if not path.is_dir():
        raise FileNotFoundError(f"no index directory at {path}")
    if not meta_path.is_file():
        raise FileNotFoundError(f"{path} is not an index: index.json is missing")
    try:
        doc = json.loads(meta_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise IndexFormatError(f"{meta_path} is not valid JSON: {exc}") from exc
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise IndexFormatError(
            f"{meta_path}: expected format {FORMAT!r}, got {doc.get('format')!r}"
            if isinstance(doc, dict)
            else f"{meta_path}: expected a JSON object"
        )
    if doc.get("format_version") != FORMAT_VERSION:
        raise IndexFormatError(
            f"{meta_path}: format_version {doc.get('format_version')!r} is not supported "
            f"(this crossknn reads version {FORMAT_VERSION}); rebuild the index"
        )
    for key in ("kind", "arrays", "models", "params", "ce_calls", "info"):
        if key not in doc:
            raise IndexFormatError(f"{meta_path}: missing key {key!r}")
    if kind is not None and doc["kind"] != kind:
        raise IndexFormatError(f"{path} is a {doc['kind']!r} index; expected a {kind!r} index")
    arrays = {}
    for name, ent in doc["arrays"].items():
        f = path / ent["file"]
        if Path(ent["file"]).name != ent["file"]:
            raise IndexFormatError(
                f"{meta_path}: array file {ent['file']!r} must be a plain file name"
            )
        if not f.is_file():
            raise FileNotFoundError(f"index {path}: array file {ent['file']} is missing")
        try:
            arr = np.load(f, mmap_mode="r" if mmap else None, allow_pickle=False)
        except (ValueError, OSError, EOFError) as exc:
            raise IndexFormatError(
                f"index {path}: {ent['file']} is corrupt or truncated ({exc})"
            ) from exc
        if arr.dtype.str != ent["dtype"] or list(arr.shape) != list(ent["shape"]):
            raise IndexFormatError(
                f"index {path}: {ent['file']} has dtype {arr.dtype.str} shape {list(arr.shape)}, "
                f"index.json expects dtype {ent['dtype']} shape {ent['shape']}"
            )
        if verify and sha256_array(arr) != ent["sha256"]:
            raise IndexFormatError(
                f"index {path}: {ent['file']} is corrupt (content hash mismatch)"
            )
        arrays[name] = arr
    idx = Index(
        kind=doc["kind"],
        arrays=arrays,
        models=doc["models"],
        params=doc["params"],
        ce_calls=int(doc["ce_calls"]),
        info=doc["info"],
        path=path,
    )
    idx.check_models(ce=ce, de=de)
    return idx
