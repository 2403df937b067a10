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
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

import crossknn.ce
from crossknn.ce.folders import model_record
from crossknn.core import ItemFeatures
from crossknn.corpus.build_key import build_key, up_to_date
from crossknn.corpus.pseudo import auto_pseudo_queries, pseudo_queries
from crossknn.corpus.work import encode_resumable, fresh_work_dir, model_fingerprint
from crossknn.corpus_folder import CORPUS_KIND, ITEMS_FILE, CorpusIndex, open_index
from crossknn.data import Corpus
from crossknn.fileio import (
    atomic_write_bytes,
    fingerprint,
    folder_lock,
    sha256_array,
    sha256_bytes,
    sha256_texts,
)
from crossknn.index.auto import (
    DEFAULT_INDEX_MINUTES,
    build_corpus_auto,
    default_index_rows,
    pseudo_query_count,
)
from crossknn.index.cur import score_dense
from crossknn.index.files import save_index, update_params
from crossknn.jobs import JobOptions
from crossknn.metadata import PARAMS_KEY as METADATA_KEY
from crossknn.metadata import ItemMetadata
from crossknn.score_map import ScoreMap
from crossknn.search.round_index import default_round_index, round_index_arrays, round_widths_meta
from crossknn.searcher import Searcher
from crossknn.topk import top_k_rows

__all__ = [
    "CORPUS_KIND",
    "CorpusIndex",
    "build_corpus_index",
    "corpus_build_key",
    "open_index",
]

TUNE_BUDGET = 100  # CE calls per query of the exact rounds --tune-rounds records


def _items_jsonl(corpus: Corpus) -> bytes:
    lines = [
        json.dumps({"id": i, "text": t}, ensure_ascii=False)
        for i, t in zip(corpus.ids, corpus.texts, strict=False)
    ]
    return ("\n".join(lines) + "\n").encode("utf-8")


def _calibrate(
    ce,
    de,
    V: np.ndarray,
    queries: list[str],
    *,
    items_per_query: int,
    seed: int,
    progress: bool = False,
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
    ce_scores: list[np.ndarray] = []
    total = int(sum(len(i) for i in items))
    with tqdm(total=total, desc="calibrate (CE)", unit="pair", disable=not progress) as bar:
        for lo in range(0, len(queries), 4):
            ce_scores += ce.score_batch(list(queries[lo : lo + 4]), items[lo : lo + 4])
            bar.update(sum(len(i) for i in items[lo : lo + 4]))
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
    chunk: int = 1024,
    round_index: str = "auto",
    index_calls: int | str | None = "default",
    tune_rounds: int = 0,
    index_minutes: float | None = None,
    force: bool = False,
) -> CorpusIndex:
    """Encode ``corpus`` with the DE and spend a small CE budget on (pseudo) train queries.

    - always: ``de_items`` (N x d) and the CE->DE score normalization (alpha, beta) fitted on
      ``train_queries`` (or ``calibration_queries`` pseudo-queries made from item texts), each
      scored against ``calibration_items`` items;
    - ``cur=True`` (needs ``train_queries``): the dense rows ``R`` = CE(train queries x all items)
      for ADACUR/ANNCUR, through a resumable sharded job;
    - ``tune_rounds=Q`` with a FAISS round index: its width per round step, tuned on the exact
      rounds of the first Q train (or pseudo-) queries (100 CE calls each; see
      :meth:`crossknn.Searcher.tune_round_widths`), stored in ``params.round_index``;
    - ``index_calls=C``: ``auto``'s index (:mod:`crossknn.index.auto`) from at most C CE calls;
      ``"default"``: C by the default rule (:func:`crossknn.index.auto.default_index_rows`, the
      CE's speed measured on the calibration batches, capped at ``index_minutes``; no auto index
      when it gives no row; the default, as ``crossknn build`` without ``--index-calls``); None
      or 0: no auto index.

    Work in progress lives in ``OUT_DIR/.build`` and is resumed after an interruption (DE
    vectors in chunks of ``chunk`` items); each piece of it is keyed by a fingerprint of its
    inputs (items, models, settings), so a rerun on a changed corpus discards it (one line on
    stderr) instead of reusing it. The new index is written beside an old one
    (``OUT_DIR/.build/stage``) and moved in by renames at the end, ``index.json`` last: until
    then the old index stays whole and usable, whatever fails (a full disk). A build holds
    ``OUT_DIR/.lock`` (with its PID): a second build into the same folder fails at once; a lock
    left by a killed build is taken over (one line on stderr).

    A folder that holds this build's index already (the same items, models and settings:
    :mod:`crossknn.corpus.build_key`; not changed since by refine, add or remove) is up to date:
    it is returned as it is, unless ``force``.
    """
    if len(corpus) == 0:
        raise ValueError("the corpus is empty: nothing to index")
    if cur and not train_queries:
        raise ValueError("a CUR index (--cur) needs train queries (--train-queries FILE)")
    if tune_rounds:
        kind = default_round_index(len(corpus)) if round_index == "auto" else round_index
        if kind == "exact":
            raise ValueError(
                f"--tune-rounds tunes a FAISS round index, but this build makes none (round "
                f"index {round_index!r} for {len(corpus)} items): use --round-index ivf|hnsw"
            )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    # looked up on the package at call time (one place to substitute the default)
    de = de if de is not None else crossknn.ce.default_dual_encoder(show_progress_bar=False)
    ce = ce if ce is not None else crossknn.ce.default_cross_encoder()
    key = corpus_build_key(
        corpus,
        ce,
        de,
        train_queries=train_queries,
        cur=cur,
        calibration_queries=calibration_queries,
        calibration_items=calibration_items,
        seed=seed,
        round_index=round_index,
        index_calls=index_calls,
        tune_rounds=tune_rounds,
        index_minutes=index_minutes,
    )
    with folder_lock(out / ".lock", what=f"index folder {out}"):
        if not force and up_to_date(out, key):
            return open_index(out)
        _build_locked(
            corpus,
            out,
            ce=ce,
            de=de,
            train_queries=train_queries,
            cur=cur,
            calibration_queries=calibration_queries,
            calibration_items=calibration_items,
            seed=seed,
            progress=progress,
            chunk=chunk,
            round_index=round_index,
            index_calls=index_calls,
            index_minutes=index_minutes,
            build_key=key,
        )
        if tune_rounds:
            _tune_round_widths(out, ce, de, train_queries, tune_rounds, seed, progress)
    return open_index(out)


