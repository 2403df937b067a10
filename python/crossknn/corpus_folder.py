"""A built corpus index folder, opened: :class:`CorpusIndex` (arrays, metadata, corpus) and
:func:`open_index`, which checks the item texts against the recorded hash. Built by
:func:`crossknn.corpus.build.build_corpus_index`."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from crossknn.data import Corpus
from crossknn.fileio import sha256_bytes
from crossknn.identity import ModelMismatchError, model_identity
from crossknn.index.files import Index, load_index
from crossknn.metadata import ItemMetadata

__all__ = ["CORPUS_KIND", "ITEMS_FILE", "CorpusIndex", "open_index"]

CORPUS_KIND = "corpus"
ITEMS_FILE = "items.jsonl"


@dataclass
class CorpusIndex:
    """A loaded corpus index: the index directory's arrays and metadata, and its corpus."""

    index: Index
    corpus: Corpus
    _metadata: ItemMetadata | None = field(default=None, repr=False, compare=False)

    @property
    def path(self) -> Path | None:
        return self.index.path

    @property
    def params(self) -> dict:
        return self.index.params

    @property
    def info(self) -> dict:
        return self.index.info

    @property
    def arrays(self) -> dict[str, np.ndarray]:
        return self.index.arrays

    @property
    def ce_calls(self) -> int:
        return self.index.ce_calls

    @property
    def metadata(self) -> ItemMetadata:
        """The items' metadata fields (:mod:`crossknn.metadata`; none for an index built from
        items without other fields), read once."""
        if self._metadata is None:
            self._metadata = ItemMetadata.from_index(self.arrays, self.params, len(self.corpus))
        return self._metadata

    def __getitem__(self, name: str) -> np.ndarray:
        return self.index[name]

    def __len__(self) -> int:
        return len(self.corpus)

    def __repr__(self) -> str:
        return (
            f"CorpusIndex(path={str(self.path)!r}, n_items={len(self)}, "
            f"arrays={sorted(self.arrays)}, ce_calls={self.ce_calls})"
        )

    @property
    def model_records(self) -> dict[str, dict | None]:
        """The CE and DE the index was built with: ``info["models"]`` (identity, hash, kind,
        precision, where found), else (older indexes) the recorded identities, fp32."""
        recs = self.info.get("models")
        if isinstance(recs, dict):
            return {role: recs.get(role) for role in ("ce", "de")}
        return {role: self.index.models.get(role) for role in ("ce", "de")}

    def check_models(self, *, ce: Any = None, de: Any = None) -> None:
        """ModelMismatchError naming the first field that differs (precision, model, hash)
        between the recorded CE/DE and ``ce``/``de``, with both values."""
        recs = self.model_records
        for role, given in (("ce", ce), ("de", de)):
            have = recs.get(role)
            if given is None or have is None:
                continue
            want = model_identity(given)
            pairs = (
                # the folder variant that runs (fp16 runs the recorded fp32 graph on a GPU)
                (
                    "precision",
                    have.get("precision"),
                    getattr(given, "variant", None) or getattr(given, "precision", None),
                ),
                ("model", have.get("model_id"), want["model_id"]),
                ("hash", have.get("model_hash"), want["model_hash"]),
            )
            for name, built, now in pairs:
                if built is not None and now is not None and built != now:
                    raise ModelMismatchError(
                        f"index {self.path} was built with {role.upper()} {name} {built!r}, but "
                        f"this run uses {name} {now!r} ({role.upper()} {want['model_id']!r}); "
                        f"use the index's model (the default), or rebuild the index with this one"
                    )
        self.index.check_models(ce=ce, de=de)


def open_index(path: str | os.PathLike, *, verify: bool = True) -> CorpusIndex:
    """Load a corpus index directory and check its items file against the recorded hash."""
    idx = load_index(path, kind=CORPUS_KIND, verify=verify)
    items_path = Path(path) / idx.info.get("items_file", ITEMS_FILE)
    if not items_path.is_file():
        raise FileNotFoundError(f"index {path}: {items_path.name} (the item texts) is missing")
    data = items_path.read_bytes()
    if verify and sha256_bytes(data) != idx.info.get("items_sha256"):
        raise ValueError(
            f"index {path}: {items_path.name} does not match the recorded hash "
            "(changed or corrupt); rebuild the index"
        )
    ids, texts = [], []
    for line in data.decode("utf-8").splitlines():
        rec = json.loads(line)
        ids.append(rec["id"])
        texts.append(rec["text"])
    if len(ids) != idx["de_items"].shape[0]:
        raise ValueError(f"index {path}: {len(ids)} items but {idx['de_items'].shape[0]} vectors")
    return CorpusIndex(idx, Corpus(ids, texts, str(items_path)))
