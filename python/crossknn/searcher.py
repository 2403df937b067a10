"""The main job end to end: build an index over a user's corpus, then search it with the CE.

Three lines from Python::

    index = crossknn.open_index("INDEX_DIR")
    searcher = crossknn.Searcher(index)
    hits = searcher.search("how do I parse a date?", k=10, budget=100)

An index built by :func:`build_corpus_index` is an index directory (``crossknn.index.files``) of
kind ``"corpus"``: the item texts (``items.jsonl``, hash recorded), the dual-encoder item vectors
``de_items``, the CE score normalization (alpha, beta) used by AXN, and, when train queries were
given, the dense CUR rows ``R`` (train queries x all items) that ADACUR and ANNCUR need.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from crossknn.corpus import Corpus
from crossknn.index.files import Index, load_index, save_index
from crossknn.jobs import atomic_save_npy, atomic_write_bytes

__all__ = [
    "CORPUS_KIND",
    "METHODS",
    "CorpusIndex",
    "Hits",
    "Searcher",
    "build_corpus_index",
    "open_index",
    "pseudo_queries",
]

CORPUS_KIND = "corpus"
ITEMS_FILE = "items.jsonl"
METHODS = ("axn", "rnr", "adacur", "anncur")
# AXN's lambda (mix of the least-squares query embedding with the DE query vector): 0.5 was chosen
# on the train rows of cisi-minilm (docs/search.md); it is a property of the CE/DE pair.
DEFAULT_MIX = 0.5


# ---------------------------------------------------------------------------------------------
# building


def _sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


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
    from tqdm.auto import tqdm

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
) -> tuple[tuple[float, float], int]:
    """(alpha, beta) with CE ~ alpha * DE + beta, fitted on ``queries`` against their DE-top
    half and a random half of ``items_per_query`` items; returns it and the CE calls spent."""
    from crossknn.search import fit_score_affine

    n = V.shape[0]
    m = min(items_per_query, n)
    Q = np.asarray(de.encode(queries), np.float32)
    rng = np.random.default_rng(seed)
    items, de_scores = [], []
    for qv in Q:
        s = V @ qv
        top = np.argsort(-s, kind="stable")[: m // 2]
        rest = np.setdiff1d(np.arange(n), top)
        rand = rng.choice(rest, size=min(m - top.size, rest.size), replace=False)
        it = np.concatenate([top, rand]).astype(np.int64)
        items.append(it)
        de_scores.append(s[it])
    ce_scores = ce.score_batch(list(queries), items)
    alpha, beta = fit_score_affine(np.concatenate(ce_scores), np.concatenate(de_scores))
    return (alpha, beta), int(sum(len(i) for i in items))


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
    (alpha, beta), ce_calls = _calibrate(
        ce, de, V, cal, items_per_query=calibration_items, seed=seed
    )
    arrays: dict[str, np.ndarray] = {"de_items": V}
    if cur:
        from crossknn.index.cur import score_dense

        R, _ = score_dense(ce, list(train_queries), work / "cur", progress=progress)
        arrays["R"] = R
        ce_calls += int(R.size)
    params = {
        "n_items": len(corpus),
        "dim": int(V.shape[1]),
        "score_affine": [alpha, beta],
        "calibration": "train queries" if train_queries else "pseudo-queries from item texts",
        "n_calibration_queries": len(cal),
        "calibration_items": int(calibration_items),
        "n_train_queries": len(train_queries) if train_queries else 0,
        "seed": int(seed),
    }
    info = {
        "items_file": ITEMS_FILE,
        "items_sha256": _sha256_bytes(items_bytes),
        "source": corpus.source,
    }
    save_index(out, CORPUS_KIND, arrays, ce=ce, de=de, params=params, ce_calls=ce_calls, info=info)
    import shutil

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
    if verify and _sha256_bytes(data) != idx.info.get("items_sha256"):
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


# ---------------------------------------------------------------------------------------------
# searching


@dataclass
class Hits:
    """One query's result: the top-k item ids with exact CE scores, and what it cost."""

    query: str
    ids: list[str]
    indices: np.ndarray
    scores: np.ndarray
    ce_calls: int
    seconds_ce: float
    seconds_other: float
    exact_ids: list[str] | None = None
    recall: float | None = None
    texts: list[str] = field(default_factory=list, repr=False)

    def to_dict(self) -> dict[str, Any]:
        out = {
            "query": self.query,
            "results": [
                {"id": i, "score": float(s)} for i, s in zip(self.ids, self.scores, strict=False)
            ],
            "ce_calls": int(self.ce_calls),
            "seconds_ce": round(self.seconds_ce, 4),
            "seconds_other": round(self.seconds_other, 4),
        }
        if self.exact_ids is not None:
            out["exact_ids"] = self.exact_ids
            out["recall"] = self.recall
        return out


