"""Training data for CMC: encoder vectors, candidate sets and targets.

A :class:`CmcData` holds what training needs, all in one encoder's vector space:

- ``item_vectors`` (N, d) and ``query_vectors`` (Q, d), float32 (frozen, precomputed DE vectors);
- ``encoder_id``: the name of the encoder that made the vectors (checked against checkpoints);
- per query, a *target* over items: either dense CE scores (distillation, a score-matrix folder)
  or gold relevance labels (qrels of a BEIR folder).

Candidate sets follow the paper (sec. 3.2 and app. C): the first stage's top ``n_top`` items
plus ``K - n_top`` items sampled without replacement from the softmax of the retriever's scores
over the rest of a pool (the DE's top ``pool``). For gold targets, a relevant item is put in the
set when the first stage missed them all (the paper's gold index).

BEIR vectors are encoded once with the embedded DE and cached as ``.npy`` plus ``meta.json``
under ``<cache>/cmc-vectors/<dataset>-<encoder id>-<hash prefix>/``.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

import crossknn.ce
from crossknn.ce.cache import cache_root
from crossknn.ce.models import DEFAULT_DE
from crossknn.data import load_beir
from crossknn.matrix import load_score_matrix

__all__ = [
    "CmcData",
    "beir_data",
    "encode_beir",
    "matrix_data",
    "sample_candidates",
    "matrix_encoder_id",
]


@dataclass
class CmcData:
    item_vectors: np.ndarray  # (N, d) float32
    query_vectors: np.ndarray  # (Q, d) float32
    encoder_id: str
    train: np.ndarray  # query rows used for training (int64)
    test: np.ndarray  # query rows used for evaluation (int64)
    target: str  # "ce" (dense scores) or "gold" (relevance labels)
    scores: np.ndarray | None = None  # (Q, N) CE scores when target == "ce"
    relevant: dict[int, dict[int, int]] = field(default_factory=dict)  # row -> {item: grade}
    name: str = ""
    query_ids: list[str] | None = None  # dataset ids of the query rows (BEIR)

    def __post_init__(self) -> None:
        self.item_vectors = np.ascontiguousarray(self.item_vectors, np.float32)
        self.query_vectors = np.ascontiguousarray(self.query_vectors, np.float32)
        if self.item_vectors.ndim != 2 or self.query_vectors.ndim != 2:
            raise ValueError(
                f"item and query vectors must be 2-D (n, d); got {self.item_vectors.shape} "
                f"and {self.query_vectors.shape}"
            )
        if self.item_vectors.shape[1] != self.query_vectors.shape[1]:
            raise ValueError(
                f"query vectors have dim {self.query_vectors.shape[1]} but item vectors have "
                f"dim {self.item_vectors.shape[1]}; both must come from the same encoder"
            )
        if self.target not in ("ce", "gold"):
            raise ValueError(f"target must be 'ce' or 'gold'; got {self.target!r}")
        if self.target == "ce":
            if self.scores is None:
                raise ValueError("target 'ce' needs a (queries x items) score matrix")
            want = (self.query_vectors.shape[0], self.item_vectors.shape[0])
            if self.scores.shape != want:
                raise ValueError(
                    f"scores must be {want} (queries x items); got {self.scores.shape}"
                )
        self.train = np.asarray(self.train, np.int64)
        self.test = np.asarray(self.test, np.int64)

    @property
    def n_items(self) -> int:
        return self.item_vectors.shape[0]

    @property
    def dim(self) -> int:
        return self.item_vectors.shape[1]

    def de_scores(self, rows) -> np.ndarray:
        return self.query_vectors[np.asarray(rows)] @ self.item_vectors.T


def matrix_encoder_id(meta: dict) -> str:
    """Encoder id of a score-matrix folder's DE vectors (``meta.json``): its ``encoder_id`` if
    given, else the embedded DE's id when the matrix was made with its weights and pooling."""
    if meta.get("encoder_id"):
        return str(meta["encoder_id"])
    model, de = str(meta.get("model", "")), str(meta.get("de", ""))
    if "all-MiniLM-L6-v2" in model and de.startswith("same model, mean pooling"):
        return DEFAULT_DE
    return f"{model} / {de}"


def matrix_data(folder) -> CmcData:
    """Distillation data from a score-matrix folder: CE scores, DE vectors, its train/test rows."""
    m = load_score_matrix(folder)
    if m.de_items is None or m.de_queries is None:
        raise FileNotFoundError(f"{m.path} has no de_items.npy/de_queries.npy (CMC needs them)")
    return CmcData(
        m.de_items,
        m.de_queries,
        matrix_encoder_id(m.meta),
        m.train,
        m.test,
        "ce",
        scores=m.scores,
        name=str(m.meta.get("dataset", m.path.name)),
    )


