"""``crossknn refine``: re-fit ``auto``'s index on the queries a service answered (the query log).

A corpus index built without train queries has ``auto`` rows of pseudo-queries cut from item
texts; the queries a service answers come from the real query distribution, and each paid for B
exact CE scores. :func:`refine_index` spends a budget of CE calls on complete CE rows of logged
queries, chosen to cover the logged distribution as the build chooses its rows (k-means medoids
of their DE vectors, :func:`crossknn.search.auto.choose_rows`), re-fits ``auto`` with the build's
own code (:func:`crossknn.index.auto.build_corpus_auto`: its cross-validation and learned prior
now on real rows), and commits a new index version beside the old one
(:mod:`crossknn.corpus.versions`).

- The log's paid-for entries are exact CE scores of the same CE: a row or partial row the refit
  reads is taken from the log where the log has the entry, and only the rest goes to the CE
  (``ce_calls`` counts the CE calls made; ``index_calls`` the entries read, as the build does).
- Rows of real queries replace pseudo rows, never the other way round: with fewer distinct
  logged queries than rows, every logged query gets a row and the index keeps pseudo rows (their
  stored scores, no CE call) for the rest; a refit that would end with fewer real rows than the
  index has is refused.
- The budget: ``index_calls`` (entries, as ``build --index-calls``), else ``index_minutes`` of CE
  time at the speed measured on a small batch, else the budget the current index was built with
  (at least its complete rows over today's items, after an ``add``).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from crossknn.corpus.query_log import LoggedQuery, read_log
from crossknn.corpus.versions import (
    WORK_DIR,
    already_applied,
    clean_work,
    index_version,
    write_version,
)
from crossknn.corpus.work import fresh_work_dir, model_fingerprint
from crossknn.corpus_folder import open_index
from crossknn.fileio import fingerprint, folder_lock
from crossknn.identity import model_identity
from crossknn.index.auto import (
    AUTO_ARRAY,
    AUTO_ITEM_COV,
    AUTO_PRIOR_DELTAS,
    AUTO_PRIOR_VECTORS,
    AUTO_QUERY_DIRS,
    AUTO_ROW_VECTORS,
    build_corpus_auto,
    default_index_rows,
)

__all__ = ["AUTO_NAMES", "RefineResult", "refine_index", "real_rows_of"]

AUTO_NAMES = (
    AUTO_ARRAY,
    AUTO_ROW_VECTORS,
    AUTO_QUERY_DIRS,
    AUTO_ITEM_COV,
    AUTO_PRIOR_VECTORS,
    AUTO_PRIOR_DELTAS,
)


class LoggedCE:
    """The CE over the corpus items, with the entries the log (or a stored row) already holds
    served from there: only the rest goes to the CE (counted in ``ce_calls``)."""

    def __init__(self, ce, logged: dict[str, dict[int, float]], stored: dict[str, np.ndarray]):
        self.ce, self.logged, self.stored = ce, logged, stored
        self.ce_calls = 0
        self.from_log = 0

    @property
    def n_items(self) -> int:
        return int(self.ce.n_items)

    def set_items(self, texts) -> None:
        self.ce.set_items(texts)

    def score(self, query, items):
        return self.score_batch([query], [items])[0]

    def score_batch(self, queries: Sequence[str], items: Sequence) -> list[np.ndarray]:
        out: list[np.ndarray] = []
        todo_q, todo_i, where = [], [], []
        for q, it in zip(queries, items, strict=True):
            it = np.asarray(it, np.int64).ravel()
            row = self.stored.get(q)
            if row is not None:
                out.append(np.asarray(row, np.float32)[it])
                continue
            known = self.logged.get(q, {})
            res = np.empty(it.size, np.float32)
            need = []
            for j, i in enumerate(it.tolist()):
                v = known.get(i)
                if v is None:
                    need.append(j)
                else:
                    res[j] = v
            self.from_log += it.size - len(need)
            if need:
                todo_q.append(q)
                todo_i.append(it[need])
                where.append((len(out), np.asarray(need, np.int64)))
            out.append(res)
        if todo_q:
            scores = self.ce.score_batch(todo_q, todo_i)
            for (k, need), s in zip(where, scores, strict=True):
                out[k][need] = np.asarray(s, np.float32).ravel()
                self.ce_calls += need.size
        return out


class RefineResult:
    def __init__(self, **kw) -> None:
        self.__dict__.update(kw)

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def real_rows_of(params: dict) -> int:
    """Rows of real queries in an index's auto index (train queries or logged ones)."""
    auto = params.get("auto") or {}
    if "real_rows" in auto:
        return int(auto["real_rows"])
    return int(auto.get("rows", 0)) if params.get("n_train_queries") else 0


def _distinct(records: list[LoggedQuery]) -> list[LoggedQuery]:
    seen: dict[str, LoggedQuery] = {}
    for r in records:
        if r.query not in seen:
            seen[r.query] = r
    return list(seen.values())


def _measured_rate(ce, n_items: int, text: str) -> float:
    """CE pairs per second on one small batch (for ``index_minutes``)."""
    it = np.arange(min(n_items, 64), dtype=np.int64)
    t = time.perf_counter()
    ce.score_batch([text], [it])
    return it.size / max(time.perf_counter() - t, 1e-9)


