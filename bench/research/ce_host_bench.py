"""Host-side cost of one CE call: one search round's 20 pairs, CPU provider, before vs after.

A round of a search scores one query against ``--pairs`` items (20: a budget of 100 in 5 rounds)
through ``OnnxCrossEncoder.score``. Its time is split, per call, into

- ``session_ms``: ``InferenceSession.run`` itself (the CE's own work);
- ``bind_copy_ms``: the rest of the session wrapper: picking the feeds, IO binding where used,
  the copy of the scores back;
- ``prep_ms``: everything before and after it: the query's cached ids, ``longest_first``
  truncation, length sort and batches, the padded input arrays, the output array;
- ``host_ms`` = total - session: what the CE call costs beyond the CE (goal <= 0.3 ms);
  ``host_only_session_noop``: the same calls with the session replaced by a no-op (the host
  cost without the cache and scheduling effects of a real session run next to it).

Also the padded inputs of one batch alone at 10..512 pairs (a GPU round or a merged serve
batch is one session run of up to 512 pairs), before vs after.

``before``: the row-by-row pair assembly (``crossknn.ce.tokenize.assemble_pairs``, one Python
iteration per pair); ``after``: the bulk numpy assembly (``crossknn.ce.feeds.pair_feeds``), the
runtime's default. Both on the same scorer, the same calls, interleaved (the machine is shared),
medians over ``--calls`` calls each. With ``--search Q`` also Q queries of ``Searcher.search``
(budget 100) over an index of the first ``--items`` SciFact abstracts, before/after interleaved:
CPU-provider search must be unchanged or faster.

    nice -n 5 .venv/bin/python bench/ce_host_bench.py [--calls 400] [--search 20]
    .venv/bin/python bench/ce_host_bench.py --only-predict     # predict's host side (below)

``--only-overlap`` (``predict_overlap`` in the JSON, the rest kept): ``predict`` on 2,048 text
pairs, all documents distinct, against a stand-in device (a session run that sleeps for its
batch at ``--device-rates`` pairs/s or multiples of the host's own rate (``3.29x``),
releasing the interpreter lock as a GPU run does): the
documents tokenized in one pass, then the device (the CPU default), against slices tokenized
in a second thread while the device runs the slice before (the GPU default,
``CrossEncoderBase.overlap_tokenize``), with the predicted rates beside the measured ones.

``--only-predict`` (``predict_host`` in the JSON, the rest kept): ``predict`` on 1,024 SciFact
(query, abstract) text pairs with a no-op session, every text tokenized whole against documents
tokenized up to a word past what truncation looks at (``TokenizerPlan.encode``'s ``min_tokens``).

Prints a table and writes bench/results/ce_host_bench.MACHINE.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: _common

from _common import SHARED, machine, result_path, utc_now, write_json  # noqa: E402
from crossknn.ce import default_cross_encoder, default_dual_encoder
from crossknn.ce.feeds import pair_feeds
from crossknn.ce.tokenize import assemble_pairs

VARIANTS = {"before": staticmethod(assemble_pairs), "after": staticmethod(pair_feeds)}


class Timed:
    """Wraps a scorer's session: ``inner`` = InferenceSession.run, ``outer`` = _Session.run."""

    def __init__(self, ce) -> None:
        self.ce, self.inner, self.outer = ce, 0.0, 0.0
        sess = ce._s
        real_outer, real_inner = sess.run, sess.session.run

        def inner(*a, **k):
            t = time.perf_counter()
            try:
                return real_inner(*a, **k)
            finally:
                self.inner += time.perf_counter() - t

        def outer(feeds):
            t = time.perf_counter()
            try:
                return real_outer(feeds)
            finally:
                self.outer += time.perf_counter() - t

        sess.session.run = inner
        sess.run = outer

    def call(self, fn) -> dict:
        self.inner = self.outer = 0.0
        t = time.perf_counter()
        fn()
        total = time.perf_counter() - t
        return {
            "total_ms": total * 1e3,
            "session_ms": self.inner * 1e3,
            "bind_copy_ms": (self.outer - self.inner) * 1e3,
            "prep_ms": (total - self.outer) * 1e3,
            "host_ms": (total - self.inner) * 1e3,
        }


def medians(rows: list[dict]) -> dict:
    return {k: round(statistics.median(r[k] for r in rows), 4) for k in rows[0]}


def scifact(n_items: int, n_queries: int):
    root = SHARED / "data" / "scifact"
    items, queries = [], []
    with (root / "corpus.jsonl").open(encoding="utf-8") as fh:
        for line in fh:
            rec = json.loads(line)
            items.append(f"{rec.get('title') or ''} {rec.get('text') or ''}".strip())
            if len(items) >= n_items:
                break
    with (root / "queries.jsonl").open(encoding="utf-8") as fh:
        for line in fh:
            queries.append(json.loads(line)["text"])
            if len(queries) >= n_queries:
                break
    return items, queries


