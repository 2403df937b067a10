"""Files written so that a reader never sees half of them: atomic writes, ``.npy`` and JSON bytes.

Every file crossknn writes (index arrays, ``index.json``, job shards and manifests, score
matrices, eval results) goes through :func:`atomic_write_bytes`: a temp file in the same folder,
fsync, ``os.replace``. A killed process leaves either the old file or the whole new one.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import io
import json
import os
import stat
import sys
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "FolderInUse",
    "UnsafeLockFile",
    "atomic_save_npy",
    "atomic_write_bytes",
    "atomic_write_json",
    "file_mode",
    "fingerprint",
    "folder_lock",
    "json_bytes",
    "npy_bytes",
    "read_json",
    "sha256_array",
    "sha256_bytes",
    "sha256_file",
    "sha256_texts",
]


def _umask() -> int:
    """The process umask, read without changing it where the OS allows."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)  # no read-only query elsewhere: set and restore
    os.umask(mask)
    return mask


def file_mode() -> int:
    """The mode a plain ``open(path, "w")`` would give a new file: ``0o666 & ~umask``."""
    return 0o666 & ~_umask()


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see either the old file or the whole new one."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fchmod(f.fileno(), file_mode())  # mkstemp makes 0600; honour the umask
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def npy_bytes(arr: np.ndarray) -> bytes:
    """``arr`` in ``.npy`` format (C order, never pickled)."""
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(arr), allow_pickle=False)
    return buf.getvalue()


def atomic_save_npy(path: str | os.PathLike, arr: np.ndarray) -> None:
    atomic_write_bytes(path, npy_bytes(arr))


def json_bytes(obj: Any) -> bytes:
    """Canonical JSON: indented, keys sorted, NaN/inf refused, newline at the end (so save ->
    load -> save is byte-identical)."""
    return (json.dumps(obj, indent=2, sort_keys=True, allow_nan=False) + "\n").encode()


def atomic_write_json(path: str | os.PathLike, obj: Any) -> None:
    atomic_write_bytes(path, json_bytes(obj))


def read_json(path: str | os.PathLike) -> Any:
    """The JSON document in ``path``; a parse error names the file, line and column."""
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"{path}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})"
        ) from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text (byte {exc.start})") from None


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | os.PathLike, *, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def sha256_array(arr: np.ndarray, *, chunk: int = 1 << 24) -> str:
    """Hash of an array's bytes in C order (read in chunks: no full copy of a memory map)."""
    h = hashlib.sha256()
    flat = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
    for s in range(0, flat.size, chunk):
        h.update(flat[s : s + chunk])
    return h.hexdigest()


def sha256_texts(texts: Iterable[str]) -> str:
    """Hash of a sequence of strings (each length-prefixed, so no two sequences collide)."""
    h = hashlib.sha256()
    n = 0
    for t in texts:
        b = str(t).encode("utf-8", "surrogatepass")
        h.update(b"%d:" % len(b))
        h.update(b)
        n += 1
    h.update(b"#%d" % n)
    return h.hexdigest()


def fingerprint(obj: Any) -> str:
    """sha256 of ``obj`` as canonical JSON: the key of a resumable artifact's inputs."""
    return sha256_bytes(json_bytes(obj))


def _alive(pid: str) -> bool:
    """Whether the process ``pid`` (text from a lock file) exists."""
    try:
        os.kill(int(pid), 0)
    except (ValueError, OverflowError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return True


class FolderInUse(ValueError):
    """Another process holds the lock of a folder crossknn writes into."""


class UnsafeLockFile(ValueError):
    """A lock file that is not a plain file of its own: a symbolic link, a FIFO, a device, a
    directory or a file with other hard links. It is never opened for writing (a symbolic link
    to another file would have that file truncated and overwritten with a PID)."""


# O_NOFOLLOW: a symbolic link at the lock's path is refused, never followed; O_NONBLOCK: a FIFO
# there does not block the open (it is refused after it)
_LOCK_FLAGS = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


def _open_lock(path: Path, what: str) -> int:
    """The lock file at ``path``, opened (created if missing) without following a symbolic link;
    :class:`UnsafeLockFile` for anything but a regular file with one link."""
    fix = f"remove it (rm {path}) if no crossknn process is writing {what}"
    try:
        fd = os.open(path, _LOCK_FLAGS, file_mode())
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafeLockFile(
                f"{what}: the lock file {path} is a symbolic link; a lock file is never followed: "
                f"{fix}"
            ) from None
        if exc.errno == errno.EISDIR:
            raise UnsafeLockFile(f"{what}: the lock file {path} is a directory; {fix}") from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink > 1:
        os.close(fd)
        kind = "has other hard links" if stat.S_ISREG(st.st_mode) else "is not a regular file"
        raise UnsafeLockFile(f"{what}: the lock file {path} {kind}; {fix}")
    return fd


@contextlib.contextmanager
def folder_lock(
    lock_path: str | os.PathLike, *, what: str | None = None, create: bool = True
) -> Iterator[Path]:
    """Hold an exclusive, non-blocking ``flock`` on ``lock_path`` (created, with this PID in it)
    for the ``with`` block; the file is removed on exit.

    Raises :class:`FolderInUse` (one line naming the holder's PID) if another process holds it.
    A lock file left by a process that died without removing it (``kill -9``: the ``flock``
    dies with it) is stale: it is taken over, saying so in one line on stderr.
    The lock is per open file, so a second ``folder_lock`` on the same path in this process
    fails too. ``what``: the folder named in the message (default: the lock file's folder).
    ``create``: make the lock's folder (and its parents) if missing; False: a missing folder is
    FileNotFoundError and nothing is created.
    The lock file is opened without following a symbolic link, and anything but a regular file
    with one link at its path is refused (:class:`UnsafeLockFile`): never written through.
    """
    path = Path(lock_path)
    where = what or str(path.parent)
    if create:
        path.parent.mkdir(parents=True, exist_ok=True)
    elif not path.parent.is_dir():
        raise FileNotFoundError(f"{where}: no such folder")
    while True:
        fd = _open_lock(path, where)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip() or "?"
            finally:
                os.close(fd)
            raise FolderInUse(
                f"{where} is in use by process {holder} (lock {path}); "
                "wait for it to finish or stop it"
            ) from None
        try:
            st = os.lstat(path)
            same = os.fstat(fd).st_ino == st.st_ino and stat.S_ISREG(st.st_mode)
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # the holder removed the file between our open and our lock: retry
    try:
        old = os.pread(fd, 64, 0).decode("ascii", "replace").strip()
        if old and old != str(os.getpid()):
            print(
                f"crossknn: {where}: taking over the stale lock {path} of process "
                f"{old}, {'which is gone' if not _alive(old) else 'which no longer holds it'}",
                file=sys.stderr,
            )
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield path
    finally:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        os.close(fd)
