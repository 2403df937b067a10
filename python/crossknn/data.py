"""Reading text data: JSONL files, BEIR folders, query files. One reader, one set of checks.

- :func:`read_jsonl`: JSON objects, one per line; every error names the file and the line.
- :func:`load_corpus`: a user's corpus (``id``/``_id``, ``text``, optional ``title``), from a JSONL
  file or a BEIR folder, as a :class:`Corpus` (ids and item texts).
- :func:`load_beir`: a BEIR folder (``corpus.jsonl``, ``queries.jsonl``, ``qrels/<split>.tsv``).
- :func:`read_queries`: queries from JSONL (``text``) or plain text, one per line;
  :func:`read_query_file` also their ids (JSONL ``_id``/``id``, else the line number).
- :func:`read_qrels`: relevance judgments from a BEIR ``.tsv`` or a TREC qrels file.
- :func:`data_roots`, :func:`find_beir`, :func:`describe_beir`: where BEIR folders are found by
  name (``$CROSSKNN_DATA``, ``os.pathsep``-separated folders holding ``<name>/`` or
  ``data/<name>/``) and what one holds (``crossknn data``).

The BEIR layout (what BEIR's and ir_datasets' public downloads unpack to)::

    NAME/corpus.jsonl      {"_id": "d1", "title": "...", "text": "..."} per line
    NAME/queries.jsonl     {"_id": "q1", "text": "..."} per line
    NAME/qrels/test.tsv    query-id<TAB>corpus-id<TAB>score, after a header line (also train, dev)

Item text convention (the benchmark matrices'): ``text`` if the title is empty or ``text``
already starts with it, else ``title + " " + text`` (:func:`item_text`).
"""

from __future__ import annotations

import csv
import json
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from crossknn.metadata import flatten

__all__ = [
    "DATA_ENV",
    "BeirCorpus",
    "Corpus",
    "data_roots",
    "describe_beir",
    "find_beir",
    "list_beir",
    "item_text",
    "load_beir",
    "load_corpus",
    "read_jsonl",
    "read_qrels",
    "read_queries",
    "read_query_file",
]


#: The environment variable naming the folder(s) that hold BEIR datasets.
DATA_ENV = "CROSSKNN_DATA"

#: Where the public BEIR datasets come from (one line, printed when none is found).
BEIR_SOURCE = (
    "the public BEIR datasets (nfcorpus, scifact, fiqa, ...) are zip files on the BEIR "
    "benchmark's download page (github.com/beir-cellar/beir), each unpacking to this layout"
)


def item_text(title: str | None, text: str | None) -> str:
    """Item text convention of every matrix: ``text`` if the title is empty or ``text`` already
    starts with it, else ``title + " " + text``."""
    title = (title or "").strip()
    text = text or ""
    if not title or text.startswith(title):
        return text
    return f"{title} {text}"


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, line) of a UTF-8 text file; a decoding error names the file and line."""
    with path.open("rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            try:
                yield lineno, raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ValueError(
                    f"{path}:{lineno}: not UTF-8 text (byte {exc.start} of the line)"
                ) from None


def read_jsonl(path: str | os.PathLike) -> Iterator[tuple[int, dict]]:
    """``(line number, object)`` for every non-blank line of a JSONL file of JSON objects."""
    path = Path(path)
    for lineno, line in _lines(path):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from None
        if not isinstance(rec, dict):
            raise ValueError(f"{path}:{lineno}: expected a JSON object, got {type(rec).__name__}")
        yield lineno, rec


def _check_unicode(src, lineno: int, text: str, what: str) -> None:
    """Refuse a lone surrogate (``"\\ud800"`` in JSON): it is not text and cannot be written."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"{src}:{lineno}: {what} holds an invalid character (lone surrogate "
            f"U+{ord(text[exc.start]):04X} at position {exc.start}); fix the text"
        ) from None