def ce_calls(ce, timed: Timed, queries, n_items: int, pairs: int, calls: int, seed: int):
    rng = np.random.default_rng(seed)
    plan = [
        (queries[i % len(queries)], rng.choice(n_items, pairs, replace=False)) for i in range(calls)
    ]
    for q, _ in plan:  # the queries' ids cached first, as after a search's first round
        ce.score(q, np.arange(1))
    rows = {v: [] for v in VARIANTS}
    for q, items in plan:
        for name, fn in VARIANTS.items():  # interleaved: the same load on both
            ce._pair_feeds = fn
            rows[name].append(timed.call(lambda q=q, items=items: ce.score(q, items)))
    ce._pair_feeds = VARIANTS["after"]
    return {name: medians(r) for name, r in rows.items()}


@contextlib.contextmanager
def noop_session(ce, pairs_per_s: float | None = None):
    """``InferenceSession.run`` of ``ce`` replaced by a no-op returning zeros (the host cost
    alone), the real one restored on exit. ``pairs_per_s``: a stand-in device instead, which
    sleeps for the batch's pairs at that rate (releasing the interpreter lock, as a GPU session
    run does) before it returns."""
    sess = ce._s.session
    real = sess.run

    def noop(names, feeds, *a, **k):
        n = len(feeds["input_ids"])
        if pairs_per_s:
            time.sleep(n / pairs_per_s)
        return [np.zeros(n, dtype=np.float32)]

    sess.run = noop
    try:
        yield
    finally:
        sess.run = real


def stub_rows(ce, queries, n_items: int, pairs: int, calls: int, seed: int) -> dict:
    """The same calls with ``InferenceSession.run`` replaced by a no-op returning zeros: the host
    cost alone, free of the cache and scheduler effects of a real session run next to it."""
    rng = np.random.default_rng(seed)
    plan = [
        (queries[i % len(queries)], rng.choice(n_items, pairs, replace=False)) for i in range(calls)
    ]
    rows = {v: [] for v in VARIANTS}
    try:
        with noop_session(ce):
            for q, items in plan:
                for name, fn in VARIANTS.items():
                    ce._pair_feeds = fn
                    t = time.perf_counter()
                    ce.score(q, items)
                    rows[name].append((time.perf_counter() - t) * 1e3)
    finally:
        ce._pair_feeds = VARIANTS["after"]
    return {name: {"host_ms": round(statistics.median(v), 4)} for name, v in rows.items()}


def assembly_rows(ce, queries, n_items: int, sizes, reps: int, seed: int) -> list[dict]:
    """The padded inputs of one batch alone, before vs after, at the batch sizes of a CPU round
    (a 20-pair call is cut into batches of at most 16) and of GPU calls (one session run per
    round, up to 512 pairs; merged serve batches): median microseconds over ``reps``."""
    from crossknn.ce.tokenize import longest_first

    rng = np.random.default_rng(seed)
    store, room, tpl = ce._items, ce._room, ce._tpl
    rows = []
    for n in sizes:
        A = ce._query_store(queries[0])
        ia = np.zeros(n, dtype=np.int64)
        ib = rng.choice(n_items, n, replace=n > n_items)
        ta, tb = longest_first(A.lengths[ia], store.lengths[ib], room)
        row = {"pairs": n}
        for _ in range(2):  # interleaved rounds
            for name, fn in VARIANTS.items():
                times = []
                for _ in range(reps):
                    t = time.perf_counter()
                    fn(tpl, ce._plan.pad_id, A, ia, ta, store, ib, tb)
                    times.append(time.perf_counter() - t)
                key = f"{name}_us"
                row[key] = min(row.get(key, 1e18), round(statistics.median(times) * 1e6, 1))
        row["speedup"] = round(row["before_us"] / row["after_us"], 2)
        rows.append(row)
    return rows


def search_rows(ce, items, queries, n_queries: int, threads: int) -> dict:
    from crossknn import Searcher
    from crossknn.corpus.build import build_corpus_index
    from crossknn.data import Corpus

    de = default_dual_encoder(threads=threads)
    corpus = Corpus(ids=[str(i) for i in range(len(items))], texts=list(items))
    with tempfile.TemporaryDirectory() as tmp:
        build_corpus_index(corpus, Path(tmp) / "idx", ce=ce, de=de, progress=False)
        s = Searcher(Path(tmp) / "idx", ce=ce, de=de)
        qs = queries[:n_queries]
        s.search(qs[:2], k=10, budget=100)  # warm: query vectors, caches
        per = {v: [] for v in VARIANTS}
        hits = {}
        for q in qs:
            for name, fn in VARIANTS.items():
                ce._pair_feeds = fn
                t = time.perf_counter()
                h = s.search([q], k=10, budget=100)[0]
                per[name].append((time.perf_counter() - t) * 1e3)
                hits.setdefault(name, []).append(list(h.ids))
        ce._pair_feeds = VARIANTS["after"]
    return {
        name: {
            "queries": len(v),
            "p50_ms": round(statistics.median(v), 3),
            "mean_ms": round(statistics.fmean(v), 3),
        }
        for name, v in per.items()
    } | {"same_results": hits["before"] == hits["after"]}


