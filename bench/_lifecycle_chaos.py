"""A chaos run of the living index (issue 54): an unlucky operator beside a busy server.

    .venv/bin/python bench/lifecycle_bench.py --part chaos                  # 220 operations
    .venv/bin/python bench/lifecycle_bench.py --part chaos --ops 30 --out build/chaos.json

(``lifecycle_bench.py --part chaos`` runs :func:`main` here with the other arguments.)

A real ``crossknn serve`` (the embedded CE and DE, an index of ``--items`` stdlib docstrings,
``--log-queries``, ``--watch-index 1``) answers 8 clients (``/search``, k = 5, B = 20) while a
driver applies a seeded random sequence of operations, each as an operator runs it, by the
``crossknn`` command beside the server:

- ``add``: new items, or an id removed before added again with another text;
- ``remove``: live ids, sometimes with an id removed before (a no-op: no new version);
- ``refine``: on the live query log (``--index-calls``: ``--rows`` complete rows);
- ``reload``: ``POST /admin/reload``;
- ``rotate``: ``mv`` of the query log (the server starts a new file), then ``kill -HUP`` or not;
- ``disk_full``: a window in which the server's file-size limit (``prlimit``) is at the log's
  size plus 200 bytes, so its appends fail or come back short as on a full disk; an ``add`` or
  ``remove`` runs in it under a 64 KiB limit of its own (it fails, the index must stay whole);
- a ``kill -9`` of an ``add``, ``remove`` or ``refine`` at a random point of its expected time
  (``--kill-share`` of them), then (half of the time) its rerun.

After each step the driver checks the folder (every hash, one whole version: the previous one or
the next, no file it does not name but the work folder of a killed command), samples stored
``auto`` row entries against the CE's exact score (``--samples`` per changed version, scored
here by the same embedded CE), and reads the server's RSS, open files and the folder's size.
At the end (the server stopped by SIGTERM, which writes what its log still holds), every answer
is checked against the version it names: no removed id, ``min(k, live)`` hits; and every answered
query against the log's records (all rotated files and the current one).

Writes ``bench/results/lifecycle_chaos.json`` (``goals``: operations, kills, removed_served,
short_answers, wrong_row_entries, log_records_lost, non_2xx, rss_growth) with the steps, the
answers' counts and the machine.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, StealMeter, _cpu_model, write_json  # noqa: E402

OUT = REPO / "bench" / "results" / "lifecycle_chaos.json"
WORK = REPO / "build" / "lifecycle_chaos"
K, BUDGET = 5, 20
# the operations and how often each is drawn
WEIGHTS = {
    "add": 0.22,
    "remove": 0.22,
    "refine": 0.11,
    "reload": 0.13,
    "rotate": 0.13,
    "disk_full": 0.08,
    "remove_again": 0.11,
}
WRITES = ("add", "remove", "refine", "remove_again")
ROW_TOL = 1e-3  # a stored row entry equals the CE's exact score within this (float noise)


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    return float("nan")


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _cut(text: str, chars: int) -> str:
    """``text``'s first ``chars`` characters at most, cut at a word."""
    text = " ".join(text.split())
    return text if len(text) <= chars else text[:chars].rsplit(" ", 1)[0]


def _alive(pid: str) -> bool:
    try:
        os.kill(int(pid), 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return True


def _folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.iterdir() if p.is_file())


