"""``serve`` follows its index (issue 47 item 4): a real ``crossknn serve`` over a small index
built with the embedded models, under load while ``crossknn remove / add / refine`` (the CLI)
commit new versions: each is swapped in (watch or ``POST /admin/reload``), every answer names
its version, none fails, removed items never come back, and a version failing its checks is
refused while the old one keeps serving."""

from __future__ import annotations

import json
import signal
import threading
import time

import numpy as np
import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

import crossknn  # noqa: E402
from crossknn.cli import main  # noqa: E402
from crossknn.corpus.query_log import read_log  # noqa: E402
from crossknn.data import Corpus  # noqa: E402
from serve_fixture import QUERIES as SERVE_QUERIES  # noqa: E402
from serve_fixture import Server, index_env  # noqa: E402

pytestmark = [pytest.mark.slow]

N_ITEMS = 160
QUERIES = SERVE_QUERIES[:6]
KEY = "s3cret-key"


@pytest.fixture(scope="module")
def env(model_env, tmp_path_factory):
    from crossknn.demo_corpus import stdlib_docstrings

    corpus = stdlib_docstrings(max_items=N_ITEMS + 10)
    base = Corpus(corpus.ids[:N_ITEMS], corpus.texts[:N_ITEMS], "base")
    built = index_env(tmp_path_factory, "reload", base, index_calls=2 * N_ITEMS)
    extra = built["root"] / "new.jsonl"
    extra.write_text(
        "".join(
            json.dumps({"id": f"new-{i}", "text": t}) + "\n"
            for i, t in enumerate(corpus.texts[N_ITEMS : N_ITEMS + 10])
        )
    )
    return {**built, "new": extra}


def _search(server: Server, q: str, http=None):
    return (http or httpx).post(
        server.url + "/search",
        json={"query": q, "k": 5, "budget": 20},
        headers=server.headers,
        timeout=120,
    )


def _info(server: Server) -> dict:
    return httpx.get(server.url + "/info", headers=server.headers, timeout=30).json()


def _wait_version(server: Server, v: int, timeout: float = 60.0) -> dict:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        info = _info(server)
        if info["index"]["version"] == v:
            return info
        time.sleep(0.2)
    raise AssertionError(f"version {v} never served: {_info(server).get('reload')}")


class Load:
    """Clients searching in a loop until stopped: every status and version seen."""

    def __init__(self, server: Server, n: int = 3) -> None:
        self.server, self.stop_ = server, threading.Event()
        self.seen: list[tuple[int, int | None, str | None, list[str]]] = []
        self.threads = [threading.Thread(target=self._run, args=(i,)) for i in range(n)]
        for t in self.threads:
            t.start()

    def _run(self, i: int) -> None:
        with httpx.Client() as http:
            j = i
            while not self.stop_.is_set():
                r = _search(self.server, QUERIES[j % len(QUERIES)], http)
                j += 1
                ok = r.status_code == 200
                body = r.json() if ok else {}
                ids = [x["id"] for h in body.get("hits", []) for x in h["results"]]
                self.seen.append(
                    (
                        r.status_code,
                        body.get("index_version"),
                        r.headers.get("x-index-version"),
                        ids,
                    )
                )

    def stop(self):
        self.stop_.set()
        for t in self.threads:
            t.join(120)
        return self.seen


def test_serve_swaps_versions_under_load(env):
    idx = env["index_dir"]
    log = env["root"] / "served.log"
    flags = ("--log-queries", str(log), "--watch-index", "0.3", "--timeout-s", "300")
    server = Server(idx, *flags, logs=env["root"], api_key=KEY)
    try:
        r = _search(server, QUERIES[0])
        assert r.status_code == 200 and r.json()["index_version"] == 1
        assert r.headers["x-index-version"] == "1"
        assert httpx.post(server.url + "/admin/reload", timeout=30).status_code == 401
        load = Load(server)
        # remove (tombstones): swapped in by the watch
        removed = [crossknn.open_index(idx).corpus.ids[i] for i in (3, 5, 8)]
        (env["root"] / "rm.txt").write_text("\n".join(removed) + "\n")
        assert main(["remove", str(idx), "--ids", str(env["root"] / "rm.txt")]) == 0
        _wait_version(server, 2)
        # add: swapped in by POST /admin/reload (the watch may be first: then "unchanged")
        assert main(["add", str(idx), str(env["new"]), "--quiet"]) == 0
        r = httpx.post(server.url + "/admin/reload", headers=server.headers, timeout=120)
        assert r.status_code == 200 and r.json()["status"] in ("swapped", "unchanged")
        assert r.json()["version"] == 3
        _wait_version(server, 3)
        # refine on what the server logged
        assert len(read_log(log)) >= 2
        assert main(["refine", str(idx), "--queries", str(log), "--quiet"]) == 0
        _wait_version(server, 4)
        # a compaction moves items: the swap waits for the old version's requests
        assert main(["remove", str(idx), "--ids", str(env["new"]), "--compact-at", "0"]) == 0
        info = _wait_version(server, 5)
        assert info["reload"]["swaps"] >= 4
        time.sleep(1.0)
        seen = load.stop()
    finally:
        if "load" in locals():
            load.stop()
        out = server.output()
        code = server.stop()
    # uvicorn re-raises the signal after its graceful shutdown: the exit status says SIGTERM
    assert code in (0, -signal.SIGTERM), out
    assert seen and all(s == 200 for s, *_ in seen), [s for s in seen if s[0] != 200][:3]
    versions = {v for _, v, _, _ in seen}
    assert max(versions) == 5 and versions <= {1, 2, 3, 4, 5}
    new_ids = {f"new-{i}" for i in range(10)}
    for _, v, _, ids in seen:  # removed items never come back once removed
        if v is not None and v >= 2:
            assert not set(removed) & set(ids)
        if v is not None and v >= 5:
            assert not new_ids & set(ids)
    recs = read_log(log)
    assert recs and all(len(r.items) == len(r.scores) > 0 for r in recs)
    assert {r.index_version for r in recs} >= {1}