def overlap_rows(ce, items, queries, n_pairs: int, rates, reps: int) -> dict:
    """``predict`` on ``n_pairs`` text pairs (all documents distinct) against a stand-in device
    of each rate: documents tokenized in one pass before the device runs (``one_pass``) vs
    slice by slice in a second thread while it runs (``overlap``, the GPU default);
    interleaved, best of ``reps``, pairs/s. ``host_pairs_per_s``: the same calls with a no-op
    session; the predictions: one pass 1 / (1/host + 1/device), overlapped min(host, device)."""
    pairs = [(queries[i % len(queries)], items[i % len(items)]) for i in range(n_pairs)]
    old = ce.overlap_tokenize
    host = float("inf")
    try:
        with noop_session(ce):
            for _ in range(reps):
                t = time.perf_counter()
                ce.predict(pairs, batch_size=256)
                host = min(host, time.perf_counter() - t)
        host_rate = n_pairs / host
        rows = []
        for spec in rates:  # pairs/s, or "Nx": N times the host's rate
            rate = float(spec[:-1]) * host_rate if spec.endswith("x") else float(spec)
            best = {"one_pass": float("inf"), "overlap": float("inf")}
            with noop_session(ce, rate):
                for _ in range(reps):
                    for name, on in (("one_pass", False), ("overlap", True)):
                        ce.overlap_tokenize = on
                        t = time.perf_counter()
                        ce.predict(pairs, batch_size=256)
                        best[name] = min(best[name], time.perf_counter() - t)
            got = {k: n_pairs / v for k, v in best.items()}
            rows.append(
                {
                    "device": spec,
                    "device_pairs_per_s": round(rate),
                    "one_pass_pairs_per_s": round(got["one_pass"]),
                    "overlap_pairs_per_s": round(got["overlap"]),
                    "speedup": round(got["overlap"] / got["one_pass"], 3),
                    "predicted_one_pass": round(1.0 / (1.0 / host_rate + 1.0 / rate)),
                    "predicted_overlap": round(min(host_rate, rate)),
                }
            )
    finally:
        ce.overlap_tokenize = old
    return {"pairs": n_pairs, "host_pairs_per_s": round(host_rate), "rows": rows}


