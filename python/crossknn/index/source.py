"""Where an offline index gets its train queries, CE and DE from: a score-matrix or BEIR folder.

- a score-matrix folder (``scores.npy`` ...): the CE is the precomputed matrix (for experiments),
  the train queries are (a sample of) its train rows, the DE vectors are the folder's;
- a BEIR folder (``corpus.jsonl`` ...): the embedded CE and DE run on the texts, the train queries
  are a seeded sample of the folder's queries (of one qrels split if asked).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import crossknn.ce
from crossknn.data import load_beir
from crossknn.job_scorers import embedded_ce_scorer
from crossknn.matrix import load_score_matrix, matrix_identity
from crossknn.scorers import MatrixScorer

__all__ = ["IndexSource", "open_index_source"]


@dataclass
class IndexSource:
    scorer: Any  # Scorer protocol
    queries: list  # scorer query objects of the train queries
    query_ids: list[str]
    query_texts: Callable[[], list[str]]  # loaded lazily: only TF-IDF needs the texts
    item_texts: Callable[[], list[str]]
    de_queries: Callable[[], np.ndarray]
    de_items: Callable[[], np.ndarray]
    ce: dict
    de: dict | None
    info: dict


def _sample(pool: list[int], n: int | None, seed: int, what: str) -> list[int]:
    if n is None or n == len(pool):
        return list(pool)
    if not 1 <= n <= len(pool):
        raise ValueError(f"n_train must be in [1, {len(pool)}] ({what}); got {n}")
    pick = np.random.default_rng(seed).choice(len(pool), n, replace=False)
    return [pool[i] for i in sorted(pick)]


def _from_matrix(src: Path, n_train: int | None, seed: int) -> IndexSource:
    m = load_score_matrix(src, mmap=True)
    rows = _sample([int(r) for r in m.train], n_train, seed, "train rows of the matrix")
    if m.de_items is None or m.de_queries is None:
        raise FileNotFoundError(f"{src} has no de_queries.npy/de_items.npy (needed for MF)")
    ce_id, de_id = matrix_identity(src)
    query_ids = [m.query_ids[r] for r in rows]
    return IndexSource(
        scorer=MatrixScorer(np.asarray(m.scores)),
        queries=rows,
        query_ids=query_ids,
        query_texts=lambda: load_beir(m.corpus_dir()).queries_in_order(query_ids),
        item_texts=lambda: load_beir(m.corpus_dir()).items_in_order(m.item_ids),
        de_queries=lambda: np.asarray(m.de_queries)[rows],
        de_items=lambda: np.asarray(m.de_items),
        ce=ce_id,
        de=de_id,
        info={"source": "matrix", "matrix": src.resolve().name, "train_rows": rows},
    )


def _from_beir(
    src: Path,
    n_train: int | None,
    split: str | None,
    seed: int,
    threads: int | None,
    batch_size: int,
    lazy: bool,
    progress: bool,
) -> IndexSource:
    corpus = load_beir(src)
    pool = list(range(len(corpus.query_ids)))
    if split:
        if split not in corpus.qrels:
            raise ValueError(f"split {split!r}: no qrels/{split}.tsv in {src}")
        keep = set(corpus.qrels[split])
        pool = [i for i in pool if corpus.query_ids[i] in keep]
    n = n_train if n_train is not None else min(100, len(pool))
    qpos = _sample(pool, n, seed, "queries available")
    texts = [corpus.query_texts[i] for i in qpos]
    scorer = embedded_ce_scorer(
        corpus.item_texts, threads=threads, batch_size=batch_size, lazy=lazy
    )
    # looked up on the package at call time (one place to substitute the default)
    de = crossknn.ce.default_dual_encoder(threads=threads)
    cache: dict = {}

    def de_items():
        if "v" not in cache:
            cache["v"] = de.encode(corpus.item_texts, show_progress_bar=progress)
        return cache["v"]

    return IndexSource(
        scorer=scorer,
        queries=texts,
        query_ids=[corpus.query_ids[i] for i in qpos],
        query_texts=lambda: texts,
        item_texts=lambda: corpus.item_texts,
        de_queries=lambda: de.encode(texts),
        de_items=de_items,
        ce={"model_id": scorer.model_id, "model_hash": scorer.model_hash},
        de={"model_id": de.model_id, "model_hash": de.model_hash},
        info={"source": "beir", "dataset": src.resolve().name},
    )


def open_index_source(
    path: str | os.PathLike,
    *,
    n_train: int | None = None,
    split: str | None = None,
    seed: int = 0,
    threads: int | None = None,
    batch_size: int = 16,
    lazy: bool = False,
    progress: bool = True,
) -> IndexSource:
    """The train queries, scorer and DE vectors of a score-matrix or BEIR folder. ``n_train``:
    a seeded sample of this many train queries (default: all train rows of a matrix, 100 queries
    of a BEIR folder); ``lazy``: a Ray-ready CE (BEIR)."""
    src = Path(path)
    if (src / "scores.npy").is_file():
        return _from_matrix(src, n_train, seed)
    if (src / "corpus.jsonl").is_file():
        return _from_beir(src, n_train, split, seed, threads, batch_size, lazy, progress)
    raise FileNotFoundError(
        f"{src} is neither a score-matrix folder (scores.npy) nor a BEIR folder (corpus.jsonl)"
    )
