"""``serve`` follows its index: new versions are loaded beside the running one and swapped in.

A new index version (``crossknn refine``, ``add``, ``remove``, or a rebuild) commits by renaming
its ``index.json`` (:mod:`crossknn.corpus.versions`). :class:`IndexFollower` notices it (a watch
on ``index.json`` every ``watch_s`` seconds, or ``POST /admin/reload``), opens the new version
beside the old one (every array's hash checked, the models checked against the running CE/DE),
makes its searcher, runs one check search on it, and only then swaps it in: one assignment, so a
request sees either version whole. A version that fails any of this is refused (logged, counted,
the reason in ``/info``) and the old one keeps serving.

Requests in flight finish on the version they started on: a request takes the searcher once, at
its start. The CE holds one tokenized item list, shared by the versions: a new version whose
items extend the old ones (refine, add, remove with tombstones: the old item positions keep their
texts) sets it while the old version still serves; one whose items moved (a compaction, a
rebuild) waits for the old version's requests to finish (new requests wait at their start
meanwhile, at most ``drain_s``), then swaps.

Every response carries the header ``X-Index-Version`` (and ``/search`` the field
``index_version``, ``/info`` the index's ``version``, ``index_id`` and history).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import crossknn
from crossknn.corpus.versions import index_version
from crossknn.serve.arrays import hold_arrays
from crossknn.serve.memory import release_memory

log = logging.getLogger("crossknn.serve")

__all__ = ["VERSION_HEADER", "IndexFollower", "VersionCE", "VersionHeader", "index_stamp"]

CHECK_QUERY = "index version check"
VERSION_HEADER = "X-Index-Version"
_HEADER = VERSION_HEADER.lower().encode()
OPEN_PATHS = ("/healthz", "/readyz")  # answered without the key: they name no version


def index_stamp(path: str | os.PathLike) -> tuple | None:
    """What changes when a new version of the index at ``path`` commits (``index.json``'s inode,
    size and mtime); None when it is missing."""
    try:
        st = os.stat(Path(path) / "index.json")
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


class VersionCE:
    """One index version's view of the shared CE: its own item count (``n_items``), the CE's
    scoring and identity otherwise. The CE's tokenized items are shared by the versions; a
    version whose items extend the old ones sets them while the old one still serves, and the
    old one must still see its own N (the search checks the scorer's N against its index)."""

    def __init__(self, ce) -> None:
        self._ce = ce.base if isinstance(ce, VersionCE) else ce
        self._n: int | None = None

    @property
    def base(self):
        return self._ce

    def __getattr__(self, name: str):
        if name.startswith("__") or name in ("_ce", "_n"):
            raise AttributeError(name)
        return getattr(self._ce, name)

    @property
    def n_items(self) -> int:
        return int(self._ce.n_items) if self._n is None else self._n

    def set_items(self, texts) -> None:
        texts = list(texts)
        self._ce.set_items(texts)
        self._n = len(texts)

    def score(self, query, items):
        return self._ce.score(query, items)

    def score_batch(self, queries, items):
        return self._ce.score_batch(queries, items)


def folder_index_id(path: str | os.PathLike) -> str:
    """The id of the version committed in the folder now (its ``meta_sha256``, 12 digits)."""
    try:
        doc = json.loads((Path(path) / "index.json").read_bytes())
        return str(doc.get("meta_sha256", ""))[:12]
    except (OSError, ValueError, AttributeError):
        return ""


class IndexFollower:
    """Reloads ``service``'s index when a new version commits (see the module docstring)."""

    def __init__(self, service, *, watch_s: float = 2.0, drain_s: float = 30.0) -> None:
        self.service = service
        self.watch_s = float(watch_s)
        self.drain_s = float(drain_s)
        self._lock = threading.Lock()  # one reload at a time
        self._cv = threading.Condition()
        self._active: dict[int, int] = {}  # searcher id -> requests running on it
        self._gate_open = True
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.stamp = index_stamp(service.config.index)
        self.index_id = folder_index_id(service.config.index)  # of the version serving
        self.swaps = 0
        self.refused = 0
        self.last_error: str | None = None
        self.history: list[dict] = []
        self.retire_s = 3600.0  # the longest a retired version's requests are waited for
        self.last_release: dict | None = None
        self.releases = 0  # retired versions whose memory was released

    # -- the version a request runs on ------------------------------------------------------
    @contextmanager
    def pinned(self):
        """The searcher (and index) a request runs on from start to end."""
        with self._cv:
            if not self._gate_open:
                self._cv.wait_for(lambda: self._gate_open, timeout=self.drain_s)
            svc = self.service
            searcher, index = svc.searcher, svc.index
            key = id(searcher)
            self._active[key] = self._active.get(key, 0) + 1
        try:
            yield searcher, index
        finally:
            with self._cv:
                self._active[key] -= 1
                if not self._active[key]:
                    del self._active[key]
                self._cv.notify_all()

    # -- watching ----------------------------------------------------------------------------
    def start(self) -> None:
        if self.watch_s <= 0 or self._thread is not None:
            return
        self._thread = threading.Thread(
            target=self._watch, name="crossknn-index-watch", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        while not self._stop.wait(self.watch_s):
            stamp = index_stamp(self.service.config.index)
            if stamp is not None and stamp != self.stamp and self.service.ready.is_set():
                try:
                    self.reload()
                except Exception:  # reload reports its own failures; the watch goes on
                    log.exception("crossknn serve: index reload failed")

    # -- reloading ---------------------------------------------------------------------------
    def reload(self) -> dict[str, Any]:
        """Loads the index folder's current version beside the running one and swaps it in;
        returns ``{"status": "swapped" | "unchanged" | "refused", ...}``."""
        with self._lock:
            svc = self.service
            old = svc.index
            old_key = id(svc.searcher)
            stamp = index_stamp(svc.config.index)
            old_v, old_id = index_version(old), self.index_id
            t0 = time.perf_counter()
            try:
                new_id = folder_index_id(svc.config.index)
                if new_id == old_id:
                    self.stamp = stamp
                    # the folder holds the version serving (again): no refusal stands
                    self.last_error = None
                    return {"status": "unchanged", "version": old_v, "index_id": old_id}
                new = crossknn.open_index(svc.config.index)
                held = hold_arrays(new)  # as at start: small indexes read into memory
                if folder_index_id(svc.config.index) != new_id:
                    raise RuntimeError("a newer version committed while this one loaded")
                new.check_models(ce=svc.ce, de=svc.de)
                same_items = _extends(old.corpus.texts, new.corpus.texts)
                if same_items:
                    searcher = self._searcher(new)
                    self._check(searcher)
                    with self._cv:
                        svc.index, svc.searcher = new, searcher
                else:
                    searcher = self._swap_drained(new)
            except Exception as exc:
                self.refused += 1
                self.stamp = stamp  # not retried until the folder changes again
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.error(
                    "crossknn serve: index version refused, version %d keeps serving: %s",
                    old_v,
                    self.last_error,
                )
                return {
                    "status": "refused",
                    "version": old_v,
                    "index_id": old_id,
                    "error": self.last_error,
                }
            self.stamp = stamp
            self.index_id = new_id
            svc.arrays_held = held
            self.swaps += 1
            self.last_error = None
            rec = {
                "status": "swapped",
                "version": index_version(new),
                "previous": old_v,
                "index_id": new_id,
                "load_s": round(time.perf_counter() - t0, 3),
                "drained": not same_items,
            }
            self.history = (self.history + [rec])[-20:]
            self._retire(old_key)
            log.info(
                "crossknn serve: index version %d -> %d swapped in (%.2f s)",
                old_v,
                rec["version"],
                rec["load_s"],
            )
            return rec

    def _retire(self, key: int) -> None:
        """Once the last request on the swapped-out searcher ``key`` finishes, its memory is
        handed back (:func:`crossknn.serve.memory.release_memory`), in a thread of its own: the
        swap does not wait for those requests."""

        def run() -> None:
            with self._cv:
                self._cv.wait_for(lambda: key not in self._active, timeout=self.retire_s)
            self.last_release = release_memory()
            self.releases += 1
            log.info("crossknn serve: a retired version's memory released: %s", self.last_release)

        threading.Thread(target=run, name="crossknn-index-retire", daemon=True).start()

    def _searcher(self, index):
        svc, c = self.service, self.service.config
        old = svc.searcher
        s = crossknn.Searcher(
            index,
            ce=VersionCE(old.ce),
            de=old.de,
            method=c.method,
            rounds=c.rounds,
            latency_target_ms=getattr(c, "latency_target_ms", "auto"),
            round_index=c.round_index,
            shards=c.shards,
            ray_address=c.ray_address,
        )
        s.record_paid = old.record_paid
        if c.warmup:
            s.prepare()
        return s

    def _check(self, searcher) -> None:
        """One search on the new version: it must answer (k hits, finite scores)."""
        n = searcher.n_items - searcher.n_dead
        budget = min(20, searcher.n_items)
        k = min(5, n, budget)
        hits = searcher.search(CHECK_QUERY, k=k, budget=budget)
        if len(hits.ids) < k:
            raise ValueError(f"the check search returned {len(hits.ids)} hits; expected {k}")

    def _swap_drained(self, new):
        """Swap in a version whose items moved: new requests wait, the old version's finish."""
        svc = self.service
        with self._cv:
            self._gate_open = False
            try:
                ok = self._cv.wait_for(lambda: not self._active, timeout=self.drain_s)
                if not ok:
                    raise TimeoutError(
                        f"requests on the old version did not finish within {self.drain_s:g} s"
                    )
                searcher = self._searcher(new)  # sets the CE's items: no request runs now
                try:
                    self._check(searcher)
                except Exception:
                    svc.searcher.ce.set_items(list(svc.searcher.corpus.texts))
                    raise
                svc.index, svc.searcher = new, searcher
            finally:
                self._gate_open = True
                self._cv.notify_all()
        return searcher

    def info(self) -> dict[str, Any]:
        idx = self.service.index
        return {
            "version": index_version(idx) if idx is not None else None,
            "index_id": self.index_id if idx is not None else None,
            "swaps": self.swaps,
            "refused": self.refused,
            "last_error": self.last_error,
            "watch_s": self.watch_s,
            "recent": self.history[-5:],
            # retired versions whose memory was handed back (crossknn.serve.memory), the last
            "releases": self.releases,
            "last_release": self.last_release,
        }


def _extends(old, new) -> bool:
    """Whether ``new`` keeps every item text of ``old`` at its position."""
    return len(new) >= len(old) and all(a == b for a, b in zip(old, new, strict=False))


class VersionHeader:
    """Pure ASGI middleware: a response says the index version that is serving
    (``X-Index-Version``) unless the route set it itself (``/search``: the version its queries
    ran on, as in its body; ``/info``: the version it describes). With a key (``keyed``) only
    the answers to callers with the key say it: never a 401 nor the open probes."""

    def __init__(self, app, service, keyed: bool = False) -> None:
        self.app, self.service, self.keyed = app, service, keyed

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        open_path = scope.get("path") in OPEN_PATHS

        async def send_v(message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                named = any(k.lower() == _HEADER for k, _ in headers)
                hide = self.keyed and (message["status"] == 401 or open_path)
                if hide and named:
                    headers = [(k, v) for k, v in headers if k.lower() != _HEADER]
                    message = {**message, "headers": headers}
                elif not hide and not named and (idx := self.service.index) is not None:
                    headers.append((_HEADER, str(index_version(idx)).encode()))
                    message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_v)


def add_reload_routes(app, service, config) -> None:
    """``POST /admin/reload`` (behind the API key: refused without ``--api-key-file``) and the
    ``X-Index-Version`` header on every response."""
    from fastapi.responses import JSONResponse  # serve extra

    detail = {
        "content": {
            "application/json": {
                "schema": {
                    "type": "object",
                    "properties": {"detail": {}},
                    "required": ["detail"],
                }
            }
        }
    }
    result = {
        "type": "object",
        "properties": {
            "status": {"type": "string", "enum": ["swapped", "unchanged", "refused"]},
            "version": {"type": "integer"},
            "previous": {"type": "integer"},
            "index_id": {"type": "string"},
            "load_s": {"type": "number"},
            "drained": {"type": "boolean"},
            "error": {"type": "string"},
        },
        "required": ["status", "version"],
    }

    @app.post(
        "/admin/reload",
        summary="load the index folder's current version beside the running one and swap it in",
        response_model=None,
        responses={
            200: {
                "description": "swapped in, or already serving this version",
                "content": {"application/json": {"schema": result}},
            },
            401: {"description": "missing or wrong API key", **detail},
            403: {"description": "the server has no API key (--api-key-file)", **detail},
            409: {
                "description": "the new version failed its checks; the old one keeps serving",
                "content": {"application/json": {"schema": result}},
            },
            503: {"description": "still loading", **detail},
        },
    )
    async def admin_reload():
        if not config.api_key_file:
            return JSONResponse(
                {"detail": "POST /admin/reload needs a server started with --api-key-file"},
                status_code=403,
            )
        if not service.ready.is_set() or service.follower is None:
            return JSONResponse(
                {"detail": "the index and models are still loading"},
                status_code=503,
                headers={"Retry-After": "1"},
            )
        loop = asyncio.get_running_loop()
        out = await loop.run_in_executor(None, service.follower.reload)
        return JSONResponse(out, status_code=409 if out["status"] == "refused" else 200)

    app.add_middleware(VersionHeader, service=service, keyed=bool(config.api_key_file))
