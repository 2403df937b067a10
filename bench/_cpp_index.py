"""The C++ searcher of an index folder against Python's (issue 68): ``overhead_bench.py cpp-index``.

    .venv/bin/python bench/overhead_bench.py cpp-index [--matrix DIR] [--queries 100]
        [--budget 100]  (DIR: ../shared/matrices/nfcorpus-minilm-gpu)

A corpus index is built by Python's ``build_corpus_index`` over the matrix's items at the default
index budget (``index_calls="default"``: one complete row per 100 items, at most 32, read from the
matrix's train queries given as train queries: 30 complete rows and the learned prior's partial
rows on nfcorpus), with stand-in models: the DE is the matrix's DE vectors (by text), the CE its
scores (no model). The test queries are then searched one at a time, ``auto`` (the index's
default), k = 10, B = ``--budget``, by both doors back to back (the same load): Python's
``crossknn.Searcher.search`` (its ``Hits.seconds_other``: wall time less the CE's, the DE vectors
encoded before) and the C++ ``crossknn::Index`` + ``crossknn::Searcher`` (``_core.IndexSearcher``:
the time of ``Searcher::search`` inside C++, the CE a row lookup). Every answer is compared (ids,
float32 score bytes, CE calls). Writes bench/results/cpp_index.json: ``rows`` (per door: p50 /
p99 / mean non-CE ms), ``equal_answers``, ``goals`` (``cpp_vs_python_other_p50`` <= 0.5,
``equal_answer_share`` 1), and ``loop_ms_per_search``: the round loop's own phases (the core's
timers), which both doors run.
"""

from __future__ import annotations

import argparse
import os
import shutil
import time

import numpy as np

from _common import REPO, RESULTS, SHARED, machine, utc_now, write_json
from crossknn import _core
from crossknn.corpus.build import build_corpus_index
from crossknn.corpus_folder import open_index
from crossknn.data import Corpus
from crossknn.matrix import load_score_matrix
from crossknn.searcher import Searcher

OUT = RESULTS / "cpp_index.json"
GOAL = 0.5  # C++ non-CE time per query <= 0.5 x Python's (p50)


class MatrixDE:
    """The matrix's DE vectors, by text ("item J" / "query R")."""

    model_id, model_hash, max_length, precision = "matrix-de", "matrix-de", 256, "fp32"

    def __init__(self, m) -> None:
        self.items = np.asarray(m.de_items, np.float32)
        self.queries = np.asarray(m.de_queries, np.float32)
        self.dim = self.items.shape[1]

    def encode(self, texts, **_):
        out = []
        for t in texts:
            kind, j = t.split(" ", 1)
            out.append((self.items if kind == "item" else self.queries)[int(j)])
        return np.stack(out).astype(np.float32)


class MatrixCE:
    """The matrix's CE scores (no model), by query text ("query R")."""

    model_id, model_hash, max_length, precision = "matrix-ce", "matrix-ce", 256, "fp32"

    def __init__(self, m) -> None:
        self.scores = m.scores
        self.n_items = m.n_items
        self.batch_size = 64

    def set_items(self, texts) -> None:
        pass

    def score(self, query, items):
        return self.score_batch([query], [items])[0]

    def score_batch(self, queries, items_list):
        return [
            np.asarray(self.scores[int(q.split(" ", 1)[1])][np.asarray(it, np.int64)], np.float32)
            for q, it in zip(queries, items_list, strict=True)
        ]


def build(m, out) -> None:
    """The default build of the matrix's items, train queries given (see the module docstring)."""
    if (out / "index.json").is_file():
        return
    shutil.rmtree(out, ignore_errors=True)
    corpus = Corpus([str(i) for i in m.item_ids], [f"item {j}" for j in range(m.n_items)])
    build_corpus_index(
        corpus,
        out,
        ce=MatrixCE(m),
        de=MatrixDE(m),
        train_queries=[f"query {r}" for r in m.train.tolist()],
        index_calls="default",
        progress=False,
    )


