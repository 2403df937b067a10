"""How the served index's arrays are held: read into memory when small, memory-mapped otherwise.

A memory-mapped ``.npy`` file that is cut or rewritten in place while it is mapped (``cp`` or
``rsync --inplace`` over the served folder, ``truncate``) makes the next read of the cut part a
``SIGBUS``, which kills the process. An array read into memory cannot be hurt that way. So
``crossknn serve`` reads every array of an index of at most :data:`IN_MEMORY_BYTES` into memory
when it loads it (at start and at each swap), and keeps larger ones mapped (their pages are
shared between processes and read on demand); its start-up line and ``/info`` say which
(docs/operating.md, "How the index is held").
"""

from __future__ import annotations

import numpy as np

__all__ = ["IN_MEMORY_BYTES", "hold_arrays"]

#: an index whose arrays take at most this many bytes in all is read into memory
IN_MEMORY_BYTES = 512 << 20


def hold_arrays(index, *, max_bytes: int = IN_MEMORY_BYTES) -> dict:
    """Read the arrays of ``index`` (a :class:`crossknn.corpus_folder.CorpusIndex`) into memory
    if they take at most ``max_bytes`` in all, in place (before anything reads them: the
    metadata columns are read again from the copies); ``{"held": "memory" | "mapped",
    "bytes": total}``."""
    arrays = index.arrays
    total = int(sum(int(a.nbytes) for a in arrays.values()))
    mapped = [name for name, a in arrays.items() if isinstance(a, np.memmap)]
    if mapped and total <= max_bytes:
        for name in mapped:
            copy = np.array(arrays[name])  # a plain array: the file is no longer read
            copy.setflags(write=False)
            arrays[name] = copy
        index._metadata = None  # its columns were views of the maps: read again from the copies
        mapped = []
    return {"held": "mapped" if mapped else "memory", "bytes": total}


def held_line(held: dict) -> str:
    """The start-up line's words for ``held`` (:func:`hold_arrays`)."""
    mb = held["bytes"] / 1e6
    if held["held"] == "memory":
        return f"index arrays read into memory, {mb:.1f} MB"
    return (
        f"index arrays memory-mapped, {mb:.1f} MB: never copy over the served folder in place "
        "(docs/operating.md)"
    )
