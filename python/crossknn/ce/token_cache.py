"""Item token ids kept on disk, so that a process setting the same items again reads them.

A CE tokenizes its items once per process (``set_items``): on NFCorpus's 3,633 abstracts that
is 2.4 s of a 2-core CPU, a third of the time a restarted ``crossknn serve`` takes to answer
``/readyz``. The ids depend only on the tokenizer file, the ``tokenizers`` release, the store's
cap and the texts, so they are cached under ``<cache>/tokens/`` (``$CROSSKNN_CACHE``, else
``~/.cache/crossknn``) by the sha256 of those: a later process with the same items (a restart, a
second ``crossknn search``, a new index version over the same texts) loads the arrays in a few
milliseconds.

- Only item lists of at least :data:`MIN_TEXTS` texts are cached (fewer tokenize in well under
  a second); at most :data:`KEEP` files are kept, the least recently used removed first.
- A file that is missing, unreadable or inconsistent is a miss: the texts are tokenized and the
  file written again (atomically: a killed writer leaves the old file or none). A cache folder
  that cannot be written is skipped with one debug line; nothing fails because of the cache.
- ``CROSSKNN_TOKEN_CACHE=off`` turns it off.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import zipfile
from pathlib import Path

import numpy as np

from crossknn.ce.cache import cache_root
from crossknn.ce.tokenize import IdStore
from crossknn.fileio import atomic_write_bytes

__all__ = ["KEEP", "MIN_TEXTS", "enabled", "load_store", "save_store", "store_key"]

log = logging.getLogger("crossknn.ce")

MIN_TEXTS = 1000
KEEP = 16
_FORMAT = "crossknn-item-ids-1"


def enabled() -> bool:
    return os.environ.get("CROSSKNN_TOKEN_CACHE", "").strip().lower() not in ("off", "0", "no")


def store_key(tokenizer_digest: str, cap: int, texts: list[str]) -> str:
    """sha256 of what the ids depend on: the tokenizer file, the ``tokenizers`` release, the
    store's cap and every text (each one length-prefixed: no two lists share a key)."""
    # tokenizers: about 10 ms to import, kept off ``import crossknn`` (as in ce.tokenize)
    import tokenizers

    h = hashlib.sha256()
    h.update(f"{_FORMAT}\0{tokenizer_digest}\0{tokenizers.__version__}\0{cap}\0".encode())
    for t in texts:
        b = t.encode("utf-8", "surrogatepass")
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)
    return h.hexdigest()


def _path(key: str) -> Path:
    return cache_root() / "tokens" / f"items-{key[:32]}.npz"


def load_store(key: str, n_texts: int, cap: int) -> IdStore | None:
    """The cached store of ``key``, or None (a miss: no file, or one that does not hold
    ``n_texts`` consistent entries of this cap)."""
    path = _path(key)
    try:
        with open(path, "rb") as f, np.load(f, allow_pickle=False) as z:
            if str(z["key"]) != key:
                return None
            flat = z["flat"].astype(np.int64)
            offsets = z["offsets"].astype(np.int64)
            lengths = z["lengths"].astype(np.int64)
            got_cap = int(z["cap"])
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:
        if not isinstance(exc, FileNotFoundError):
            log.debug("crossknn.ce: token cache %s unreadable (%s); tokenizing", path.name, exc)
        return None
    kept = np.diff(offsets) if offsets.size else offsets
    if (
        got_cap != cap
        or lengths.shape != (n_texts,)
        or offsets.shape != (n_texts + 1,)
        or offsets[0] != 0
        or offsets[-1] != flat.size
        or (kept != np.minimum(lengths, cap)).any()
    ):
        return None
    try:
        os.utime(path)  # recently used: kept longest
    except OSError:
        pass
    store = IdStore.__new__(IdStore)
    store.flat, store.offsets, store.lengths, store.cap = flat, offsets, lengths, got_cap
    return store


def save_store(key: str, store: IdStore) -> None:
    """Writes the store under ``key`` (atomically) and keeps the :data:`KEEP` newest files."""
    path = _path(key)
    buf = io.BytesIO()
    small = np.int32 if store.flat.size == 0 or int(store.flat.max()) < 2**31 else np.int64
    np.savez(
        buf,
        key=np.array(key),
        flat=store.flat.astype(small),
        offsets=store.offsets,
        lengths=store.lengths,
        cap=np.array(store.cap),
    )
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, buf.getvalue())
        files = sorted(path.parent.glob("items-*.npz"), key=lambda p: p.stat().st_mtime)
        for old in files[:-KEEP]:
            old.unlink(missing_ok=True)
    except OSError as exc:
        log.debug("crossknn.ce: token cache not written to %s (%s)", path.parent, exc)
