"""TREC run files and the retrieval metrics of a run against qrels (computed by ``ir_measures``).

A run file has one line per (query, result): ``qid Q0 docid rank score tag`` (6 columns,
whitespace-separated, ranks from 1). Qrels are read from a BEIR ``qrels/*.tsv`` file
(``query-id corpus-id score`` with a header line) or a TREC qrels file (``qid 0 docid rel``):
:func:`crossknn.data.read_qrels`.

Metrics (:func:`run_metrics`): ``nDCG@10``, ``RR@10`` and, when the run has at least 100 results
for some query, ``R@100``, each the mean over the queries of the qrels that the run answers
(``ir_measures.calc_aggregate``: a query of the run without qrels is not counted; a query of the
qrels missing from the run counts as 0 only if ``all_qrels_queries``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from crossknn.fileio import atomic_write_bytes

__all__ = ["Run", "measures_for", "read_run", "run_metrics", "run_tag", "write_run"]

#: qid -> {docid: score}
Run = dict[str, dict[str, float]]


def run_tag(method: str, budget: int | None = None) -> str:
    """The TREC tag of a crossknn run: the method and the budget, e.g. ``crossknn-axn-B100``."""
    return f"crossknn-{method}" + ("" if budget is None else f"-B{int(budget)}")


def write_run(
    path: str | os.PathLike,
    rows: Sequence[tuple[str, Sequence[str], Sequence[float]]],
    tag: str,
) -> Path:
    """Write ``(qid, ranked ids, scores)`` rows as a TREC run file (atomically)."""
    if not tag or any(c.isspace() for c in tag):
        raise ValueError(f"a TREC tag is one word; got {tag!r}")
    lines = []
    for qid, ids, scores in rows:
        for bad in (qid, *ids):
            if not str(bad) or any(c.isspace() for c in str(bad)):
                raise ValueError(f"TREC run ids cannot be empty or contain spaces; got {bad!r}")
        for rank, (doc, score) in enumerate(zip(ids, scores, strict=True), start=1):
            lines.append(f"{qid} Q0 {doc} {rank} {float(score):.6f} {tag}\n")
    path = Path(path)
    atomic_write_bytes(path, "".join(lines).encode("utf-8"))
    return path


def read_run(path: str | os.PathLike) -> Run:
    """A TREC run file as ``{qid: {docid: score}}``; a malformed line names the file and line."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"run file not found: {path}")
    run: Run = {}
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
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
                raise ValueError(f"{path}:{lineno}: rank and score must be numbers") from None
            run.setdefault(parts[0], {})[parts[2]] = score
    if not run:
        raise ValueError(f"{path}: the run file is empty")
    return run


def measures_for(depth: int):
    """The measures reported for a run of ``depth`` results per query."""
    from ir_measures import RR, R, nDCG

    out = [nDCG @ 10, RR @ 10]
    if depth >= 100:
        out.append(R @ 100)
    return out


def run_metrics(run: Mapping[str, Mapping[str, float]], qrels: Mapping) -> dict:
    """``{"nDCG@10": ..., "RR@10": ..., ("R@100": ...), "n_queries": ...}`` of ``run`` against
    ``qrels`` (``{qid: {docid: relevance}}``), by ``ir_measures``; queries of the run without
    qrels are left out (and counted in ``n_queries_without_qrels``)."""
    import ir_measures

    judged = {q: dict(r) for q, r in run.items() if q in qrels}
    if not judged:
        raise ValueError(
            f"none of the run's {len(run)} queries has qrels (query ids differ? e.g. run "
            f"{next(iter(run), None)!r} vs qrels {next(iter(qrels), None)!r})"
        )
    depth = max(len(r) for r in judged.values())
    qrels = {q: {d: int(v) for d, v in qrels[q].items()} for q in judged}
    agg = ir_measures.calc_aggregate(measures_for(depth), qrels, judged)
    out = {str(m): float(v) for m, v in agg.items()}
    out["n_queries"] = len(judged)
    out["n_queries_without_qrels"] = len(run) - len(judged)
    return out