class Clients:
    """``n`` clients searching in a loop (a pause of ``think_s`` on average between requests);
    every answer kept: (start, end, status, version, ids, query, Retry-After given)."""

    def __init__(self, url: str, auth: dict, queries: list[str], n: int, think_s: float, seed):
        import httpx

        self.httpx = httpx
        self.url, self.auth, self.queries, self.think_s = url, auth, queries, think_s
        self.stop_ = threading.Event()
        self.answers: list[tuple] = []
        self.rng = np.random.default_rng(seed)
        self.threads = [threading.Thread(target=self._run, args=(i,)) for i in range(n)]
        for t in self.threads:
            t.start()

    def _run(self, i: int) -> None:
        rng = np.random.default_rng(1000 + i)
        with self.httpx.Client(timeout=600) as http:
            while not self.stop_.is_set():
                q = self.queries[int(rng.integers(len(self.queries)))]
                a = time.monotonic()
                try:
                    r = http.post(
                        self.url + "/search",
                        json={"query": q, "k": K, "budget": BUDGET},
                        headers=self.auth,
                    )
                    body = r.json() if r.status_code == 200 else {}
                    hits = body.get("hits") or [{}]
                    ids = tuple(x["id"] for x in hits[0].get("results", []))
                    rec = (a, time.monotonic(), r.status_code, body.get("index_version"), ids, q,
                           "retry-after" in r.headers)  # fmt: skip
                except (self.httpx.HTTPError, ValueError):
                    rec = (a, time.monotonic(), 599, None, (), q, False)
                self.answers.append(rec)
                if rec[2] == 429:
                    self.stop_.wait(min(float(r.headers.get("retry-after", 1)), 5.0))
                self.stop_.wait(float(rng.exponential(self.think_s)))

    def stop(self) -> list[tuple]:
        self.stop_.set()
        for t in self.threads:
            t.join(700)
        return self.answers


