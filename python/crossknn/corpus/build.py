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
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

import crossknn.ce
from crossknn.ce.folders import model_record
from crossknn.core import ItemFeatures
from crossknn.corpus.build_key import build_key, up_to_date
from crossknn.corpus.pseudo import auto_pseudo_queries, pseudo_queries
from crossknn.corpus.pseudo_shape import check_example_queries, pseudo_shape
from crossknn.corpus.versions import index_version
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
    AUTO_ARRAY,
    AUTO_ROW_VECTORS,
    ITEMS_PER_ROW,
    MAX_DEFAULT_ROWS,
    build_corpus_auto,
    default_index_budget,
)
from crossknn.index.cur import score_dense
from crossknn.index.files import save_index, update_params
from crossknn.jobs import JobOptions
from crossknn.metadata import PARAMS_KEY as METADATA_KEY
from crossknn.metadata import ItemMetadata
from crossknn.score_map import ScoreMap
from crossknn.search.graph import graph_arrays
from crossknn.search.round_index import default_round_index, round_index_arrays, round_widths_meta
from crossknn.searcher import Searcher
from crossknn.topk import top_k_rows

__all__ = [
    "CORPUS_KIND",
    "CorpusIndex",
    "build_corpus_index",
    "corpus_build_key",
    "living_index",
    "open_index",
    "refuse_living_index",
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
    m = min(items_per_query, V.shape[0])
    Q = np.asarray(de.encode(queries), np.float32)
    rng = np.random.default_rng(seed)
    items, de_scores = [], []
    for qv in Q:
        s = V @ qv
        it = _calibration_items(s, m, rng)
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


def _calibration_items(s: np.ndarray, m: int, rng: np.random.Generator) -> np.ndarray:
    """The calibration items of one query: its DE-top ``m // 2`` items (DE scores ``s``) and a
    seeded random rest, ``m`` in all."""
    n = s.shape[0]
    top = top_k_rows(s, m // 2)[0]
    rest = np.setdiff1d(np.arange(n), top)
    rand = rng.choice(rest, size=min(m - top.size, rest.size), replace=False)
    return np.concatenate([top, rand]).astype(np.int64)


def _calibrate_from_rows(
    V: np.ndarray,
    rows: np.ndarray,
    row_vectors: np.ndarray,
    *,
    queries: int,
    items_per_query: int,
    seed: int,
) -> tuple[ScoreMap, int]:
    """The CE score map fitted on pairs read from ``rows`` (complete CE rows already paid for by
    the auto index) instead of new CE calls: ``queries x items_per_query`` pairs (the DE-top half
    and a random half of each row's items, as :func:`_calibrate` takes them), spread over the m
    rows (``items_per_query x ceil(queries / m)`` pairs a row, at most N). Returns the map and
    the pairs it was fitted on (no CE call)."""
    m, n = rows.shape
    per_row = min(n, int(items_per_query) * -(-int(queries) // m))
    rng = np.random.default_rng(seed)
    ce_s, de_s = [], []
    for row, v in zip(rows, np.asarray(row_vectors, np.float32), strict=True):
        s = V @ v
        it = _calibration_items(s, per_row, rng)
        ce_s.append(np.asarray(row, np.float64)[it])
        de_s.append(s[it])
    return ScoreMap.fit(np.concatenate(ce_s), np.concatenate(de_s)), m * per_row


def _index_budget(
    index_calls, n: int, *, n_train: int | None, calibration_queries: int, calibration_items: int
) -> dict:
    """The stated index budget of a build: ``{"index_calls": C, "rule": ..., "auto": whether
    an auto index is built}``; every CE call of the calibration and the auto rows is inside C."""
    if index_calls == "default":
        C, m = default_index_budget(
            n,
            n_train=n_train,
            calibration_queries=calibration_queries,
            calibration_items=calibration_items,
        )
        rule = (
            f"default: {m} complete rows (one per {ITEMS_PER_ROW} items, at most "
            f"{MAX_DEFAULT_ROWS}) x {n} items"
            if m
            else f"default: the calibration's pairs alone (fewer than {ITEMS_PER_ROW} items)"
        )
        return {"index_calls": C, "rule": rule, "auto": m > 0}
    if index_calls is None:  # no auto index: the calibration's pairs
        q = calibration_queries if n_train is None else min(calibration_queries, n_train)
        C = int(q) * min(int(calibration_items), n)
        return {"index_calls": C, "rule": "no auto index: the calibration's pairs", "auto": False}
    if isinstance(index_calls, bool) or not isinstance(index_calls, (int, np.integer)):
        raise ValueError(f"index_calls must be an int, 'default' or None; got {index_calls!r}")
    if index_calls < 0:
        raise ValueError(f"index_calls must be >= 0; got {index_calls}")
    return {"index_calls": int(index_calls), "rule": "--index-calls", "auto": index_calls > 0}


def _calibrate_within(
    ce, de, V, corpus, train_queries, *, left, queries, items, seed, progress
) -> tuple[ScoreMap | None, dict]:
    """The score map from new CE calls, at most ``left`` of them (what the index budget has
    left): ``q x m`` pairs, m = min(items, N, left), q = min(queries, train queries, left // m)
    queries (a seeded sample of the train queries, else pseudo-queries from item texts); no
    map (AXN then uses the CE scores as they are) when fewer than 2 pairs fit."""
    m = min(int(items), V.shape[0], max(int(left), 0))
    n_src = len(train_queries) if train_queries else int(queries)
    q = min(int(queries), n_src, int(left) // m) if m else 0
    what = "train queries" if train_queries else "pseudo-queries from item texts"
    if q * m < 2:
        return None, {
            "from": f"none (no CE call left for it: {max(int(left), 0)})",
            "queries": 0,
            "pairs": 0,
        }
    if train_queries:
        rng = np.random.default_rng([int(seed), 31])
        picks = np.sort(rng.choice(len(train_queries), q, replace=False))
        cal = [train_queries[int(i)] for i in picks]
    else:
        cal = pseudo_queries(corpus, q, seed=seed)
    smap, calls = _calibrate(ce, de, V, cal, items_per_query=m, seed=seed, progress=progress)
    return smap, {"from": what, "queries": len(cal), "pairs": int(calls)}


def build_corpus_index(
    corpus: Corpus,
    out_dir: str | os.PathLike,
    *,
    ce=None,
    de=None,
    train_queries: Sequence[str] | None = None,
    example_queries: Sequence[str] | None = None,
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
    auto_options: Mapping[str, Any] | None = None,
    force: bool = False,
) -> CorpusIndex:
    """Encode ``corpus`` with the DE and spend a small CE budget on (pseudo) train queries.

    - always: ``de_items`` (N x d) and the CE->DE score normalization (alpha, beta), fitted on
      ``calibration_queries x calibration_items`` pairs (each query's DE-top half and a random
      half): read from ``auto``'s complete rows when the build has some (no CE call), else
      scored for a seeded sample of ``train_queries`` (or pseudo-queries made from item texts)
      inside what the index budget leaves;
    - ``cur=True`` (needs ``train_queries``): the dense rows ``R`` = CE(train queries x all items)
      for ADACUR/ANNCUR, through a resumable sharded job (its stated cost: train queries x N);
    - ``tune_rounds=Q`` with a FAISS round index: its width per round step, tuned on the exact
      rounds of the first Q train (or pseudo-) queries (at most 100 CE calls each; see
      :meth:`crossknn.Searcher.tune_round_widths`), stored in ``params.round_index``;
    - ``index_calls=C``: the index budget, every CE call of the calibration and of ``auto``'s
      index (:mod:`crossknn.index.auto`) inside it (0: no CE call at all, no auto index and no
      score map); ``"default"`` (as ``crossknn build`` without ``--index-calls``): C by the
      default rule, a function of the corpus alone
      (:func:`crossknn.index.auto.default_index_budget`: one complete row per 100 items, at most
      32; no auto index below 100 items); None: no auto index, C = the calibration's pairs;
    - ``index_minutes``: an explicit time cap on ``auto``'s complete rows (no row is started
      that would end after it); ``params.budget.time_cap`` says whether it cut. Without it two
      builds of one corpus with one seed are the same index on any machine.

    ``example_queries`` (without ``train_queries``): a handful of real queries that shape the
    pseudo-queries of auto's rows (:func:`crossknn.corpus.pseudo_shape.pseudo_shape`: topics of
    a few words keep keyword rows, longer queries get a mix of keywords, first words and
    sentences); never scored by the CE, never rows. ``params.pseudo_queries`` says how the
    pseudo-queries were made.

    ``auto_options``: keyword arguments of auto's index build
    (:func:`crossknn.search.auto.build_auto_index`), for experiments.

    ``params.budget`` in ``index.json`` says how the budget was spent: ``index_calls`` (C),
    ``rule``, ``spent`` (calibration, auto rows, auto partial rows, and the stated ``extra`` of
    ``cur`` and ``tune_rounds``) and ``ce_calls`` (their sum, ``index.json``'s ``ce_calls``).

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
    it is returned as it is, unless ``force`` (the work folder that build left, if it was killed
    after moving its index in, is removed: :func:`settle_up_to_date`). A folder that holds a
    living index (a version after 1: refine, add or remove changed it since its build) is
    refused in one line (ValueError) saying what a build would lose, unless ``force``, which
    replaces it with a new version 1 (:func:`refuse_living_index`).
    """
    if len(corpus) == 0:
        raise ValueError("the corpus is empty: nothing to index")
    if cur and not train_queries:
        raise ValueError("a CUR index (--cur) needs train queries (--train-queries FILE)")
    if example_queries is not None:
        if train_queries:
            raise ValueError(
                "example queries shape pseudo-queries, and a build with train queries makes "
                "none (its rows are the train queries): give --train-queries or "
                "--example-queries, not both"
            )
        example_queries = check_example_queries(example_queries)
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
        example_queries=example_queries,
        cur=cur,
        calibration_queries=calibration_queries,
        calibration_items=calibration_items,
        seed=seed,
        round_index=round_index,
        index_calls=index_calls,
        tune_rounds=tune_rounds,
        index_minutes=index_minutes,
        auto_options=dict(auto_options) if auto_options else None,
    )
    with folder_lock(out / ".lock", what=f"index folder {out}"):
        if not force:
            refuse_living_index(out, source=corpus.source, force="force=True (build --force)")
            if _recorded_key(out) == key and up_to_date(out, key):
                _drop_finished_work(out, key)
                return open_index(out)
        _build_locked(
            corpus,
            out,
            ce=ce,
            de=de,
            train_queries=train_queries,
            example_queries=example_queries,
            cur=cur,
            calibration_queries=calibration_queries,
            calibration_items=calibration_items,
            seed=seed,
            progress=progress,
            chunk=chunk,
            round_index=round_index,
            index_calls=index_calls,
            index_minutes=index_minutes,
            auto_options=auto_options,
            build_key=key,
        )
        if tune_rounds:
            _tune_round_widths(out, ce, de, train_queries, tune_rounds, seed, progress)
    return open_index(out)


WORK_KEY = "build_key"  # in OUT_DIR/.build: the key of the build whose work it holds


def _drop_finished_work(out: Path, key: str) -> None:
    """Remove ``out/.build`` when it is the work of the build with ``key`` whose index is in
    place (one killed after its index was moved in, before it removed its work); the work of
    another build (killed on its way, resumable) is kept."""
    work = out / ".build"
    try:
        mine = (work / WORK_KEY).read_text(encoding="utf-8") == key
    except OSError:
        return
    if mine:
        shutil.rmtree(work, ignore_errors=True)


def _info(out: Path) -> dict:
    """``info`` of the index.json in ``out`` as recorded ({} when there is none or it does not
    read: a damaged index is rebuilt)."""
    try:
        doc = json.loads((out / "index.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    info = doc.get("info") if isinstance(doc, dict) else None
    return info if isinstance(info, dict) else {}


def _recorded_key(out: Path) -> str | None:
    return _info(out).get("build_key")


def living_index(out_dir: str | os.PathLike) -> tuple[str, str] | None:
    """What a build into ``out_dir`` would replace that no build makes again: None when the
    folder holds no index, or an index as its build made it (version 1, no history); else its
    changes since its build (``version 8: 2 refines, 3 adds, 2 removes``) and what a build
    would lose (its history, the items added, refine's rows, the removals), in a few words."""
    info = _info(Path(out_dir))
    version = index_version(info)
    hist = [h for h in info.get("history") or [] if isinstance(h, dict)]
    if version == 1 and not hist:
        return None
    ops = {op: [h for h in hist if h.get("op") == op] for op in ("refine", "add", "remove")}
    done = ", ".join(_count(len(hs), op) for op, hs in ops.items() if hs)
    lost = ["its history"]
    if ops["add"]:
        lost.append(f"the {_count(_total(ops['add'], 'added'), 'item')} added")
    if ops["refine"]:
        lost.append("the rows of real queries from refine")
    if ops["remove"]:
        n = _total(ops["remove"], "removed")
        lost.append(f"the removal of {_count(n, 'item')} (back if the corpus has them)")
    lost_text = ", ".join(lost[:-1]) + " and " + lost[-1] if len(lost) > 1 else lost[0]
    return f"version {version}" + (f": {done}" if done else ""), lost_text


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}" + ("" if n == 1 else "s")


def _total(entries: list[dict], key: str) -> int:
    return sum(h[key] for h in entries if isinstance(h.get(key), int))


def refuse_living_index(
    out_dir: str | os.PathLike, *, source: str | None = None, force: str = "--force"
) -> None:
    """Refuse (ValueError, one line) a build into ``out_dir`` when it holds a living index: one
    changed since its build by refine, add or remove (:func:`living_index`), which a build
    would replace with a new version 1. ``force``: how the caller says to replace it anyway."""
    living = living_index(out_dir)
    if living is None:
        return
    changes, lost = living
    src = f" from {source}" if source else ""
    raise ValueError(
        f"{out_dir} holds a living index ({changes} since its build): a build{src} would "
        f"replace it with a new version 1 and lose {lost}; change it with crossknn add, remove "
        f"or refine, or give {force} to replace it"
    )


def settle_up_to_date(out_dir: str | os.PathLike, key: str) -> bool:
    """Whether ``out_dir`` holds the finished index of the build with ``key``
    (:func:`crossknn.corpus.build_key.up_to_date`); if so, under the folder's lock (a stale lock
    of a killed build is taken over, a live build's is :class:`crossknn.fileio.FolderInUse`) the
    work that build left is removed, so the folder is as a build that ran to its end leaves it."""
    out = Path(out_dir)
    if not up_to_date(out, key):
        return False
    with folder_lock(out / ".lock", what=f"index folder {out}", create=False):
        if not up_to_date(out, key):
            return False
        _drop_finished_work(out, key)
    return True


def item_metadata(corpus: Corpus) -> ItemMetadata:
    """The metadata columns of a corpus's items (none when its items have no other fields)."""
    if corpus.metadata is None:
        return ItemMetadata({}, len(corpus))
    return ItemMetadata.from_records(corpus.metadata, ids=corpus.ids)


def corpus_build_key(
    corpus: Corpus, ce, de, *, train_queries=None, example_queries=None, **settings
) -> str:
    """The key of :func:`build_corpus_index` with these arguments (``settings``: its keyword
    arguments but ``progress`` and ``chunk``, which change nothing it makes); a folder whose
    index has it is up to date (:func:`crossknn.corpus.build_key.up_to_date`). Example queries
    enter the key only when given (the keys of builds without them are unchanged)."""
    defaults = {
        "cur": False,
        "calibration_queries": 16,
        "calibration_items": 32,
        "seed": 0,
        "round_index": "auto",
        "index_calls": "default",
        "tune_rounds": 0,
        "index_minutes": None,
        "auto_options": None,
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
    settings = {**defaults, **settings}
    if example_queries is not None:
        settings["example_queries"] = sha256_texts(list(example_queries))
    return build_key(items, ce, de, train_queries=train_queries, settings=settings)


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
    params = {**index.params, "round_index": meta}
    if "budget" in params:  # stated by --tune-rounds: Q queries x TUNE_BUDGET calls at most
        b = dict(params["budget"])
        b["extra"] = {**b.get("extra", {}), "tune_rounds": len(queries) * budget}
        b["spent"] = {**b["spent"], "tune_rounds": int(calls)}
        b["ce_calls"] = int(b["ce_calls"]) + int(calls)
        params["budget"] = b
    update_params(out, params, ce_calls_added=calls)


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
    auto_options: Mapping[str, Any] | None = None,
    build_key: str | None = None,
    example_queries: Sequence[str] | None = None,
) -> None:
    # the new index is written beside the old one (work/stage) and moved in at the end: the old
    # index stays whole and usable until then, whatever fails on the way (a full disk ...)
    work = out / ".build"
    stage = work / "stage"
    if stage.exists():
        shutil.rmtree(stage)  # a half-written index of an interrupted build
    stage.mkdir(parents=True)
    if build_key is not None:  # whose work this is (_drop_finished_work)
        atomic_write_bytes(work / WORK_KEY, build_key.encode("utf-8"))
    items_bytes = _items_jsonl(corpus)
    # the items' other fields (crossknn.metadata), checked before any model runs
    meta_arrays, meta_params = item_metadata(corpus).to_index()
    atomic_write_bytes(stage / ITEMS_FILE, items_bytes)
    V = encode_resumable(
        de, list(corpus.texts), work / "de", chunk=chunk, progress=progress, ids=corpus.ids
    )
    ce.set_items(list(corpus.texts))

    n = len(corpus)
    n_train = len(train_queries) if train_queries else None
    budget = _index_budget(
        index_calls,
        n,
        n_train=n_train,
        calibration_queries=calibration_queries,
        calibration_items=calibration_items,
    )
    C = budget["index_calls"]
    spent = {"calibration": 0, "auto_rows": 0, "auto_partial_rows": 0}
    arrays: dict[str, np.ndarray] = {"de_items": V}
    auto = pseudo = None
    if budget.pop("auto"):  # the default method's index (crossknn.index.auto)
        if train_queries:
            qs = train_queries
        else:
            plan = pseudo_shape(example_queries, C, n, calibration_queries)
            pseudo = plan["shape"]
            qs = auto_pseudo_queries(
                corpus,
                pseudo["count"],
                seed=seed,
                kind=pseudo["kind"],
                words=pseudo.get("words", 10),
            )
            pseudo["count"] = len(qs)
            auto_options = {**plan["auto_options"], **dict(auto_options or {})}
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
            index_calls=C,
            seed=seed,
            progress=progress,
            work=work / "auto",
            max_seconds=None if index_minutes is None else 60.0 * float(index_minutes),
            options=auto_options or None,
        )
        spent["auto_rows"] = int(auto["rows"]) * n
        spent["auto_partial_rows"] = int(a_calls) - spent["auto_rows"]
        if auto.get("time_cap"):
            budget["time_cap"] = auto["time_cap"]
        if auto["rows"] == 0 and index_calls == "default":
            auto = None  # the time cap read no row: no auto index, as a rule of no rows
        else:
            arrays.update(a_arrays)
    rows = arrays.get(AUTO_ARRAY)
    if rows is not None and rows.shape[0]:  # the score map from the rows' pairs: no CE call
        smap, pairs = _calibrate_from_rows(
            V,
            rows,
            arrays[AUTO_ROW_VECTORS],
            queries=calibration_queries,
            items_per_query=calibration_items,
            seed=seed,
        )
        cal_info = {"from": "auto rows", "queries": int(rows.shape[0]), "pairs": pairs}
    else:  # CE calls of the calibration, inside what the rows left of C
        smap, cal_info = _calibrate_within(
            ce,
            de,
            V,
            corpus,
            train_queries,
            left=C - sum(spent.values()),
            queries=calibration_queries,
            items=calibration_items,
            seed=seed,
            progress=progress,
        )
        spent["calibration"] = int(cal_info["pairs"])
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
        budget["extra"] = {"cur_rows": int(R.size)}  # stated by --cur: train queries x N
        spent["cur_rows"] = int(R.size)
    ce_calls = sum(spent.values())
    budget["spent"] = spent
    budget["ce_calls"] = ce_calls
    params = {
        "n_items": n,
        "dim": int(V.shape[1]),
        **({"score_map": smap.to_list()} if smap is not None else {}),
        "calibration": cal_info["from"],
        "n_calibration_queries": int(cal_info["queries"]),
        "calibration_items": int(calibration_items),
        "n_train_queries": len(train_queries) if train_queries else 0,
        "seed": int(seed),
        "budget": budget,
        **({"auto": auto} if auto is not None else {}),
        **({"pseudo_queries": pseudo} if auto is not None and pseudo is not None else {}),
    }
    # the rounds' MIPS index over de_items (crossknn.search.round_index; none for 'exact')

    rarrays, params["round_index"] = round_index_arrays(
        ItemFeatures(V), round_index, progress=progress
    )
    arrays.update(rarrays)
    # GAR's corpus graph: each item's 16 nearest items by DE vectors (crossknn.search.graph)
    garrays, gparams = graph_arrays(V)
    arrays.update(garrays)
    if gparams is not None:
        params["gar_graph"] = gparams
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
            "gar_graph",
        ),
    )
    shutil.rmtree(work, ignore_errors=True)
