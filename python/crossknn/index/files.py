"""Index directories: ``index.json`` plus one ``.npy`` file per array (memory-mapped on load).

``index.json`` (written last, atomically, keys sorted, so save -> load -> save is byte-identical)::

    {"format": "crossknn-index", "format_version": 1, "kind": "cur" | "mf",
     "arrays": {NAME: {"file": "NAME.npy", "dtype": "float32", "shape": [...], "sha256": "..."}},
     "models": {"ce": {"model_id": ..., "model_hash": ...}, "de": {...} | null},
     "params": {...}, "ce_calls": int, "info": {...}, "meta_sha256": "..."}

``meta_sha256`` is the sha256 of the canonical JSON of every other key: a hand edit of the
parameters is refused ("index.json was modified"); indexes written before it existed are read
without that check. Loading checks the format and version, the type of every key (one clear
line naming index.json and what was expected), the kind, every array's presence, header
dtype/shape and content hash, the recorded hash, that every number in ``params``/``info`` is
finite and that a recorded CE score map is in range, and (when given) that the CE/DE used at
search time are the ones the index was built with. No pickle: arrays are loaded with
``allow_pickle=False``; object dtypes and ``.npz`` archives are refused.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from crossknn.fileio import (
    atomic_save_npy,
    atomic_write_json,
    json_bytes,
    sha256_array,
    sha256_bytes,
)
from crossknn.identity import ModelMismatchError, model_identity
from crossknn.score_map import ScoreMap

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "Index",
    "IndexFormatError",
    "ModelMismatchError",
    "save_index",
    "load_index",
    "check_params",
    "fsync_dir",
    "meta_hash",
    "update_params",
]

FORMAT = "crossknn-index"
FORMAT_VERSION = 1
_NAME_OK = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")
HASH_KEY = "meta_sha256"


class IndexFormatError(ValueError):
    """The index directory is malformed, corrupt or of an unsupported version."""


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
    stage: str | os.PathLike | None = None,
    stale: Iterable[str] = (),
) -> Path:
    """Write an index directory: every file into a staging folder beside it first, then moved in
    by renames, ``index.json`` last (it marks the index complete).

    An old index in ``path`` stays whole and usable until the new one is complete: a failure
    while writing (a full disk, a bad array) leaves it untouched; only the final renames, which
    need no space, replace it. ``stage``: the staging folder (default a fresh ``.index-stage-*``
    in ``path``, removed afterwards); files the caller put there (``items.jsonl``) move in too.
    ``stale``: array names of an earlier index whose ``NAME.npy`` is removed if this index has no
    such array (arrays the old ``index.json`` lists are removed in any case)."""
    path = Path(path)
    if not kind or not isinstance(kind, str):
        raise ValueError(f"kind must be a non-empty string; got {kind!r}")
    if not arrays:
        raise ValueError("an index needs at least one array")
    for name, arr in arrays.items():
        if not name or set(name) - _NAME_OK:
            raise ValueError(f"array name {name!r} must be made of letters, digits, '_' and '-'")
        dtype = np.asarray(arr).dtype
        if dtype.hasobject or dtype.kind not in "biuf":
            raise ValueError(f"array {name!r}: only numeric dtypes are stored; got {dtype}")
    path.mkdir(parents=True, exist_ok=True)
    own_stage = stage is None
    st = Path(tempfile.mkdtemp(prefix=".index-stage-", dir=path) if own_stage else stage)
    try:
        st.mkdir(parents=True, exist_ok=True)
        _write_index(
            st, kind, arrays, ce=ce, de=de, params=params, ce_calls=ce_calls, info=info, final=path
        )
        _swap_in(st, path, {f"{s}.npy" for s in stale})
    finally:
        if own_stage:
            shutil.rmtree(st, ignore_errors=True)
    return path


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _listed_files(meta_path: Path) -> set[str]:
    """The array files an ``index.json`` lists (none if it is missing or unreadable)."""
    try:
        doc = json.loads(meta_path.read_bytes().decode("utf-8"))
        files = [e["file"] for e in doc["arrays"].values()]
        # a version's own item texts (crossknn.corpus.versions: items.vN.jsonl)
        files.append(doc["info"].get("items_file"))
        return {f for f in files if isinstance(f, str) and f and Path(f).name == f}
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return set()


def _swap_in(stage: Path, path: Path, stale: set[str]) -> None:
    """Move every file of ``stage`` into ``path``, ``index.json`` last; remove array files of the
    old index (and ``stale`` ones) that the new one does not have."""
    fsync_dir(stage)
    meta = path / "index.json"
    old = _listed_files(meta) | stale
    new = _listed_files(stage / "index.json")
    # the old index stops being one before any of its files is replaced: a reader (or a process
    # killed here) never sees the old index.json with new arrays
    try:
        os.unlink(meta)
        fsync_dir(path)
    except FileNotFoundError:
        pass
    for f in sorted(stage.iterdir()):
        if f.name != "index.json" and f.is_file():
            os.replace(f, path / f.name)
    for name in old - new:
        try:
            os.unlink(path / name)
        except FileNotFoundError:
            pass
    os.replace(stage / "index.json", meta)
    fsync_dir(path)


def _write_index(
    path: Path,
    kind: str,
    arrays: Mapping[str, np.ndarray],
    *,
    ce: Any,
    de: Any,
    params: Mapping | None,
    ce_calls: int,
    info: Mapping | None,
    final: Path,
) -> None:
    """Arrays, then ``index.json``, into the folder ``path`` (the index's ``final`` folder is
    the one errors name); params are checked before anything is written."""
    probe = {"params": dict(params or {}), "info": dict(info or {})}
    check_params(probe, final / "index.json")
    entries = {}
    for name, arr in arrays.items():
        arr = np.ascontiguousarray(np.asarray(arr))
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
    doc[HASH_KEY] = meta_hash(doc)
    atomic_write_json(path / "index.json", doc)


def update_params(path: str | os.PathLike, params: Mapping, *, ce_calls_added: int = 0) -> Path:
    """Rewrites ``index.json`` of a complete, valid index with new ``params`` (and ``ce_calls``
    grown by ``ce_calls_added``: what computing them spent), keeping its arrays; atomic, with a
    new ``meta_sha256``. For settings tuned on the built index (the rounds' FAISS widths)."""
    path = Path(path)
    load_index(path, verify=False)  # a complete index whose index.json was not hand-edited
    doc = json.loads((path / "index.json").read_bytes().decode("utf-8"))
    doc["params"] = dict(params)
    doc["ce_calls"] = int(doc["ce_calls"]) + int(ce_calls_added)
    check_params(doc, path / "index.json")
    doc[HASH_KEY] = meta_hash(doc)
    atomic_write_json(path / "index.json", doc)
    return path


def meta_hash(doc: Mapping) -> str:
    """sha256 of the canonical JSON of ``doc`` without its own hash."""
    return sha256_bytes(json_bytes({k: v for k, v in doc.items() if k != HASH_KEY}))


def _bad(meta_path: Path, what: str) -> IndexFormatError:
    return IndexFormatError(f"{meta_path}: {what}; rebuild the index")


def _finite_numbers(value: Any, where: str, meta_path: Path) -> None:
    """Every number in ``value`` (nested lists/dicts) is finite."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return
    if isinstance(value, (int, float)):
        if not np.isfinite(float(value)):
            raise _bad(meta_path, f"{where} must be a finite number; got {value!r}")
    elif isinstance(value, dict):
        for k, v in value.items():
            _finite_numbers(v, f"{where}.{k}", meta_path)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _finite_numbers(v, f"{where}[{i}]", meta_path)


def check_params(doc: Mapping, meta_path: Path) -> None:
    """Numbers finite, non-negative counts, and a recorded CE score map in range."""
    for key in ("params", "info"):
        _finite_numbers(doc[key], key, meta_path)
    params = doc["params"]
    for key in ("n_items", "dim", "n_calibration_queries", "calibration_items", "n_train_queries"):
        v = params.get(key)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
            raise _bad(meta_path, f"params.{key} must be a non-negative integer; got {v!r}")
    items_file = doc["info"].get("items_file")
    if items_file is not None and (
        not isinstance(items_file, str) or not items_file or Path(items_file).name != items_file
    ):
        raise _bad(meta_path, f"info.items_file must be a plain file name; got {items_file!r}")
    try:
        ScoreMap.from_params(params, what="params")
    except (ValueError, TypeError) as exc:
        raise _bad(meta_path, str(exc)) from None


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_structure(doc: dict, meta_path: Path) -> None:
    """The type of every key of ``index.json`` (one line naming the key and what was expected)."""
    for key in ("kind", "arrays", "models", "params", "ce_calls", "info"):
        if key not in doc:
            raise IndexFormatError(f"{meta_path}: missing key {key!r}")
    if not isinstance(doc["kind"], str) or not doc["kind"]:
        raise _bad(meta_path, f"'kind' must be a non-empty string; got {doc['kind']!r}")
    if not _is_int(doc["ce_calls"]) or doc["ce_calls"] < 0:
        raise _bad(meta_path, f"'ce_calls' must be a non-negative integer; got {doc['ce_calls']!r}")
    for key in ("params", "info", "models"):
        if not isinstance(doc[key], dict):
            raise _bad(meta_path, f"{key!r} must be an object; got {type(doc[key]).__name__}")
    if not isinstance(doc["arrays"], dict) or not doc["arrays"]:
        raise _bad(meta_path, "'arrays' must be a non-empty object {name: {file, dtype, shape}}")
    for name, ent in doc["arrays"].items():
        where = f"arrays.{name}"
        if not isinstance(ent, dict):
            raise _bad(meta_path, f"{where} must be an object; got {type(ent).__name__}")
        for key in ("file", "dtype", "sha256"):
            if not isinstance(ent.get(key), str) or not ent[key]:
                raise _bad(
                    meta_path, f"{where}.{key} must be a non-empty string; got {ent.get(key)!r}"
                )
        shape = ent.get("shape")
        if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
            raise _bad(
                meta_path, f"{where}.shape must be a list of non-negative integers; got {shape!r}"
            )
        if Path(ent["file"]).name != ent["file"] or not ent["file"].endswith(".npy"):
            raise _bad(meta_path, f"{where}.file {ent['file']!r} must be a plain .npy file name")
    for role in ("ce", "de"):
        m = doc["models"].get(role)
        if m is None and role == "de":
            continue
        if (
            not isinstance(m, dict)
            or not isinstance(m.get("model_hash"), str)
            or not m["model_hash"]
            or not (m.get("model_id") is None or isinstance(m.get("model_id"), str))
        ):
            raise _bad(
                meta_path, f"models.{role} must be {{model_id, model_hash}} (strings); got {m!r}"
            )


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


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
        doc = json.loads(meta_path.read_bytes().decode("utf-8"), parse_constant=_no_constant)
    except (json.JSONDecodeError, UnicodeDecodeError, ValueError) as exc:
        raise IndexFormatError(f"{meta_path} is not valid JSON: {exc}") from None
    except OSError as exc:
        raise IndexFormatError(f"{meta_path}: cannot be read ({exc.strerror or exc})") from None
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
    _check_structure(doc, meta_path)
    if kind is not None and doc["kind"] != kind:
        raise IndexFormatError(f"{path} is a {doc['kind']!r} index; expected a {kind!r} index")
    arrays = {}
    for name, ent in doc["arrays"].items():
        f = path / ent["file"]
        if not f.is_file():
            raise FileNotFoundError(f"index {path}: array file {ent['file']} is missing")
        try:
            arr = np.load(f, mmap_mode="r" if mmap else None, allow_pickle=False)
        except (ValueError, OSError, EOFError) as exc:
            raise IndexFormatError(
                f"index {path}: {ent['file']} is corrupt or truncated ({exc})"
            ) from None
        if not isinstance(arr, np.ndarray):  # an .npz archive under a .npy name
            raise IndexFormatError(f"index {path}: {ent['file']} is not a .npy array file")
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
    if HASH_KEY in doc and doc[HASH_KEY] != meta_hash(doc):
        raise IndexFormatError(
            f"{meta_path}: index.json was modified after the index was built (its recorded "
            f"{HASH_KEY} does not match); rebuild the index"
        )
    check_params(doc, meta_path)
    idx = Index(
        kind=doc["kind"],
        arrays=arrays,
        models=doc["models"],
        params=doc["params"],
        ce_calls=doc["ce_calls"],
        info=doc["info"],
        path=path,
    )
    idx.check_models(ce=ce, de=de)
    return idx
