"""The query log: every answered query with the CE scores it paid for (``--log-queries FILE``).

``crossknn search --log-queries FILE`` and ``crossknn serve --log-queries FILE`` (off by default:
queries are user data) append one JSON line per answered query::

    {"id": "q-...", "time": 1764288000.1, "query": "...", "index_version": 3,
     "de": {"model_hash": "...", "text_sha256": "..."}, "ce": {"model_hash": "..."},
     "items": ["d12", "d7", ...], "item_text_sha256": ["9f2c41d07a3be815", ...],
     "scores": [4.21, 3.9, ...]}

``items`` / ``scores``: every item the search scored with the CE for this query and its exact
score (the B entries it paid for, not only the top-k; ``ce``: the CE that scored them);
``item_text_sha256``: the first 16 hex digits of the sha256 of each of those items' text
(:func:`item_text_hash`), so that ``refine`` uses an entry only for the item it scored (not for
an item of another index with the same id, nor for a new item added under a removed one's id);
``de``: a reference to the query's DE vector (the DE model's hash and the query text's hash: the
vector is recomputed from them, never stored).

The file is created ``0600`` (it holds user queries; an existing file readable by others gets one
warning line). Appends are crash-safe: each record is one ``write`` of a whole line to a file
opened with ``O_APPEND``, under an ``flock`` shared by every crossknn writer of the file. A write
that fails or comes back short (a full disk) is undone (the file cut back to its size before it)
and the record is kept in memory and written before the next one (at most :data:`BACKLOG`
records; the oldest beyond are dropped and counted); a file that does not end with a newline (a
writer killed mid-record) gets one before the next record, so records never join. Only a crash
can tear a record: :func:`read_log` skips it with one line on stderr.

Rotation: before each append the path is checked; when the file was renamed (``mv``,
``logrotate``) or deleted, a new file is started at the path. :meth:`QueryLog.reopen` does the
same on demand (``crossknn serve`` calls it on ``SIGHUP``). ``crossknn refine`` reads the log
(:mod:`crossknn.corpus.refine`).
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import stat
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from crossknn.fileio import sha256_texts

__all__ = ["BACKLOG", "LOG_MODE", "LoggedQuery", "QueryLog", "item_text_hash", "read_log"]

LOG_MODE = 0o600  # a new log's mode: it holds user queries
BACKLOG = 10_000  # records kept in memory while appends fail (a full disk); the oldest go beyond
HASH_CHARS = 16  # hex digits of an item text's sha256 kept in a record (64 bits)


def item_text_hash(text: str) -> str:
    """The item-text hash of a log record: the first 16 hex digits of the text's sha256."""
    return hashlib.sha256(str(text).encode("utf-8", "surrogatepass")).hexdigest()[:HASH_CHARS]


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
    # item_text_hash of each item's text when it was scored (None: a record written before
    # records had them)
    item_hashes: list[str] | None = None


def mode_warning(path: str | os.PathLike, st: os.stat_result | None = None) -> str | None:
    """One line when the log at ``path`` can be read by its group or by everyone, else None."""
    try:
        mode = (st or os.stat(path)).st_mode
    except OSError:
        return None
    who = [w for bit, w in ((stat.S_IRGRP, "its group"), (stat.S_IROTH, "everyone")) if mode & bit]
    if not who:
        return None
    return (
        f"--log-queries {path} is readable by {' and '.join(who)} (mode {stat.S_IMODE(mode):o}) "
        f"and holds user queries; chmod 600 {path}"
    )