def _record_id(path: Path, lineno: int, rec: dict) -> str:
    rid = rec.get("id", rec.get("_id"))
    if rid is None or (isinstance(rid, str) and not rid):
        raise ValueError(f"{path}:{lineno}: missing 'id' (or '_id')")
    return str(rid)


@dataclass(frozen=True)
class Corpus:
    """A corpus: parallel lists of item ids and item texts, where it came from, and each item's
    metadata fields (``metadata``: one flat mapping per item, :func:`crossknn.metadata.flatten`
    of its other JSON keys; None: no item has any)."""

    ids: list[str]
    texts: list[str]
    source: str = ""
    metadata: list[dict] | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if len(self.ids) != len(self.texts):
            raise ValueError(
                f"ids ({len(self.ids)}) and texts ({len(self.texts)}) differ in length"
            )
        if self.metadata is not None and len(self.metadata) != len(self.ids):
            raise ValueError(
                f"metadata ({len(self.metadata)} records) and ids ({len(self.ids)}) differ in "
                "length"
            )

    def __len__(self) -> int:
        return len(self.ids)

    def __repr__(self) -> str:
        return f"Corpus(n_items={len(self)}, source={self.source!r})"


def _read_corpus(path: Path) -> Corpus:
    ids: list[str] = []
    texts: list[str] = []
    meta: list[dict] = []
    seen: set[str] = set()
    for lineno, rec in read_jsonl(path):
        rid = _record_id(path, lineno, rec)
        text = rec.get("text")
        title = rec.get("title")
        if "text" not in rec:
            raise ValueError(f"{path}:{lineno}: item {rid!r} is missing 'text'")
        for key, value in (("text", text), ("title", title)):
            if value is not None and not isinstance(value, str) or key == "text" and text is None:
                raise ValueError(
                    f"{path}:{lineno}: {key!r} must be a string; got {type(value).__name__}"
                )
        joined = item_text(title, text)
        if not joined.strip():
            raise ValueError(f"{path}:{lineno}: item {rid!r} has an empty text")
        if rid in seen:
            raise ValueError(f"{path}:{lineno}: duplicate id {rid!r}")
        _check_unicode(path, lineno, rid, "the id")
        _check_unicode(path, lineno, joined, "the text")
        seen.add(rid)
        ids.append(rid)
        texts.append(joined)
        meta.append(flatten(rec, where=f"{path}:{lineno}"))
    if not ids:
        raise ValueError(f"{path}: the corpus is empty (no JSON lines)")
    return Corpus(ids, texts, str(path), meta if any(meta) else None)


def load_corpus(path: str | os.PathLike) -> Corpus:
    """Load a JSONL corpus file (``id``/``_id``, ``text``, optional ``title``) or a BEIR folder.
    A pipe or character device (``<(...)``, ``/dev/stdin``) is read like a file."""
    p = Path(path)
    if p.is_dir():
        if not (p / "corpus.jsonl").is_file():
            raise FileNotFoundError(
                f"{p} is a folder but has no corpus.jsonl (BEIR layout expected)"
            )
        p = p / "corpus.jsonl"
    elif not p.exists():
        raise FileNotFoundError(f"corpus not found: {p}")
    return _read_corpus(p)


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


def _read_qrels(tsv: Path) -> dict[str, dict[str, int]]:
    """A BEIR qrels ``.tsv``; a line without its 3 columns names the file and line."""
    split: dict[str, dict[str, int]] = {}
    with open(tsv, encoding="utf-8", newline="") as f:
        reader = csv.reader(f, delimiter="\t")
        next(reader, None)  # header
        for row in reader:
            if row and any(c.strip() for c in row) and len(row) < 3:
                raise ValueError(
                    f"{tsv}:{reader.line_num}: expected 3 tab-separated columns (query-id, "
                    f"corpus-id, score) as in a BEIR qrels .tsv; got {len(row)}"
                )
            if len(row) >= 3:
                try:
                    rel = int(float(row[2]))
                except ValueError:
                    raise ValueError(
                        f"{tsv}:{reader.line_num}: relevance {row[2]!r} is not a number"
                    ) from None
                split.setdefault(row[0], {})[row[1]] = rel
    return split


