"""The query log: every answered query with the CE scores it paid for (``--log-queries FILE``).

``crossknn search --log-queries FILE`` and ``crossknn serve --log-queries FILE`` (off by default:
queries are user data) append one JSON line per answered query::

    {"id": "q-...", "time": 1764288000.1, "query": "...", "index_version": 3,
     "de": {"model_hash": "...", "text_sha256": "..."}, "ce": {"model_hash": "..."},
     "items": ["d12", "d7", ...], "scores": [4.21, 3.9, ...]}

``items`` / ``scores``: every item the search scored with the CE for this query and its exact
score (the B entries it paid for, not only the top-k; ``ce``: the CE that scored them);
``de``: a reference to the query's DE
vector (the DE model's hash and the query text's hash: the vector is recomputed from them, never
stored). The log is append-only and crash-safe: each record is one ``write`` of a whole line to a
file opened with ``O_APPEND``; a record torn by a crash (a last line without its newline) is
skipped by :func:`read_log` with one line on stderr, and the next writer starts on a new line.
``crossknn refine`` reads it (:mod:`crossknn.corpus.refine`).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from crossknn.fileio import sha256_texts

__all__ = ["LoggedQuery", "QueryLog", "read_log"]


@dataclass
class LoggedQuery:
    """One record of a query log."""

    id: str
    time: float
    query: str
    items: list[str]
    scores: np.ndarray
    index_version: int | None = None
    de_model_hash: str | None = None
    ce_model_hash: str | None = None


class QueryLog:
    """An append-only query log at ``path`` (thread-safe; one line per query)."""

    def __init__(self, path: str | os.PathLike, *, fsync: bool = False) -> None:
        self.path = Path(path)
        if self.path.exists() and not self.path.is_file():
            raise ValueError(f"--log-queries {self.path}: exists and is not a file")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o666)
        self._lock = threading.Lock()
        self._fsync = bool(fsync)
        self.written = 0
        # a record torn by a crash has no newline: start ours on a line of its own
        size = os.fstat(self._fd).st_size
        if size:
            with open(self.path, "rb") as f:
                f.seek(size - 1)
                if f.read(1) != b"\n":
                    os.write(self._fd, b"\n")

    def __enter__(self) -> QueryLog:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1

    def append(
        self,
        query: str,
        items: Sequence[str],
        scores: Iterable[float],
        *,
        index_version: int | None = None,
        de_model_hash: str | None = None,
        ce_model_hash: str | None = None,
        qid: str | None = None,
    ) -> str:
        """Appends one answered query; returns its record id."""
        rid = qid or f"q-{uuid.uuid4().hex[:16]}"
        rec = {
            "id": rid,
            "time": round(time.time(), 3),
            "query": query,
            "index_version": index_version,
            "de": {"model_hash": de_model_hash, "text_sha256": sha256_texts([query])},
            "ce": {"model_hash": ce_model_hash},
            "items": [str(i) for i in items],
            "scores": [float(s) for s in np.asarray(scores, np.float32).tolist()],
        }
        line = (json.dumps(rec, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8")
        with self._lock:
            if self._fd < 0:
                raise ValueError(f"query log {self.path} is closed")
            os.write(self._fd, line)  # one write of a whole line (O_APPEND)
            if self._fsync:
                os.fsync(self._fd)
            self.written += 1
        return rid

    def append_hits(self, hits, corpus_ids: Sequence[str], **kw) -> None:
        """Appends each :class:`crossknn.searcher.Hits` with its paid-for entries (``paid``)."""
        for h in hits:
            paid = getattr(h, "paid", None)
            if paid is None:
                idx, sc = h.indices, h.scores
            else:
                idx, sc = paid
            self.append(h.query, [corpus_ids[int(i)] for i in idx], sc, **kw)


def _records(path: Path) -> Iterator[tuple[int, bytes]]:
    with open(path, "rb") as f:
        yield from enumerate(f, start=1)


def read_log(path: str | os.PathLike, *, quiet: bool = False) -> list[LoggedQuery]:
    """Every whole record of the log at ``path``; a torn or unreadable record is skipped with
    one line on stderr (a crash while appending tears at most the last one)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no query log at {path}")
    out: list[LoggedQuery] = []
    for no, line in _records(path):
        if not line.strip():
            continue
        try:
            rec = json.loads(line.decode("utf-8"))
            items = [str(i) for i in rec["items"]]
            scores = np.asarray(rec["scores"], np.float32)
            q = rec["query"]
            if not isinstance(q, str) or not q.strip() or scores.shape != (len(items),):
                raise ValueError("bad fields")
            if not np.all(np.isfinite(scores)):
                raise ValueError("non-finite scores")
        except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
            if not quiet:
                what = "torn" if not line.endswith(b"\n") else "unreadable"
                print(
                    f"crossknn: {path}:{no}: skipping a {what} query-log record ({exc})",
                    file=sys.stderr,
                )
            continue
        out.append(
            LoggedQuery(
                id=str(rec.get("id", f"line-{no}")),
                time=float(rec.get("time", 0.0)),
                query=q,
                items=items,
                scores=scores,
                index_version=rec.get("index_version"),
                de_model_hash=(rec.get("de") or {}).get("model_hash"),
                ce_model_hash=(rec.get("ce") or {}).get("model_hash"),
            )
        )
    return out