class Chaos:
    """The driver: the server, the operations, the checks after each step."""

    def __init__(self, args) -> None:
        self.args = args
        self.rng = np.random.default_rng(args.seed)
        self.root = args.work / "run"
        self.idx = self.root / "idx"
        self.log = self.root / "logs" / "queries.log"
        self.rotated: list[Path] = []
        self.steps: list[dict] = []
        self.live: dict[int, tuple[frozenset, int]] = {}  # version -> (live ids, live count)
        self.sampled = self.wrong = 0
        self.max_diff = 0.0
        self.checked_rows: set[tuple] = set()
        self.durations: dict[str, list[float]] = collections.defaultdict(list)
        self.kills = 0
        # killed or failed, not finished since: their work folders may be left for a rerun
        self.killed_ops: set[str] = set()
        self.removed: dict[str, str] = {}  # ids removed (not added again) -> their text
        self.next_new = 0

    # -- setup ---------------------------------------------------------------------------------
    def setup(self) -> None:
        import crossknn.ce
        from crossknn.corpus.build import build_corpus_index
        from crossknn.data import Corpus
        from crossknn.demo_corpus import stdlib_docstrings

        a = self.args
        docs = stdlib_docstrings()
        # short items (at most --chars characters, cut at a word): the CE's work per pair is what
        # a 2-core CPU shared with the server and its clients can do in about an hour
        full = Corpus(docs.ids, [_cut(t, a.chars) for t in docs.texts], "stdlib docstrings")
        pick = np.random.default_rng(0).permutation(len(full))
        base_j, self.pool_j = pick[: a.items], pick[a.items :]
        self.full = full
        base = a.work / f"base_{a.items}_{a.rows}_{a.chars}"
        self.ce = crossknn.ce.default_cross_encoder()
        if not (base / "index.json").is_file():
            de = crossknn.ce.default_dual_encoder(show_progress_bar=False)
            build_corpus_index(
                Corpus([full.ids[j] for j in base_j], [full.texts[j] for j in base_j], "chaos"),
                base,
                ce=self.ce,
                de=de,
                index_calls=a.rows * a.items,
                calibration_queries=4,
                calibration_items=16,
                progress=False,
            )
        shutil.rmtree(self.root, ignore_errors=True)
        self.root.mkdir(parents=True)
        shutil.copytree(base, self.idx)
        self.log.parent.mkdir()
        (self.root / "rotated").mkdir()
        (self.root / "key").write_text("chaos-key\n")
        (self.root / "key").chmod(0o600)
        words = [w for j in base_j for w in full.texts[j].split()[:8] if len(w) > 3]
        qrng = np.random.default_rng(a.seed + 1)
        self.queries = [" ".join(qrng.choice(words, 4).tolist()) for _ in range(600)]

    def start_server(self) -> None:
        import httpx

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        self.auth = {"Authorization": "Bearer chaos-key"}
        cmd = [sys.executable, "-m", "crossknn.cli", "serve", str(self.idx), "--port", str(port)]
        cmd += ["--api-key-file", str(self.root / "key"), "--log-queries", str(self.log)]
        cmd += ["--watch-index", "1", "--log-level", "warning"]
        cmd += ["--timeout-s", "600", "--admit-within", "1.0"]  # a slow, shared CPU
        self.serve_log = open(self.root / "serve.log", "w")  # noqa: SIM115
        self.srv = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=self.serve_log)
        t0 = time.monotonic()
        while time.monotonic() - t0 < 600:
            if self.srv.poll() is not None:
                raise RuntimeError(f"the server exited: {(self.root / 'serve.log').read_text()}")
            try:
                if httpx.get(self.url + "/readyz", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise TimeoutError("the server was not ready in 10 minutes")

    def info(self) -> dict:
        import httpx

        return httpx.get(self.url + "/info", headers=self.auth, timeout=60).json()

    # -- the operations -------------------------------------------------------------------------
    def _cli(self, argv: list[str], *, kill_after: float | None = None, fsize: int | None = None):
        """One ``crossknn`` command; ``kill_after``: SIGKILL after that many seconds if it still
        runs; ``fsize``: its file-size limit (a full disk). (rc or "killed", seconds, stderr)."""

        def limits() -> None:
            if self.args.op_nice:
                os.nice(self.args.op_nice)
            if fsize is not None:
                resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))

        err = self.root / "op.err"
        t = time.monotonic()
        with open(err, "w") as f:
            p = subprocess.Popen(
                [sys.executable, "-m", "crossknn.cli", *argv],
                stdout=subprocess.DEVNULL,
                stderr=f,
                preexec_fn=limits,
            )
            try:
                rc = p.wait(timeout=kill_after)
            except subprocess.TimeoutExpired:
                p.send_signal(signal.SIGKILL)
                p.wait()
                rc = "killed"
        return rc, time.monotonic() - t, err.read_text()[-400:]

    def _argv(self, op: str) -> tuple[list[str], dict]:
        """The command of a write operation and what it does."""
        from crossknn.corpus_folder import open_index

        rng = self.rng
        if op == "add":
            rows, what = [], {}
            if self.removed and rng.random() < 0.4:  # an id removed before, another text now
                iid = sorted(self.removed)[int(rng.integers(len(self.removed)))]
                j = int(self.pool_j[self.next_new % len(self.pool_j)])
                self.next_new += 1
                rows.append({"id": iid, "text": self.full.texts[j]})
                what["readded"] = iid
            for _ in range(int(rng.integers(2, 5))):
                j = int(self.pool_j[self.next_new % len(self.pool_j)])
                self.next_new += 1
                rows.append({"id": f"new-{self.next_new}", "text": self.full.texts[j]})
            f = self.root / f"add_{len(self.steps)}.jsonl"
            f.write_text("".join(json.dumps(r) + "\n" for r in rows))
            what["ids"] = [r["id"] for r in rows]
            return ["add", str(self.idx), str(f), "--quiet"], what
        if op in ("remove", "remove_again"):
            if op == "remove_again" and self.removed:
                ids = [sorted(self.removed)[int(rng.integers(len(self.removed)))]]
            else:
                live = sorted(self._texts())
                ids = [live[int(j)] for j in rng.choice(len(live), 2, replace=False)]
                if self.removed and rng.random() < 0.25:
                    ids.append(sorted(self.removed)[int(rng.integers(len(self.removed)))])
            f = self.root / f"remove_{len(self.steps)}.txt"
            f.write_text("\n".join(ids) + "\n")
            return ["remove", str(self.idx), "--ids", str(f)], {"ids": ids}
        n = len(open_index(self.idx, verify=False))
        calls = str(self.args.rows * n)
        return ["refine", str(self.idx), "--queries", str(self.log), "--index-calls", calls,
                "--quiet"], {}  # fmt: skip

    def write_op(self, op: str, step: dict, *, fsize: int | None = None) -> None:
        """A write operation, killed at a random point (``--kill-share``), then maybe rerun."""
        from crossknn.corpus.versions import index_version
        from crossknn.corpus_folder import open_index

        argv, what = self._argv(op)
        step.update(what)
        before = {i: t for i, t in self._texts().items()}
        past = self.durations[op.replace("_again", "")]
        est = float(np.median(past)) if past else 6.0
        kill = fsize is None and self.rng.random() < self.args.kill_share
        if kill:
            at = float(self.rng.uniform(0.2, 1.0)) * est
            rc, took, err = self._cli(argv, kill_after=at)
            step["kill_at_s"] = round(at, 2)
            if rc == "killed":
                self.kills += 1
                step["killed"] = True
                v = index_version(open_index(self.idx))  # whole (every hash), one version
                step["version_after_kill"] = v
                self.killed_ops.add(argv[0])
                if self.rng.random() < 0.5:  # the operator runs it again
                    rc, took, err = self._cli(argv)
                    step["rerun"] = True
        else:
            rc, took, err = self._cli(argv, fsize=fsize)
            if fsize is None and rc == 0:
                past.append(took)
        step["rc"], step["op_s"] = rc, round(took, 2)
        if rc not in (0, "killed"):
            step["error"] = err.strip().splitlines()[-1] if err.strip() else ""
        if rc == 0:
            self.killed_ops.discard(argv[0])
        elif rc != "killed":  # failed (a full disk): its work is kept for a rerun, as a kill's
            self.killed_ops.add(argv[0])
        after = self._texts()
        for iid in set(before) - set(after):
            self.removed[iid] = before[iid]
        for iid in set(after) & set(self.removed):
            del self.removed[iid]

    def _texts(self) -> dict[str, str]:
        from crossknn.corpus_folder import open_index

        index = open_index(self.idx, verify=False)
        dead = index.arrays.get("tombstones")
        dead = np.zeros(len(index), bool) if dead is None else np.asarray(dead, bool)
        return {
            i: t
            for i, t, d in zip(index.corpus.ids, index.corpus.texts, dead, strict=True)
            if not d
        }

    def rotate(self, step: dict) -> None:
        dest = self.root / "rotated" / f"{len(self.rotated):04d}.log"
        if self.log.exists():
            self.log.rename(dest)
            self.rotated.append(dest)
        if self.rng.random() < 0.5:
            self.srv.send_signal(signal.SIGHUP)
            step["sighup"] = True

    def disk_full(self, step: dict) -> None:
        size = self.log.stat().st_size if self.log.exists() else 0
        soft, hard = resource.prlimit(self.srv.pid, resource.RLIMIT_FSIZE)
        resource.prlimit(self.srv.pid, resource.RLIMIT_FSIZE, (size + 200, hard))
        try:
            time.sleep(self.args.full_s)
            if self.rng.random() < 0.5:  # an operation on the full disk too
                op = "add" if self.rng.random() < 0.5 else "remove"
                step["during"] = op
                self.write_op(op, step, fsize=64 << 10)
        finally:
            resource.prlimit(self.srv.pid, resource.RLIMIT_FSIZE, (soft, hard))

    def reload(self, step: dict) -> None:
        import httpx

        r = httpx.post(self.url + "/admin/reload", headers=self.auth, timeout=600)
        step["reload"] = r.json().get("status")
        step["reload_code"] = r.status_code

    # -- the checks -----------------------------------------------------------------------------
    def check(self, step: dict, v_before: int) -> None:
        from crossknn.corpus.versions import index_version
        from crossknn.corpus_folder import open_index

        index = open_index(self.idx)  # every array's hash checked
        v = index_version(index)
        step["version"] = v
        step["whole"] = v in (v_before, v_before + 1)
        doc = json.loads((self.idx / "index.json").read_text())
        named = {e["file"] for e in doc["arrays"].values()}
        named |= {doc["info"].get("items_file", "items.jsonl"), "index.json"}
        stray = {p.name for p in self.idx.iterdir() if p.name not in named}
        # left by a kill -9: the lock of a process that is gone (the next writer takes it
        # over) and the work of a killed add / refine (its rerun reads it back)
        if ".lock" in stray and not _alive((self.idx / ".lock").read_text().strip()):
            stray.discard(".lock")
        work = self.idx / ".build" / "lifecycle"
        if ".build" in stray and work.is_dir():
            left = {p.name for p in work.iterdir()}
            if left <= self.killed_ops and {p.name for p in work.parent.iterdir()} == {"lifecycle"}:
                stray.discard(".build")
        step["stray_files"] = sorted(stray)
        dead = index.arrays.get("tombstones")
        dead = np.zeros(len(index), bool) if dead is None else np.asarray(dead, bool)
        live = frozenset(i for i, d in zip(index.corpus.ids, dead, strict=True) if not d)
        self.live[v] = (live, len(live))
        self._sample_rows(index, v, step)
        pid = self.srv.pid
        step["rss_mb"] = round(_rss_mb(pid), 1)
        step["fds"] = _fds(pid)
        step["folder_mb"] = round(_folder_bytes(self.idx) / 1e6, 2)

    def _sample_rows(self, index, v: int, step: dict) -> None:
        """``--samples`` stored auto row entries of version ``v`` against the CE's exact
        score (each version's rows sampled once)."""
        from crossknn.index.auto import AUTO_ARRAY

        rows = index.arrays.get(AUTO_ARRAY)
        key = (v, index.info.get("items_sha256"), (index.params.get("auto") or {}).get("rows"))
        if rows is None or key in self.checked_rows:
            return
        self.checked_rows.add(key)
        rows = np.asarray(rows, np.float32)
        qs = index.params["auto"]["row_queries"]
        n = self.args.samples
        r = self.rng.integers(rows.shape[0], size=n)
        c = self.rng.integers(rows.shape[1], size=n)
        texts = [index.corpus.texts[int(j)] for j in c]
        self.ce.set_items(texts)
        got = np.empty(n, np.float32)
        for t in range(n):
            got[t] = float(self.ce.score(qs[int(r[t])], np.array([t]))[0])
        diff = np.abs(got - rows[r, c])
        wrong = int(np.sum(diff > ROW_TOL))
        self.sampled += n
        self.wrong += wrong
        self.max_diff = max(self.max_diff, float(diff[diff <= ROW_TOL].max(initial=0.0)))
        step["rows_sampled"], step["rows_wrong"] = n, wrong

    # -- the run --------------------------------------------------------------------------------
    def run(self) -> dict:
        a = self.args
        self.setup()
        self.start_server()
        from crossknn.corpus.versions import index_version
        from crossknn.corpus_folder import open_index

        v0 = index_version(open_index(self.idx))
        self.check({}, v0)
        clients = Clients(self.url, self.auth, self.queries, a.clients, a.think_s, a.seed)
        steal = StealMeter()
        t_start = time.monotonic()
        ops = list(WEIGHTS)
        p = np.array([WEIGHTS[o] for o in ops])
        p = p / p.sum()
        try:
            time.sleep(a.steady_s)  # some answered (and logged) queries first
            first = [o.strip() for o in a.first.split(",") if o.strip()]
            for i in range(a.ops):
                if time.monotonic() - t_start > 60 * a.max_minutes:
                    print(f"stopped after {i} operations: --max-minutes {a.max_minutes}")
                    break
                op = first[i] if i < len(first) else ops[int(self.rng.choice(len(ops), p=p))]
                if op == "remove_again" and not self.removed:
                    op = "remove"
                v_before = index_version(open_index(self.idx, verify=False))
                step = {"i": i, "op": op, "t_s": round(time.monotonic() - t_start, 1)}
                t = time.monotonic()
                if op in WRITES:
                    self.write_op(op, step)
                elif op == "rotate":
                    self.rotate(step)
                elif op == "disk_full":
                    self.disk_full(step)
                else:
                    self.reload(step)
                if op == "remove_again" and step.get("rc") == 0 and not step.get("killed"):
                    v_now = index_version(open_index(self.idx, verify=False))
                    step["no_new_version"] = v_now == v_before
                self.check(step, v_before)
                step["seconds"] = round(time.monotonic() - t, 2)
                step["cpu_steal_pct"] = steal.read()
                self.steps.append(step)
                print(
                    f"{i + 1:4d} {op:12s} rc={step.get('rc', '-')!s:7s} v{v_before}->"
                    f"v{step['version']} {'KILLED ' if step.get('killed') else ''}"
                    f"{step['seconds']:5.1f} s RSS {step['rss_mb']:.0f} MB fds {step['fds']}",
                    flush=True,
                )
            time.sleep(3.0)
            self.reload({})  # the last version swapped in
            time.sleep(a.steady_s / 2)
        finally:
            answers = clients.stop()
            info = self.info()
            self.srv.send_signal(signal.SIGTERM)  # graceful: the log's backlog is written
            try:
                self.srv.wait(120)
            except subprocess.TimeoutExpired:
                self.srv.kill()
            self.serve_log.close()
        return self.summary(answers, info, time.monotonic() - t_start)

    # -- the verdict ----------------------------------------------------------------------------
    def _log_records(self) -> tuple[collections.Counter, int, int]:
        """(logged queries, readable records, unreadable lines) over every log file."""
        logged: collections.Counter = collections.Counter()
        n = bad = 0
        for f in [*self.rotated, self.log]:
            if not f.exists():
                continue
            for line in f.read_bytes().splitlines():
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                    logged[rec["query"]] += 1
                    n += 1
                except (ValueError, KeyError):
                    bad += 1
        return logged, n, bad

    def summary(self, answers: list[tuple], info: dict, seconds: float) -> dict:
        removed_served = short = unknown = 0
        non_2xx = 0
        codes: collections.Counter = collections.Counter()
        answered: collections.Counter = collections.Counter()
        for _start, _end, code, v, ids, q, retry in answers:
            codes[str(code)] += 1
            if code == 429 and retry:
                continue
            if not 200 <= code < 300:
                non_2xx += 1
                continue
            answered[q] += 1
            if v not in self.live:
                unknown += 1
                continue
            live, n_live = self.live[v]
            removed_served += any(i not in live for i in ids)
            short += len(ids) < min(K, n_live)
        logged, n_records, unreadable = self._log_records()
        lost = sum(max(0, c - logged[q]) for q, c in answered.items())
        warm = self.args.warmup_ops
        rss = [s["rss_mb"] for s in self.steps]
        fds = [s["fds"] for s in self.steps]
        base = float(np.median(rss[warm : warm + 10])) if len(rss) > warm else None
        end = float(np.median(rss[-10:])) if rss else None
        growth = None if base is None else round((end - base) / base, 4)
        kills = self.kills
        ops_done = len(self.steps)
        outcome: collections.Counter = collections.Counter()
        for s in self.steps:
            if "rc" in s:
                outcome[f"{s['op']}:{'killed' if s.get('killed') else s['rc']}"] += 1
        goals = {
            "operations": ops_done,
            "kills": kills,
            "removed_served": int(removed_served),
            "short_answers": int(short),
            # not measured below 1,000 sampled entries
            "wrong_row_entries": int(self.wrong) if self.sampled >= 1000 else None,
            "log_records_lost": int(lost + unreadable),
            "non_2xx": int(non_2xx),
            "rss_growth": growth,
        }
        return {
            "setup": {
                "items": self.args.items,
                "item_chars": self.args.chars,
                "rows": self.args.rows,
                "k": K,
                "budget": BUDGET,
                "clients": self.args.clients,
                "think_s": self.args.think_s,
                "seed": self.args.seed,
                "kill_share": self.args.kill_share,
                "op_nice": self.args.op_nice,
                "weights": WEIGHTS,
                "models": "the embedded CE and DE (fp32, CPU)",
                "full_disk": "the server's RLIMIT_FSIZE at the log's size + 200 bytes (prlimit) "
                f"for {self.args.full_s:g} s; a command in the window at a 64 KiB limit",
            },
            "seconds": round(seconds, 1),
            "answers": {
                "total": len(answers),
                "status_counts": dict(sorted(codes.items())),
                "answered_queries": int(sum(answered.values())),
                "versions_served": sorted({a[3] for a in answers if a[3] is not None}),
                "unknown_version": unknown,
            },
            "log": {
                "files": 1 + len(self.rotated),
                "records": n_records,
                "unreadable_lines": unreadable,
                "answered_not_logged": int(lost),
                "server": info.get("query_log"),
            },
            "rows": {
                "sampled": self.sampled,
                "wrong": self.wrong,
                "tolerance": ROW_TOL,
                "max_abs_diff_within_tolerance": round(self.max_diff, 6),
            },
            "folder": {
                "not_whole": sum(not s["whole"] for s in self.steps),
                "stray_files": sum(bool(s["stray_files"]) for s in self.steps),
                "remove_again_new_versions": sum(
                    s.get("no_new_version") is False for s in self.steps
                ),
                "mb_first_last": [self.steps[0]["folder_mb"], self.steps[-1]["folder_mb"]]
                if self.steps
                else None,
            },
            "server": {
                "rss_mb_first_warm_last": [rss[0], base, end] if rss else None,
                "fds_first_warm_last": [fds[0], fds[min(warm, len(fds) - 1)], fds[-1]]
                if fds
                else None,
                "reload": info.get("reload", {}).get("swaps"),
                "refused": info.get("reload", {}).get("refused"),
                "releases": info.get("reload", {}).get("releases"),
            },
            "outcomes": dict(sorted(outcome.items())),
            "steps": self.steps,
            "goals": goals,
        }