def test_a_version_failing_its_checks_is_refused_and_the_old_one_serves(env, tmp_path):
    import shutil

    from crossknn.corpus.versions import write_version

    idx = tmp_path / "idx"
    shutil.copytree(env["index_dir"], idx)
    server = Server(idx, "--watch-index", "0", logs=tmp_path, api_key=KEY)
    try:
        before = _info(server)["index"]["version"]
        r0 = _search(server, QUERIES[1])
        assert r0.status_code == 200
        index = crossknn.open_index(idx)
        v = np.asarray(index["de_items"], np.float32).copy()
        write_version(index, changed={"de_items": v}, params=index.params, op={"op": "test"})
        # the new version's vectors are damaged on disk after its commit
        f = idx / f"de_items.v{before + 1}.npy"
        data = bytearray(f.read_bytes())
        data[-8:] = b"\x00\x01\x02\x03\x04\x05\x06\x07"
        f.write_bytes(bytes(data))
        r = httpx.post(server.url + "/admin/reload", headers=server.headers, timeout=60)
        assert r.status_code == 409 and r.json()["status"] == "refused"
        assert "corrupt" in r.json()["error"]
        r1 = _search(server, QUERIES[1])
        assert r1.status_code == 200 and r1.json()["index_version"] == before
        same = [[(x["id"], x["score"]) for x in h["results"]] for h in r1.json()["hits"]]
        assert same == [[(x["id"], x["score"]) for x in h["results"]] for h in r0.json()["hits"]]
        info = _info(server)
        assert info["reload"]["refused"] == 1 and info["index"]["version"] == before
    finally:
        server.stop()


def test_old_versions_are_freed_after_their_swap(env, tmp_path):
    """Memory after a swap: the versions swapped out (their index, arrays and searcher) are
    freed, and once the last request on one finishes its memory is handed back
    (crossknn.serve.memory.release_memory: a collection, then malloc_trim); a request still
    running on the old version holds that release back."""
    import shutil
    import weakref

    from crossknn.serve.service import SearchService, ServeConfig

    def released_after(n: int, within: float = 30.0) -> bool:
        t = time.monotonic() + within
        while time.monotonic() < t:
            if svc.follower.releases >= n:
                return True
            time.sleep(0.05)
        return False

    idx = tmp_path / "idx"
    shutil.copytree(env["index_dir"], idx)
    svc = SearchService(ServeConfig(index=str(idx), watch_index_s=0))
    svc.load()
    try:
        v0 = svc.index_version
        refs = []
        for k in range(4):
            refs.append((weakref.ref(svc.index), weakref.ref(svc.searcher)))
            gone = tmp_path / "rm.txt"
            gone.write_text(crossknn.open_index(idx).corpus.ids[k] + "\n")
            # tombstones (no compaction): a version whose items extend the old ones
            assert main(["remove", str(idx), "--ids", str(gone), "--compact-at", "1"]) == 0
            if k == 3:
                # a request on the old version: its memory is released when the request ends
                with svc.follower.pinned() as (searcher, _):
                    assert svc.follower.reload()["status"] == "swapped"
                    time.sleep(0.5)
                    assert svc.follower.releases == 3, "released while a request still ran on it"
                    assert searcher is not svc.searcher
                del searcher, _
            else:
                assert svc.follower.reload()["status"] == "swapped"
            assert released_after(k + 1), f"swap {k + 1}: the old version was never released"
        # no gc.collect() here: the release did what was needed
        alive = [k for k, (i, s) in enumerate(refs) if i() is not None or s() is not None]
        assert alive == [], f"versions still held after their swap: {alive}"
        assert svc.index_version == v0 + 4
        rel = svc.follower.last_release
        assert set(rel) == {"collected", "trimmed", "seconds"}
        assert isinstance(rel["trimmed"], bool)
    finally:
        svc.close()