def item_metadata(corpus: Corpus) -> ItemMetadata:
    """The metadata columns of a corpus's items (none when its items have no other fields)."""
    if corpus.metadata is None:
        return ItemMetadata({}, len(corpus))
    return ItemMetadata.from_records(corpus.metadata, ids=corpus.ids)


def corpus_build_key(corpus: Corpus, ce, de, *, train_queries=None, **settings) -> str:
    """The key of :func:`build_corpus_index` with these arguments (``settings``: its keyword
    arguments but ``progress`` and ``chunk``, which change nothing it makes); a folder whose
    index has it is up to date (:func:`crossknn.corpus.build_key.up_to_date`)."""
    defaults = {
        "cur": False,
        "calibration_queries": 16,
        "calibration_items": 32,
        "seed": 0,
        "round_index": "auto",
        "index_calls": "default",
        "tune_rounds": 0,
        "index_minutes": None,
    }
    unknown = set(settings) - set(defaults)
    if unknown:
        raise TypeError(f"unknown build settings {sorted(unknown)}")
    # the items: ids, texts and their other fields (the metadata filters read)
    items = sha256_bytes(_items_jsonl(corpus))
    if corpus.metadata is not None:
        arrays, spec = item_metadata(corpus).to_index()
        columns = {name: sha256_array(arr) for name, arr in sorted(arrays.items())}
        items = fingerprint([items, spec, columns])
    return build_key(items, ce, de, train_queries=train_queries, settings={**defaults, **settings})


def _tune_round_widths(out, ce, de, train_queries, n, seed, progress):
    """Per-round widths of the built index's FAISS round index, tuned on the exact rounds of
    ``n`` train (or pseudo-) queries with the default search settings, written into
    ``params.round_index`` (the CE calls added to the index's count)."""
    index = open_index(out)
    meta = dict(index.params["round_index"])
    corpus = index.corpus
    queries = list(train_queries or pseudo_queries(corpus, n, seed=seed))[:n]
    searcher = Searcher(index, ce=ce, de=de)
    budget = min(TUNE_BUDGET, len(corpus))
    schedule, calls = searcher.tune_round_widths(
        queries, k=min(10, budget), budget=budget, progress=progress
    )
    meta["round_widths"] = round_widths_meta(schedule)
    meta["tuned_on"] = {
        "queries": len(queries),
        "from": "train queries" if train_queries else "pseudo-queries from item texts",
        "method": searcher.method,
        "rounds": searcher.plan_info(budget=budget)["rounds"],
        "budget": budget,
    }
    update_params(out, {**index.params, "round_index": meta}, ce_calls_added=calls)


