"""``crossknn search INDEX_DIR "query"``: the CE's top-k on a budget of CE calls.

Queries come from the command line, ``--queries FILE`` (JSONL ids kept) or ``--beir DIR``
(``--split``'s queries, ids and qrels); ``--run`` writes a TREC run, ``--first-stage-run`` the
DE-only run of the same queries, ``--metrics`` the ir_measures metrics against the qrels.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
from pathlib import Path

import numpy as np

from crossknn.ce.folders import model_record
from crossknn.ce.tokenize import check_encodable
from crossknn.commands._common import as_named, forward, index_models
from crossknn.commands._printing import print_hits, say_fidelity
from crossknn.corpus.query_log import QueryLog
from crossknn.corpus.versions import index_version
from crossknn.corpus_folder import open_index
from crossknn.data import find_beir, load_beir, read_qrels, read_query_file
from crossknn.fileio import atomic_write_json
from crossknn.filters import parse_filter
from crossknn.outputs import check_output_file
from crossknn.searcher import Searcher
from crossknn.trec import run_metrics, run_tag, write_run


def _common_filter(args) -> dict | None:
    """``--filter``: a JSON object, or ``@FILE`` holding one (None: not given)."""
    if not args.filter:
        return None
    text = args.filter
    if text.startswith("@"):
        text = _read_text(text[1:], "--filter")
    try:
        common = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--filter is not valid JSON ({exc.msg}): {args.filter!r}") from None
    if not isinstance(common, dict):
        raise ValueError(f"--filter must be a JSON object; got {args.filter!r}")
    return common


def _filters(common: dict | None, n: int, per_query: list) -> list | None:
    """Each query's filter: ``--filter`` and the query file's own, both when both are given
    (None: no filter at all)."""
    per_query = per_query + [None] * (n - len(per_query))
    out = [
        common if f is None else f if common is None else {"$and": [common, f]} for f in per_query
    ]
    return None if all(f is None for f in out) else out


def _read_text(path: str, option: str) -> str:
    """A UTF-8 text file given as ``option`` (a byte-order mark dropped); bytes that are not
    UTF-8 are one line naming the file and line."""
    data = Path(path).read_bytes()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise ValueError(
            f"{option} {path}:{line}: not UTF-8 text (byte {exc.start} of the file)"
        ) from None


def _id_list(path: str | None) -> list[str] | None:
    if not path:
        return None
    ids = [line.strip() for line in _read_text(path, "--ids").splitlines()]
    ids = [i for i in ids if i]
    if not ids:
        raise ValueError(f"--ids {path}: the file holds no item id")
    return ids


def _queries(
    args, filters: list | None = None, where: list | None = None
) -> tuple[list[str], list[str], dict | None]:
    """(ids, texts, qrels or None) from the arguments; ``filters`` receives the query file's
    per-query filters, ``where`` each query's ``FILE:LINE`` (None: not from a file)."""
    ids, texts = [], []
    qrels = None
    if args.beir:
        if args.query or args.queries:
            raise ValueError("--beir brings its own queries: give no query text or --queries")
        beir = load_beir(find_beir(args.beir))
        if args.split not in beir.qrels:
            raise ValueError(
                f"{args.beir}: no qrels/{args.split}.tsv (splits: {sorted(beir.qrels) or 'none'})"
            )
        qrels = beir.qrels[args.split]
        known = set(beir.query_ids)
        ids = [q for q in beir.query_ids if q in qrels]
        if not ids:
            missing = next(iter(qrels), None)
            raise ValueError(
                f"{args.beir}: none of the {args.split} qrels' queries is in queries.jsonl "
                f"(e.g. {missing!r}, known: {len(known)} queries)"
            )
        texts = beir.queries_in_order(ids)
    else:
        texts = list(args.query)
        ids = [str(i) for i in range(1, len(texts) + 1)]
        if args.queries:
            if filters is not None:
                filters.extend([None] * len(texts))
            if where is not None:
                where.extend([None] * len(texts))
            fids, ftexts = _read_query_file(args.queries, filters, where)
            ids, texts = ids + fids, texts + ftexts
    if args.qrels:
        qrels = read_qrels(args.qrels)
    if not texts:
        raise ValueError(
            "no query given: pass query text(s), --queries FILE ('-' = stdin) or --beir DIR"
        )
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise ValueError(f"query id {dup!r} appears more than once")
    if getattr(args, "max_queries", None) is not None:
        ids, texts = ids[: args.max_queries], texts[: args.max_queries]
    return ids, texts, qrels