def _pct(xs, p) -> float:
    return round(float(np.percentile(xs, p)) * 1e3, 4)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--matrix", default=str(SHARED / "matrices" / "nfcorpus-minilm-gpu"))
    ap.add_argument("--queries", type=int, default=100, help="test queries timed (default 100)")
    ap.add_argument("--budget", type=int, default=100)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--work", default=str(REPO / "build" / "bench-cpp-index"))
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args(argv)

    m = load_score_matrix(args.matrix)
    out_dir = REPO / args.work if not os.path.isabs(args.work) else args.work
    index_dir = type(REPO)(out_dir) / m.path.name
    t0 = time.perf_counter()
    build(m, index_dir)
    build_s = time.perf_counter() - t0
    index = open_index(index_dir)
    de, ce = MatrixDE(m), MatrixCE(m)
    py = Searcher(index, ce=ce, de=de)
    cpp = _core.IndexSearcher(str(index_dir))
    texts = [f"query {r}" for r in m.test[: args.queries].tolist()]
    py.qvec.prefetch(texts)  # DE vectors encoded before: not timed (they are the C++ input)
    kw = {"k": args.k, "budget": args.budget}
    warm = texts[0]
    for _ in range(3):  # warm-up: features, prefilter copies, caches
        py.search(warm, **kw)
        cpp.search(de.encode([warm])[0], m.scores[int(warm.split()[1])], **kw)
    py_s, cpp_s, cpp_wall, equal = [], [], [], 0
    _core.search_profile(True)  # the round loop's phases (CROSSKNN_PROFILE=1: overhead_bench.py)
    for t in texts:
        h = py.search(t, **kw)
        py_s.append(h.seconds_other)
        q = de.encode([t])[0]
        row = np.ascontiguousarray(m.scores[int(t.split()[1])], np.float32)
        w0 = time.perf_counter()
        r = cpp.search(q, row, **kw)
        cpp_wall.append(time.perf_counter() - w0)
        cpp_s.append(r["seconds"])
        equal += int(
            np.array_equal(r["indices"], h.indices)
            and r["scores"].tobytes() == np.asarray(h.scores, np.float32).tobytes()
            and int(r["ce_calls"]) == int(h.ce_calls)
        )
    prof = _core.search_profile(True)
    n_loops = int(prof.pop("searches")) or 1
    # the round loop's own time per search (both doors run it: 2 searches a query), by phase
    loop = {k: round(v / n_loops * 1e3, 4) for k, v in prof.items()}
    rows = []
    for door, xs in (
        ("python Searcher", py_s),
        ("C++ Searcher", cpp_s),
        ("C++ Searcher + binding", cpp_wall),
    ):
        rows.append(
            {
                "door": door,
                "method": cpp.default_method,
                "budget": args.budget,
                "k": args.k,
                "queries": len(xs),
                "other_ms_p50": _pct(xs, 50),
                "other_ms_p99": _pct(xs, 99),
                "other_ms_mean": round(float(np.mean(xs)) * 1e3, 4),
            }
        )
    ratio = round(float(np.median(cpp_s)) / float(np.median(py_s)), 4)
    auto = index.params.get("auto", {})
    result = {
        "bench": "cpp_index",
        "date": utc_now(),
        "machine": machine(),
        "matrix": m.path.name,
        "index": {
            "n_items": len(index),
            "rows": auto.get("rows"),
            "partial_rows": auto.get("partial_rows"),
            "learned_prior": auto.get("learned_prior"),
            "rounds": auto.get("rounds"),
            "build_s": round(build_s, 2),
        },
        "rows": rows,
        "equal_answers": {"equal": equal, "queries": len(texts)},
        "loop_ms_per_search": {**loop, "total": round(sum(loop.values()), 4)},
        "goals": {
            "cpp_vs_python_other_p50": ratio,
            "equal_answer_share": round(equal / max(len(texts), 1), 4),
        },
    }
    write_json(args.out, result)
    for r in rows:
        print(f"{r['door']:24s} p50 {r['other_ms_p50']:8.3f} ms  p99 {r['other_ms_p99']:8.3f} ms")
    print(f"C++ / Python (p50) {ratio}; equal answers {equal}/{len(texts)}")
    return 0
