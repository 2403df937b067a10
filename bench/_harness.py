"""The harness table: RNR vs GAR vs auto at equal CE calls (issue 66), bench/results/harness.json.

    .venv/bin/python bench/recall_bench.py harness [--part matrices|reference|ndcg]
    .venv/bin/python bench/recall_bench.py harness --part ndcg --ndcg-corpora cisi --ndcg-queries 30

``matrices``: on each shared score matrix, ``crossknn eval`` (the path every recall table of
bench/recall_bench.py runs) of ``rnr``, ``gar`` and ``auto`` with the DE first stage, k = 10, at
B = 10..200 (Top-10-Recall of the exact CE top-10); ``auto`` on the index a default
``crossknn build`` makes from the matrix's train queries (``--index-calls`` = the default index
budget, crossknn.index.auto.default_index_budget), GAR with its defaults (DE graph k = 16,
b = 16). ``reference``: on the same matrices' test queries at B = 50/100/200, the items ``gar``
scores against the real ``pyterrier_adaptive.GAR`` on the same initial ranking (the DE's top B),
corpus graph, batch size and budget. ``ndcg``: nDCG@10 through ``pt.Experiment`` on BEIR test
queries (bench/_harness_ndcg.py; runs the CE on the CPU, so only when asked). Each part rewrites
its section of harness.json (ndcg: the corpora it ran); the goals are recomputed from what is
there.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from _common import RESULTS, SHARED, provenance, write_json

HARNESS = RESULTS / "harness.json"
RUNS = RESULTS / "recall"  # the eval JSON of each matrix (eval_harness_<tag>.json)
MATRICES = {"cisi": "cisi-minilm", "nfcorpus": "nfcorpus-minilm-gpu"}
TABLE_BUDGETS = (50, 100, 200)
# auto's budgets for calls_to_match_gar_200 (the smallest B that reaches GAR's recall at 200)
BUDGETS = (*range(10, 101, 5), 120, 140, 160, 180, 200)
K = 10


def _load() -> dict:
    return json.loads(HARNESS.read_text()) if HARNESS.is_file() else {}


def _default_index_calls(matrix) -> int:
    from crossknn.index.auto import default_index_budget

    return default_index_budget(matrix.n_items, n_train=int(matrix.train.size))[0]


def part_matrices(doc: dict) -> None:
    from crossknn.cli import main as crossknn
    from crossknn.matrix import load_score_matrix

    out = {}
    for tag, name in MATRICES.items():
        path = SHARED / "matrices" / name
        m = load_score_matrix(path)
        calls = _default_index_calls(m)
        run = RUNS / f"eval_harness_{tag}.json"
        argv = ["eval", str(path), "--method", "rnr", "--method", "gar", "--method", "auto"]
        argv += ["--first", "de", "--k", str(K), "--index-calls", str(calls)]
        argv += [a for b in BUDGETS for a in ("--budget", str(b))]
        argv += ["--json", str(run), "--no-plot", "--quiet"]
        print(f"\n== harness {tag}: crossknn {' '.join(argv)}")
        t0 = time.perf_counter()
        if crossknn(argv):
            raise SystemExit(f"crossknn eval failed on {path}")
        prov = provenance() | {"command": f"python bench/recall_bench.py harness ({tag})"}
        write_json(run, json.loads(run.read_text()) | {"provenance": prov})
        rows = json.loads(run.read_text())["rows"]
        recall = {
            meth: {str(r["budget"]): r["recall"] for r in rows if r["method"] == meth}
            for meth in ("rnr", "gar", "auto")
        }
        calls_max = {
            meth: {str(r["budget"]): r["ce_calls_max"] for r in rows if r["method"] == meth}
            for meth in ("rnr", "gar", "auto")
        }
        out[tag] = {
            "matrix": name,
            "n_items": m.n_items,
            "n_test": int(m.test.size),
            "n_train": int(m.train.size),
            "auto_index_calls": calls,
            "auto_index_rows": calls // m.n_items,
            "recall": recall,
            "ce_calls_max": calls_max,
            "eval_json": str(run.relative_to(RESULTS.parent.parent)),
            "seconds": round(time.perf_counter() - t0, 1),
        }
        for b in TABLE_BUDGETS:
            print(
                f"{tag} B={b}: rnr {recall['rnr'][str(b)]:.3f}  gar {recall['gar'][str(b)]:.3f}"
                f"  auto {recall['auto'][str(b)]:.3f}"
            )
    doc["matrices"] = out


def write_graph_folder(graph: np.ndarray, folder: Path) -> list[str]:
    """``graph`` as a pyterrier_adaptive NpTopKCorpusGraph folder; docnos are the item indices
    written with equal width (so that their string order is the items' order)."""
    from npids import Lookup

    n = graph.shape[0]
    docnos = [str(i).zfill(len(str(n - 1))) for i in range(n)]
    folder.mkdir(parents=True)
    with Lookup.builder(folder / "docnos.npids") as build:
        for d in docnos:
            build.add(d)
    (folder / "edges.u32.np").write_bytes(graph.astype(np.uint32).tobytes())
    (folder / "weights.f16.np").write_bytes(np.zeros(graph.shape, np.float16).tobytes())
    meta = {"type": "corpus_graph", "format": "np_topk", "doc_count": n, "k": graph.shape[1]}
    (folder / "pt_meta.json").write_text(json.dumps(meta))
    return docnos


def part_reference(doc: dict) -> None:
    import pandas as pd
    import pyterrier as pt
    import pyterrier_adaptive as pta

    from crossknn.matrix import load_score_matrix
    from crossknn.retrievers import DenseRetriever
    from crossknn.scorers import MatrixScorer
    from crossknn.search import make_method

    out = {}
    for tag, name in MATRICES.items():
        m = load_score_matrix(SHARED / "matrices" / name)
        first = DenseRetriever(m.de_items, query_vectors=m.de_queries)
        method = make_method("gar", first=first, n_items=m.n_items)  # the registry's defaults
        S = m.scores

        class MatrixCE(pt.Transformer):
            def transform(self, df, S=S):
                df = df.copy()
                pairs = zip(df.qid, df.docno, strict=True)
                df["score"] = [float(S[int(q), int(d)]) for q, d in pairs]
                return df

        with tempfile.TemporaryDirectory() as tmp:
            docnos = write_graph_folder(method.graph, Path(tmp) / "graph")
            graph = pta.NpTopKCorpusGraph(Path(tmp) / "graph")
            test = m.test.tolist()
            per_b = {}
            for b in TABLE_BUDGETS:
                res = method.search(MatrixScorer(S), test, budget=b, k=K)
                initial = first.retrieve(test, b)
                rows = [
                    {"qid": str(q), "query": "q", "docno": docnos[i], "score": float(b - r)}
                    for q, items in zip(test, initial.tolist(), strict=True)
                    for r, i in enumerate(items)
                ]
                ref = pta.GAR(
                    MatrixCE(), graph, num_results=b, batch_size=method.batch_size, backfill=False
                )(pd.DataFrame(rows))
                got = ref.groupby("qid").docno.apply(lambda d: {int(x) for x in d}).to_dict()
                equal = sum(
                    set(res.scored_items[j].tolist()) == got.get(str(q), set())
                    for j, q in enumerate(test)
                )
                per_b[str(b)] = {"equal": int(equal), "queries": len(test)}
                print(f"reference {tag} B={b}: {equal} of {len(test)} scored sets equal")
        out[tag] = per_b
    doc["reference"] = {
        "what": "queries whose gar scored set equals pyterrier_adaptive.GAR's (same DE top-B "
        "initial ranking, graph k=16, b=16, budget B)",
        "pyterrier_adaptive": _version("pyterrier-adaptive"),
        "pyterrier": _version("python-terrier"),
        "matrices": out,
    }


def _version(dist: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def round_min(values) -> float:
    return round(min(values), 4)


def goals(doc: dict) -> dict:
    """The issue's three goals from the sections present (None where a section is missing)."""
    out: dict = {
        "gar_equals_reference": None,
        "auto_vs_gar_min": None,
        "calls_to_match_gar_200": None,
    }
    ref = (doc.get("reference") or {}).get("matrices")
    if ref:
        cells = [c for per_b in ref.values() for c in per_b.values()]
        out["gar_equals_reference"] = sum(c["equal"] for c in cells) / sum(
            c["queries"] for c in cells
        )
    mats = doc.get("matrices")
    if mats:
        out["auto_vs_gar_min"] = round_min(
            v["recall"]["auto"][str(b)] - v["recall"]["gar"][str(b)]
            for v in mats.values()
            for b in TABLE_BUDGETS
        )
        ratios = []
        for v in mats.values():
            target = v["recall"]["gar"]["200"]
            reach = [int(b) for b, r in v["recall"]["auto"].items() if r >= target]
            v["auto_budget_to_match_gar_200"] = min(reach) if reach else None
            ratios.append(min(reach) / 200 if reach else float("inf"))
        out["calls_to_match_gar_200"] = max(ratios)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--part",
        action="append",
        choices=("matrices", "reference", "ndcg"),
        help="default: matrices and reference",
    )
    ap.add_argument("--ndcg-budgets", default="50,100", help="B of the ndcg part")
    ap.add_argument("--ndcg-corpora", default="cisi", help="BEIR corpora of ndcg (comma list)")
    ap.add_argument("--ndcg-queries", type=int, default=None, help="at most this many queries")
    ap.add_argument(
        "--ndcg-index-rows", type=int, default=None, help="index budget in rows (default: build's)"
    )
    args = ap.parse_args(argv)
    parts = args.part or ["matrices", "reference"]
    doc = _load()
    doc.pop("provenance", None)
    if "matrices" in parts:
        part_matrices(doc)
    if "reference" in parts:
        part_reference(doc)
    if "ndcg" in parts:
        from _harness_ndcg import part_ndcg

        doc["ndcg"] = part_ndcg(
            budgets=[int(b) for b in args.ndcg_budgets.split(",")],
            corpora=args.ndcg_corpora.split(","),
            max_queries=args.ndcg_queries,
            index_rows=args.ndcg_index_rows,
            before=doc.get("ndcg"),
        )
    doc["goals"] = goals(doc)
    print("goals:", json.dumps(doc["goals"]))
    write_json(HARNESS, doc)
    return 0