def _read_query_file(path: str, filters: list | None, where: list | None):
    """:func:`crossknn.data.read_query_file`; ``where`` receives each query's ``FILE:LINE``
    (``stdin:LINE`` for ``-``), which messages about a query's own filter name."""
    if where is None:
        return read_query_file(path, filters=filters)
    if path == "-":  # read here to number its lines, then handed to the reader as it came
        text = sys.stdin.read()
        lines = [n for n, line in enumerate(text.splitlines(), start=1) if line.strip()]
        stdin, sys.stdin = sys.stdin, io.StringIO(text)
        try:
            out = read_query_file(path, filters=filters)
        finally:
            sys.stdin = stdin
        src = "stdin"
    else:
        out = read_query_file(path, filters=filters)
        with open(path, "rb") as fh:  # read_query_file's lines: the non-blank ones
            lines = [n for n, raw in enumerate(fh, start=1) if raw.decode("utf-8").strip()]
        src = path
    where.extend(f"{src}:{n}" for n in lines)
    return out


def run(args: argparse.Namespace) -> int:
    _check_outputs(args)
    rescore = _rescore_arg(args)
    per_query: list = []
    where: list = []
    ids, queries, qrels = _queries(args, per_query, where)
    common = _common_filter(args)
    filters = _filters(common, len(queries), per_query[: len(queries)])
    allow_ids = _id_list(args.ids)

    check_encodable(queries, "queries")  # one line before any model opens
    if args.metrics and qrels is None:
        raise ValueError("--metrics needs relevance judgments: --beir DIR or --qrels FILE")

    index = open_index(args.index_dir)
    # checked against the index's fields before any model opens; a query file's filter is
    # named by its file and line (q.jsonl:2: filter.year: ...)
    if common is not None:
        parse_filter(common, index.metadata.fields)
    for f, at in zip(per_query[: len(queries)], where, strict=False):
        if f is not None:
            parse_filter(f, index.metadata.fields, where=f"{at}: filter" if at else "filter")
    # the query log is opened (and a log it cannot write refused) before any model or CE call
    log = QueryLog(args.log_queries) if args.log_queries else None
    try:
        return _search(args, index, ids, queries, qrels, rescore, filters, allow_ids, log)
    finally:
        if log is not None:
            log.close()


def _search(args, index, ids, queries, qrels, rescore, filters, allow_ids, log) -> int:
    """The body of :func:`run` from the models on (``log``: the open query log, or None)."""
    # the models with the run's precision (fp16: the recorded fp32 graph on a GPU) and options
    ce, de = index_models(args, index)
    searcher = Searcher(
        index,
        ce=ce,
        de=de,
        **forward(args, "method", "rounds", "cmc_model", "cmc_candidates", "round_index"),
        **forward(args, "shards", "ray_address"),
        rescore=rescore,
        latency_target_ms="auto" if args.latency_target_ms is None else args.latency_target_ms,
        target_recall=args.target_recall,
    )
    say_fidelity(args, searcher.ce)
    searcher.record_paid = bool(args.log_queries)
    # exact CE rows are kept under INDEX_DIR/exact (keyed by query, items and CE hash)
    hits = searcher.search(
        queries,
        k=args.k,
        budget=args.budget,
        seed=args.seed,
        exact=args.exact,
        exact_cache=Path(args.index_dir) / "exact",
        query_ids=ids,
        query_batch=args.query_batch,
        show_progress_bar=not args.quiet and (len(queries) > 1 or args.exact),
        filter=filters,
        ids=allow_ids,
    )
    if log is not None:
        _log_queries(log, searcher, hits)
    if allow_ids is not None:
        _say_unknown_ids(hits, allow_ids)
    tag = run_tag(searcher.method, args.budget)
    # what ran: the method, its rounds, the plan's steps and why (auto's round choice)
    plan = hits[0].plan if hits else searcher.plan_info(budget=args.budget, rounds=args.rounds)
    if args.run:
        write_run(args.run, [(h.qid, h.ids, h.scores) for h in hits], tag)
    first = None
    if args.first_stage_run or args.metrics:
        first = _first_stage(searcher, ids, queries, args.k, filters, allow_ids)
        if args.first_stage_run:
            write_run(args.first_stage_run, first, run_tag("de"))
    records = _models(searcher)
    if args.metrics:
        run_ = {h.qid: dict(zip(h.ids, map(float, h.scores), strict=True)) for h in hits}
        de_run = {q: dict(zip(d, map(float, s), strict=True)) for q, d, s in first}
        metrics = {
            "run": {
                **run_metrics(run_, qrels),
                "ce_calls_per_query": float(np.mean([h.ce_calls for h in hits])),
            },
            "first_stage": {**run_metrics(de_run, qrels), "ce_calls_per_query": 0.0},
            "tag": tag,
            "method": searcher.method,
            "budget": args.budget,
            "k": args.k,
            "rounds": plan["rounds"],
            "plan": plan,
            "models": records,
            "computed_with": "ir_measures",
        }
        if rescore:
            metrics["rescore"] = {"precision": rescore[0], "n": rescore[1]}
            metrics["run"]["rescore_calls_per_query"] = float(
                np.mean([h.rescore_calls for h in hits])
            )
        atomic_write_json(args.metrics, metrics)
    if args.json:
        json.dump(
            {
                "method": searcher.method,
                "k": args.k,
                "budget": args.budget,
                "rounds": plan["rounds"],
                "plan": plan,
                "tag": tag,
                "precision": searcher.ce.precision,
                "provider": searcher.ce.provider,
                "rescore": {"precision": rescore[0], "n": rescore[1]} if rescore else None,
                "models": records,
                "hits": [h.to_dict() for h in hits],
            },
            sys.stdout,
            indent=2,
        )
        print()
    elif not args.quiet:
        print_hits(hits)
        if rescore:
            calls = sum(h.rescore_calls for h in hits) / len(hits)
            print(
                f"\nrescored the top {rescore[1]} of each search with the {rescore[0]} CE: "
                f"{calls:.1f} CE calls/query on top of the budget (counted in CE calls)"
            )
        if args.exact:
            mean = sum(h.recall for h in hits) / len(hits)
            print(f"\nmean Top-{args.k}-Recall@{args.budget}: {mean:.3f} over {len(hits)} queries")
    if args.metrics and not args.json:
        m = metrics["run"]
        fs = metrics["first_stage"]
        print(
            f"{tag}: nDCG@10 {m['nDCG@10']:.4f} (DE alone {fs['nDCG@10']:.4f}), RR@10 "
            f"{m['RR@10']:.4f}, CE calls/query {m['ce_calls_per_query']:.1f}, "
            f"{m['n_queries']} queries; wrote {args.metrics}",
            file=sys.stderr if args.quiet else sys.stdout,
        )
    return 0


