"""The scoring-job folder of an index build: where its shards live while the build runs.

An index build scores its CE pairs through a resumable :class:`crossknn.jobs.ScoreJob` whose
state lives in ``OUT_DIR/.job`` unless the caller names a folder. Once the index is saved, the
shards are in the index's own arrays, so a folder the build chose itself is removed (unless
``keep``); a folder the caller named is the caller's to keep.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

__all__ = ["JobFolder"]


class JobFolder:
    def __init__(
        self, out_dir: str | os.PathLike, job_dir: str | os.PathLike | None, *, keep: bool = False
    ) -> None:
        self.owned = job_dir is None
        self.path = Path(out_dir) / ".job" if job_dir is None else Path(job_dir)
        self.keep = keep

    def done(self) -> None:
        """Call after the index is saved: removes the folder if the build chose it."""
        if self.owned and not self.keep:
            shutil.rmtree(self.path, ignore_errors=True)
