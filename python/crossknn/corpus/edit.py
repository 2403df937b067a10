"""``crossknn add`` and ``crossknn remove``: new and removed items without a rebuild.

:func:`add_items` gives new items their DE vectors, their entries in every stored ``auto`` row
(one CE call per row per item), their place in the round index (FAISS ``add``; nothing to do for
exact rounds) and the item covariance of the row prior, after the corpus checks of ``build``
(duplicate ids and empty texts refused). :func:`remove_items` marks items removed (the
``tombstones`` array, one flag per item: a search never returns them,
:class:`crossknn.searcher.Searcher`); when the removed share reaches ``compact_at`` (default
10%) the index is compacted: the removed items' vectors, row entries, texts and flags are
dropped and the round index is rebuilt. Both commit a new index version
(:mod:`crossknn.corpus.versions`) under the folder's lock; their CE and DE work is kept in the
folder's work area, so a rerun after a kill resumes it, and a rerun after the commit does nothing.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import numpy as np

from crossknn.core import ItemFeatures
from crossknn.corpus.versions import (
    WORK_DIR,
    already_applied,
    clean_work,
    collect_superseded,
    index_lock,
    index_version,
    items_jsonl,
    write_version,
)
from crossknn.corpus.work import encode_resumable, fresh_work_dir, model_fingerprint
from crossknn.corpus_folder import open_index
from crossknn.data import Corpus
from crossknn.fileio import atomic_save_npy, fingerprint, sha256_texts
from crossknn.index.auto import AUTO_ARRAY, AUTO_ITEM_COV
from crossknn.metadata import PARAMS_KEY as METADATA_KEY
from crossknn.metadata import ItemMetadata
from crossknn.search.auto import item_covariance
from crossknn.search.round_index import (
    ARRAY_NAME,
    faiss_from_array,
    faiss_to_array,
    round_index_arrays,
)
from crossknn.text import is_blank

__all__ = ["COMPACT_AT", "REMOVED_IDS", "TOMBSTONES", "add_items", "id_hashes", "remove_items"]

TOMBSTONES = "tombstones"
# ids of items a compaction dropped (sorted uint64 hashes of the ids, id_hashes): removing one
# of them again is a no-op, as removing a tombstoned one is
REMOVED_IDS = "removed_ids"
COMPACT_AT = 0.10  # removed share of the items at which remove compacts the index


def _check_new(index, items: Corpus) -> None:
    """The corpus checks of ``build``, and no id the index already has (live)."""
    if len(items) == 0:
        raise ValueError("no items to add: the file has none")
    seen: set[str] = set()
    for i, (iid, text) in enumerate(zip(items.ids, items.texts, strict=True)):
        if not isinstance(text, str) or is_blank(text):
            raise ValueError(
                f"item {iid!r} (line {i + 1}) has an empty text (only whitespace, invisible "
                "characters or combining marks); expected text"
            )
        if iid in seen:
            raise ValueError(f"item id {iid!r} appears twice in the items to add; ids are unique")
        seen.add(iid)
    dead = _dead(index)
    live = {iid for j, iid in enumerate(index.corpus.ids) if not dead[j]}
    dup = [iid for iid in items.ids if iid in live]
    if dup:
        raise ValueError(
            f"{len(dup)} item id(s) to add are already in the index (first {dup[0]!r}); "
            "remove them first (crossknn remove) or give new ids"
        )


def _metadata_changes(index, meta: ItemMetadata, changed: dict, params: dict) -> None:
    """Every metadata array of ``meta`` into ``changed`` (the index's old ones dropped) and its
    fields into ``params``."""
    for name in ItemMetadata.array_names(index.arrays):
        changed[name] = None
    arrays, spec = meta.to_index()
    changed.update(arrays)
    if spec is None:
        params.pop(METADATA_KEY, None)
    else:
        params[METADATA_KEY] = spec


def _dead(index) -> np.ndarray:
    t = index.arrays.get(TOMBSTONES)
    return np.zeros(len(index), bool) if t is None else np.asarray(t, bool)


def id_hashes(ids) -> np.ndarray:
    """64-bit hashes of item ids (the first 8 bytes of each id's sha256), as uint64."""
    out = np.empty(len(ids), np.uint64)
    for j, i in enumerate(ids):
        out[j] = int.from_bytes(hashlib.sha256(str(i).encode("utf-8")).digest()[:8], "little")
    return out


def _compacted_away(index, ids) -> np.ndarray:
    """Which of ``ids`` a compaction dropped (removed before, and not added again since)."""
    gone = index.arrays.get(REMOVED_IDS)
    if gone is None or not len(ids) or not len(gone):
        return np.zeros(len(ids), bool)
    return np.isin(id_hashes(ids), np.asarray(gone, np.uint64))


def _row_queries(index) -> list[str]:
    auto = index.params.get("auto")
    if auto is None or AUTO_ARRAY not in index.arrays:
        return []
    qs = auto.get("row_queries")
    rows = index.arrays[AUTO_ARRAY]
    if qs is None or len(qs) != rows.shape[0]:
        raise ValueError(
            f"index {index.path} does not record the queries of its {rows.shape[0]} auto rows "
            "(built before crossknn add existed): rebuild it once with crossknn build"
        )
    return list(qs)


def add_items(path, items: Corpus, *, ce, de, progress: bool = False) -> dict:
    """Adds ``items`` to the corpus index at ``path``; returns what it did (see the module
    docstring)."""
    path = Path(path)
    with index_lock(path):
        index = open_index(path)
        index.check_models(ce=ce, de=de)
        key = fingerprint({"op": "add", "ids": list(items.ids), "texts": sha256_texts(items.texts)})
        done = already_applied(index, key)
        if done is not None:
            # a run killed after its commit, before its clean-up, left its work behind
            clean_work(path, "add")
            collect_superseded(path)
            return {"version": done, "already": True, "added": len(items)}
        _check_new(index, items)
        item_meta = None  # every item's metadata, its kinds checked before any model runs
        if items.metadata is not None or index.metadata.columns:
            # the stored columns kept as they are (kinds and values), the new items' appended
            item_meta = index.metadata.extended(
                list(items.metadata or [None] * len(items)),
                ids=index.corpus.ids,
                new_ids=items.ids,
            )
        if "R" in index.arrays:
            raise ValueError(
                f"index {path} has CUR rows (--cur) of train queries it does not store; "
                "rebuild it with the new items instead"
            )
        t0 = time.perf_counter()
        work = path / WORK_DIR / "add"
        fresh_work_dir(
            work, {"what": "add", "key": key, "ce": model_fingerprint(ce)}, "added items' work"
        )
        texts = list(items.texts)
        V_new = encode_resumable(
            de, texts, work / "de", progress=progress, ids=list(items.ids)
        ).astype(np.float32)
        V = np.concatenate([np.asarray(index["de_items"], np.float32), V_new])
        changed: dict[str, np.ndarray | None] = {"de_items": V}
        rq = _row_queries(index)
        calls = 0
        if rq:
            cols_path = work / "row_entries.npy"
            cols = None
            if cols_path.is_file():
                cols = np.load(cols_path, allow_pickle=False)
                if cols.shape != (len(rq), len(texts)):
                    cols = None
            if cols is None:
                ce.set_items(texts)
                all_new = np.arange(len(texts), dtype=np.int64)
                got = ce.score_batch(rq, [all_new] * len(rq))
                cols = np.stack([np.asarray(s, np.float32) for s in got])
                atomic_save_npy(cols_path, cols)
            calls = int(cols.size)
            changed[AUTO_ARRAY] = np.concatenate(
                [np.asarray(index[AUTO_ARRAY], np.float32), cols], axis=1
            )
        if AUTO_ITEM_COV in index.arrays:
            changed[AUTO_ITEM_COV] = item_covariance(V)
        params = dict(index.params)
        params["n_items"] = int(V.shape[0])
        meta = dict(params.get("round_index") or {"kind": "exact"})
        if meta.get("kind", "exact") != "exact":
            fx = faiss_from_array(index[ARRAY_NAME])
            fx.add(np.ascontiguousarray(V_new))
            changed[ARRAY_NAME] = faiss_to_array(fx)
        if TOMBSTONES in index.arrays:
            changed[TOMBSTONES] = np.concatenate(
                [np.asarray(index[TOMBSTONES], np.uint8), np.zeros(len(texts), np.uint8)]
            )
        ids = list(index.corpus.ids) + list(items.ids)
        all_texts = list(index.corpus.texts) + texts
        if item_meta is not None:
            _metadata_changes(index, item_meta, changed, params)
        seconds = time.perf_counter() - t0
        op = {
            "op": "add",
            "key": key,
            "added": len(items),
            "ce_calls": calls,
            "seconds": round(seconds, 2),
        }
        version = write_version(
            index,
            changed=changed,
            params=params,
            op=op,
            ce_calls_added=calls,
            items=items_jsonl(ids, all_texts),
        )
        clean_work(path, "add")
        return {
            "version": version,
            "already": False,
            "added": len(items),
            "ce_calls": calls,
            "seconds": seconds,
        }


def remove_items(path, ids, *, compact_at: float = COMPACT_AT, progress: bool = False) -> dict:
    """Removes the items ``ids`` from the corpus index at ``path`` (tombstones; compaction when
    the removed share reaches ``compact_at``); returns what it did."""
    path = Path(path)
    ids = [str(i) for i in ids]
    if not ids:
        raise ValueError("no item ids to remove: the file has none")
    if not 0.0 <= compact_at <= 1.0:
        raise ValueError(f"compact_at must be within [0, 1]; got {compact_at}")
    with index_lock(path):
        index = open_index(path)
        key = fingerprint({"op": "remove", "ids": sorted(set(ids))})
        done = already_applied(index, key)
        if done is not None:
            collect_superseded(path)  # what a run killed after its commit left
            return {"version": done, "already": True, "removed": len(set(ids))}
        pos: dict[str, list[int]] = {}
        for j, iid in enumerate(index.corpus.ids):
            pos.setdefault(iid, []).append(j)
        dead = _dead(index).copy()
        live = [i for i in dict.fromkeys(ids) if i in pos and not dead[pos[i]].all()]
        # removed already: tombstoned (every position of the id), or dropped by a compaction
        absent = [i for i in dict.fromkeys(ids) if i not in pos]
        gone = _compacted_away(index, absent)
        unknown = [i for i, g in zip(absent, gone, strict=True) if not g]
        if unknown:
            raise ValueError(
                f"{len(unknown)} id(s) to remove are not in the index (first {unknown[0]!r}); "
                "expected ids of its items"
            )
        if not live:  # every id was removed already: nothing to do, no new version
            return {"version": index_version(index), "already": True, "removed": 0}
        ids = live
        for i in ids:
            dead[pos[i]] = True
        if dead.all():
            raise ValueError("removing these ids would leave no item; build a new index instead")
        N = len(index)
        changed: dict[str, np.ndarray | None] = {}
        params = dict(index.params)
        items = None
        compacted = bool(dead.mean() >= compact_at)
        t0 = time.perf_counter()
        if compacted:
            keep = np.flatnonzero(~dead)
            V = np.ascontiguousarray(np.asarray(index["de_items"], np.float32)[keep])
            changed["de_items"] = V
            for name, arr in index.arrays.items():
                if name == "R" or name == AUTO_ARRAY:
                    changed[name] = np.ascontiguousarray(np.asarray(arr)[:, keep])
            if AUTO_ITEM_COV in index.arrays:
                changed[AUTO_ITEM_COV] = item_covariance(V)
            kind = (params.get("round_index") or {}).get("kind", "exact")
            rarrays, meta = round_index_arrays(ItemFeatures(V), kind, progress=progress)
            old_meta = params.get("round_index") or {}
            for k in ("round_widths", "tuned_on"):
                if k in old_meta:
                    meta[k] = old_meta[k]
            params["round_index"] = meta
            changed[ARRAY_NAME] = rarrays.get(ARRAY_NAME)
            if changed[ARRAY_NAME] is None and ARRAY_NAME not in index.arrays:
                del changed[ARRAY_NAME]
            if TOMBSTONES in index.arrays:
                changed[TOMBSTONES] = None  # compacted: no removed item is left
            # the ids dropped here (unless a live item keeps the id), for later removes
            kept = {index.corpus.ids[j] for j in keep}
            dropped = [index.corpus.ids[j] for j in np.flatnonzero(dead)]
            old_gone = np.asarray(index.arrays.get(REMOVED_IDS, np.empty(0, np.uint64)))
            new_gone = id_hashes([i for i in dict.fromkeys(dropped) if i not in kept])
            kept_h = id_hashes(sorted(kept))
            gone = np.union1d(old_gone.astype(np.uint64), new_gone)
            changed[REMOVED_IDS] = np.setdiff1d(gone, kept_h).astype(np.uint64)
            params["n_items"] = int(keep.size)
            if index.metadata.columns:
                _metadata_changes(index, index.metadata.take(keep), changed, params)
            items = items_jsonl(
                [index.corpus.ids[j] for j in keep], [index.corpus.texts[j] for j in keep]
            )
        else:
            changed[TOMBSTONES] = dead.astype(np.uint8)
        op = {
            "op": "remove",
            "key": key,
            "removed": len(set(ids)),
            "compacted": compacted,
            "n_items_before": N,
            "seconds": round(time.perf_counter() - t0, 2),
        }
        version = write_version(index, changed=changed, params=params, op=op, items=items)
        return {
            "version": version,
            "already": False,
            "removed": len(set(ids)),
            "compacted": compacted,
            "dead": int(dead.sum()) if not compacted else 0,
        }