def refine_index(
    path,
    log: str | Path | list[LoggedQuery],
    *,
    ce,
    de,
    index_calls: int | None = None,
    index_minutes: float | None = None,
    seed: int = 0,
    progress: bool = False,
    quiet: bool = False,
) -> RefineResult:
    """Refits ``auto``'s index of the corpus index at ``path`` on the logged queries (see the
    module docstring) and commits a new version; returns what it did."""
    path = Path(path)
    records = log if isinstance(log, list) else read_log(log, quiet=quiet)
    with folder_lock(path / ".lock", what=f"index folder {path}"):
        index = open_index(path)
        ce_id = model_identity(ce)
        index.check_models(ce=ce, de=de)
        N = len(index)
        auto = index.params.get("auto") or {}
        pos = {i: j for j, i in enumerate(index.corpus.ids)}
        recs = _distinct(records)
        if len(recs) < 2:
            raise ValueError(
                f"refine needs at least 2 distinct logged queries; the log has {len(recs)}"
            )
        rate = None
        if index_calls is None and index_minutes is not None:
            rate = _measured_rate(ce_set(ce, index), N, recs[0].query)
            index_calls = int(index_minutes * 60.0 * rate // N) * N
        if index_calls is None:  # the index's own budget: its complete rows over today's items
            rows = int(auto.get("rows") or 0) or default_index_rows(N, None)
            # and at least the 2 complete rows refine needs (a default build of < 200 items has 1)
            index_calls = max(int(auto.get("index_calls_limit") or 0), rows * N, 2 * N)
        index_calls = int(index_calls)
        if index_calls < 2 * N:
            raise ValueError(
                f"--index-calls {index_calls} buys fewer than 2 complete rows of {N} items; "
                f"refine needs at least {2 * N}"
            )
        key = fingerprint(
            {
                "op": "refine",
                "queries": [r.id for r in recs],
                "index_calls": index_calls,
                "seed": int(seed),
            }
        )
        done = already_applied(index, key)
        if done is not None:
            return RefineResult(version=done, already=True, index_calls=index_calls)
        # the log's paid-for entries of this CE, by query text and item position
        logged: dict[str, dict[int, float]] = {}
        for r in recs:
            if r.ce_model_hash is not None and r.ce_model_hash != ce_id["model_hash"]:
                continue
            got = logged.setdefault(r.query, {})
            for i, s in zip(r.items, r.scores.tolist(), strict=True):
                if i in pos:
                    got[pos[i]] = float(s)
        real = [r.query for r in recs]
        m_target = index_calls // N
        stored: dict[str, np.ndarray] = {}
        fill: list[str] = []
        if len(real) < m_target:  # every logged query a row; pseudo rows kept for the rest
            old_q = [q for q in auto.get("row_queries") or [] if q not in set(real)]
            rows = index.arrays.get(AUTO_ARRAY)
            for j, q in enumerate(auto.get("row_queries") or []):
                if q in old_q and rows is not None and j < rows.shape[0]:
                    stored[q] = np.asarray(rows[j], np.float32)
            fill = [q for q in old_q if q in stored][: m_target - len(real)]
        queries = real + fill
        scorer = LoggedCE(ce, logged, stored)
        scorer.set_items(list(index.corpus.texts))
        work = path / WORK_DIR / "refine"
        fresh_work_dir(
            work,
            {
                "what": "refine rows",
                "ce": model_fingerprint(ce),
                "items": index.info.get("items_sha256"),
            },
            "refine rows",
        )
        V = np.asarray(index["de_items"], np.float32)
        t0 = time.perf_counter()
        arrays, new_auto, calls = build_corpus_auto(
            scorer, de, V, queries, index_calls=index_calls, seed=seed, progress=progress, work=work
        )
        seconds = time.perf_counter() - t0
        n_real = sum(q not in stored for q in new_auto["row_queries"])
        old_real = real_rows_of(index.params)
        if n_real < old_real:
            raise ValueError(
                f"refine would leave {n_real} rows of real queries where the index has "
                f"{old_real}: rows of real queries are never replaced by pseudo rows (give a "
                "larger --index-calls or log more queries)"
            )
        new_auto.update(
            {
                "row_source": "query log",
                "real_rows": n_real,
                "logged_queries": len(real),
                "log_entries_used": int(scorer.from_log),
            }
        )
        if auto.get("default_rule"):
            new_auto["default_rule"] = auto["default_rule"]
        changed = {name: arrays.get(name) for name in AUTO_NAMES}
        changed = {k: v for k, v in changed.items() if v is not None or k in index.arrays}
        op = {
            "op": "refine",
            "key": key,
            "logged_queries": len(real),
            "rows": int(new_auto["rows"]),
            "real_rows": n_real,
            "index_calls": int(calls),
            "ce_calls": int(scorer.ce_calls),
            "log_entries_used": int(scorer.from_log),
            "seconds": round(seconds, 2),
        }
        version = write_version(
            index,
            changed=changed,
            params={**index.params, "auto": new_auto},
            op=op,
            ce_calls_added=scorer.ce_calls,
        )
        clean_work(path, "refine")
        if not quiet and rate is not None:
            print(f"crossknn refine: CE at {rate:,.0f} pairs/s", file=sys.stderr)
        return RefineResult(
            version=version,
            already=False,
            previous=index_version(index),
            index_calls=int(calls),
            ce_calls=int(scorer.ce_calls),
            log_entries_used=int(scorer.from_log),
            rows=int(new_auto["rows"]),
            real_rows=n_real,
            logged_queries=len(real),
            seconds=seconds,
        )


def ce_set(ce, index):
    ce.set_items(list(index.corpus.texts))
    return ce
