"""Whether a finished index is already what a build would make: the build's key.

``build`` records in ``index.json`` (``info.build_key``) a hash of everything its result depends
on: the items, the CE's and DE's identity (id, hash, kind, precision, maximum length), the build
settings and the build's recipe (:data:`BUILD_RECIPE`). A build asked again with the same key
into a folder whose index is that build, unchanged since (version 1: no refine, add or remove),
is up to date: nothing is redone (``force`` rebuilds it).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from crossknn.ce.folders import model_record
from crossknn.corpus.versions import index_version
from crossknn.corpus_folder import open_index
from crossknn.fileio import fingerprint, sha256_texts

__all__ = ["BUILD_RECIPE", "build_key", "up_to_date"]

#: bumped whenever what ``build`` makes from the same inputs changes (part of the key)
BUILD_RECIPE = 2  # 2: the default index budget follows from the corpus alone (no measured speed)


def _model(model: Any) -> dict[str, Any]:
    rec = model_record(model)
    out = {k: rec.get(k) for k in ("model_id", "model_hash", "kind", "precision")}
    out["max_length"] = getattr(model, "max_length", None)
    return out


def build_key(
    items_sha256: str,
    ce: Any,
    de: Any,
    *,
    train_queries: Sequence[str] | None,
    settings: Mapping[str, Any],
) -> str:
    """The key of a build of the items (hash of ``items.jsonl``) with these models, train
    queries and ``settings`` (every other argument that changes what the build makes)."""
    doc = {
        "recipe": BUILD_RECIPE,
        "items": items_sha256,
        "ce": _model(ce),
        "de": _model(de),
        "train_queries": sha256_texts(list(train_queries)) if train_queries else None,
        "settings": dict(settings),
    }
    return fingerprint(doc)


def up_to_date(out_dir: str | os.PathLike, key: str) -> bool:
    """Whether ``out_dir`` holds a finished index of the build with ``key``, unchanged since."""
    if not (Path(out_dir) / "index.json").is_file():
        return False
    try:
        index = open_index(out_dir)
    except (OSError, ValueError):
        return False  # a damaged index is rebuilt
    return index.info.get("build_key") == key and index_version(index) == 1
