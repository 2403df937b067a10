"""Resumable, sharded CE scoring jobs (local or on Ray).

A job scores an ordered list of (query, item) pairs with a scorer (the Scorer protocol:
``n_items``, ``score(query, items)``, ``score_batch(queries, items_list)``) and returns one
float32 score per pair, in pair order. The pairs are either *dense* (every query x every item,
row-major: the score matrix) or *sparse* (explicit ``(query_pos, item)`` arrays: the AXN matrix G).

The pair list is cut into shards of ``shard_pairs`` consecutive pairs. Each finished shard is
written to ``JOB_DIR/shards/NNNNNN.npy`` atomically (temp file in the same directory, fsync,
``os.replace``), so a killed process (SIGKILL included) loses at most the shards in flight and
never leaves a half-written or duplicated one. ``JOB_DIR/manifest.json`` records a fingerprint of
the job (pairs, queries, scorer identity, shard size); rerunning the same job resumes and skips
the finished shards, and running a *different* job into the same directory is refused. A running
job holds ``JOB_DIR/.lock`` (``flock``, with its PID): a second run into the same directory fails
at once, naming the process that holds it.

With ``backend="ray"`` shards are scored by Ray actors (one per worker slot), each holding its own
copy of the scorer; the driver writes the shard files. Scorers that hold an inference session are
not picklable, so wrap them in :class:`LazyScorer`, which pickles only its factory and arguments
and opens the session on first use in the worker process.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from crossknn.fileio import atomic_save_npy, atomic_write_json, folder_lock
from crossknn.identity import model_identity

__all__ = [
    "DensePairs",
    "JobOptions",
    "SparsePairs",
    "LazyScorer",
    "ScoreJob",
]

MANIFEST_VERSION = 1
LOCK_FILE = ".lock"


# ----------------------------------------------------------------------------------------------
# how a job runs


@dataclass(frozen=True)
class JobOptions:
    """How a scoring job runs, shared by every command and builder that runs one.

    ``shard_pairs``: pairs per shard file; ``backend``: ``"local"`` or ``"ray"``;
    ``ray_address``: the cluster to join (default: start or join a local one); ``ray_workers``:
    actors (default: the cluster's CPUs); ``ray_gpus_per_worker``: GPUs each actor reserves;
    ``keep_job``: keep the job folder after the result is saved; ``progress``: progress bars.
    """

    shard_pairs: int = 4096
    backend: str = "local"
    progress: bool = True
    ray_address: str | None = None
    ray_workers: int | None = None
    ray_gpus_per_worker: float = 0.0
    keep_job: bool = False

    def __post_init__(self) -> None:
        if self.backend not in ("local", "ray"):
            raise ValueError(f"backend must be 'local' or 'ray'; got {self.backend!r}")
        if self.shard_pairs < 1:
            raise ValueError(f"shard_pairs must be >= 1; got {self.shard_pairs}")

    def init_ray(self) -> None:
        """Join the Ray cluster at ``ray_address`` (a job starts a local one otherwise)."""
        if self.backend == "ray" and self.ray_address:
            # ray: optional (ray extra), slow to import
            import ray

            ray.init(address=self.ray_address, include_dashboard=False, log_to_driver=False)

    def run(self, job: ScoreJob, *, desc: str = "CE scores") -> dict:
        """Runs ``job`` with these options; returns its stats."""
        return job.run(
            backend=self.backend,
            progress=self.progress,
            ray_workers=self.ray_workers,
            ray_gpus_per_worker=self.ray_gpus_per_worker,
            desc=desc,
        )


# ----------------------------------------------------------------------------------------------
# pair lists


@dataclass(frozen=True)
class DensePairs:
    """All ``n_queries x n_items`` pairs, row-major: pair p = (p // n_items, p % n_items)."""

    n_queries: int
    n_items: int

    def __post_init__(self) -> None:
        if self.n_queries < 1 or self.n_items < 1:
            raise ValueError(
                f"DensePairs needs n_queries >= 1 and n_items >= 1; "
                f"got {self.n_queries}, {self.n_items}"
            )

    @property
    def n_pairs(self) -> int:
        return self.n_queries * self.n_items

    def slice(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        p = np.arange(start, stop, dtype=np.int64)
        return p // self.n_items, p % self.n_items

    def fingerprint(self) -> str:
        return f"dense:{self.n_queries}x{self.n_items}"


class SparsePairs:
    """Explicit pairs: ``query_pos[p]`` (index into the job's queries) and ``items[p]``."""

    def __init__(self, query_pos, items) -> None:
        qp = np.ascontiguousarray(query_pos, dtype=np.int64)
        it = np.ascontiguousarray(items, dtype=np.int64)
        if qp.ndim != 1 or it.shape != qp.shape or qp.size == 0:
            raise ValueError(
                "SparsePairs needs two non-empty 1-D arrays of equal length; "
                f"got shapes {qp.shape} and {it.shape}"
            )
        if qp.min() < 0 or it.min() < 0:
            raise ValueError("SparsePairs: query positions and items must be >= 0")
        self.query_pos, self.items = qp, it
        self.n_queries = int(qp.max()) + 1

    @property
    def n_pairs(self) -> int:
        return int(self.query_pos.size)

    def slice(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        return self.query_pos[start:stop], self.items[start:stop]

    def fingerprint(self) -> str:
        h = hashlib.sha256(self.query_pos.tobytes())
        h.update(self.items.tobytes())
        return f"sparse:{self.n_pairs}:{h.hexdigest()[:32]}"


# ----------------------------------------------------------------------------------------------
# scorers


class LazyScorer:
    """A picklable stand-in for a scorer: ``factory(*args, **kwargs)`` is called on first use.

    ``factory`` must be picklable by reference (a module-level function or class). Only the
    factory and its arguments travel to Ray workers; each worker opens its own session.
    ``model_id``/``model_hash`` may be given so the driver can fingerprint the job without
    opening the model itself.
    """

    def __init__(
        self,
        factory: Callable[..., Any],
        *args: Any,
        model_id: str | None = None,
        model_hash: str | None = None,
        n_items: int | None = None,
        **kwargs: Any,
    ) -> None:
        if not callable(factory):
            raise TypeError(f"LazyScorer: factory must be callable; got {type(factory).__name__}")
        self.factory, self.args, self.kwargs = factory, args, kwargs
        self._model_id, self._model_hash, self._n_items = model_id, model_hash, n_items
        self._scorer = None

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_scorer"] = None  # never ship an open session
        return state

    @property
    def scorer(self) -> Any:
        if self._scorer is None:
            self._scorer = self.factory(*self.args, **self.kwargs)
        return self._scorer

    @property
    def loaded(self) -> bool:
        return self._scorer is not None

    def identity(self) -> dict:
        if self._model_hash is not None or self._model_id is not None:
            return {"model_id": self._model_id, "model_hash": self._model_hash}
        return model_identity(self.scorer, require_hash=False)

    @property
    def model_id(self):
        return self.identity()["model_id"]

    @property
    def model_hash(self):
        return self.identity()["model_hash"]

    @property
    def n_items(self) -> int:
        return self._n_items if self._n_items is not None else int(self.scorer.n_items)

    def score(self, query, items):
        return self.scorer.score(query, items)

    def score_batch(self, queries, items):
        return self.scorer.score_batch(queries, items)


def _score_pairs(scorer: Any, queries: Sequence, qpos: np.ndarray, items: np.ndarray) -> np.ndarray:
    """Score one shard: consecutive pairs of the same query go to the scorer as one group, all
    groups of the shard in one ``score_batch`` call (the runtime batches at its best size)."""
    if qpos.size == 0:
        return np.empty(0, np.float32)
    cuts = np.flatnonzero(np.diff(qpos)) + 1
    starts = np.concatenate([[0], cuts])
    stops = np.concatenate([cuts, [qpos.size]])
    qs = [queries[int(qpos[s])] for s in starts]
    groups = [items[s:e] for s, e in zip(starts, stops, strict=True)]
    out = scorer.score_batch(qs, groups)
    if len(out) != len(groups):
        raise ValueError(f"scorer.score_batch returned {len(out)} arrays for {len(groups)} queries")
    res = np.empty(qpos.size, np.float32)
    for s, e, o in zip(starts, stops, out, strict=True):
        o = np.asarray(o, dtype=np.float32).ravel()
        if o.size != e - s:
            raise ValueError(f"scorer returned {o.size} scores for {e - s} items")
        res[s:e] = o
    return res


def _queries_fingerprint(queries: Sequence) -> str:
    h = hashlib.sha256()
    for q in queries:
        if isinstance(q, (int, np.integer)):
            h.update(b"i%d\0" % int(q))
        elif isinstance(q, str):
            h.update(b"s" + q.encode() + b"\0")
        else:
            raise TypeError(
                f"queries must be ints (matrix rows) or strings (texts); got {type(q).__name__}"
            )
    return h.hexdigest()[:32]


# ----------------------------------------------------------------------------------------------
# the job


class ScoreJob:
    """A sharded, resumable scoring job whose state lives in ``job_dir``.

    ``queries``: the query objects handed to the scorer (row indices or texts); ``pairs``:
    :class:`DensePairs` or :class:`SparsePairs` whose query positions index ``queries``.
    ``extra``: anything else that defines the job (dataset, item ids, ...), folded into the
    fingerprint so a different job in the same directory is refused.
    """

    def __init__(
        self,
        job_dir: str | os.PathLike,
        scorer: Any,
        queries: Sequence,
        pairs: DensePairs | SparsePairs,
        *,
        shard_pairs: int = 4096,
        extra: dict | None = None,
    ) -> None:
        if shard_pairs < 1:
            raise ValueError(f"shard_pairs must be >= 1; got {shard_pairs}")
        if pairs.n_queries > len(queries):
            raise ValueError(
                f"pairs refer to {pairs.n_queries} queries but only {len(queries)} were given"
            )
        self.job_dir = Path(job_dir)
        self.scorer, self.queries, self.pairs = scorer, list(queries), pairs
        self.shard_pairs = int(shard_pairs)
        self.n_shards = -(-pairs.n_pairs // self.shard_pairs)
        ident = model_identity(scorer, require_hash=False)
        self.manifest = {
            "version": MANIFEST_VERSION,
            "pairs": pairs.fingerprint(),
            "n_pairs": pairs.n_pairs,
            "queries": _queries_fingerprint(self.queries),
            "n_queries": len(self.queries),
            "scorer": ident,
            "shard_pairs": self.shard_pairs,
            "n_shards": self.n_shards,
            "extra": extra or {},
        }

    # -- files --------------------------------------------------------------------------------
    @property
    def shard_dir(self) -> Path:
        return self.job_dir / "shards"

    def shard_path(self, i: int) -> Path:
        return self.shard_dir / f"{i:06d}.npy"

    def shard_range(self, i: int) -> tuple[int, int]:
        start = i * self.shard_pairs
        return start, min(start + self.shard_pairs, self.pairs.n_pairs)

    def _prepare(self) -> None:
        self.shard_dir.mkdir(parents=True, exist_ok=True)
        mpath = self.job_dir / "manifest.json"
        if mpath.exists():
            try:
                old = json.loads(mpath.read_text())
            except json.JSONDecodeError as exc:
                raise ValueError(
                    f"{mpath} is not valid JSON ({exc}); delete {self.job_dir} to restart"
                ) from exc
            if old != self.manifest:
                diff = sorted(
                    k for k in set(old) | set(self.manifest) if old.get(k) != self.manifest.get(k)
                )
                raise ValueError(
                    f"{self.job_dir} holds a different job (differs in: {', '.join(diff)}); "
                    "use another output directory or delete it to start over"
                )
        else:
            atomic_write_json(mpath, self.manifest)
        # temp files of a killed run are garbage: the shard they belonged to is not done
        for tmp in self.shard_dir.glob(".*.tmp"):
            try:
                tmp.unlink()
            except FileNotFoundError:
                pass

    def _shard_ok(self, i: int) -> bool:
        path = self.shard_path(i)
        if not path.exists():
            return False
        start, stop = self.shard_range(i)
        try:
            arr = np.load(path, mmap_mode="r", allow_pickle=False)
        except (ValueError, OSError):
            return False
        return arr.dtype == np.float32 and arr.shape == (stop - start,)

    def pending(self) -> list[int]:
        """Shards not finished yet (after :meth:`run` started once, i.e. the directory exists)."""
        return [i for i in range(self.n_shards) if not self._shard_ok(i)]

    def done(self) -> bool:
        return self.job_dir.exists() and not self.pending()

    # -- running ------------------------------------------------------------------------------
    def run(
        self,
        *,
        backend: str = "local",
        progress: bool = True,
        max_shards: int | None = None,
        ray_workers: int | None = None,
        ray_gpus_per_worker: float = 0.0,
        desc: str = "scoring",
    ) -> dict:
        """Score the pending shards. Returns stats: pairs scored now, seconds, pairs/s.

        ``backend="ray"``: one actor per worker (default: the cluster's CPUs), each reserving
        1 CPU and ``ray_gpus_per_worker`` GPUs; ``max_shards`` stops after that many shards."""
        if backend not in ("local", "ray"):
            raise ValueError(f"backend must be 'local' or 'ray'; got {backend!r}")
        with folder_lock(self.job_dir / LOCK_FILE, what=f"job folder {self.job_dir}"):
            return self._run_locked(
                backend=backend,
                progress=progress,
                max_shards=max_shards,
                ray_workers=ray_workers,
                ray_gpus_per_worker=ray_gpus_per_worker,
                desc=desc,
            )

    def _run_locked(
        self,
        *,
        backend: str,
        progress: bool,
        max_shards: int | None,
        ray_workers: int | None,
        ray_gpus_per_worker: float,
        desc: str,
    ) -> dict:
        self._prepare()
        pend = self.pending()
        todo = pend if max_shards is None else pend[:max_shards]
        done_pairs = self.pairs.n_pairs - sum(e - s for s, e in map(self.shard_range, pend))

        bar = tqdm(
            total=self.pairs.n_pairs,
            initial=done_pairs,
            unit="pair",
            unit_scale=True,
            desc=desc,
            disable=not progress,
            smoothing=0.1,
            dynamic_ncols=True,
        )
        t0 = time.perf_counter()
        n_new = 0
        try:
            it = (
                self._run_local(todo)
                if backend == "local"
                else self._run_ray(todo, ray_workers, ray_gpus_per_worker)
            )
            for i, scores in it:
                atomic_save_npy(self.shard_path(i), scores)
                n_new += scores.size
                bar.update(scores.size)
        finally:
            bar.close()
        dt = time.perf_counter() - t0
        return {
            "pairs": n_new,
            "seconds": dt,
            "pairs_per_s": n_new / dt if dt > 0 else 0.0,
            "shards": len(todo),
        }

    def _shard_pairs(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        return self.pairs.slice(*self.shard_range(i))

    def _run_local(self, todo: list[int]) -> Iterator[tuple[int, np.ndarray]]:
        for i in todo:
            qpos, items = self._shard_pairs(i)
            yield i, _score_pairs(self.scorer, self.queries, qpos, items)

    def _run_ray(
        self, todo: list[int], n_workers: int | None, gpus: float = 0.0
    ) -> Iterator[tuple[int, np.ndarray]]:
        try:
            # ray: optional (ray extra), slow to import
            import ray
        except ImportError as exc:  # pragma: no cover - ray is installed in the dev env
            raise ValueError("--ray needs the 'ray' package: pip install 'crossknn[ray]'") from exc
        if not todo:
            return
        if not ray.is_initialized():
            ray.init(include_dashboard=False, log_to_driver=False)
        if n_workers is None:
            res = ray.available_resources()
            n_workers = max(
                1, int(res.get("GPU", 0) / gpus) if gpus > 0 else int(res.get("CPU", 1))
            )
        n_workers = max(1, min(n_workers, len(todo)))
        Worker = ray.remote(num_cpus=1, num_gpus=gpus)(_ShardWorker)
        scorer_ref = ray.put(self.scorer)
        queries_ref = ray.put(self.queries)
        workers = [Worker.remote(scorer_ref, queries_ref) for _ in range(n_workers)]
        queue = list(todo)
        inflight: dict = {}

        def submit(w):
            i = queue.pop(0)
            qpos, items = self._shard_pairs(i)
            inflight[w.score.remote(qpos, items)] = (i, w)

        try:
            # two shards per actor in flight keeps every worker busy while the driver writes files
            for _ in range(2):
                for w in workers:
                    if queue:
                        submit(w)
            while inflight:
                ready, _ = ray.wait(list(inflight), num_returns=1)
                i, w = inflight.pop(ready[0])
                scores = ray.get(ready[0])
                if queue:
                    submit(w)
                yield i, scores
        finally:
            # killing the actors also drops their queued shards (on an error or Ctrl-C)
            for w in workers:
                try:
                    ray.kill(w)
                except Exception:  # noqa: BLE001 - best effort clean-up, keep the first error
                    pass

    # -- results ------------------------------------------------------------------------------
    def result(self) -> np.ndarray:
        """All scores in pair order (float32, n_pairs). Raises if shards are missing."""
        missing = self.pending() if self.job_dir.exists() else list(range(self.n_shards))
        if missing:
            raise ValueError(
                f"job in {self.job_dir} is not finished: "
                f"{len(missing)} of {self.n_shards} shards missing"
            )
        out = np.empty(self.pairs.n_pairs, np.float32)
        for i in range(self.n_shards):
            s, e = self.shard_range(i)
            out[s:e] = np.load(self.shard_path(i), allow_pickle=False)
        return out


class _ShardWorker:
    """Ray actor body: holds one scorer (opened lazily on first shard) for its lifetime."""

    def __init__(self, scorer: Any, queries: Sequence) -> None:
        self.scorer, self.queries = scorer, queries

    def score(self, qpos: np.ndarray, items: np.ndarray) -> np.ndarray:
        return _score_pairs(self.scorer, self.queries, qpos, items)
