"""CMC benchmark: CE-top-k recall on cisi-minilm, qrels metrics on nfcorpus/scifact, latency.

Parts (``--part``, repeatable; default all), each prints a table and writes
``bench/results/cmc_<part>.json``:

- ``cisi``: distill CMC to the CE scores of cisi-minilm's train rows; Top-k-Recall@B on its
  test rows for RNR with a DE first stage vs BE -> CMC (K = 256, 512, 1024 DE candidates), and
  ADACUR / AXN with a DE vs a CMC first round (the ``crossknn eval`` harness).
- ``beir``: gold-label CMC on nfcorpus / scifact train qrels; nDCG@10 and recall@100 on the test
  qrels for DE vs BE -> CMC; the CE (embedded minilm-l6-joint) reranking the DE's top
  ``--ce-depth`` on the first ``--ce-queries`` scifact test queries, with DE and CMC on the same
  queries.
- ``ablation``: CISI, training K = 64 vs 256 and without the KL term.
- ``latency``: CMC on ONNX Runtime for K = 64, 256, 1024 (one query, 1 thread) vs the CE on
  K pairs (measured on ``--ce-pairs`` pairs and extrapolated linearly).

Models are written under ``--work`` (outside the repository). Example::

    CROSSKNN_CACHE=/work/cache/crossknn .venv/bin/python bench/cmc_bench.py \
        --work /work/cache/cmc-bench
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from _common import CISI_MATRIX, RESULTS, SHARED, machine, write_json


def _train(data, out: Path, **kw) -> dict:
    from crossknn.cmc.export import export_onnx
    from crossknn.cmc.model import CmcConfig
    from crossknn.cmc.train import TrainConfig, train

    info = train(
        data,
        out,
        model_cfg=CmcConfig(dim=data.dim, width=128),
        cfg=TrainConfig(**kw),
        progress=True,
        threads=1,
    )
    export_onnx(out)
    return json.loads((out / "cmc.json").read_text()) | {"train_seconds": info["train_seconds"]}


def _write(name: str, payload: dict) -> None:
    write_json(RESULTS / f"cmc_{name}.json", payload | {"machine": machine("torch", "onnxruntime")})


def part_cisi(args) -> None:
    from crossknn.cmc.data import matrix_data
    from crossknn.eval import EvalConfig, evaluate, format_table

    mdir = CISI_MATRIX
    out = Path(args.work) / "cisi-ce-k256"
    info = _train(matrix_data(mdir), out, k=256, epochs=30, seed=args.seed)
    budgets, ks = [50, 100, 200, 500], [1, 10, 50, 100]
    rows = evaluate(
        mdir,
        EvalConfig(
            methods=["rnr", "adacur", "axn"], budgets=budgets, ks=ks, firsts=["de"], seed=args.seed
        ),
        progress=False,
    )
    for kc in (256, 512, 1024):
        methods = ["rnr"] if kc != 512 else ["rnr", "adacur", "axn"]
        got = evaluate(
            mdir,
            EvalConfig(
                methods=methods,
                budgets=budgets,
                ks=ks,
                firsts=["cmc"],
                seed=args.seed,
                extra={"cmc_model": out, "cmc_candidates": kc},
            ),
            progress=False,
        )
        for r in got:
            r["cmc_candidates"] = kc
        rows += got
    for r in rows:
        r.pop("seconds", None)
    print(format_table([r for r in rows if r.get("cmc_candidates") in (None, 512)]))
    print("\nRNR via BE->CMC by K (recall):")
    for r in rows:
        if r["method"] == "rnr" and r["first"] == "cmc":
            print(
                f"  K={r['cmc_candidates']:>5} B={r['budget']:>4} k={r['k']:>4} {r['recall']:.3f}"
            )
    _write(
        "cisi",
        {
            "matrix": str(mdir),
            "model": {
                k: info[k] for k in ("model", "train", "data", "train_seconds", "steps", "onnx")
            },
            "rows": rows,
        },
    )


def part_ablation(args) -> None:
    """CISI: training K and the KL term (RNR via BE->CMC over K=512, test rows)."""
    from crossknn.cmc.data import matrix_data
    from crossknn.eval import EvalConfig, evaluate

    mdir = CISI_MATRIX
    data = matrix_data(mdir)
    budgets, ks = [50, 100, 200], [1, 10, 50, 100]
    runs = [
        ("k256", dict(k=256, epochs=30), Path(args.work) / "cisi-ce-k256"),
        ("k64", dict(k=64, epochs=30), None),
        ("k64-no-kl", dict(k=64, epochs=30, lambda_ce=1.0, lambda_kl=0.0), None),
    ]
    out_rows = []
    for name, kw, out in runs:
        out = out or Path(args.work) / f"cisi-ce-{name}"
        info = _train(data, out, seed=args.seed, **kw)
        rows = evaluate(
            mdir,
            EvalConfig(
                methods=["rnr"],
                budgets=budgets,
                ks=ks,
                firsts=["cmc"],
                seed=args.seed,
                extra={"cmc_model": out, "cmc_candidates": 512},
            ),
            progress=False,
        )
        for r in rows:
            out_rows.append(
                {
                    "variant": name,
                    "train_seconds": info["train_seconds"],
                    **{k: r[k] for k in ("budget", "k", "recall")},
                }
            )
    for name, _, _ in runs:
        vals = " ".join(
            f"B{r['budget']}/k{r['k']}={r['recall']:.3f}" for r in out_rows if r["variant"] == name
        )
        print(f"{name:<10} {vals}")
    _write("ablation", {"matrix": str(mdir), "cmc_candidates": 512, "rows": out_rows})


def _ce_rerank(data, rows, depth, dataset):
    from crossknn.ce import default_cross_encoder
    from crossknn.cmc.evaluate import rank_de
    from crossknn.data import load_beir

    corpus = load_beir(SHARED / "data" / dataset)
    ids = data.query_ids
    qtext = dict(zip(corpus.query_ids, corpus.query_texts, strict=True))
    cands = rank_de(data, rows, depth)
    ce = default_cross_encoder(items=corpus.item_texts)
    out, t0, n = [], time.perf_counter(), 0
    for r, c in zip(rows, cands, strict=True):
        s = ce.score(qtext[ids[r]], c)
        out.append(c[np.argsort(-s, kind="stable")])
        n += len(c)
    return np.stack(out), n / (time.perf_counter() - t0)


def part_beir(args) -> None:
    from crossknn.cmc import CmcReranker
    from crossknn.cmc.data import beir_data
    from crossknn.cmc.evaluate import qrels_metrics, rank_cmc, rank_de

    results = []
    for name, epochs in (("nfcorpus", 2), ("scifact", 6)):
        data = beir_data(SHARED / "data" / name, progress=False)
        out = Path(args.work) / f"{name}-gold-k64"
        info = _train(data, out, k=64, epochs=epochs, seed=args.seed)
        rr = CmcReranker(out)
        test = data.test.tolist()
        res = {
            "dataset": name,
            "n_train": info["data"]["n_train_queries"],
            "train_seconds": info["train_seconds"],
            "epochs": epochs,
            "steps": info["steps"],
            "rows": [{"ranker": "de", **qrels_metrics(rank_de(data, test, 100), test, data)}],
        }
        for kc in (256, 1024):
            res["rows"].append(
                {
                    "ranker": "cmc",
                    "cmc_candidates": kc,
                    **qrels_metrics(rank_cmc(data, test, 100, rr, kc), test, data),
                }
            )
        if name == "scifact" and args.ce_queries:
            sub = test[: args.ce_queries]
            ranked, pps = _ce_rerank(data, sub, args.ce_depth, name)
            res["ce_subset"] = {
                "queries": len(sub),
                "depth": args.ce_depth,
                "ce_pairs_per_s": round(pps, 1),
                "de": qrels_metrics(rank_de(data, sub, 100), sub, data),
                "cmc_k1024": qrels_metrics(rank_cmc(data, sub, 100, rr, 1024), sub, data),
                "ce_rerank_de": qrels_metrics(ranked, sub, data),
            }
        results.append(res)
        print(
            f"\n{name}: {res['n_train']} train queries, {epochs} epochs, "
            f"{res['train_seconds']:.0f} s"
        )
        for r in res["rows"]:
            print(
                f"  {r['ranker']:<4} K={r.get('cmc_candidates', '-'):>5}  "
                f"nDCG@10 {r['ndcg@10']:.4f}  R@100 {r['recall@100']:.4f}  "
                f"({r['n_queries']} test q)"
            )
        if "ce_subset" in res:
            s = res["ce_subset"]
            print(f"  first {s['queries']} test queries, CE reranks DE top-{s['depth']}:")
            for k in ("de", "cmc_k1024", "ce_rerank_de"):
                print(f"    {k:<13} nDCG@10 {s[k]['ndcg@10']:.4f}")
    _write("beir", {"results": results})


def part_latency(args) -> None:
    from crossknn.ce import default_cross_encoder
    from crossknn.cmc import CmcReranker
    from crossknn.matrix import load_score_matrix

    m = load_score_matrix(CISI_MATRIX)
    rr = CmcReranker(Path(args.work) / "cisi-ce-k256", threads=1)
    rng = np.random.default_rng(args.seed)
    items = np.tile(m.de_items, (1, 1))
    rows = []
    for k in (64, 256, 1024):
        q = m.de_queries[:1]
        c = items[rng.choice(m.n_items, size=k, replace=False)][None]
        rr.score(q, c)  # warm-up
        ts = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            rr.score(q, c)
            ts.append(time.perf_counter() - t0)
        rows.append({"k": k, "cmc_ms_median": round(1e3 * float(np.median(ts)), 3)})
    from crossknn.data import load_beir

    corpus = load_beir(SHARED / "data" / "cisi")
    texts = corpus.items_in_order(m.item_ids)
    qtexts = corpus.queries_in_order(m.query_ids)
    ce = default_cross_encoder(items=texts, threads=1)
    idx = rng.choice(m.n_items, size=args.ce_pairs, replace=False)
    ce.score(qtexts[0], idx[:4])  # warm-up
    t0 = time.perf_counter()
    ce.score(qtexts[0], idx)
    per_pair = (time.perf_counter() - t0) / args.ce_pairs
    for r in rows:
        r["ce_ms_extrapolated"] = round(1e3 * per_pair * r["k"], 1)
        r["ratio"] = round(r["ce_ms_extrapolated"] / r["cmc_ms_median"], 1)
    print(f"{'K':>6}{'CMC ms':>10}{'CE ms (extrap.)':>18}{'CE/CMC':>9}")
    for r in rows:
        print(
            f"{r['k']:>6}{r['cmc_ms_median']:>10.2f}{r['ce_ms_extrapolated']:>18.1f}"
            f"{r['ratio']:>9.1f}"
        )
    _write(
        "latency",
        {
            "threads": 1,
            "ce_pairs_measured": args.ce_pairs,
            "ce_ms_per_pair": round(1e3 * per_pair, 2),
            "repeat": args.repeat,
            "rows": rows,
        },
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", action="append", choices=("cisi", "beir", "latency", "ablation"))
    ap.add_argument("--work", required=True, help="directory for trained models (not the repo)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ce-queries", type=int, default=20)
    ap.add_argument("--ce-depth", type=int, default=50)
    ap.add_argument("--ce-pairs", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=20)
    args = ap.parse_args()
    for part in args.part or ["cisi", "beir", "latency", "ablation"]:
        t0 = time.perf_counter()
        print(f"== {part}")
        {"cisi": part_cisi, "beir": part_beir, "latency": part_latency, "ablation": part_ablation}[
            part
        ](args)
        print(f"({part}: {time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