def encode_beir(folder, cache_dir=None, *, progress: bool = True) -> Path:
    """Encodes a BEIR folder's items and its qrels' queries with the embedded DE, once.

    Returns the cache directory (``items.npy``, ``queries.npy``, ``item_ids.json``,
    ``query_ids.json``, ``meta.json``). A finished entry is reused; it is written to a temporary
    name and renamed when complete.
    """
    folder = Path(folder)
    corpus = load_beir(folder)
    # looked up on the package at call time (one place to substitute the default)
    de = crossknn.ce.default_dual_encoder(cache_dir=cache_dir, show_progress_bar=progress)
    wanted = sorted({q for split in corpus.qrels.values() for q in split})
    key = hashlib.sha256(
        "\n".join(
            [folder.resolve().as_posix(), de.model_hash, str(len(corpus.item_ids)), *wanted]
        ).encode()
    ).hexdigest()[:12]
    out = cache_root(cache_dir) / "cmc-vectors" / f"{folder.name}-{de.model_id}-{key}"
    if (out / "meta.json").is_file():
        return out
    tmp = out.with_name(out.name + ".tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    qpos = {q: i for i, q in enumerate(corpus.query_ids)}
    missing = [q for q in wanted if q not in qpos]
    if missing:
        raise KeyError(f"{len(missing)} qrels query ids not in queries.jsonl, e.g. {missing[0]!r}")
    qtexts = [corpus.query_texts[qpos[q]] for q in wanted]
    np.save(tmp / "queries.npy", de.encode(qtexts), allow_pickle=False)
    np.save(tmp / "items.npy", de.encode(corpus.item_texts), allow_pickle=False)
    (tmp / "item_ids.json").write_text(json.dumps(corpus.item_ids))
    (tmp / "query_ids.json").write_text(json.dumps(wanted))
    (tmp / "meta.json").write_text(
        json.dumps(
            {
                "dataset": folder.name,
                "folder": str(folder),
                "encoder_id": de.model_id,
                "encoder_hash": de.model_hash,
                "dim": de.dim,
                "n_items": len(corpus.item_ids),
                "n_queries": len(wanted),
            },
            indent=1,
        )
    )
    tmp.rename(out)
    return out


def beir_data(
    folder,
    cache_dir=None,
    *,
    train_split: str = "train",
    test_split: str = "test",
    progress: bool = True,
) -> CmcData:
    """Gold-label data from a BEIR folder: DE vectors (cached), relevance from qrels."""
    folder = Path(folder)
    vec = encode_beir(folder, cache_dir, progress=progress)
    meta = json.loads((vec / "meta.json").read_text())
    item_ids = json.loads((vec / "item_ids.json").read_text())
    query_ids = json.loads((vec / "query_ids.json").read_text())
    qrels = load_beir(folder).qrels
    for s in (train_split, test_split):
        if s not in qrels:
            raise ValueError(f"{folder}/qrels has no {s}.tsv; it has {sorted(qrels)}")
    ipos = {i: n for n, i in enumerate(item_ids)}
    qpos = {q: n for n, q in enumerate(query_ids)}
    relevant: dict[int, dict[int, int]] = {}
    rows = {}
    for s in (train_split, test_split):
        rs = []
        for q, docs in qrels[s].items():
            rel = {ipos[d]: g for d, g in docs.items() if g > 0 and d in ipos}
            if rel:
                relevant.setdefault(qpos[q], {}).update(rel)
                rs.append(qpos[q])
        rows[s] = np.asarray(sorted(rs), np.int64)
    return CmcData(
        np.load(vec / "items.npy"),
        np.load(vec / "queries.npy"),
        meta["encoder_id"],
        rows[train_split],
        rows[test_split],
        "gold",
        relevant=relevant,
        name=folder.name,
        query_ids=query_ids,
    )


def sample_candidates(
    de_scores: np.ndarray,
    k: int,
    *,
    n_top: int,
    pool: int,
    rng: np.random.Generator,
    temperature: float = 0.05,
    must: np.ndarray | None = None,
) -> np.ndarray:
    """One query's K candidates: the ``n_top`` best by ``de_scores`` plus ``k - n_top`` drawn
    without replacement from softmax(score / temperature) over the rest of the top ``pool``
    (Gumbel-top-k). ``must``: items of which at least one must be in the set (gold labels);
    when none is, the last candidate is replaced by one of them (drawn uniformly)."""
    n = de_scores.shape[0]
    if k > n:
        raise ValueError(f"K={k} candidates asked for but the corpus has only {n} items")
    n_top = min(n_top, k)
    pool = min(max(pool, k), n)
    order = np.argsort(-de_scores, kind="stable")[:pool]
    top, rest = order[:n_top], order[n_top:]
    m = k - n_top
    if m:
        g = de_scores[rest] / temperature + rng.gumbel(size=rest.size)
        picked = rest[np.argsort(-g, kind="stable")[:m]]
        cand = np.concatenate([top, picked])
    else:
        cand = top
    if must is not None and must.size and not np.isin(must, cand).any():
        cand = cand.copy()
        cand[-1] = must[rng.integers(must.size)]
    return cand.astype(np.int64)
