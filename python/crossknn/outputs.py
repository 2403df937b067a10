"""Where a command may write: never over a file of an index, score-matrix or model folder, never
over one of its own inputs.

Every output path of the CLI (``--json``, ``--run``, ``--first-stage-run``, ``--metrics``, plots)
goes through :func:`check_output_file`, every output folder (``score-matrix OUT_DIR``, ``index
cur|mf OUT_DIR``, ``export OUT_DIR``, ``train-ce OUT_DIR``) through :func:`check_output_folder`.
Folders are recognized by their marker files (:func:`folder_kind`); paths are compared resolved
(symlinks followed), and by inode where both exist (hard links). A refusal is one
``ValueError`` line naming the path and what it belongs to, raised before anything is written.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

__all__ = ["check_output_file", "check_output_folder", "folder_kind", "own_entry"]

MODEL_MANIFEST = "crossknn_model.json"  # crossknn.ce.manifest.MANIFEST (not imported: no torch)
_HF_WEIGHTS = ("model.safetensors", "pytorch_model.bin")

# names no output file may take inside a recognized folder (they would make it look like, or
# replace a piece of, one of these folders)
_RESERVED_NAMES = {
    "index.json",
    "items.jsonl",
    "meta.json",
    "query_ids.json",
    "item_ids.json",
    "splits.json",
    MODEL_MANIFEST,
    "tokenizer.json",
    "config.json",
    "cmc.json",
    ".lock",
}
_RESERVED_SUFFIXES = (".npy", ".onnx", ".safetensors", ".pt", ".bin")

# what each kind of folder may hold besides atomic-write temp files (".NAME.RANDOM.tmp")
_OWN = {
    "index": (
        {"index.json", "items.jsonl", ".lock"},
        {".build", ".job", "exact"},
        (".npy",),
    ),
    "score-matrix": (
        {"meta.json", "query_ids.json", "item_ids.json", "splits.json", ".lock"},
        {".job"},
        (".npy",),
    ),
}


def folder_kind(folder: str | os.PathLike) -> str | None:
    """``"index"``, ``"score-matrix"``, ``"model"`` (crossknn), ``"CMC model"``, ``"Hugging Face
    checkpoint"`` or ``None``, from the marker files ``folder`` holds."""
    f = Path(folder)
    try:
        if not f.is_dir():
            return None
        if (f / "index.json").is_file():
            return "index"
        if (f / "meta.json").is_file() and (f / "scores.npy").is_file():
            return "score-matrix"
        if (f / MODEL_MANIFEST).is_file():
            return "model"
        if (f / "cmc.json").is_file():
            return "CMC model"
        if (f / "config.json").is_file() and any((f / w).is_file() for w in _HF_WEIGHTS):
            return "Hugging Face checkpoint"
    except OSError:
        return None
    return None


def _resolved(path: str | os.PathLike) -> Path:
    return Path(os.path.realpath(os.fspath(path)))