class _TimedScorer:
    """Scorer proxy that adds up the seconds spent inside the CE."""

    def __init__(self, scorer) -> None:
        self.scorer = scorer
        self.n_items = scorer.n_items
        self.seconds = 0.0

    def score(self, query, items):
        return self.score_batch([query], [items])[0]

    def score_batch(self, queries, items):
        t = time.perf_counter()
        try:
            return self.scorer.score_batch(queries, items)
        finally:
            self.seconds += time.perf_counter() - t


class _QueryVectors:
    """DE query vectors by text, encoded once per text (the first stage and AXN's prior)."""

    def __init__(self, de) -> None:
        self.de = de
        self.cache: dict[str, np.ndarray] = {}

    def prefetch(self, texts: Sequence[str]) -> None:
        todo = [t for t in dict.fromkeys(texts) if t not in self.cache]
        if todo:
            for t, v in zip(todo, np.asarray(self.de.encode(todo), np.float32), strict=False):
                self.cache[t] = v

    def __call__(self, text: str) -> np.ndarray:
        self.prefetch([text])
        return self.cache[text]

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        self.prefetch(texts)
        return np.stack([self.cache[t] for t in texts])


class Searcher:
    """Searches a corpus index with the CE on a budget of CE calls per query.

    ``ce``/``de`` default to the embedded models; an index built with other models is refused.
    ``method``: ``axn`` (default: rounds over the DE item vectors, DE first round, least squares
    mixed with the DE query vector), ``rnr`` (rerank the DE top-B), ``adacur``/``anncur`` (need
    an index built with train queries and ``cur=True``). ``cmc_model``: a CMC model directory
    (``crossknn cmc export``) trained on this DE; the first round then takes the DE's top
    ``cmc_candidates`` reranked by CMC instead of the DE's top items.
    """

    def __init__(
        self,
        index: CorpusIndex | str | os.PathLike,
        *,
        ce=None,
        de=None,
        method: str = "axn",
        rounds: int = 5,
        mix: float = DEFAULT_MIX,
        precision: str = "fp32",
        threads: int | None = None,
        cmc_model: str | os.PathLike | None = None,
        cmc_candidates: int = 512,
    ) -> None:
        from crossknn.ce import default_cross_encoder, default_dual_encoder

        if not isinstance(index, CorpusIndex):
            index = open_index(index)
        self.index = index
        self.corpus = index.corpus
        self.de = (
            de if de is not None else default_dual_encoder(precision=precision, threads=threads)
        )
        self.ce = (
            ce if ce is not None else default_cross_encoder(precision=precision, threads=threads)
        )
        index.check_models(ce=self.ce, de=self.de)
        self._check_method(method)
        self.method, self.rounds, self.mix = method, int(rounds), float(mix)
        self.ce.set_items(list(self.corpus.texts))
        self.V = np.ascontiguousarray(index["de_items"], np.float32)
        self.qvec = _QueryVectors(self.de)
        self._methods: dict[tuple, Any] = {}
        self.first = self._first_stage(cmc_model, cmc_candidates)

    def _first_stage(self, cmc_model, cmc_candidates: int):
        from crossknn.retrievers import DenseRetriever

        if cmc_model is None:
            return DenseRetriever(self.V, encode=self.qvec.encode)
        from crossknn.cmc import CmcRetriever

        de_id = (self.index.index.models.get("de") or {}).get("model_id")
        return CmcRetriever(
            cmc_model,
            self.V,
            encode=self.qvec.encode,
            candidates=min(int(cmc_candidates), self.n_items),
            encoder_id=de_id,
        )

    def __repr__(self) -> str:
        return (
            f"Searcher(n_items={len(self.corpus)}, method={self.method!r}, "
            f"rounds={self.rounds}, ce={getattr(self.ce, 'model_id', '?')!r})"
        )

    @property
    def n_items(self) -> int:
        return len(self.corpus)

    def _check_method(self, method: str) -> None:
        if method not in METHODS:
            raise ValueError(f"unknown method {method!r}; expected one of {METHODS}")
        if method in ("adacur", "anncur") and "R" not in self.index.arrays:
            raise ValueError(
                f"method {method!r} needs a CUR index (CE scores of train queries x all items); "
                "rebuild with: crossknn build CORPUS INDEX_DIR --train-queries FILE --cur"
            )

    def _make(self, method: str, rounds: int):
        key = (method, rounds)
        if key in self._methods:
            return self._methods[key]
        from crossknn.search import ADACUR, ANNCUR, AXN, RNR, CurIndex

        first = self.first
        if method == "axn":
            alpha, beta = self.index.params["score_affine"]
            m = AXN(
                self.V,
                rounds=rounds,
                first=first,
                prior=self.qvec,
                mix=self.mix,
                score_affine=(float(alpha), float(beta)),
            )
        elif method == "rnr":
            m = RNR(first)
        else:
            cur = CurIndex(np.asarray(self.index["R"], np.float32))
            m = (
                ADACUR(cur, rounds=rounds, first=first)
                if method == "adacur"
                else ANNCUR(cur, first=first)
            )
        self._methods[key] = m
        return m

    def search(
        self,
        queries: str | Sequence[str],
        *,
        k: int = 10,
        budget: int = 100,
        method: str | None = None,
        rounds: int | None = None,
        seed: int = 0,
        exact: bool = False,
        exact_cache: str | os.PathLike | None = None,
        progress: bool = False,
    ) -> list[Hits]:
        """Top-k items by exact CE score for each query, spending at most ``budget`` CE calls
        each. All queries are searched together (one CE batch per round). ``exact=True`` also
        scores every item for each query (N CE calls each, not counted in ``ce_calls``) and
        reports Top-k-Recall@budget."""
        single = isinstance(queries, str)
        qs = [queries] if single else list(queries)
        bad = [i for i, q in enumerate(qs) if not isinstance(q, str) or not q.strip()]
        if bad:
            raise ValueError(f"queries must be non-empty strings; query {bad[0]} is {qs[bad[0]]!r}")
        method = method or self.method
        self._check_method(method)
        rounds = int(rounds or self.rounds)
        t0 = time.perf_counter()
        self.qvec.prefetch(qs)
        timed = _TimedScorer(self.ce)
        res = self._make(method, rounds).search(timed, qs, budget=budget, k=k, seed=seed)
        total = time.perf_counter() - t0
        ce_share = timed.seconds / max(len(qs), 1)
        other_share = (total - timed.seconds) / max(len(qs), 1)
        hits = []
        for i, q in enumerate(qs):
            keep = res.indices[i] >= 0
            idx = res.indices[i][keep]
            hits.append(
                Hits(
                    query=q,
                    ids=[self.corpus.ids[j] for j in idx],
                    indices=idx,
                    scores=res.scores[i][keep],
                    ce_calls=int(res.ce_calls[i]),
                    seconds_ce=ce_share,
                    seconds_other=other_share,
                    texts=[self.corpus.texts[j] for j in idx],
                )
            )
        if exact:
            for h, top in zip(
                hits,
                self.exact_top_k(qs, k=k, progress=progress, cache_dir=exact_cache),
                strict=False,
            ):
                h.exact_ids = [self.corpus.ids[j] for j in top]
                h.recall = len(set(h.indices.tolist()) & set(top.tolist())) / len(top)
        return hits

    def exact_scores(self, query: str) -> np.ndarray:
        """CE scores of ``query`` against every item (N CE calls)."""
        return np.asarray(self.ce.score(query, np.arange(self.n_items, dtype=np.int64)), np.float32)

    def exact_top_k(
        self,
        queries: Sequence[str],
        *,
        k: int,
        progress: bool = False,
        cache_dir: str | os.PathLike | None = None,
    ) -> list[np.ndarray]:
        """The exact CE top-k of each query (ties to the lower index); with ``cache_dir`` the
        full score rows are kept there as ``.npy`` files keyed by the query and index hash."""
        from tqdm.auto import tqdm

        out = []
        for q in tqdm(list(queries), desc="exact CE top-k", unit="query", disable=not progress):
            s = None
            path = None
            if cache_dir is not None:
                key = hashlib.sha256(
                    (
                        self.index.info.get("items_sha256", "")
                        + "\0"
                        + str(getattr(self.ce, "model_hash", ""))
                        + "\0"
                        + q
                    ).encode()
                ).hexdigest()[:24]
                path = Path(cache_dir) / f"exact-{key}.npy"
                if path.is_file():
                    s = np.load(path, allow_pickle=False)
                    if s.shape != (self.n_items,):
                        s = None
            if s is None:
                s = self.exact_scores(q)
                if path is not None:
                    path.parent.mkdir(parents=True, exist_ok=True)
                    atomic_save_npy(path, s)
            out.append(np.lexsort((np.arange(s.size), -s))[:k].astype(np.int64))
        return out
