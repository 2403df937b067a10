"""The living index (issue 47): refine on served queries, add, remove, and serve's swaps.

    .venv/bin/python bench/lifecycle_bench.py                 # both parts (~25 min on 2 cores)
    .venv/bin/python bench/lifecycle_bench.py --part recall   # refine / add / remove
    .venv/bin/python bench/lifecycle_bench.py --part swap     # serve under load through swaps

``recall`` (CPU scale: the items of a score matrix in ``../shared/matrices`` -- ``--matrix``,
``cisi-minilm`` by default, all 1,460 items; or a seeded subset of ``--items`` items, e.g. of
``nfcorpus-minilm-gpu``): the CE is the embedded CE for every query that is
not a matrix row (pseudo-queries, the calibration) and the matrix's exact scores of the embedded
CE for the matrix's train and test queries (the honest CE for them: the same model);
the DE is the embedded DE. It builds the default pseudo-row index (``crossknn build``'s default
budget rule, timed: the rebuild time), replays the **train** queries through the searcher with
the query log on (``--log-queries``'s code: every query's paid-for entries logged, B = 100),
refines after 0, 100, 300 and all served queries (a quarter and a half of a shorter log) and at
several budgets, and evaluates Top-10-Recall@100 on the **test** queries against the exact
top-10 within the items; beside it
the real-row index (``build --train-queries`` with the train queries at the same budget). ``add``:
an index of 90% of the items plus ``crossknn add`` of the other 10%, against the full build;
``remove``: 10% of the items removed from the refined index (tombstones, and compacted).

``swap``: a real ``crossknn serve`` (embedded CE, a 100-item index of stdlib docstrings,
--log-queries) under 8 concurrent clients while 20 new versions (``--ops``: add, remove, refine in
turn, each by the ``crossknn`` command at ``--op-nice`` 10, as an operator runs it beside the
server) are swapped in by ``POST /admin/reload``: non-2xx responses, p99 latency in the swap
windows against steady state, the server's RSS after each swap once the old version's memory is
released (``/info``), against its steady state before the swaps. ``--swaps 0 --steady-s 600``:
the same load without swaps (a control).

``chaos`` (issue 54; ``bench/_lifecycle_chaos.py``, its own arguments): a server under 8 clients
while a seeded random sequence of 220 operations (add, remove, refine, reload, kill -9 of a
command, log rotation, a full disk) runs beside it, every invariant checked after each step;
writes ``bench/results/lifecycle_chaos.json``.

Writes ``bench/results/lifecycle_bench.json`` (``goals``: the issue's six keys) and
``docs/img/lifecycle.png``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import StealMeter, _cpu_model, write_json  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
MATRICES = SHARED / "matrices"
OUT = REPO / "bench" / "results" / "lifecycle_bench.json"
PLOT = REPO / "docs" / "img" / "lifecycle.png"
WORK = REPO / "build" / "lifecycle_bench"
K, B = 10, 100


class CachedDE:
    """The embedded DE, each text encoded once (the same vectors, fewer passes)."""

    def __init__(self, de) -> None:
        self.de, self.cache = de, {}

    def __getattr__(self, name):
        if name.startswith("__") or name == "de":
            raise AttributeError(name)
        return getattr(self.de, name)

    def encode(self, texts, **kw):
        texts = list(texts)
        todo = [t for t in dict.fromkeys(texts) if t not in self.cache]
        if todo:
            for t, v in zip(todo, np.asarray(self.de.encode(todo, **kw), np.float32), strict=True):
                self.cache[t] = v
        return np.stack([self.cache[t] for t in texts]) if texts else np.empty((0, self.dim))


class HybridCE:
    """The embedded CE, except for queries that are rows of the score matrix: their scores are
    looked up (the matrix holds this CE's exact scores for them). Counts the real CE's pairs."""

    def __init__(self, real, S, qrow: dict[str, int], col_of_text: dict[str, int], cache=None):
        self.real, self.S, self.qrow, self.col_of_text = real, S, qrow, col_of_text
        self.cols = np.empty(0, np.int64)
        self.real_pairs, self.real_seconds = 0, 0.0
        self._texts: list[str] | None = None
        self._real_set = False
        # (query, subset column) -> score of the real CE, kept on disk (resumable runs); None:
        # every pair goes to the CE (the timed steps)
        self.cache: dict | None = None
        self.cache_file = cache
        if cache is not None:
            self.cache = {}
            if Path(cache).is_file():
                for line in Path(cache).read_text().splitlines():
                    try:
                        q, cols, sc = json.loads(line)
                    except ValueError:
                        continue  # a torn last line
                    for c, v in zip(cols, sc, strict=True):
                        self.cache[(q, c)] = v

    def __getattr__(self, name):
        if name.startswith("__") or name in ("real",):
            raise AttributeError(name)
        return getattr(self.real, name)

    @property
    def n_items(self) -> int:
        return int(self.cols.size)

    def set_items(self, texts) -> None:
        self._texts = list(texts)
        self.cols = np.array([self.col_of_text.get(t, -1) for t in self._texts], np.int64)
        self._real_set = False

    def score(self, query, items):
        return self.score_batch([query], [items])[0]

    def score_batch(self, queries, items):
        out, todo = [], []
        for q, it in zip(queries, items, strict=True):
            it = np.asarray(it, np.int64).ravel()
            r = self.qrow.get(q)
            c = self.cols[it]
            if r is not None and (c >= 0).all():
                out.append(self.S[r, c].astype(np.float32))
            elif self.cache is not None and all((q, int(x)) in self.cache for x in c):
                out.append(np.array([self.cache[(q, int(x))] for x in c], np.float32))
            else:
                todo.append(len(out))
                out.append((q, it))
        if todo:
            if not self._real_set:
                self.real.set_items(self._texts)
                self._real_set = True
            t = time.perf_counter()
            got = self.real.score_batch([out[j][0] for j in todo], [out[j][1] for j in todo])
            self.real_seconds += time.perf_counter() - t
            lines = []
            for j, s in zip(todo, got, strict=True):
                q, it = out[j]
                self.real_pairs += it.size
                out[j] = np.asarray(s, np.float32)
                if self.cache is not None:
                    cols = [int(x) for x in self.cols[it]]
                    self.cache.update(zip([(q, c) for c in cols], out[j].tolist(), strict=True))
                    lines.append(json.dumps([q, cols, out[j].tolist()]) + "\n")
            if lines:  # one append: two processes caching the same corpus never tear a line
                fd = os.open(self.cache_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                try:
                    os.write(fd, "".join(lines).encode("utf-8"))
                finally:
                    os.close(fd)
        return out


def _setup(matrix: Path, n_items: int, seed: int):
    """The matrix's items (all when ``n_items`` is 0 or at least their count, else a seeded
    subset), its scores over them, and its train and test queries (one row per distinct text)."""
    from crossknn.data import Corpus, load_beir
    from crossknn.matrix import load_score_matrix

    m = load_score_matrix(matrix, mmap=True)
    beir = load_beir(m.corpus_dir())
    texts_all = beir.items_in_order(m.item_ids)
    qtexts = beir.queries_in_order(m.query_ids)
    rng = np.random.default_rng(seed)
    if 0 < n_items < m.n_items:
        cols = np.sort(rng.choice(m.n_items, n_items, replace=False))
    else:
        cols = np.arange(m.n_items)
    S = np.ascontiguousarray(np.asarray(m.scores)[:, cols], np.float32)
    ids = [m.item_ids[c] for c in cols]
    texts = [texts_all[c] for c in cols]
    col_of_text: dict[str, int] = {}
    for j, t in enumerate(texts):
        col_of_text.setdefault(t, j)
    qrow: dict[str, int] = {}
    for r, t in enumerate(qtexts):
        qrow.setdefault(t, r)
    train = [qtexts[r] for r in m.train if qrow[qtexts[r]] == r]
    test_rows = [int(r) for r in m.test if qrow[qtexts[r]] == r]
    test = [qtexts[r] for r in test_rows]
    name = matrix.name + (" subset" if cols.size < m.n_items else "")
    return Corpus(ids, texts, name), S, qrow, col_of_text, train, test, test_rows


def _exact_top(S, rows, live=None):
    from crossknn.topk import exact_top_k

    out = []
    for r in rows:
        s = S[r].astype(np.float64)
        if live is not None:
            s = np.where(live, s, -np.inf)
        out.append(set(exact_top_k(s, K).tolist()))
    return out


def _recall(index_dir, ce, de, test, exact_ids, *, hits_out=None):
    """Mean Top-10-Recall@100 of the index's default method on the test queries (exact_ids: the
    exact top-10 as item ids)."""
    from crossknn.corpus_folder import open_index
    from crossknn.searcher import Searcher

    s = Searcher(open_index(index_dir), ce=ce, de=de)
    hits = s.search(test, k=K, budget=B)
    if hits_out is not None:
        hits_out.extend(hits)
    return float(np.mean([len(set(h.ids) & ex) / K for h, ex in zip(hits, exact_ids, strict=True)]))


def part_recall(args, res: dict) -> None:
    import crossknn.ce
    from crossknn.corpus.build import build_corpus_index
    from crossknn.corpus.edit import add_items, remove_items
    from crossknn.corpus.query_log import QueryLog, read_log
    from crossknn.corpus.refine import refine_index
    from crossknn.corpus_folder import open_index
    from crossknn.data import Corpus
    from crossknn.index.auto import default_index_rows
    from crossknn.searcher import Searcher

    corpus, S, qrow, col_of_text, train, test, test_rows = _setup(
        args.matrix, args.items, args.seed
    )
    N = len(corpus)
    real_ce = crossknn.ce.default_cross_encoder()
    de = CachedDE(crossknn.ce.default_dual_encoder(show_progress_bar=False))
    if args.fresh:
        shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True, exist_ok=True)
    key = {"matrix": args.matrix.name, "items": N, "seed": args.seed, "rows": args.rows}
    if not (WORK / "key.json").is_file() or json.loads((WORK / "key.json").read_text()) != key:
        shutil.rmtree(WORK)
        WORK.mkdir(parents=True)
    if not (WORK / "key.json").is_file():
        (WORK / "key.json").write_text(json.dumps(key))
    # the untimed steps read the real CE's scores through a cache (resumable); the timed ones
    # (the full build, the add) score every pair
    ce = HybridCE(real_ce, S, qrow, col_of_text, cache=WORK / "ce_cache.jsonl")
    ids = corpus.ids
    exact_ids = [{ids[j] for j in ex} for ex in _exact_top(S, test_rows)]
    out = {
        "scale": {
            "dataset": corpus.source,
            "items": N,
            "train_queries": len(train),
            "test_queries": len(test),
            "k": K,
            "budget": B,
            "seed": args.seed,
        }
    }
    print(f"{corpus.source}: {N} items, {len(train)} train, {len(test)} test queries")

    # the default pseudo-row index (build's default budget rule), timed: the rebuild's time
    pseudo = WORK / "pseudo"
    timed = WORK / "pseudo_build.json"
    if not timed.is_file():
        # an interrupted build resumes from its work folder; its time counts from the first
        # attempt's start (WORK/key.json is written just before it): never shorter than it was
        ce_t = HybridCE(real_ce, S, qrow, col_of_text)
        t = time.perf_counter() - (time.time() - (WORK / "key.json").stat().st_mtime)
        # the default rule's rows (N / 100, at most 32) without its time cap, which on a busy
        # CPU would buy a row or two
        rows = args.rows or default_index_rows(N)
        build_corpus_index(corpus, pseudo, ce=ce_t, de=de, index_calls=rows * N, progress=False)
        t_build = time.perf_counter() - t
        timed.write_text(json.dumps({"build_s": t_build, "real_pairs": ce_t.real_pairs}))
    t_build = json.loads(timed.read_text())["build_s"]
    build_pairs = json.loads(timed.read_text())["real_pairs"]
    p_idx = open_index(pseudo)
    C = int(p_idx.params["auto"]["index_calls_limit"])
    rows = C // N
    r_pseudo = _recall(pseudo, ce, de, test, exact_ids)
    print(
        f"pseudo-row index: {rows} rows ({C:,} CE calls), build {t_build:.1f} s, "
        f"recall {r_pseudo:.4f}"
    )
    out["pseudo"] = {
        "rows": rows,
        "index_calls": C,
        "build_s": round(t_build, 2),
        "real_ce_pairs": build_pairs,
        "recall": r_pseudo,
    }

    def real_rows_index(c: int) -> float:
        d = WORK / f"real_{c}"
        shutil.rmtree(d, ignore_errors=True)
        build_corpus_index(
            corpus, d, ce=ce, de=de, train_queries=train, index_calls=c, progress=False
        )
        return _recall(d, ce, de, test, exact_ids)

    # replay the train queries through the searcher, logging them (search/serve --log-queries)
    log_path = WORK / "queries.log"
    if log_path.is_file():
        cached = read_log(log_path, quiet=True)  # kept only if whole, with item-text hashes
        if len(cached) != len(train) or any(r.item_hashes is None for r in cached):
            log_path.unlink()
    s = Searcher(p_idx, ce=ce, de=de)
    s.record_paid = True
    t = time.perf_counter()
    hits = [] if log_path.is_file() else s.search(train, k=K, budget=B)
    with QueryLog(log_path) as log:
        log.append_hits(
            hits,
            ids,
            s.corpus.texts,
            index_version=1,
            ce_model_hash=ce.model_hash,
            de_model_hash=de.model_hash,
        )
    print(f"replayed {len(train)} train queries in {time.perf_counter() - t:.1f} s")
    records = read_log(log_path)

    def refined(n_queries: int, c: int) -> tuple[float, dict]:
        d = WORK / f"refined_{n_queries}_{c}"
        shutil.rmtree(d, ignore_errors=True)
        shutil.copytree(pseudo, d)
        r = refine_index(d, records[:n_queries], ce=ce, de=de, index_calls=c, quiet=True)
        return _recall(d, ce, de, test, exact_ids), r.as_dict()

    curve = [{"served": 0, "rows": rows, "recall": r_pseudo}]
    # the points (100, 300, all served); on a short log (CISI: 62 train queries) a
    # quarter and a half of it
    points = [n for n in (100, 300) if n < len(records)] or [len(records) // 4, len(records) // 2]
    for n in sorted({*points, len(records)}):
        rec, info = refined(n, C)
        curve.append({"served": n, "rows": rows, "recall": rec, "real_rows": info["real_rows"]})
        print(f"refined after {n} served queries: recall {rec:.4f}")
    out["curve_served"] = curve
    budgets = []
    for m in sorted({max(2, rows // 2), rows, 2 * rows}):
        rec, info = refined(len(records), m * N)
        real = real_rows_index(m * N)
        budgets.append({"rows": m, "index_calls": m * N, "refined": rec, "real_rows": real})
        print(f"budget {m} rows: refined {rec:.4f}, real-row index {real:.4f}")
    out["curve_budget"] = budgets
    same = next(b for b in budgets if b["rows"] == rows)
    r_refined, r_real = same["refined"], same["real_rows"]

    # add: 90% built, the other 10% added, against the full build (the pseudo index above)
    rng = np.random.default_rng(args.seed + 1)
    new_pos = np.sort(rng.choice(N, N // 10, replace=False))
    is_new = np.zeros(N, bool)
    is_new[new_pos] = True
    base = Corpus(
        [ids[j] for j in range(N) if not is_new[j]],
        [corpus.texts[j] for j in range(N) if not is_new[j]],
        "base",
    )
    extra = Corpus([ids[j] for j in new_pos], [corpus.texts[j] for j in new_pos], "new")
    # the 90% index: the full build with the 10% removed and compacted (its rows, calibration
    # and round index over the 90%), then those 10% added back
    part = WORK / "add"
    shutil.rmtree(part, ignore_errors=True)
    shutil.copytree(pseudo, part)
    remove_items(part, list(extra.ids), compact_at=0.0)
    assert len(open_index(part)) == len(base)
    ce_t = HybridCE(real_ce, S, qrow, col_of_text)  # timed: every pair scored
    t = time.perf_counter()
    add_info = add_items(part, extra, ce=ce_t, de=de)
    t_add = time.perf_counter() - t
    new_ids = set(extra.ids)
    sel = [i for i, ex in enumerate(exact_ids) if ex & new_ids]
    sub_test, sub_exact = [test[i] for i in sel], [exact_ids[i] for i in sel]
    r_add = _recall(part, ce, de, sub_test, sub_exact)
    r_rebuild = _recall(pseudo, ce, de, sub_test, sub_exact)
    print(
        f"add {len(extra)} items: {t_add:.1f} s vs rebuild {t_build:.1f} s; recall on {len(sel)} "
        f"queries with new items in their top-10: add {r_add:.4f}, rebuild {r_rebuild:.4f}"
    )
    out["add"] = {
        "added": len(extra),
        "add_s": round(t_add, 2),
        "rebuild_s": round(t_build, 2),
        "ce_calls": add_info["ce_calls"],
        "queries": len(sel),
        "recall_add": r_add,
        "recall_rebuild": r_rebuild,
    }

    # remove 10% of the refined index's items: tombstones, and compacted
    refined_dir = WORK / f"refined_{len(records)}_{C}"
    rm = [ids[j] for j in np.sort(rng.choice(N, N // 10, replace=False))]
    live = np.array([i not in set(rm) for i in ids])
    exact_live = [{ids[j] for j in ex} for ex in _exact_top(S, test_rows, live)]
    out["remove"] = {"removed": len(rm), "recall_before": r_refined}
    for how, share in (("tombstones", 1.0), ("compacted", 0.1)):
        d = WORK / f"remove_{how}"
        shutil.rmtree(d, ignore_errors=True)
        shutil.copytree(refined_dir, d)
        info = remove_items(d, rm, compact_at=share)
        got: list = []
        r = _recall(d, ce, de, test, exact_live, hits_out=got)
        leaks = sum(i in set(rm) for h in got for i in h.ids)
        out["remove"][how] = {"recall": r, "leaks": int(leaks), "compacted": info["compacted"]}
        print(
            f"remove {len(rm)} ({how}): recall of the rest {r:.4f}, removed items returned {leaks}"
        )

    out["recall"] = {"pseudo": r_pseudo, "real_rows": r_real, "refined": r_refined}
    out["real_ce"] = {"pairs": ce.real_pairs, "seconds": round(ce.real_seconds, 1)}
    res["recall_part"] = out


def _plot(res: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rp = res.get("recall_part")
    if not rp:
        return
    fig, ax = plt.subplots(1, 2, figsize=(10, 3.8))
    c = rp["curve_served"]
    ax[0].plot([x["served"] for x in c], [x["recall"] for x in c], "o-", label="refined")
    ax[0].axhline(rp["recall"]["real_rows"], color="g", ls="--", label="real-row index")
    ax[0].axhline(rp["recall"]["pseudo"], color="r", ls=":", label="pseudo-row index")
    ax[0].set_xlabel("train queries served (and logged)")
    ax[0].set_ylabel(f"test Top-{K}-Recall@{B}")
    ax[0].set_title(f"refine at the default budget ({c[0]['rows']} rows)")
    ax[0].legend()
    b = rp["curve_budget"]
    ax[1].plot([x["rows"] for x in b], [x["refined"] for x in b], "o-", label="refined (log)")
    ax[1].plot([x["rows"] for x in b], [x["real_rows"] for x in b], "s--", label="real-row build")
    ax[1].axhline(rp["recall"]["pseudo"], color="r", ls=":", label="pseudo-row index")
    ax[1].set_xlabel("refine budget (complete rows' worth of CE calls)")
    ax[1].set_title("by budget, all served queries")
    ax[1].legend()
    s = rp["scale"]
    fig.suptitle(
        f"{s['dataset']} ({s['items']} items, {s['test_queries']} test queries), "
        f"{rp.get('hardware', res.get('hardware', ''))}",
        fontsize=9,
    )
    fig.tight_layout()
    PLOT.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(PLOT, dpi=110)
    print(f"wrote {PLOT}")


def goals(res: dict) -> dict:
    rp, sw = res.get("recall_part") or {}, res.get("swap_part") or {}
    g = {
        "refine_vs_real_rows": None,
        "refine_vs_pseudo": None,
        "add_vs_rebuild": None,
        "add_time_share": None,
        "remove_leaks": None,
        "swap_non_2xx": None,
    }
    if rp:
        r = rp["recall"]
        g["refine_vs_real_rows"] = round(r["refined"] - r["real_rows"], 4)
        g["refine_vs_pseudo"] = round(r["refined"] - r["pseudo"], 4)
        a = rp["add"]
        g["add_vs_rebuild"] = round(a["recall_add"] - a["recall_rebuild"], 4)
        g["add_time_share"] = round(a["add_s"] / a["rebuild_s"], 4)
        g["remove_leaks"] = int(sum(rp["remove"][h]["leaks"] for h in ("tombstones", "compacted")))
    if sw:
        g["swap_non_2xx"] = int(sw["non_2xx"])
    return g


def main(argv=None) -> int:
    global WORK
    argv = sys.argv[1:] if argv is None else list(argv)
    chaos = _chaos(argv)
    if chaos is not None:  # the chaos run has arguments of its own (bench/_lifecycle_chaos.py)
        from _lifecycle_chaos import main as chaos_main

        return chaos_main(chaos)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--part",
        choices=("recall", "swap", "all", "merge", "chaos"),
        default="all",
        help="merge: no measurement, the parts of the --merge results into --out; chaos: "
        "bench/_lifecycle_chaos.py (its own arguments: --part chaos --help)",
    )
    ap.add_argument(
        "--matrix",
        type=Path,
        default=MATRICES / "cisi-minilm",
        help="a score matrix of the embedded CE (default: ../shared/matrices/cisi-minilm)",
    )
    ap.add_argument("--items", type=int, default=0, help="a seeded subset (default 0: all)")
    ap.add_argument("--rows", type=int, default=0, help="auto rows (default: N / 100)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--swaps", type=int, default=20)
    ap.add_argument(
        "--ops",
        default="add,remove,refine",
        help="the commands the swaps cycle through (default add,remove,refine)",
    )
    ap.add_argument("--steady-s", type=float, default=20.0, help="steady state before the swaps")
    ap.add_argument(
        "--op-nice",
        type=int,
        default=10,
        help="niceness of the refine/add/remove commands during the swaps (0: the server's)",
    )
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--fresh", action="store_true", help="discard the cached work first")
    ap.add_argument(
        "--merge",
        type=Path,
        action="append",
        default=[],
        help="take the parts this run does not measure from this result (repeatable)",
    )
    ap.add_argument("--work", type=Path, default=WORK, help="work folder (cached, resumable)")
    args = ap.parse_args(argv)
    args.ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    bad = sorted(set(args.ops) - {"add", "remove", "refine"})
    if bad or not args.ops:
        got = ", ".join(bad) or "nothing"
        ap.error(f"--ops: expected add, remove or refine, comma-separated; got {got}")
    WORK = args.work
    if not args.matrix.is_dir():
        print(f"skipped: {args.matrix} is missing")
        return 0
    res = json.loads(args.out.read_text()) if args.out.exists() else {}
    res.pop("provenance", None)

    here = f"{os.cpu_count()}-core {_cpu_model()}, " + time.strftime("%Y-%m-%d", time.gmtime())
    parts = ("recall_part", "swap_part")
    for part in parts:  # a part kept from an earlier run keeps the machine it ran on
        if part in res:
            res[part].setdefault("hardware", res.get("hardware", ""))
    if args.part in ("recall", "all"):
        part_recall(args, res)
        res["recall_part"]["hardware"] = here
    if args.part in ("swap", "all"):
        part_swap(args, res)
        res["swap_part"]["hardware"] = here
    for path in args.merge:
        other = json.loads(path.read_text())
        for part in parts:
            if part in other and args.part not in ("all", part.split("_")[0]):
                res[part] = other[part]
                res[part].setdefault("hardware", other.get("hardware", ""))
                res.setdefault("measured", {})[part] = other.get("provenance")
    where = {p: res[p]["hardware"] for p in parts if p in res}
    if len(set(where.values())) == 1:
        res["hardware"] = next(iter(where.values()))
    else:
        names = {"recall_part": "refine/add/remove", "swap_part": "swaps"}
        res["hardware"] = "; ".join(f"{names[p]}: {h}" for p, h in where.items())
    res["goals"] = goals(res)
    print(json.dumps(res["goals"], indent=1))
    write_json(args.out, res)
    _plot(res)
    return 0


def _chaos(argv: list[str]) -> list[str] | None:
    """The chaos run's arguments when ``argv`` asks for ``--part chaos`` (else None)."""
    for i, a in enumerate(argv):
        if a == "--part=chaos" or (a == "--part" and argv[i + 1 : i + 2] == ["chaos"]):
            return argv[:i] + argv[i + (1 if "=" in a else 2) :]
    return None


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    return float("nan")