def _same(a: Path, b: Path) -> bool:
    if _resolved(a) == _resolved(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _within(path: Path, folder: Path) -> bool:
    """Whether resolved ``path`` is ``folder`` or lies under it (both resolved)."""
    try:
        _resolved(path).relative_to(_resolved(folder))
    except ValueError:
        return False
    return True


def _owner(path: Path) -> tuple[str, Path] | None:
    """The nearest recognized folder above ``path`` (resolved): (kind, folder)."""
    for parent in _resolved(path).parents:
        kind = folder_kind(parent)
        if kind is not None:
            return kind, parent
    return None


def _a(kind: str) -> str:
    return ("an " if kind[0] in "aeiouAEIOU" else "a ") + kind


def _reserved(name: str) -> bool:
    return name in _RESERVED_NAMES or name.endswith(_RESERVED_SUFFIXES)


def _inputs(inputs: Iterable[tuple[str, str | os.PathLike | None]]) -> list[tuple[str, Path]]:
    return [(what, Path(p)) for what, p in inputs if p not in (None, "", "-")]


def check_output_file(
    path: str | os.PathLike,
    *,
    option: str,
    inputs: Iterable[tuple[str, str | os.PathLike | None]] = (),
    others: Iterable[tuple[str, str | os.PathLike | None]] = (),
) -> None:
    """Refuse (ValueError, one line) to write the file ``path`` (given as ``option``) when it is:
    a folder; one of ``inputs`` ((what, path) pairs: the command's input files and folders) or a
    file inside an input folder; a file of an index folder (any name), or an existing file or a
    reserved name (``meta.json``, ``*.npy``, ``*.onnx`` ...) inside a score-matrix or model
    folder; the same file as another output in ``others``."""
    p = Path(path)
    where = f"{option} {p}"
    if p.is_dir():
        raise ValueError(f"{where} is a folder; give a file name")
    named = _inputs(inputs)
    for what, src in named:
        if _same(p, src):
            raise ValueError(f"{where} is the input {what} {src} of this command; write elsewhere")
    for what, other in _inputs(others):
        if _same(p, other):
            raise ValueError(f"{where} is also the output {what}; give each output its own file")
    owner = _owner(p)
    if owner is not None:
        kind, folder = owner
        if kind == "index" or p.exists() or p.is_symlink() or _reserved(p.name):
            rel = _resolved(p).relative_to(folder)
            raise ValueError(
                f"{where} would overwrite {rel} of the {kind} folder {folder}; write elsewhere"
                if p.exists()
                else f"{where} would put {rel} into the {kind} folder {folder}; write elsewhere"
            )
    for what, src in named:
        if src.is_dir() and _within(p, src) and p.exists():
            raise ValueError(
                f"{where} is a file of the input {what} {src} of this command; write elsewhere"
            )


def own_entry(kind: str, name: str, is_dir: bool) -> bool:
    """Whether a folder of ``kind`` ("index", "score-matrix") may hold the entry ``name``."""
    files, folders, suffixes = _OWN[kind]
    if name.startswith(".") and name.endswith(".tmp"):
        return True
    if is_dir:  # its work folders, and the staging folder of an index write that was killed
        return name in folders or kind == "index" and name.startswith(".index-stage-")
    return name in files or name.endswith(suffixes)


def check_output_folder(
    out: str | os.PathLike,
    *,
    kind: str,
    inputs: Iterable[tuple[str, str | os.PathLike | None]] = (),
    foreign: bool = True,
) -> None:
    """Refuse (ValueError, one line) to write a ``kind`` folder ("index", "score-matrix",
    "model", "CE training") at ``out`` when it is a file, is or holds one of ``inputs``, is (or
    lies inside) a recognized folder of another kind, or (``foreign``, for "index" and
    "score-matrix") holds entries that are not a ``kind`` folder's own."""
    o = Path(out)
    if o.exists() and not o.is_dir():
        raise ValueError(f"{o} exists and is not a folder; give a new or empty folder")
    for what, src in _inputs(inputs):
        if _same(o, src) or _within(src, o):
            raise ValueError(
                f"the output folder {o} is or holds the input {what} {src} of this command; "
                "give another output folder"
            )
    have = folder_kind(o)
    if have is not None and have != kind:
        raise ValueError(
            f"the output folder {o} is {_a(have)} folder; {_a(kind)} folder is not written over "
            "it: give another output folder"
        )
    owner = _owner(o)
    if owner is not None:
        raise ValueError(
            f"the output folder {o} lies inside the {owner[0]} folder {owner[1]}; give another "
            "output folder"
        )
    if not foreign or kind not in _OWN or not o.is_dir():
        return
    for e in o.iterdir():
        if not own_entry(kind, e.name, e.is_dir() and not e.is_symlink()):
            raise ValueError(
                f"the output folder {o} holds {e.name!r}, which is not part of {_a(kind)} folder; "
                f"give a new or empty folder (or {_a(kind)} folder to resume or rebuild)"
            )