class QueryLog:
    """An append-only query log at ``path`` (thread-safe; one line per query; see the module
    docstring for rotation, full disks and the file's mode). ``warn``: where its one-line
    warnings go (default: stderr)."""

    def __init__(self, path: str | os.PathLike, *, fsync: bool = False, warn=None) -> None:
        self.path = Path(path)
        self._warn = warn or (lambda line: print(f"crossknn: warning: {line}", file=sys.stderr))
        self._lock = threading.Lock()
        self._fsync = bool(fsync)
        self._fd = -1
        self._ident: tuple[int, int] | None = None
        self._backlog: deque[bytes] = deque()
        self.written = 0  # records written
        self.failed = 0  # appends that failed (their records kept in the backlog)
        self.dropped = 0  # records dropped from a full backlog
        self.reopened = 0  # new files started at the path (rotation, deletion, reopen)
        self.last_error: str | None = None
        self._open()

    # -- the file -----------------------------------------------------------------------------
    def _open(self) -> None:
        """Opens (creates, 0600) the file at the path; ValueError in one line when it cannot."""
        p = self.path
        if p.exists() and not p.is_file():
            raise ValueError(f"--log-queries {p}: exists and is not a file")
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(p, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, LOG_MODE)
        except OSError as exc:
            raise ValueError(
                f"--log-queries {p}: cannot open it for appending ({exc.strerror}); expected a "
                "writable file"
            ) from None
        st = os.fstat(fd)
        self._fd, self._ident = fd, (st.st_dev, st.st_ino)
        if (line := mode_warning(p, st)) is not None:
            self._warn(line)

    def _path_moved(self) -> bool:
        """Whether the path no longer names the open file (renamed, deleted, replaced)."""
        try:
            st = os.stat(self.path)
        except OSError:
            return True
        return (st.st_dev, st.st_ino) != self._ident

    def reopen(self) -> None:
        """Starts again at the path: the open file is closed and the one at the path opened (a
        new one if it was renamed or deleted). For ``SIGHUP`` after a rotation."""
        with self._lock:
            self._reopen()

    def _reopen(self) -> None:
        old = self._fd
        self._open()  # the old file stays open until the new one is
        self.reopened += 1
        if old >= 0:
            os.close(old)

    def __enter__(self) -> QueryLog:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Writes what the backlog holds (if it can), then closes the file."""
        with self._lock:
            if self._fd >= 0:
                if self._backlog:
                    try:
                        self._write_backlog()
                    except OSError as exc:
                        self.last_error = str(exc)
                    if self._backlog:
                        self._warn(
                            f"--log-queries {self.path}: {len(self._backlog)} records could not "
                            f"be written ({self.last_error}); they are lost"
                        )
                os.close(self._fd)
                self._fd = -1

    @property
    def pending(self) -> int:
        """Records waiting in the backlog (appends failed; written before the next record)."""
        return len(self._backlog)

    def info(self) -> dict:
        return {
            "path": str(self.path),
            "written": self.written,
            "failed": self.failed,
            "pending": self.pending,
            "dropped": self.dropped,
            "reopened": self.reopened,
            "last_error": self.last_error,
        }

    # -- appending ----------------------------------------------------------------------------
    def _write_line(self, line: bytes) -> None:
        """One whole line at the end of the file, or nothing: a failed or short write is undone
        (the file cut back to its size before it; every crossknn writer holds the flock)."""
        fd = self._fd
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                line = b"\n" + line  # a record torn by a killed writer: ours on its own line
            try:
                n = os.write(fd, line)  # one write of a whole line (O_APPEND)
            except OSError:
                self._cut(fd, size)
                raise
            if n != len(line):
                self._cut(fd, size)
                raise OSError(errno.ENOSPC, f"short write ({n} of {len(line)} bytes)")
            if self._fsync:
                os.fsync(fd)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)

    @staticmethod
    def _cut(fd: int, size: int) -> None:
        try:
            if os.fstat(fd).st_size > size:
                os.ftruncate(fd, size)
        except OSError:
            pass  # the next record starts with a newline (the tail check above)

    def _write_backlog(self) -> None:
        while self._backlog:
            self._write_line(self._backlog[0])
            self._backlog.popleft()
            self.written += 1

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
        item_texts: Sequence[str] | None = None,
    ) -> str:
        """Appends one answered query; returns its record id. ``item_texts``: the texts of
        ``items`` (their hashes go into the record). OSError when the record cannot be written
        now: it is kept and written before the next one."""
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
        if item_texts is not None:
            if len(item_texts) != len(rec["items"]):
                raise ValueError(f"{len(item_texts)} item texts for {len(rec['items'])} items")
            rec["item_text_sha256"] = [item_text_hash(t) for t in item_texts]
        line = (json.dumps(rec, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8")
        with self._lock:
            if self._fd < 0:
                raise ValueError(f"query log {self.path} is closed")
            self._backlog.append(line)
            while len(self._backlog) > BACKLOG:
                self._backlog.popleft()
                self.dropped += 1
            try:
                if self._path_moved():  # renamed or deleted (rotation): a new file at the path
                    self._reopen()
                self._write_backlog()
            except (OSError, ValueError) as exc:
                self.failed += 1
                self.last_error = str(exc)
                raise OSError(
                    exc.errno if isinstance(exc, OSError) else errno.EIO,
                    f"query log {self.path}: cannot append ({exc}); {len(self._backlog)} "
                    "records kept to be written before the next one",
                ) from None
            self.last_error = None
        return rid

    def append_hits(
        self, hits, corpus_ids: Sequence[str], corpus_texts: Sequence[str], **kw
    ) -> None:
        """Appends each :class:`crossknn.searcher.Hits` with its paid-for entries (``paid``);
        ``corpus_ids`` / ``corpus_texts``: the searched index's items (the texts' hashes go into
        each record: ``refine`` uses an entry only for the item it scored). Every record is
        kept (written, or waiting); the first failure to write is raised after the last one."""
        failed: OSError | None = None
        for h in hits:
            paid = getattr(h, "paid", None)
            if paid is None:
                idx, sc = h.indices, h.scores
            else:
                idx, sc = paid
            ix = [int(i) for i in idx]
            texts = [corpus_texts[i] for i in ix]
            try:
                self.append(h.query, [corpus_ids[i] for i in ix], sc, item_texts=texts, **kw)
            except OSError as exc:  # kept in the backlog: the next records are kept too
                failed = failed or exc
        if failed is not None:
            raise failed


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
            hashes = rec.get("item_text_sha256")
            if hashes is not None:
                if not isinstance(hashes, list) or len(hashes) != len(items):
                    raise ValueError("item_text_sha256 does not match items")
                hashes = [str(x) for x in hashes]
        except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
            if not quiet:
                what = "a torn" if not line.endswith(b"\n") else "an unreadable"
                print(
                    f"crossknn: {path}:{no}: skipping {what} query-log record ({exc})",
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
                item_hashes=hashes,
            )
        )
    return out