def print_table(res: dict) -> None:
    g = res["goals"]
    targets = {
        "operations": "≥ 200",
        "kills": "≥ 30",
        "removed_served": "0",
        "short_answers": "0",
        "wrong_row_entries": f"0 of ≥ 1,000 sampled ({res['rows']['sampled']:,})",
        "log_records_lost": "0",
        "non_2xx": "0 (429 with Retry-After allowed)",
        "rss_growth": "≤ 0.05",
    }
    print(f"\n{'goal':20s} {'measured':>10s}  target")
    for key, target in targets.items():
        v = g[key]
        print(f"{key:20s} {'-' if v is None else f'{v:g}':>10s}  {target}")
    a = res["answers"]
    print(
        f"\n{a['total']:,} requests ({a['status_counts']}), versions "
        f"{a['versions_served'][0] if a['versions_served'] else '-'}.."
        f"{a['versions_served'][-1] if a['versions_served'] else '-'}; log: "
        f"{res['log']['records']:,} records in {res['log']['files']} files, "
        f"{res['log']['unreadable_lines']} unreadable; outcomes {res['outcomes']}"
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="lifecycle_bench.py --part chaos", description=__doc__.splitlines()[0]
    )
    ap.add_argument("--ops", type=int, default=220, help="operations (default 220)")
    ap.add_argument("--items", type=int, default=300, help="items of the index (default 300)")
    ap.add_argument("--rows", type=int, default=2, help="complete auto rows (default 2)")
    ap.add_argument("--chars", type=int, default=160, help="characters of an item at most")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--think-s", type=float, default=0.3, help="mean pause between requests")
    ap.add_argument("--kill-share", type=float, default=0.4, help="write operations killed")
    ap.add_argument("--samples", type=int, default=40, help="row entries sampled per version")
    ap.add_argument(
        "--first",
        default="",
        help="operations run first, before the random ones (comma-separated; a smoke test)",
    )
    ap.add_argument("--full-s", type=float, default=4.0, help="seconds of a disk-full window")
    ap.add_argument("--steady-s", type=float, default=15.0)
    ap.add_argument("--warmup-ops", type=int, default=20, help="steps before the RSS baseline")
    ap.add_argument("--op-nice", type=int, default=0, help="niceness of the commands")
    ap.add_argument("--max-minutes", type=float, default=120.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--work", type=Path, default=WORK, help="work folder (the base index cached)")
    args = ap.parse_args(argv)
    if not 0.0 <= args.kill_share <= 1.0:
        ap.error(f"--kill-share must be within [0, 1]; got {args.kill_share}")
    bad = [o for o in args.first.split(",") if o.strip() and o.strip() not in WEIGHTS]
    if bad:
        ap.error(f"--first: expected operations among {', '.join(WEIGHTS)}; got {bad[0]!r}")
    res = Chaos(args).run()
    res["hardware"] = f"{os.cpu_count()}-core {_cpu_model()}, " + time.strftime(
        "%Y-%m-%d", time.gmtime()
    )
    print_table(res)
    write_json(args.out, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