def part_swap(args, res: dict) -> None:
    """A real ``crossknn serve`` under 8 concurrent clients through ``args.swaps`` swaps."""
    import socket
    import subprocess
    import threading

    import httpx

    import crossknn.ce
    from crossknn.corpus.build import build_corpus_index
    from crossknn.corpus_folder import open_index
    from crossknn.data import Corpus
    from crossknn.demo_corpus import stdlib_docstrings

    n, budget, conc = 100, 20, 8
    root = WORK / "swap"
    base = WORK / "swap_base"
    corpus = stdlib_docstrings(max_items=n + 5 * args.swaps)
    ce = crossknn.ce.default_cross_encoder()
    de = crossknn.ce.default_dual_encoder(show_progress_bar=False)
    if not (base / "index.json").is_file():
        build_corpus_index(
            Corpus(corpus.ids[:n], corpus.texts[:n], "swap"),
            base,
            ce=ce,
            de=de,
            index_calls=2 * n,
            calibration_queries=4,
            calibration_items=16,
            progress=False,
        )
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(base, root / "idx")
    idx = root / "idx"
    (root / "key").write_text("bench-key\n")
    (root / "key").chmod(0o600)
    log = root / "served.log"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "crossknn.cli", "serve", str(idx), "--port", str(port)]
    cmd += ["--api-key-file", str(root / "key"), "--log-queries", str(log)]
    cmd += ["--watch-index", "0", "--log-level", "warning"]
    # a slow, shared CPU: admit what fits in 10 minutes rather than shed it (429)
    cmd += ["--timeout-s", "600", "--admit-within", "1.0"]
    srv = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(root / "serve.log", "w"))  # noqa: SIM115
    auth = {"Authorization": "Bearer bench-key"}
    t0 = time.monotonic()
    while time.monotonic() - t0 < 300:
        try:
            if httpx.get(url + "/readyz", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.5)

    def run_op(argv: list[str]) -> None:
        """One CLI command (``crossknn refine``/``add``/``remove``), as an operator runs it on the
        serving machine: at ``--op-nice`` niceness, so that the server keeps the CPU first."""
        with open(root / "ops.log", "a") as err:
            subprocess.run(
                [sys.executable, "-m", "crossknn.cli", *argv, "--quiet"]
                if argv[0] != "remove"
                else [sys.executable, "-m", "crossknn.cli", *argv],
                check=True,
                stdout=subprocess.DEVNULL,
                stderr=err,
                preexec_fn=(lambda: os.nice(args.op_nice)) if args.op_nice else None,
            )

    words = [w for t in corpus.texts[:n] for w in t.split()[:6] if len(w) > 3]
    rng = np.random.default_rng(0)
    queries = [" ".join(rng.choice(words, 4).tolist()) for _ in range(400)]
    records: list[tuple[float, float, int, int | None]] = []
    stop = threading.Event()

    def client(i: int) -> None:
        with httpx.Client(timeout=120) as http:
            j = i
            while not stop.is_set():
                a = time.monotonic()
                try:
                    r = http.post(
                        url + "/search",
                        json={"query": queries[j % len(queries)], "k": 5, "budget": budget},
                        headers=auth,
                    )
                    code, v = r.status_code, (r.json() or {}).get("index_version")
                except (httpx.HTTPError, ValueError):
                    code, v = 599, None
                records.append((a, time.monotonic(), code, v))
                j += conc
                if code == 429:  # a client honours Retry-After (capped: the load goes on)
                    stop.wait(min(float(r.headers.get("retry-after", 1)), 5.0))

    timeline: list[tuple[float, float]] = []  # (s since the clients started, server RSS MB)

    def sample_rss() -> None:
        t_start = time.monotonic()
        while not stop.wait(10.0):
            timeline.append((round(time.monotonic() - t_start, 1), round(_rss_mb(srv.pid), 1)))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(conc)]
    threads.append(threading.Thread(target=sample_rss))
    try:
        for t in threads:
            t.start()
        time.sleep(args.steady_s)
        t1 = time.monotonic()  # steady state: at least 50 answered (and logged) queries
        while sum(r[2] == 200 for r in records) < 50 and time.monotonic() - t1 < 300:
            time.sleep(1.0)
        rss_steady = _rss_mb(srv.pid)
        swaps, ops = [], []
        steal = StealMeter()
        for k in range(args.swaps):
            op = args.ops[k % len(args.ops)]
            a = time.monotonic()
            steal.read()  # from the start of this swap
            if op == "refine":
                calls = str(2 * len(open_index(idx)))
                run_op(["refine", str(idx), "--queries", str(log), "--index-calls", calls])
            elif op == "add":
                lo = n + 5 * k
                new = root / f"add_{k}.jsonl"
                new.write_text(
                    "".join(
                        json.dumps({"id": i, "text": t}) + "\n"
                        for i, t in zip(
                            corpus.ids[lo : lo + 5], corpus.texts[lo : lo + 5], strict=True
                        )
                    )
                )
                run_op(["add", str(idx), str(new)])
            else:
                live = open_index(idx).corpus.ids
                gone = root / f"remove_{k}.txt"
                gone.write_text(f"{live[3 + k]}\n{live[20 + k]}\n")
                run_op(["remove", str(idx), "--ids", str(gone), "--compact-at", "0.5"])
            b = time.monotonic()
            r = httpx.post(url + "/admin/reload", headers=auth, timeout=300)
            c = time.monotonic()
            body = r.json()
            # the old version's memory is released once its last request ends (/info says when)
            released = None
            while time.monotonic() - c < 120:
                rel = httpx.get(url + "/info", headers=auth, timeout=30).json().get("reload", {})
                if rel.get("releases", 0) >= len(swaps) + 1:
                    released = round(time.monotonic() - c, 2)
                    break
                time.sleep(0.2)
            time.sleep(1.0)
            rss = _rss_mb(srv.pid)
            swaps.append(
                {
                    "op": op,
                    "status": r.status_code,
                    "result": body.get("status"),
                    "version": body.get("version"),
                    "op_s": round(b - a, 2),
                    "reload_s": round(c - b, 2),
                    "rss_mb": round(rss, 1),  # 1 s after the old version's release
                    "release_s": released,  # from the reload's answer (None: not seen)
                    # the hypervisor's share of this VM's CPU in the swap (other guests')
                    "cpu_steal_pct": steal.read(),
                }
            )
            ops.append((a, b, c))
            print(
                f"swap {k + 1}: {op} -> version {body.get('version')} ({body.get('status')}), "
                f"op {b - a:.1f} s, reload {c - b:.1f} s, RSS {rss:.0f} MB"
            )
            time.sleep(2.0)
        time.sleep(args.steady_s / 2)
    finally:
        stop.set()
        for t in threads:
            t.join(150)
        srv.terminate()
        try:
            srv.wait(60)
        except subprocess.TimeoutExpired:
            srv.kill()

    def overlaps(rec, lo, hi):
        return rec[0] < hi and rec[1] > lo

    lat = lambda rs: [1e3 * (r[1] - r[0]) for r in rs]  # noqa: E731
    in_swap = [r for r in records if any(overlaps(r, b, c) for _, b, c in ops)]
    in_op = [r for r in records if any(overlaps(r, a, b) for a, b, _ in ops)]
    steady = [r for r in records if not any(overlaps(r, a, c) for a, _, c in ops)]
    p99 = lambda xs: float(np.percentile(xs, 99)) if xs else None  # noqa: E731
    out = {
        "items": n,
        "budget": budget,
        "concurrency": conc,
        "ops": f"the crossknn CLI, nice {args.op_nice}",
        "swaps": swaps,
        "requests": len(records),
        "non_2xx": int(sum(not 200 <= r[2] < 300 for r in records)),
        "status_counts": {
            str(c): int(sum(r[2] == c for r in records)) for c in sorted({r[2] for r in records})
        },
        "non_2xx_in_swaps": int(sum(not 200 <= r[2] < 300 for r in in_swap)),
        "versions_served": sorted({r[3] for r in records if r[3] is not None}),
        "p99_steady_ms": p99(lat(steady)),
        "p99_swap_ms": p99(lat(in_swap)),
        "p99_op_ms": p99(lat(in_op)),
        "requests_in_swaps": len(in_swap),
        "rss_steady_mb": round(rss_steady, 1),
        "rss_max_after_swap_mb": max(s["rss_mb"] for s in swaps) if swaps else None,
        "rss_last_mb": swaps[-1]["rss_mb"] if swaps else None,
        # after each swap (its old version released) against the steady state before the swaps
        "rss_max_over_steady_mb": (
            round(max(s["rss_mb"] for s in swaps) - rss_steady, 1) if swaps else None
        ),
        # every 10 s; --swaps 0 with a long --steady-s: the same load without swaps (a control)
        "rss_timeline_mb": timeline,
    }
    ms = lambda x: "-" if x is None else f"{x:.0f}"  # noqa: E731
    print(
        f"{len(records)} requests, {out['non_2xx']} non-2xx; p99 steady {ms(out['p99_steady_ms'])} "
        f"ms, in swaps {ms(out['p99_swap_ms'])} ms, during the ops {ms(out['p99_op_ms'])} ms; "
        f"RSS {rss_steady:.0f} MB steady, {out['rss_last_mb']} MB after the last swap, "
        f"{timeline[-1][1] if timeline else '-'} MB at the end"
    )
    res["swap_part"] = out


if __name__ == "__main__":
    sys.exit(main())