def predict_rows(ce, items, queries, n_pairs: int, reps: int) -> dict:
    """``predict`` on ``n_pairs`` (query, abstract) text pairs with the session replaced by a
    no-op: the host side of an uncached call (tokenizing both sides, truncation, inputs).
    ``whole``: every text tokenized whole; ``prefix``: a document only up to a word past what
    truncation looks at (the runtime's default); interleaved, best of ``reps``, pairs/s."""
    pairs = [(queries[i % len(queries)], items[i % len(items)]) for i in range(n_pairs)]
    safe = ce._plan.prefix_safe
    best = {"whole": float("inf"), "prefix": float("inf")}
    try:
        with noop_session(ce):
            for _ in range(reps):
                for name, on in (("whole", False), ("prefix", True)):
                    ce._plan.prefix_safe = on and safe
                    t = time.perf_counter()
                    ce.predict(pairs, batch_size=256)
                    best[name] = min(best[name], time.perf_counter() - t)
    finally:
        ce._plan.prefix_safe = safe
    out = {name: {"pairs_per_s": round(n_pairs / t)} for name, t in best.items()}
    out["speedup"] = round(best["whole"] / best["prefix"], 2)
    out["pairs"] = n_pairs
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=20, help="pairs per CE call (default 20)")
    ap.add_argument("--calls", type=int, default=400, help="calls per variant (default 400)")
    ap.add_argument("--items", type=int, default=1000, help="SciFact abstracts (default 1000)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--search", type=int, default=0, metavar="Q", help="also Q searches")
    ap.add_argument("--out", default=str(result_path("ce_host_bench")))
    ap.add_argument(
        "--only-predict",
        action="store_true",
        help="only the predict rows (1,024 text pairs), kept beside the rest of --out",
    )
    ap.add_argument(
        "--only-overlap",
        action="store_true",
        help="only the predict_overlap rows (2,048 distinct documents, a stand-in device at "
        "--device-rates pairs/s), kept beside the rest of --out",
    )
    ap.add_argument(
        "--device-rates",
        default="5000,3.29x,63721",
        help="stand-in device rates, pairs/s, or Nx: N times the host's (3.29x: the H200's "
        "device : host ratio in predict, docs/ce.md; 63,721: its fp16 rate from cached tokens)",
    )
    args = ap.parse_args()

    if args.only_overlap:
        items, queries = scifact(max(args.items, 2048), 300)
        ce = default_cross_encoder(threads=args.threads, provider="cpu")
        rates = [r.strip() for r in args.device_rates.split(",") if r.strip()]
        out = Path(args.out)
        doc = json.loads(out.read_text()) if out.is_file() else {"bench": "ce_host_bench"}
        ov = overlap_rows(ce, items, queries, 2048, rates, 3)
        ov["when"], ov["machine"] = utc_now(), machine("onnxruntime")
        doc["predict_overlap"] = ov
        print(
            f"predict, 2,048 SciFact pairs (distinct documents), host alone "
            f"{ov['host_pairs_per_s']} pairs/s; stand-in device (pairs/s):"
        )
        print(f"{'device':>16}{'one pass':>10}{'overlap':>9}{'speedup':>9}{'predicted':>18}")
        for r in ov["rows"]:
            print(
                f"{r['device']:>8}{r['device_pairs_per_s']:8}{r['one_pass_pairs_per_s']:10}"
                f"{r['overlap_pairs_per_s']:9}{r['speedup']:9.3f}"
                f"{r['predicted_one_pass']:9}/{r['predicted_overlap']}"
            )
        write_json(args.out, doc)
        return 0

    items, queries = scifact(args.items, 300)
    ce = default_cross_encoder(items=items, threads=args.threads, provider="cpu")
    if args.only_predict:
        out = Path(args.out)
        doc = json.loads(out.read_text()) if out.is_file() else {"bench": "ce_host_bench"}
        pr = predict_rows(ce, items, queries, 1024, 5)
        pr["when"], pr["machine"] = utc_now(), machine("onnxruntime")
        doc["predict_host"] = pr
        print(
            f"predict, 1,024 SciFact pairs, session a no-op: whole texts "
            f"{pr['whole']['pairs_per_s']} pairs/s, document prefixes "
            f"{pr['prefix']['pairs_per_s']} pairs/s (x{pr['speedup']})"
        )
        write_json(args.out, doc)
        return 0
    timed = Timed(ce)
    rows = ce_calls(ce, timed, queries, len(items), args.pairs, args.calls, seed=0)
    stub = stub_rows(ce, queries, len(items), args.pairs, max(args.calls, 2000), seed=2)
    asm = assembly_rows(ce, queries, len(items), (10, 16, 20, 64, 256, 512), 100, seed=1)
    doc = {
        "bench": "ce_host_bench",
        "when": utc_now(),
        "command": "bench/ce_host_bench.py "
        + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k != "out"),
        "machine": machine("onnxruntime"),
        "provider": ce.provider,
        "pairs": args.pairs,
        "calls": args.calls,
        "ce_call": rows,
        "goal_host_ms": 0.3,
        "host_only_session_noop": stub,
        "assembly": asm,
    }
    print(f"one CE call of {args.pairs} pairs, CPU provider, medians over {args.calls} calls (ms)")
    print(f"{'':8}{'total':>9}{'session':>9}{'bind+copy':>11}{'prep':>8}{'host':>8}")
    for name, r in rows.items():
        print(
            f"{name:8}{r['total_ms']:9.3f}{r['session_ms']:9.3f}{r['bind_copy_ms']:11.3f}"
            f"{r['prep_ms']:8.3f}{r['host_ms']:8.3f}"
        )
    print(
        f"host cost alone (session replaced by a no-op, median of {max(args.calls, 2000)} calls): "
        f"before {stub['before']['host_ms']:.3f} ms, after {stub['after']['host_ms']:.3f} ms"
    )
    print("one batch's padded inputs alone (one query, median us): before / after")
    for r in asm:
        print(
            f"  {r['pairs']:>4} pairs: {r['before_us']:9.1f} {r['after_us']:9.1f}  x{r['speedup']}"
        )
    if args.search:
        doc["search"] = search_rows(ce, items, queries, args.search, args.threads)
        sr = doc["search"]
        before, after = sr["before"]["p50_ms"], sr["after"]["p50_ms"]
        print(
            f"search (budget 100, {args.search} queries, {len(items)} items): before p50 "
            f"{before:.1f} ms, after p50 {after:.1f} ms, same results: {sr['same_results']}"
        )
    write_json(args.out, doc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