def _first_stage(searcher, ids, queries, k: int, filters, allow_ids) -> list[tuple]:
    """The DE-only run of the queries: ``(qid, item ids, DE scores)``, each query's top
    min(k, the items it may be given) among its allowed items (its filter, ``--ids``, less the
    removed items); queries that may be given as many items are retrieved together."""
    masks = searcher.allow_masks(len(queries), filter=filters, ids=allow_ids)
    masks = masks or [None] * len(queries)
    depth = [min(k, searcher.n_items if m is None else int(m.sum())) for m in masks]
    rows: list = [None] * len(queries)
    for n in sorted(set(depth)):
        group = [q for q, d in enumerate(depth) if d == n]
        allow = [masks[q] for q in group]
        kw = {} if all(m is None for m in allow) else {"allow": allow}
        top = searcher.first.retrieve([queries[q] for q in group], n, **kw)
        for q, row in zip(group, top, strict=True):
            rows[q] = row[row >= 0]
    V, Q = searcher.V, searcher.qvec.encode(queries)
    return [
        (qid, [searcher.corpus.ids[j] for j in row], V[row] @ qv)
        for qid, row, qv in zip(ids, rows, Q, strict=True)
    ]


def _say_unknown_ids(hits, allow_ids: list[str]) -> None:
    """One stderr line when ids of ``--ids`` are not in the index (never added, or removed):
    they allow nothing; each JSON hit's ``unknown_ids`` counts them (``Hits.unknown_ids``)."""
    unknown = hits[0].unknown_ids if hits else 0
    if unknown:
        print(
            f"crossknn search: {unknown:,} of {len(set(allow_ids)):,} --ids are not in the index "
            "(ignored)",
            file=sys.stderr,
        )


def _rescore_arg(args) -> tuple[str, int] | None:
    """``--rescore PRECISION N`` as ``(precision, N)``, checked against -k and --budget."""
    if not args.rescore:
        return None
    precision, n = args.rescore
    try:
        n = int(n)
    except ValueError:
        raise ValueError(f"--rescore N must be an integer; got {n!r}") from None
    if n < args.k:
        raise ValueError(f"--rescore N={n} is less than -k {args.k}: N must be >= k")
    if n > args.budget:
        raise ValueError(f"--rescore N={n} exceeds --budget {args.budget}: N must be <= budget")
    return precision, n


def _check_outputs(args) -> None:
    """No output file over an input or a file of an index, matrix or model folder."""
    inputs = as_named(
        args, "INDEX_DIR", "--queries", "--beir", "--qrels", "--model", "--de-model", "--cmc-model"
    )
    outs = [
        ("--run", args.run),
        ("--first-stage-run", args.first_stage_run),
        ("--metrics", args.metrics),
    ]
    for i, (opt, path) in enumerate(outs):
        if path:
            check_output_file(path, option=opt, inputs=inputs, others=outs[:i])


def _models(searcher) -> dict:
    return {"ce": model_record(searcher.ce), "de": model_record(searcher.de)}


def _log_queries(log: QueryLog, searcher: Searcher, hits) -> None:
    """Appends the answered queries to the query log (crossknn.corpus.query_log). A full disk
    does not fail the search: the records wait and are written when the log closes, or said
    lost in one line."""
    try:
        log.append_hits(
            hits,
            searcher.corpus.ids,
            searcher.corpus.texts,
            index_version=index_version(searcher.index),
            de_model_hash=getattr(searcher.de, "model_hash", None),
            ce_model_hash=getattr(searcher.ce, "model_hash", None),
        )
    except OSError as exc:
        print(f"crossknn search: warning: {exc}", file=sys.stderr)
