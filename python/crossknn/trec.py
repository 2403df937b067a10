"""TREC run files and the retrieval metrics of a run against qrels (computed by ``ir_measures``).

A run file has one line per (query, result): ``qid Q0 docid rank score tag`` (6 columns,
whitespace-separated, ranks from 1). :func:`write_run` writes each score at full precision (the
shortest decimal that reads back as the same double as the float32 score, ``repr``), so a run
read back from its file is the run that was scored; and it writes each query's lines in the order
``trec_eval`` ranks them: score descending, and equal scores by docid
descending (string order: ``trec_eval``'s rule), so the rank column is the rank evaluated.
:func:`run_metrics` scores each query's results in that order for every measure (ir_measures'
providers disagree on ties: its nDCG@10, by pytrec_eval, takes equal scores by docid
descending, its RR@10, by the msmarco provider, by docid ascending).
:func:`read_run` refuses what these tools would score silently: a score that is not a finite
number, the same docid twice for one query, and bytes that are not UTF-8 text (file:line).

Qrels are read from a BEIR ``qrels/*.tsv`` file (``query-id corpus-id score`` with a header
line) or a TREC qrels file (``qid 0 docid rel``): :func:`crossknn.data.read_qrels`.

Metrics (:func:`run_metrics`): by default ``nDCG@10``, ``RR@10`` and, when the run has at least
100 results for some query, ``R@100`` (or any measures in ir_measures syntax:
:func:`parse_measures`), each the mean over the queries of the qrels that the run answers
(``ir_measures.calc_aggregate``: a query of the run without qrels is not counted; a query of the
qrels missing from the run counts as 0 only if ``all_qrels_queries``).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from crossknn.fileio import atomic_write_bytes

__all__ = [
    "Run",
    "format_score",
    "measures_for",
    "parse_measures",
    "query_metrics",
    "read_run",
    "run_metrics",
    "run_tag",
    "trec_order",
    "write_run",
]

#: qid -> {docid: score}
Run = dict[str, dict[str, float]]


def run_tag(method: str, budget: int | None = None) -> str:
    """The TREC tag of a crossknn run: the method and the budget, e.g. ``crossknn-axn-B100``."""
    return f"crossknn-{method}" + ("" if budget is None else f"-B{int(budget)}")


def format_score(score: float) -> str:
    """A score as written in a run: the float32 value at full precision (``repr`` of it as a
    double), so that reading it back gives exactly the value that was ranked."""
    return repr(float(np.float32(score)))


def trec_order(ids: Sequence[str], scores: Sequence[float]) -> list[tuple[str, float]]:
    """``(docid, float32 score)`` in the order trec_eval and ir_measures rank a query's results:
    score descending, equal scores by docid descending (string order)."""
    pairs = [(str(d), float(np.float32(s))) for d, s in zip(ids, scores, strict=True)]
    pairs.sort(key=lambda p: p[0], reverse=True)  # stable: the second sort keeps this for ties
    pairs.sort(key=lambda p: p[1], reverse=True)
    return pairs


def write_run(
    path: str | os.PathLike,
    rows: Sequence[tuple[str, Sequence[str], Sequence[float]]],
    tag: str,
) -> Path:
    """Write ``(qid, ids, scores)`` rows as a TREC run file (atomically): full-precision scores,
    lines in the evaluators' order (:func:`trec_order`); a score that is not finite or a docid
    given twice for one query is refused."""
    if not tag or any(c.isspace() for c in tag):
        raise ValueError(f"a TREC tag is one word; got {tag!r}")
    lines = []
    for qid, ids, scores in rows:
        for bad in (qid, *ids):
            if not str(bad) or any(c.isspace() for c in str(bad)):
                raise ValueError(f"TREC run ids cannot be empty or contain spaces; got {bad!r}")
        ranked = trec_order(ids, scores)
        seen: set[str] = set()
        for doc, score in ranked:
            if not math.isfinite(score):
                raise ValueError(f"query {qid!r}, docid {doc!r}: score {score} is not finite")
            if doc in seen:
                raise ValueError(f"query {qid!r}: docid {doc!r} appears twice")
            seen.add(doc)
        for rank, (doc, score) in enumerate(ranked, start=1):
            lines.append(f"{qid} Q0 {doc} {rank} {format_score(score)} {tag}\n")
    path = Path(path)
    atomic_write_bytes(path, "".join(lines).encode("utf-8"))
    return path


def read_run(path: str | os.PathLike) -> Run:
    """A TREC run file as ``{qid: {docid: score}}``. Refused, naming the file and line: a line
    that is not 6 columns, a rank or score that is not a number, a score that is not finite
    (NaN, inf), the same docid twice for one query, bytes that are not UTF-8 text."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"run file not found: {path}")
    run: Run = {}
    first_line: dict[tuple[str, str], int] = {}
    with path.open("rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            if b"\0" in raw:
                raise ValueError(
                    f"{path}:{lineno}: a binary file (NUL byte), not a TREC run "
                    "(qid Q0 docid rank score tag)"
                )
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ValueError(
                    f"{path}:{lineno}: not UTF-8 text (byte {exc.start} of the line); "
                    "a TREC run (qid Q0 docid rank score tag) was expected"
                ) from None
            if not line.strip():
                continue
            parts = line.split()
            if len(parts) != 6:
                raise ValueError(
                    f"{path}:{lineno}: expected 6 columns (qid Q0 docid rank score tag); "
                    f"got {len(parts)}"
                )
            try:
                score = float(parts[4])
                int(parts[3])
            except ValueError:
                raise ValueError(
                    f"{path}:{lineno}: rank and score must be numbers; got rank "
                    f"{parts[3]!r}, score {parts[4]!r}"
                ) from None
            if not math.isfinite(score):
                raise ValueError(
                    f"{path}:{lineno}: score {parts[4]!r} is not a finite number "
                    f"(query {parts[0]!r}, docid {parts[2]!r})"
                )
            key = (parts[0], parts[2])
            if key in first_line:
                raise ValueError(
                    f"{path}:{lineno}: docid {parts[2]!r} appears twice for query "
                    f"{parts[0]!r} (first at line {first_line[key]})"
                )
            first_line[key] = lineno
            run.setdefault(parts[0], {})[parts[2]] = score
    if not run:
        raise ValueError(f"{path}: the run file is empty")
    return run


def measures_for(depth: int):
    """The measures reported for a run of ``depth`` results per query."""
    # ir_measures: about 20 ms to import, only metrics need it
    from ir_measures import RR, R, nDCG

    out = [nDCG @ 10, RR @ 10]
    if depth >= 100:
        out.append(R @ 100)
    return out


def parse_measures(text: str | Sequence[str]) -> list:
    """ir_measures measures from their names in ir_measures syntax (``"nDCG@10 RR@10 P(rel=2)@5"``,
    separated by spaces or commas, or a list of names); an unknown name is refused by name."""
    # ir_measures: about 20 ms to import, only metrics need it
    import ir_measures

    names = text.replace(",", " ").split() if isinstance(text, str) else list(text)
    if not names:
        raise ValueError("--metrics: no measure given (e.g. 'nDCG@10 RR@10 R@100')")
    out = []
    for name in names:
        try:
            out.append(ir_measures.parse_measure(name))
        except (ValueError, NameError, SyntaxError, TypeError, AttributeError) as exc:
            raise ValueError(
                f"--metrics: {name!r} is not an ir_measures measure (e.g. nDCG@10, RR@10, "
                f"R@100, P@5, AP, Judged@10): {exc}"
            ) from None
    return out


def _judged(run: Mapping[str, Mapping[str, float]], qrels: Mapping) -> tuple[dict, dict]:
    """The run's queries that have qrels, each scored by its rank in :func:`trec_order`, and
    their qrels (int grades)."""
    # each query's results in trec_order, scored by their rank: every provider then ranks the
    # same way (ir_measures' providers break ties differently: pytrec_eval's nDCG by docid
    # descending, the msmarco provider's RR@10 by docid ascending)
    judged = {
        q: {d: float(len(r) - n) for n, (d, _) in enumerate(trec_order(list(r), list(r.values())))}
        for q, r in run.items()
        if q in qrels
    }
    return judged, {q: {d: int(v) for d, v in qrels[q].items()} for q in judged}


def run_metrics(
    run: Mapping[str, Mapping[str, float]], qrels: Mapping, measures: Sequence | None = None
) -> dict:
    """``{"nDCG@10": ..., "RR@10": ..., ("R@100": ...), "n_queries": ...}`` of ``run`` against
    ``qrels`` (``{qid: {docid: relevance}}``), by ``ir_measures`` (``measures``: any ir_measures
    measures instead, :func:`parse_measures`); queries of the run without qrels are left out
    (and counted in ``n_queries_without_qrels``)."""
    # ir_measures: about 20 ms to import, only metrics need it
    import ir_measures

    judged, judged_qrels = _judged(run, qrels)
    if not judged:
        raise ValueError(
            f"none of the run's {len(run)} queries has qrels (query ids differ? e.g. run "
            f"{next(iter(run), None)!r} vs qrels {next(iter(qrels), None)!r})"
        )
    depth = max(len(r) for r in judged.values())
    agg = ir_measures.calc_aggregate(
        measures_for(depth) if measures is None else list(measures), judged_qrels, judged
    )
    out = {str(m): float(v) for m, v in agg.items()}
    out["n_queries"] = len(judged)
    out["n_queries_without_qrels"] = len(run) - len(judged)
    return out


def query_metrics(
    run: Mapping[str, Mapping[str, float]], qrels: Mapping, measures: Sequence
) -> dict[str, dict[str, float]]:
    """``{measure name: {qid: value}}``: each measure of each query of ``run`` that has qrels,
    on the same rank order as :func:`run_metrics` (a query ir_measures does not score, e.g. one
    without a relevant result in its qrels, is absent)."""
    # ir_measures: about 20 ms to import, only metrics need it
    import ir_measures

    judged, qrels = _judged(run, qrels)
    out: dict[str, dict[str, float]] = {str(m): {} for m in measures}
    for m in ir_measures.iter_calc(list(measures), qrels, judged):
        out[str(m.measure)][m.query_id] = float(m.value)
    return out