def _build_locked(
    corpus: Corpus,
    out: Path,
    *,
    ce,
    de,
    train_queries,
    cur: bool,
    calibration_queries: int,
    calibration_items: int,
    seed: int,
    progress: bool,
    chunk: int,
    round_index: str = "auto",
    index_calls: int | str | None = None,
    index_minutes: float | None = None,
    build_key: str | None = None,
) -> None:
    # the new index is written beside the old one (work/stage) and moved in at the end: the old
    # index stays whole and usable until then, whatever fails on the way (a full disk ...)
    work = out / ".build"
    stage = work / "stage"
    if stage.exists():
        shutil.rmtree(stage)  # a half-written index of an interrupted build
    stage.mkdir(parents=True)
    items_bytes = _items_jsonl(corpus)
    # the items' other fields (crossknn.metadata), checked before any model runs
    meta_arrays, meta_params = item_metadata(corpus).to_index()
    atomic_write_bytes(stage / ITEMS_FILE, items_bytes)
    V = encode_resumable(
        de, list(corpus.texts), work / "de", chunk=chunk, progress=progress, ids=corpus.ids
    )
    ce.set_items(list(corpus.texts))

    cal = (
        list(train_queries)
        if train_queries
        else pseudo_queries(corpus, calibration_queries, seed=seed)
    )
    t_cal = time.perf_counter()
    smap, ce_calls = _calibrate(
        ce, de, V, cal, items_per_query=calibration_items, seed=seed, progress=progress
    )
    rule = None
    if index_calls == "default":  # C from the CE's speed on the calibration batches
        rate = ce_calls / max(time.perf_counter() - t_cal, 1e-9)
        minutes = DEFAULT_INDEX_MINUTES if index_minutes is None else float(index_minutes)
        n_train = len(train_queries) if train_queries else None
        rows = default_index_rows(len(corpus), rate, n_train=n_train, minutes=minutes)
        rule = {"rows": rows, "pairs_per_s": round(rate, 1), "minutes": minutes}
        index_calls = rows * len(corpus) if rows else None
    elif isinstance(index_calls, str):
        raise ValueError(f"index_calls must be an int, 'default' or None; got {index_calls!r}")
    elif index_calls == 0:  # as --index-calls 0: no auto index
        index_calls = None
    arrays: dict[str, np.ndarray] = {"de_items": V}
    auto = None
    if index_calls is not None:  # the default method's index (crossknn.index.auto)
        qs = train_queries or auto_pseudo_queries(
            corpus, pseudo_query_count(index_calls, len(corpus), calibration_queries), seed=seed
        )
        auto_key = {
            "what": "auto_rows",
            "ce": model_fingerprint(ce),
            "items": sha256_bytes(items_bytes),
        }
        fresh_work_dir(work / "auto", auto_key, "auto index rows")
        a_arrays, auto, a_calls = build_corpus_auto(
            ce,
            de,
            V,
            list(qs),
            index_calls=index_calls,
            seed=seed,
            progress=progress,
            work=work / "auto",
        )
        arrays.update(a_arrays)
        ce_calls += a_calls
        if rule is not None:
            auto["default_rule"] = rule
    if cur:
        cur_key = {
            "what": "cur_rows",
            "ce": model_fingerprint(ce),
            "items_sha256": sha256_bytes(items_bytes),
            "train_queries_sha256": sha256_texts(train_queries),
        }
        fresh_work_dir(work / "cur", cur_key, "CUR rows")
        R, _ = score_dense(
            ce,
            list(train_queries),
            work / "cur" / "job",
            options=JobOptions(progress=progress),
            extra={"items_sha256": cur_key["items_sha256"]},
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
        **({"auto": auto} if auto is not None else {}),
    }
    # the rounds' MIPS index over de_items (crossknn.search.round_index; none for 'exact')

    rarrays, params["round_index"] = round_index_arrays(
        ItemFeatures(V), round_index, progress=progress
    )
    arrays.update(rarrays)
    arrays.update(meta_arrays)
    if meta_params is not None:
        params[METADATA_KEY] = meta_params
    info = {
        "items_file": ITEMS_FILE,
        "items_sha256": sha256_bytes(items_bytes),
        "source": corpus.source,
        # what search reopens by default: identity, hash, kind, precision, where found
        "models": {"ce": model_record(ce), "de": model_record(de)},
        # what it was built from (crossknn.corpus.build_key): a rebuild of the same is skipped
        "build_key": build_key,
    }
    # arrays of an earlier build that this one does not have must not linger beside the new index
    save_index(
        out,
        CORPUS_KIND,
        arrays,
        ce=ce,
        de=de,
        params=params,
        ce_calls=ce_calls,
        info=info,
        stage=stage,
        stale=(
            "de_items",
            "R",
            "round_index",
            "auto_rows",
            "auto_row_vectors",
            "auto_query_dirs",
            "auto_item_cov",
            "auto_prior_vectors",
            "auto_prior_deltas",
        ),
    )
    shutil.rmtree(work, ignore_errors=True)
