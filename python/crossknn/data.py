"""Loaders: BEIR corpus folders and score-matrix folders (``shared/BENCHMARKS.md`` formats)."""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

__all__ = [
    "BeirCorpus",
    "ScoreMatrix",
    "item_text",
    "load_beir",
    "load_score_matrix",
    "shared_dir",
]


def shared_dir() -> Path:
    """``../shared`` next to the repository root (where data and matrices live)."""
    return Path(__file__).resolve().parents[2].parent / "shared"


def item_text(title: str | None, text: str | None) -> str:
    """Item text convention of every matrix: ``text`` if the title is empty or ``text`` already
    starts with it, else ``title + " " + text``."""
    title = (title or "").strip()
    text = text or ""
    if not title or text.startswith(title):
        return text
    return f"{title} {text}"


def _read_jsonl(path: Path) -> list[dict]:
    rows = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{n}: not a JSON object ({exc.msg})") from None
    return rows


@dataclass
class BeirCorpus:
    """A BEIR folder: items (``corpus.jsonl``), queries and qrels."""

    item_ids: list[str]
    item_texts: list[str]
    query_ids: list[str]
    query_texts: list[str]
    qrels: dict[str, dict[str, dict[str, int]]] = field(default_factory=dict)  # split->q->doc->rel

    def items_in_order(self, ids: list[str]) -> list[str]:
        """Item texts in the order of ``ids`` (e.g. a score matrix's columns)."""
        pos = {i: n for n, i in enumerate(self.item_ids)}
        missing = [i for i in ids if i not in pos]
        if missing:
            raise KeyError(f"{len(missing)} item ids not in the corpus, e.g. {missing[0]!r}")
        return [self.item_texts[pos[i]] for i in ids]

    def queries_in_order(self, ids: list[str]) -> list[str]:
        pos = {i: n for n, i in enumerate(self.query_ids)}
        missing = [i for i in ids if i not in pos]
        if missing:
            raise KeyError(f"{len(missing)} query ids not in the corpus, e.g. {missing[0]!r}")
        return [self.query_texts[pos[i]] for i in ids]


def load_beir(folder: str | Path) -> BeirCorpus:
    folder = Path(folder)
    corpus, queries = folder / "corpus.jsonl", folder / "queries.jsonl"
    for p in (corpus, queries):
        if not p.is_file():
            raise FileNotFoundError(f"{folder} is not a BEIR folder: {p.name} is missing")
    items = _read_jsonl(corpus)
    qs = _read_jsonl(queries)
    qrels: dict[str, dict[str, dict[str, int]]] = {}
    for tsv in sorted((folder / "qrels").glob("*.tsv")):
        split: dict[str, dict[str, int]] = {}
        with open(tsv, encoding="utf-8", newline="") as f:
            reader = csv.reader(f, delimiter="\t")
            next(reader, None)  # header
            for row in reader:
                if len(row) >= 3:
                    split.setdefault(row[0], {})[row[1]] = int(float(row[2]))
        qrels[tsv.stem] = split
    return BeirCorpus(
        item_ids=[str(r["_id"]) for r in items],
        item_texts=[item_text(r.get("title"), r.get("text")) for r in items],
        query_ids=[str(r["_id"]) for r in qs],
        query_texts=[str(r.get("text", "")) for r in qs],
        qrels=qrels,
    )


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
        return shared_dir() / "data" / str(name)


def _load_json(path: Path):
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing")
    with open(path, encoding="utf-8") as f:
        return json.load(f)


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
    meta = _load_json(folder / "meta.json") if (folder / "meta.json").is_file() else {}
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
