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

from crossknn.corpus.query_log import LoggedQuery, item_text_hash, read_log
from crossknn.corpus.versions import (
    WORK_DIR,
    already_applied,
    clean_work,
    collect_superseded,
    index_lock,
    index_version,
    write_version,
)
from crossknn.corpus.work import fresh_work_dir, model_fingerprint
from crossknn.corpus_folder import open_index
from crossknn.fileio import atomic_write_json, fingerprint, read_json
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
    served from there: only the rest goes to the CE (counted in ``ce_calls``).

    ``spent``: a file that keeps the counts across runs (the work folder's): a refine killed
    and rerun resumes with the rows its first run finished, and ``ce_calls`` counts the CE calls
    of both runs (every call spent, the killed run's included), not only the rerun's."""

    def __init__(
        self,
        ce,
        logged: dict[str, dict[int, float]],
        stored: dict[str, np.ndarray],
        spent: Path | None = None,
    ):
        self.ce, self.logged, self.stored = ce, logged, stored
        self.spent = spent
        before = _read_spent(spent)
        self.ce_calls = before.get("ce_calls", 0)
        self.from_log = before.get("from_log", 0)

    def _save_spent(self) -> None:
        if self.spent is not None:
            atomic_write_json(self.spent, {"ce_calls": self.ce_calls, "from_log": self.from_log})

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
            self._save_spent()  # spent: counted even if this run is killed before its commit
        return out


def _read_spent(path: Path | None) -> dict[str, int]:
    """The counts a killed run of the same refine kept in its work folder (none: zeros)."""
    if path is None:
        return {}
    try:
        doc = read_json(path)
        return {k: int(doc[k]) for k in ("ce_calls", "from_log")}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def logged_entries(
    records: list[LoggedQuery], index, ce_hash: str | None
) -> tuple[dict[str, dict[int, float]], dict[str, int]]:
    """The entries of ``records`` that ``refine`` may use for ``index``, by query text and item
    position, and the counts of those it may not, by reason.

    An entry is used only for the item it scored: its record's item-text hash must be the hash
    of the text at the item's position now (not an item of another index with the same id, not
    a new item added under a removed one's id). Entries of records without item hashes (logs
    written before they had them) cannot be checked and are not used; nor are those of another
    CE's records."""
    where: dict[str, list[int]] = {}
    for j, iid in enumerate(index.corpus.ids):
        where.setdefault(iid, []).append(j)
    texts = index.corpus.texts
    hashes: dict[int, str] = {}

    def text_hash(j: int) -> str:
        if j not in hashes:
            hashes[j] = item_text_hash(texts[j])
        return hashes[j]

    logged: dict[str, dict[int, float]] = {}
    skipped = {"other_ce": 0, "not_in_index": 0, "other_item": 0, "unchecked": 0}
    for r in records:
        if r.ce_model_hash is not None and r.ce_model_hash != ce_hash:
            skipped["other_ce"] += len(r.items)
            continue
        got = logged.setdefault(r.query, {})
        if r.item_hashes is None:
            skipped["unchecked"] += len(r.items)
            continue
        for i, h, s in zip(r.items, r.item_hashes, r.scores.tolist(), strict=True):
            pos = where.get(i)
            if not pos:
                skipped["not_in_index"] += 1
                continue
            match = [j for j in pos if text_hash(j) == h]
            if not match:
                skipped["other_item"] += 1
                continue
            for j in match:
                got[j] = float(s)
    return logged, skipped


def skipped_line(skipped: dict[str, int]) -> str | None:
    """One line on the logged entries ``refine`` did not use (None: it used all)."""
    why = {
        "other_item": "the item they scored is not the item in the index now (another index "
        "with the same ids, or an item replaced since)",
        "unchecked": "their records carry no item hashes (written by an older crossknn)",
        "not_in_index": "their items are not in the index",
        "other_ce": "another CE scored them",
    }
    parts = [f"{n:,} because {why[k]}" for k, n in skipped.items() if n]
    if not parts:
        return None
    total = sum(skipped.values())
    return f"crossknn refine: {total:,} logged entries not used (scored by the CE instead): " + (
        "; ".join(parts)
    )


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
    with index_lock(path):
        index = open_index(path)
        ce_id = model_identity(ce)
        index.check_models(ce=ce, de=de)
        N = len(index)
        auto = index.params.get("auto") or {}
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
            rows = int(auto.get("rows") or 0) or default_index_rows(N)
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
            # a run killed after its commit, before its clean-up, left its work behind
            clean_work(path, "refine")
            collect_superseded(path)
            return RefineResult(version=done, already=True, index_calls=index_calls)
        # the log's paid-for entries of this CE, by query text and item position: each only
        # for the item it scored
        logged, skipped = logged_entries(recs, index, ce_id["model_hash"])
        if not quiet and (line := skipped_line(skipped)):
            print(line, file=sys.stderr)
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
        scorer = LoggedCE(ce, logged, stored, spent=work / "spent.json")
        scorer.set_items(list(index.corpus.texts))
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
            "log_entries_skipped": int(sum(skipped.values())),
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
            log_entries_skipped=skipped,
            rows=int(new_auto["rows"]),
            real_rows=n_real,
            logged_queries=len(real),
            seconds=seconds,
        )


def ce_set(ce, index):
    ce.set_items(list(index.corpus.texts))
    return ce
