"""The manifest of an exported model directory (``crossknn_model.json``) and its checks.

An exported model directory holds ``tokenizer.json``, one ONNX file per precision and the manifest,
written last. A directory without a manifest, or with a file missing or of the wrong size, is
never used: the error names the missing or damaged file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from crossknn.fileio import sha256_file

__all__ = ["MANIFEST", "FORMAT_VERSION", "KINDS", "read_manifest", "write_manifest"]

MANIFEST = "crossknn_model.json"
FORMAT_VERSION = 1
# cls-ce: [CLS]-pooled sequence classifier (one logit, activation applied by the runtime)
# joint-ce: [EMB]-CE, query/item segment vectors pooled from one joint pass, score = dot product
# dual-encoder: one text -> one L2-normalized vector
KINDS = ("cls-ce", "joint-ce", "dual-encoder")


def file_entry(path: Path) -> dict[str, Any]:
    return {"sha256": sha256_file(path), "bytes": path.stat().st_size}


def write_manifest(model_dir: str | os.PathLike, manifest: dict[str, Any]) -> None:
    """Write the manifest atomically (temp file + rename): it is the last file of an export."""
    model_dir = Path(model_dir)
    tmp = model_dir / f".{MANIFEST}.{os.getpid()}.tmp"
    with tmp.open("w", encoding="utf-8") as fh:
        json.dump(manifest, fh, indent=1, sort_keys=True)
        fh.write("\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, model_dir / MANIFEST)


def read_manifest(model_dir: str | os.PathLike, *, verify_hashes: bool = False) -> dict[str, Any]:
    """Read and check the manifest of an exported model directory.

    Raises FileNotFoundError naming the missing file (the directory, the manifest, the tokenizer,
    an ONNX file) and ValueError for a damaged manifest or a file of the wrong size or hash.
    """
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise FileNotFoundError(f"model directory not found: {model_dir}")
    path = model_dir / MANIFEST
    if not path.is_file():
        hint = ""
        if (model_dir / "config.json").is_file():
            hint = (
                " (this looks like a Hugging Face checkpoint: export it first with "
                "crossknn.ce.export_cross_encoder / export_dual_encoder)"
            )
        raise FileNotFoundError(f"missing file {path}: not an exported crossknn model{hint}")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc.msg})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_VERSION:
        got = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
        raise ValueError(f"{path}: expected manifest format {FORMAT_VERSION}, got {got!r}")
    if manifest.get("kind") not in KINDS:
        raise ValueError(f"{path}: kind must be one of {KINDS}, got {manifest.get('kind')!r}")
    files = manifest.get("files")
    variants = manifest.get("variants")
    if not isinstance(files, dict) or not isinstance(variants, dict) or not variants:
        raise ValueError(f"{path}: manifest lists no files/variants")
    for name, entry in files.items():
        f = model_dir / name
        if not f.is_file():
            raise FileNotFoundError(f"missing file {f} (listed in {path}); re-export the model")
        size = f.stat().st_size
        if size != entry["bytes"]:
            raise ValueError(
                f"{f}: expected {entry['bytes']} bytes (per {MANIFEST}), found {size}: "
                "the file is damaged or half-written; re-export the model"
            )
        if verify_hashes and sha256_file(f) != entry["sha256"]:
            raise ValueError(f"{f}: sha256 differs from {MANIFEST}; re-export the model")
    return manifest
