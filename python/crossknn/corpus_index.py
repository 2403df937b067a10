"""A user's corpus as an index: build it (DE vectors, CE calibration, optional CUR rows), open it.

An index built by :func:`build_corpus_index` is an index directory (``crossknn.index.files``) of
kind ``"corpus"``: the item texts (``items.jsonl``, hash recorded), the dual-encoder item vectors
``de_items``, the CE score map used by AXN (``params.score_map``), and, when train queries were
given, the dense CUR rows ``R`` (train queries x all items) that ADACUR and ANNCUR need.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from crossknn.data import Corpus
from crossknn.fileio import atomic_save_npy, atomic_write_bytes, sha256_bytes
from crossknn.index.cur import score_dense
from crossknn.index.files import Index, load_index, save_index
from crossknn.jobs import JobOptions
from crossknn.score_map import ScoreMap
from crossknn.topk import top_k_rows

__all__ = [
    "CORPUS_KIND",
    "CorpusIndex",
    "build_corpus_index",
    "open_index",
    "pseudo_queries",
]

CORPUS_KIND = "corpus"
ITEMS_FILE = "items.jsonl"


def _items_jsonl(corpus: Corpus) -> bytes:
    lines = [
        json.dumps({"id": i, "text": t}, ensure_ascii=False)
        for i, t in zip(corpus.ids, corpus.texts, strict=False)
    ]
    return ("\n".join(lines) + "\n").encode("utf-8")


def pseudo_queries(corpus: Corpus, n: int, *, seed: int = 0, words: int = 10) -> list[str]:
    """``n`` short pseudo-queries: the first ``words`` words of random items (seeded).

    Used to calibrate the CE score scale when the user gives no train queries.
    """
    rng = np.random.default_rng(seed)
    picks = rng.choice(len(corpus), size=min(n, len(corpus)), replace=False)
    return [" ".join(corpus.texts[i].split()[:words]) for i in sorted(picks.tolist())]


def _encode_resumable(
    de, texts: list[str], work: Path, *, chunk: int = 1024, progress: bool = True
) -> np.ndarray:
    """DE vectors of ``texts``, encoded in chunks saved atomically under ``work`` (resumable)."""
    work.mkdir(parents=True, exist_ok=True)
    n_chunks = (len(texts) + chunk - 1) // chunk
    parts = []
    with tqdm(total=len(texts), desc="encode items (DE)", unit="item", disable=not progress) as bar:
        for c in range(n_chunks):
            lo, hi = c * chunk, min(len(texts), (c + 1) * chunk)
            path = work / f"de_{c:06d}_{lo}_{hi}.npy"
            arr = None
            if path.is_file():
                try:
                    arr = np.load(path, allow_pickle=False)
                except (ValueError, OSError, EOFError):
                    arr = None
                if arr is not None and arr.shape != (hi - lo, de.dim):
                    arr = None
            if arr is None:
                arr = np.asarray(de.encode(texts[lo:hi]), np.float32)
                atomic_save_npy(path, arr)
            parts.append(arr)
            bar.update(hi - lo)
    return np.concatenate(parts) if parts else np.empty((0, de.dim), np.float32)


def _calibrate(
    ce, de, V: np.ndarray, queries: list[str], *, items_per_query: int, seed: int
) -> tuple[ScoreMap, int]:
    """The CE score map (CE ~ scale * DE + offset), fitted on ``queries`` against their DE-top
    half and a random half of ``items_per_query`` items; returns it and the CE calls spent."""
    n = V.shape[0]
    m = min(items_per_query, n)
    Q = np.asarray(de.encode(queries), np.float32)
    rng = np.random.default_rng(seed)
    items, de_scores = [], []
    for qv in Q:
        s = V @ qv
        top = top_k_rows(s, m // 2)[0]
        rest = np.setdiff1d(np.arange(n), top)
        rand = rng.choice(rest, size=min(m - top.size, rest.size), replace=False)
        it = np.concatenate([top, rand]).astype(np.int64)
        items.append(it)
        de_scores.append(s[it])
    ce_scores = ce.score_batch(list(queries), items)
    smap = ScoreMap.fit(np.concatenate(ce_scores), np.concatenate(de_scores))
    return smap, int(sum(len(i) for i in items))


def build_corpus_index(
    corpus: Corpus,
    out_dir: str | os.PathLike,
    *,
    ce=None,
    de=None,
    train_queries: Sequence[str] | None = None,
    cur: bool = False,
    calibration_queries: int = 16,
    calibration_items: int = 32,
    seed: int = 0,
    progress: bool = True,
) -> CorpusIndex:
    """Encode ``corpus`` with the DE and spend a small CE budget on (pseudo) train queries.

    - always: ``de_items`` (N x d) and the CE->DE score normalization (alpha, beta) fitted on
      ``train_queries`` (or ``calibration_queries`` pseudo-queries made from item texts), each
      scored against ``calibration_items`` items;
    - ``cur=True`` (needs ``train_queries``): the dense rows ``R`` = CE(train queries x all items)
      for ADACUR/ANNCUR, through a resumable sharded job.

    Work in progress lives in ``OUT_DIR/.build`` and is resumed after an interruption; the index
    is complete once ``index.json`` exists.
    """
    from crossknn.ce import default_cross_encoder, default_dual_encoder

    if len(corpus) == 0:
        raise ValueError("the corpus is empty: nothing to index")
    if cur and not train_queries:
        raise ValueError("a CUR index (--cur) needs train queries (--train-queries FILE)")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    work = out / ".build"
    de = de if de is not None else default_dual_encoder(show_progress_bar=False)
    ce = ce if ce is not None else default_cross_encoder()

    items_bytes = _items_jsonl(corpus)
    atomic_write_bytes(out / ITEMS_FILE, items_bytes)
    V = _encode_resumable(de, list(corpus.texts), work, progress=progress)
    ce.set_items(list(corpus.texts))

    cal = (
        list(train_queries)
        if train_queries
        else pseudo_queries(corpus, calibration_queries, seed=seed)
    )
    smap, ce_calls = _calibrate(ce, de, V, cal, items_per_query=calibration_items, seed=seed)
    arrays: dict[str, np.ndarray] = {"de_items": V}
    if cur:
        R, _ = score_dense(
            ce, list(train_queries), work / "cur", options=JobOptions(progress=progress)
        )
        arrays["R"] = R
        ce_calls += int(R.size)
    params = {
        "n_items": len(corpus),
        "dim": int(V.shape[1]),
        "score_map": smap.to_list(),
        "calibration": "train queries" if train_queries else "pseudo-queries from item texts",
        "n_calibration_queries": len(cal),
        "calibration_items": int(calibration_items),
        "n_train_queries": len(train_queries) if train_queries else 0,
        "seed": int(seed),
    }
    info = {
        "items_file": ITEMS_FILE,
        "items_sha256": sha256_bytes(items_bytes),
        "source": corpus.source,
    }
    save_index(out, CORPUS_KIND, arrays, ce=ce, de=de, params=params, ce_calls=ce_calls, info=info)
    shutil.rmtree(work, ignore_errors=True)
    return open_index(out)


@dataclass
class CorpusIndex:
    """A loaded corpus index: the index directory's arrays and metadata, and its corpus."""

    index: Index
    corpus: Corpus

    @property
    def path(self) -> Path | None:
        return self.index.path

    @property
    def params(self) -> dict:
        return self.index.params

    @property
    def info(self) -> dict:
        return self.index.info

    @property
    def arrays(self) -> dict[str, np.ndarray]:
        return self.index.arrays

    @property
    def ce_calls(self) -> int:
        return self.index.ce_calls

    def __getitem__(self, name: str) -> np.ndarray:
        return self.index[name]

    def __len__(self) -> int:
        return len(self.corpus)

    def __repr__(self) -> str:
        return (
            f"CorpusIndex(path={str(self.path)!r}, n_items={len(self)}, "
            f"arrays={sorted(self.arrays)}, ce_calls={self.ce_calls})"
        )

    def check_models(self, *, ce: Any = None, de: Any = None) -> None:
        self.index.check_models(ce=ce, de=de)


def open_index(path: str | os.PathLike, *, verify: bool = True) -> CorpusIndex:
    """Load a corpus index directory and check its items file against the recorded hash."""
    idx = load_index(path, kind=CORPUS_KIND, verify=verify)
    items_path = Path(path) / idx.info.get("items_file", ITEMS_FILE)
    if not items_path.is_file():
        raise FileNotFoundError(f"index {path}: {items_path.name} (the item texts) is missing")
    data = items_path.read_bytes()
    if verify and sha256_bytes(data) != idx.info.get("items_sha256"):
        raise ValueError(
            f"index {path}: {items_path.name} does not match the recorded hash "
            "(changed or corrupt); rebuild the index"
        )
    ids, texts = [], []
    for line in data.decode("utf-8").splitlines():
        rec = json.loads(line)
        ids.append(rec["id"])
        texts.append(rec["text"])
    if len(ids) != idx["de_items"].shape[0]:
        raise ValueError(f"index {path}: {len(ids)} items but {idx['de_items'].shape[0]} vectors")
    return CorpusIndex(idx, Corpus(ids, texts, str(items_path)))
