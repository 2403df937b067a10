"""``auto``'s index for a user's corpus (``crossknn build --index-calls C``).

The same builder as the eval harness (:func:`crossknn.search.auto.build_auto_index`), fed with the
CE over the corpus and train queries given by the user, or pseudo-queries made from item texts
(as the CE calibration does) when there are none. At most ``C`` CE calls are spent, counted by
:class:`crossknn.search.auto.IndexCallBudget`. Stored in the corpus index as the arrays
``auto_rows`` (m x N, the complete CE rows) and ``auto_row_vectors`` (m x d, the row queries' DE
vectors, for the row prior) and ``params["auto"]`` (the choices made). An index built before the
row prior has no ``auto_row_vectors`` and searches with the plain DE prior; one built before the
query-subspace block has no ``auto_query_dirs`` and searches without it; ``auto_item_cov`` (the
item vectors' covariance for the row prior, d x d) is computed at load where an older index lacks
it. A build with few rows also stores the learned prior (``auto_prior_vectors``,
``auto_prior_deltas``: the fitted queries' DE vectors and corrections, from partial rows of other
train queries); an index without them searches with the row prior.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from crossknn.fileio import atomic_save_npy, sha256_texts
from crossknn.search.auto import (
    PRIOR_KERNEL_TAU,
    AutoIndex,
    IndexCallBudget,
    build_auto_index,
    partial_plan,
)

__all__ = [
    "AUTO_ARRAY",
    "AUTO_ITEM_COV",
    "AUTO_PRIOR_DELTAS",
    "AUTO_PRIOR_VECTORS",
    "AUTO_QUERY_DIRS",
    "AUTO_ROW_VECTORS",
    "ITEMS_PER_ROW",
    "MAX_DEFAULT_ROWS",
    "auto_index_of",
    "build_corpus_auto",
    "default_index_budget",
    "default_index_rows",
    "expected_gain",
    "pseudo_query_count",
]

AUTO_ARRAY = "auto_rows"
AUTO_ROW_VECTORS = "auto_row_vectors"
AUTO_QUERY_DIRS = "auto_query_dirs"
# d x d float64, the item vectors' covariance for the row prior's spread (computed at build time:
# O(N d^2), tens of seconds at a million items, which a search process would otherwise pay at load)
AUTO_ITEM_COV = "auto_item_cov"
# the learned prior (few rows; crossknn.search.auto.learned_prior): the fitted queries' DE vectors
# (P x d) and their corrections (P x (d + m + r + 1)); an index without them uses the row prior
AUTO_PRIOR_VECTORS = "auto_prior_vectors"
AUTO_PRIOR_DELTAS = "auto_prior_deltas"

# The default index budget of ``crossknn build`` (no --index-calls): m complete CE rows, C = m x N,
#   m = min(N // ITEMS_PER_ROW, MAX_DEFAULT_ROWS, train queries given)
# a function of the corpus alone, so that two builds of one corpus are the same index on any
# machine and under any load (the CE's speed at build time does not enter; --index-minutes is an
# explicit time cap that says when it cut). Every CE call of the build is inside C: the score
# map's calibration pairs are read from these rows. A corpus under 100 items reads no row; its
# budget is the calibration's pairs alone (default_index_budget). docs/methods.md has the numbers
# behind the rule.
ITEMS_PER_ROW = 100
MAX_DEFAULT_ROWS = 32
# measured on nfcorpus-minilm-gpu (323 test queries, DE first round, seed 0; bench/recall_bench.py
# --nfcorpus; row prior, query-subspace block, the learned prior of partial rows below 64 rows,
# its kernel ridge):
# Top-10-Recall@100 of auto by the index's CE calls in rows' worth (C / N, rounded), and of AXN
EXPECTED_K10_B100 = {0: 0.758, 1: 0.787, 16: 0.942, 32: 0.950, 167: 0.964}
AXN_K10_B100 = 0.707


def default_index_rows(n_items: int, *, n_train: int | None = None) -> int:
    """The rows m of the default index budget (C = m x N; see the constants above); ``n_train``
    the train queries given (None: pseudo-queries, as many as needed). Depends on nothing but
    its arguments: no clock, no measured speed."""
    if n_items < 1:
        raise ValueError(f"need n_items >= 1; got {n_items}")
    m = min(int(n_items) // ITEMS_PER_ROW, MAX_DEFAULT_ROWS)
    if n_train is not None:
        m = min(m, int(n_train))
    return max(m, 0)


def default_index_budget(
    n_items: int,
    *,
    n_train: int | None = None,
    calibration_queries: int = 16,
    calibration_items: int = 32,
) -> tuple[int, int]:
    """``(C, m)``: the default index budget of a build and the complete rows it pays for.

    ``C = m x N`` with m = :func:`default_index_rows`; where m = 0 (fewer than 100 items, or no
    train query), ``C`` is the calibration's pairs alone: ``calibration_queries`` (at most the
    train queries given) x ``calibration_items`` (at most N)."""
    m = default_index_rows(n_items, n_train=n_train)
    if m:
        return m * int(n_items), m
    q = int(calibration_queries) if n_train is None else min(int(calibration_queries), n_train)
    return max(q, 0) * min(int(calibration_items), int(n_items)), 0


def expected_gain(index_calls: int, n_items: int) -> str:
    """What an index of ``index_calls`` CE calls over ``n_items`` items is expected to buy: the
    NFCorpus measurement for the largest measured budget, in rows' worth of calls (C / N,
    rounded; complete and partial rows alike), not above this one."""
    worth = round(max(int(index_calls), 0) / max(int(n_items), 1))
    r = max(k for k in EXPECTED_K10_B100 if k <= worth)
    rows = "row's" if r == 1 else "rows'"
    return (
        f"on NFCorpus {r} {rows} worth of CE calls gave Top-10-Recall@100 "
        f"{EXPECTED_K10_B100[r]:.2f} (AXN over DE {AXN_K10_B100:.2f})"
    )


def pseudo_query_count(index_calls: int, n_items: int, calibration_queries: int) -> int:
    """Pseudo-queries to make when no train queries are given: enough for every complete row
    ``C`` pays for, and at least as many as the calibration uses."""
    return max(int(calibration_queries), int(index_calls) // max(int(n_items), 1))


class _TextScorer:
    """The CE over the corpus items, addressed by train query position (IndexCallBudget keys).
    With ``work``, each complete row is kept there (``row_<sha256 of the query>.npy``) and read
    back instead of scored: an interrupted build resumes after its last finished row."""

    def __init__(self, ce, texts: Sequence[str], n_items: int, work: Path | None = None) -> None:
        self.ce, self.texts, self.n_items = ce, list(texts), int(n_items)
        self.work = None if work is None else Path(work)

    def _row_path(self, q) -> Path:
        return self.work / f"row_{sha256_texts([self.texts[int(q)]])[:24]}.npy"

    def score_batch(self, queries, items):
        if self.work is None:
            return self.ce.score_batch([self.texts[int(q)] for q in queries], items)
        out = []
        for q, it in zip(queries, items, strict=True):
            it = np.asarray(it, np.int64)
            full = it.size == self.n_items and np.array_equal(it, np.arange(self.n_items))
            path = self._row_path(q) if full else None
            row = None
            if path is not None and path.is_file():
                try:
                    row = np.load(path, allow_pickle=False)
                except (ValueError, OSError, EOFError):
                    row = None
                if row is not None and (row.shape != (self.n_items,) or row.dtype != np.float32):
                    row = None
            if row is None:
                row = np.asarray(self.ce.score_batch([self.texts[int(q)]], [it])[0], np.float32)
                if path is not None:
                    atomic_save_npy(path, row)
            out.append(row)
        return out


def build_corpus_auto(
    ce,
    de,
    item_vectors: np.ndarray,
    train_queries: Sequence[str],
    *,
    index_calls: int,
    seed: int = 0,
    progress: bool = False,
    work: Path | None = None,
    max_seconds: float | None = None,
    options: Mapping[str, Any] | None = None,
) -> tuple[dict[str, np.ndarray], dict, int]:
    """(arrays, params, CE calls spent) of the auto index; ``ce`` must have the corpus items set
    (``ce.set_items``). Train queries are addressed by position; ``de.encode`` gives their DE
    vectors (used for the cross-validated choices). ``work``: a folder that keeps the finished
    rows of an interrupted build (the caller keys it to the CE and the items). ``max_seconds``:
    a time cap on the complete rows: no row is started that would end after it (at the mean
    time of the rows read so far; 0 reads none); ``params["time_cap"]`` says whether it cut.
    ``options``: keyword arguments of :func:`crossknn.search.auto.build_auto_index` (e.g.
    ``partial_items=0``: no learned prior)."""
    qs = list(train_queries)
    if not qs:
        raise ValueError("the auto index needs at least one train or pseudo query")
    V = np.asarray(item_vectors, np.float32)
    Q = np.asarray(de.encode(qs), np.float32)
    if work is not None:
        Path(work).mkdir(parents=True, exist_ok=True)
    reader = IndexCallBudget(_TextScorer(ce, qs, V.shape[0], work), range(len(qs)), index_calls)
    stop = None
    if max_seconds is not None:
        limit = float(max_seconds)

        def stop(j: int, spent: float) -> bool:  # would row j end after the cap?
            return limit <= 0 or spent + (spent / j if j else 0.0) > limit

    idx = build_auto_index(
        reader,
        list(range(len(qs))),
        V,
        Q,
        index_calls=index_calls,
        seed=seed,
        progress=progress,
        stop_rows=stop,
        **dict(options or {}),
    )
    params = {**idx.meta(), "index_calls_limit": int(index_calls), "n_train_queries": len(qs)}
    if max_seconds is not None:
        items = (options or {}).get("partial_items")
        planned = partial_plan(
            int(index_calls), V.shape[0], len(qs), *(() if items is None else (int(items),))
        )[0]
        params["time_cap"] = {
            "minutes": round(float(max_seconds) / 60.0, 4),
            "rows_planned": int(planned),
            "rows_read": idx.n_rows,
            "cut": idx.n_rows < planned,
        }
    # the texts of the row queries: crossknn add scores new items against them
    params["row_queries"] = [qs[int(p)] for p in idx.row_ids]
    arrays = {AUTO_ARRAY: idx.rows, AUTO_ROW_VECTORS: np.asarray(idx.row_vectors, np.float32)}
    if idx.n_dirs:
        arrays[AUTO_QUERY_DIRS] = idx.query_dirs
    if idx.prior_deltas is not None:
        arrays[AUTO_PRIOR_VECTORS] = idx.prior_vectors
        arrays[AUTO_PRIOR_DELTAS] = idx.prior_deltas
    if (idx.prior_alpha > 0 and idx.n_rows) or idx.prior_deltas is not None:
        arrays[AUTO_ITEM_COV] = idx.prior_tables()[2]
    return arrays, params, int(reader.calls)


def auto_index_of(index) -> AutoIndex | None:
    """The :class:`AutoIndex` of a corpus index (``crossknn.corpus_folder.CorpusIndex``), or None
    when it was built without ``--index-calls``."""
    params = index.params.get("auto")
    if params is None:
        return None
    rows = index.arrays.get(AUTO_ARRAY)
    V = np.asarray(index["de_items"], np.float32)
    R = np.zeros((0, V.shape[0]), np.float32) if rows is None else np.asarray(rows, np.float32)
    W = index.arrays.get(AUTO_ROW_VECTORS)
    A = index.arrays.get(AUTO_QUERY_DIRS)
    C = index.arrays.get(AUTO_ITEM_COV)  # absent in indexes built before it: computed at load
    P, D = index.arrays.get(AUTO_PRIOR_VECTORS), index.arrays.get(AUTO_PRIOR_DELTAS)
    alpha = float(params.get("prior_alpha", 0.0)) if W is not None else 0.0
    return AutoIndex(
        V,
        R,
        rho_d=float(params["rho_d"]),
        rho_r=float(params["rho_r"]),
        rounds=int(params["rounds"]),
        first_share=params.get("first_share"),
        decay=float(params.get("decay", 0.0)),
        index_calls=int(params["index_calls"]),
        row_vectors=None if W is None else np.asarray(W, np.float32),
        prior_alpha=alpha,
        prior_tau=float(params.get("prior_tau", 10.0)),
        query_dirs=None if A is None else np.asarray(A, np.float32),
        item_cov=None if C is None else np.asarray(C, np.float64),
        prior_vectors=None if P is None else np.asarray(P, np.float32),
        prior_deltas=None if D is None else np.asarray(D, np.float32),
        partial_rows=int(params.get("partial_rows", 0)),
        # absent in indexes built before the kernel ridge: the softmax average, as they searched
        prior_ridge=float(params.get("prior_ridge", 0.0)),
        prior_kernel_tau=float(params.get("prior_kernel_tau", PRIOR_KERNEL_TAU)),
        # absent in indexes built before the rounds curve: their rounds run (no time trade)
        rounds_curve=params.get("rounds_curve"),
        stop_curve=params.get("stop_curve"),
    )