def load_beir(folder: str | os.PathLike) -> BeirCorpus:
    folder = Path(folder)
    corpus, queries = folder / "corpus.jsonl", folder / "queries.jsonl"
    for p in (corpus, queries):
        if not p.is_file():
            raise FileNotFoundError(f"{folder} is not a BEIR folder: {p.name} is missing")
    items = [(_record_id(corpus, n, r), r) for n, r in read_jsonl(corpus)]
    qs = [(_record_id(queries, n, r), r) for n, r in read_jsonl(queries)]
    qrels = {tsv.stem: _read_qrels(tsv) for tsv in sorted((folder / "qrels").glob("*.tsv"))}
    return BeirCorpus(
        item_ids=[i for i, _ in items],
        item_texts=[item_text(r.get("title"), r.get("text")) for _, r in items],
        query_ids=[i for i, _ in qs],
        query_texts=[str(r.get("text", "")) for _, r in qs],
        qrels=qrels,
    )


def read_qrels(path: str | os.PathLike) -> dict[str, dict[str, int]]:
    """``{qid: {docid: relevance}}`` from a BEIR qrels ``.tsv`` (``query-id corpus-id score``,
    header line) or a TREC qrels file (``qid 0 docid rel``, whitespace-separated)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"qrels file not found: {path}")
    first = next((line for _, line in _lines(path) if line.strip()), "")
    if "\t" in first and len(first.split("\t")) == 3:
        qrels = _read_qrels(path)
        if not qrels:
            raise ValueError(
                f"{path}: no relevance judgments found (a BEIR .tsv: header, then "
                "query-id<TAB>corpus-id<TAB>score lines)"
            )
        return qrels
    qrels: dict[str, dict[str, int]] = {}
    for lineno, line in _lines(path):
        parts = line.split()
        if not parts:
            continue
        if len(parts) != 4:
            raise ValueError(
                f"{path}:{lineno}: expected 4 columns 'qid 0 docid relevance' (TREC qrels) or a "
                f"BEIR .tsv (header, then query-id<TAB>corpus-id<TAB>score); got {len(parts)} "
                "columns"
            )
        try:
            rel = int(float(parts[3]))
        except ValueError:
            raise ValueError(f"{path}:{lineno}: relevance {parts[3]!r} is not a number") from None
        qrels.setdefault(parts[0], {})[parts[2]] = rel
    if not qrels:
        raise ValueError(f"{path}: no relevance judgments found")
    return qrels


def read_query_file(path: str, *, filters: list | None = None) -> tuple[list[str], list[str]]:
    """``(ids, texts)`` of a query file: JSONL lines keep their ``_id``/``id`` (a line without
    one, or a plain-text line, gets its line number as id). ``filters`` (a list) receives each
    query's ``filter`` (a JSON line's object, :mod:`crossknn.filters`; None without one)."""
    ids: list[str] = []
    texts = read_queries(path, ids=ids, filters=filters)
    return ids, texts


def read_queries(
    path: str, *, ids: list[str] | None = None, filters: list | None = None
) -> list[str]:
    """Queries from a file (``-``: standard input): JSONL with ``text`` per line, or plain text,
    one query per line. ``ids`` (a list) receives each query's id, ``filters`` its filter (see
    :func:`read_query_file`)."""
    if path == "-":
        numbered = list(enumerate(sys.stdin.read().splitlines(), start=1))
        src = "stdin"
    else:
        p = Path(path)
        if not p.exists() or p.is_dir():
            raise FileNotFoundError(f"queries file not found: {p}")
        numbered = list(_lines(p))
        src = str(p)
    out = []
    for lineno, line in numbered:
        if not line.strip():
            continue
        if line.lstrip().startswith("{"):
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{src}:{lineno}: not valid JSON ({exc.msg})") from None
            text = rec.get("text") if isinstance(rec, dict) else None
            if not isinstance(text, str) or not text.strip():
                raise ValueError(f"{src}:{lineno}: a JSON query line needs a non-empty 'text'")
            _check_unicode(src, lineno, text, "the query")
            out.append(text)
            qid = rec.get("_id", rec.get("id"))
            flt = rec.get("filter")
            if flt is not None and not isinstance(flt, dict):
                raise ValueError(f"{src}:{lineno}: 'filter' must be a JSON object")
        else:
            out.append(line.strip())
            qid, flt = None, None
        if filters is not None:
            filters.append(flt)
        if ids is not None:
            ids.append(str(lineno) if qid is None else str(qid))
    if not out:
        raise ValueError(f"{src}: no queries found")
    return out


def data_roots() -> list[Path]:
    """The folders named by ``$CROSSKNN_DATA`` (``os.pathsep``-separated), in order."""
    return [Path(p) for p in os.environ.get(DATA_ENV, "").split(os.pathsep) if p]


def _is_beir(folder: Path) -> bool:
    return (folder / "corpus.jsonl").is_file() and (folder / "queries.jsonl").is_file()


def find_beir(name: str | os.PathLike) -> Path:
    """The BEIR folder ``name``: an existing path, else ``ROOT/name`` or ``ROOT/data/name`` for
    the first ``ROOT`` of ``$CROSSKNN_DATA`` that has it. The error says where it looked and
    what the layout is."""
    path = Path(name)
    if path.exists():
        if not path.is_dir():
            raise NotADirectoryError(f"{path} is a file; a BEIR folder is expected")
        if not _is_beir(path):
            missing = [f for f in ("corpus.jsonl", "queries.jsonl") if not (path / f).is_file()]
            raise FileNotFoundError(
                f"{path} is not a BEIR folder: {', '.join(missing)} missing "
                "(expected corpus.jsonl, queries.jsonl, qrels/<split>.tsv)"
            )
        return path
    looked = []
    if len(path.parts) == 1:
        for root in data_roots():
            for cand in (root / path, root / "data" / path):
                looked.append(str(cand))
                if _is_beir(cand):
                    return cand
    where = (
        f"looked in {', '.join(looked)}"
        if looked
        else f"not a folder, and ${DATA_ENV} is not set (the folder that holds BEIR datasets)"
    )
    raise FileNotFoundError(f"BEIR dataset {str(name)!r} not found: {where}; {BEIR_SOURCE}")


def list_beir() -> list[Path]:
    """Every BEIR folder directly under a ``$CROSSKNN_DATA`` root (or its ``data/``)."""
    found = []
    for root in data_roots():
        for base in (root, root / "data"):
            if base.is_dir():
                found += [d for d in sorted(base.iterdir()) if d.is_dir() and _is_beir(d)]
    return found


def _count_lines(path: Path) -> int:
    with path.open("rb") as fh:
        return sum(1 for line in fh if line.strip())


def describe_beir(folder: str | os.PathLike) -> dict:
    """What a BEIR folder holds: ``{"path", "items", "queries", "qrels": {split: {"queries",
    "judgments"}}}`` (lines counted; the files are checked by :func:`find_beir`)."""
    folder = find_beir(folder)
    qrels = {}
    for tsv in sorted((folder / "qrels").glob("*.tsv")):
        split = _read_qrels(tsv)
        qrels[tsv.stem] = {
            "queries": len(split),
            "judgments": sum(len(d) for d in split.values()),
        }
    return {
        "path": str(folder),
        "items": _count_lines(folder / "corpus.jsonl"),
        "queries": _count_lines(folder / "queries.jsonl"),
        "qrels": qrels,
    }
