"""Exact CE rows of a query file against every item of a corpus (issue 29: pseudo-query rows).

For each query of ``--queries`` (JSONL, ``_id`` / ``text`` per line) the CE scores all items of
the corpus, through crossknn's own runtime (``OnnxCrossEncoder.set_items`` + ``score``: the item
token cache), into ``--out`` (.npy, float32, queries x items, row order = file order, item order
= ``--item-ids`` (a JSON list, e.g. a score matrix's item_ids.json) or the corpus file's). With
``--de`` the DE vectors of the queries go to ``OUT`` with ``.de.npy`` (same model options).

Resumable: rows are written into ``OUT.partial.npy`` (a memory map) and counted in
``OUT.partial.json``; a rerun with the same inputs continues after the last finished row, and
the finished file is renamed into place at the end. The GPU run of issue 29 (the rounded-weights
embedded model of ../shared/tools/gpu-bundle on the host, ONNX Runtime CUDA fp16)::

    python bench/pseudo_rows.py --corpus .gpu-data/nfcorpus --item-ids .gpu-data/item_ids.json \\
        --queries .gpu-data/pseudo_first.jsonl --out .gpu-data/pseudo_first.npy \\
        --provider cuda --precision fp16 --batch-size 1024 --max-batch-tokens 262144 --de

A tiny CPU check: ``--provider cpu --limit 2`` (about 30 s per row of 3,633 items here).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np


def _queries(path: Path) -> tuple[list[str], list[str]]:
    from crossknn.data import read_query_file

    ids, texts = read_query_file(str(path))
    if not texts:
        raise ValueError(f"{path}: no queries")
    return ids, texts


def _items(corpus: Path, item_ids: Path | None) -> tuple[list[str], list[str]]:
    from crossknn.data import load_corpus

    c = load_corpus(corpus)
    if item_ids is None:
        return list(c.ids), list(c.texts)
    ids = json.loads(item_ids.read_text())
    pos = {i: n for n, i in enumerate(c.ids)}
    missing = [i for i in ids if i not in pos]
    if missing:
        raise KeyError(f"{len(missing)} of --item-ids are not in the corpus, e.g. {missing[0]!r}")
    return ids, [c.texts[pos[i]] for i in ids]


def model_options(args) -> dict:
    """``--precision fp16`` is the fp32 model run in half precision on a GPU provider."""
    fp16 = args.precision == "fp16"
    return {
        "precision": "fp32" if fp16 else args.precision,
        "provider": args.provider,
        "fp16": fp16 or None,
        "threads": args.threads,
        "batch_size": args.batch_size,
        "max_batch_tokens": args.max_batch_tokens,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", required=True, type=Path, help="BEIR folder or corpus.jsonl")
    ap.add_argument("--queries", required=True, type=Path, help="JSONL queries (_id, text)")
    ap.add_argument("--out", required=True, type=Path, help="scores .npy (queries x items)")
    ap.add_argument("--item-ids", type=Path, help="JSON list: the column order (default corpus)")
    ap.add_argument("--model", help="CE folder (default: the embedded minilm-l6-joint)")
    ap.add_argument("--de-model", help="DE folder for --de (default: the embedded minilm-l6-de)")
    ap.add_argument("--precision", default="fp32", help="fp32, an int8 recipe, or fp16 (GPU)")
    ap.add_argument("--provider", default="auto", choices=("auto", "cpu", "cuda", "tensorrt"))
    ap.add_argument("--threads", type=int)
    ap.add_argument("--batch-size", type=int, help="CE pairs per batch (default: the runtime's)")
    ap.add_argument("--max-batch-tokens", type=int, help="padded tokens per batch (GPU: large)")
    ap.add_argument("--limit", type=int, help="only the first N queries (a quick check)")
    ap.add_argument("--de", action="store_true", help="also write the queries' DE vectors")
    args = ap.parse_args(argv)

    from tqdm.auto import tqdm

    if args.provider in ("cuda", "tensorrt"):  # the CUDA libraries PyTorch's packages ship
        import onnxruntime

        getattr(onnxruntime, "preload_dlls", lambda: None)()
    from crossknn.ce.folders import open_cross_encoder, open_dual_encoder

    qids, queries = _queries(args.queries)
    if args.limit is not None:
        qids, queries = qids[: args.limit], queries[: args.limit]
    iids, items = _items(args.corpus, args.item_ids)
    n, N = len(queries), len(items)
    opts = model_options(args)
    ce = open_cross_encoder(args.model, **opts)
    print(f"{n} queries x {N} items = {n * N:,} pairs; {ce!r}", file=sys.stderr)
    t0 = time.perf_counter()
    ce.set_items(items)
    print(f"items tokenized in {time.perf_counter() - t0:.1f} s", file=sys.stderr)

    out = args.out
    part, state = Path(f"{out}.partial.npy"), Path(f"{out}.partial.json")
    key = {"queries": queries, "item_ids": iids, "model": repr(ce)}
    done = 0
    if part.is_file() and state.is_file():
        prev = json.loads(state.read_text())
        if prev.get("key") == key:
            done = int(prev["rows_done"])
    if done == 0:
        np.lib.format.open_memmap(part, mode="w+", dtype=np.float32, shape=(n, N)).flush()
    M = np.lib.format.open_memmap(part, mode="r+")
    all_items = np.arange(N, dtype=np.int64)
    t_rows = time.perf_counter()
    bar = tqdm(total=n * N, initial=done * N, unit="pair", unit_scale=True, desc="CE rows")
    for j in range(done, n):
        s = np.asarray(ce.score(queries[j], all_items), np.float32)
        if s.shape != (N,) or not np.all(np.isfinite(s)):
            raise ValueError(f"query {qids[j]!r}: the CE returned bad scores {s.shape}")
        M[j] = s
        if (j + 1) % 8 == 0 or j + 1 == n:
            M.flush()
            state.write_text(json.dumps({"key": key, "rows_done": j + 1}))
        bar.update(N)
    bar.close()
    del M
    rate = (n - done) * N / max(time.perf_counter() - t_rows, 1e-9)  # CE pairs/s of this run
    if args.de:
        de_opts = {k: v for k, v in opts.items() if k not in ("batch_size", "max_batch_tokens")}
        de = open_dual_encoder(args.de_model, **de_opts)
        np.save(Path(f"{out.with_suffix('')}.de.npy"), np.asarray(de.encode(queries), np.float32))
    os.replace(part, out)
    state.unlink()
    meta = {
        "queries": str(args.queries),
        "query_ids": qids,
        "item_ids_from": str(args.item_ids or args.corpus),
        "n_items": N,
        "model": repr(ce),
        "options": {k: v for k, v in opts.items() if v is not None},
        "pairs_per_s": round(rate, 1),
    }
    Path(f"{out.with_suffix('')}.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(f"wrote {out} ({n} x {N}); {rate:,.0f} pairs/s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
