"""Training examples: queries, items and each query's positives, from a BEIR folder or JSONL pairs.

A BEIR folder gives the queries of ``split`` that have at least one item with relevance > 0 in
its qrels; queries of the split without one are skipped and counted. A JSONL file gives one pair
per line, ``{"query": str, "item": str, "label": number}``: label > 0 marks a positive, label 0 an
explicit negative (used before the mined ones). The dev split is carved from these (train) queries.
"""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from crossknn.data import load_beir, read_jsonl

__all__ = ["Examples", "load_examples"]


@dataclass
class Examples:
    """What training reads: texts by index and, per query, its positives and relevances."""

    query_ids: list[str]
    query_texts: list[str]
    item_ids: list[str]
    item_texts: list[str]
    positives: list[np.ndarray]  # item indices with relevance > 0, per query
    relevance: list[dict[int, int]]  # item index -> relevance (> 0), per query
    negatives: list[np.ndarray]  # explicit negatives (JSONL label 0), per query
    skipped: dict[str, int] = field(default_factory=dict)  # why -> how many queries

    def __len__(self) -> int:
        return len(self.query_ids)

    def subset(self, rows: np.ndarray) -> Examples:
        """The queries at ``rows`` (same items)."""
        take = [int(r) for r in rows]
        return Examples(
            [self.query_ids[r] for r in take],
            [self.query_texts[r] for r in take],
            self.item_ids,
            self.item_texts,
            [self.positives[r] for r in take],
            [self.relevance[r] for r in take],
            [self.negatives[r] for r in take],
            dict(self.skipped),
        )


def load_examples(data: str | os.PathLike, split: str = "train") -> Examples:
    """Examples from a BEIR folder (qrels of ``split``) or a JSONL file of labelled pairs."""
    path = Path(data)
    if path.is_dir():
        return _from_beir(path, split)
    if path.is_file():
        return _from_jsonl(path)
    raise FileNotFoundError(f"training data not found: {path} (a BEIR folder or a JSONL file)")


def _from_beir(folder: Path, split: str) -> Examples:
    beir = load_beir(folder)
    if split not in beir.qrels:
        raise ValueError(
            f"{folder}: no qrels for split {split!r} (qrels/{split}.tsv; has "
            f"{sorted(beir.qrels) or 'none'})"
        )
    _check_qrels_rows(folder / "qrels" / f"{split}.tsv")
    item_pos = {i: n for n, i in enumerate(beir.item_ids)}
    query_pos = {q: n for n, q in enumerate(beir.query_ids)}
    ex = Examples([], [], beir.item_ids, beir.item_texts, [], [], [])
    skipped = {"no positive in the qrels": 0, "query not in queries.jsonl": 0}
    for qid, rels in beir.qrels[split].items():
        if qid not in query_pos:
            skipped["query not in queries.jsonl"] += 1
            continue
        rel = {item_pos[d]: r for d, r in rels.items() if r > 0 and d in item_pos}
        if not rel:
            skipped["no positive in the qrels"] += 1
            continue
        ex.query_ids.append(qid)
        ex.query_texts.append(beir.query_texts[query_pos[qid]])
        ex.positives.append(np.array(sorted(rel), dtype=np.int64))
        ex.relevance.append(rel)
        ex.negatives.append(np.zeros(0, dtype=np.int64))
    ex.skipped = {k: v for k, v in skipped.items() if v}
    if not ex.query_ids:
        raise ValueError(f"{folder}: no query of split {split!r} has a positive item")
    return ex


def _check_qrels_rows(tsv: Path) -> None:
    """Every row of a BEIR qrels file (after its header) has its three columns: a line without
    its score is refused (file:line), never silently dropped from the training positives."""
    with open(tsv, encoding="utf-8", newline="") as f:
        reader = csv.reader(f, delimiter="\t")
        next(reader, None)  # header
        for row in reader:
            if not row or not any(c.strip() for c in row):
                continue  # a blank line
            if len(row) < 3 or not row[2].strip():
                raise ValueError(
                    f"{tsv}:{reader.line_num}: expected 'query-id<TAB>corpus-id<TAB>score'; got "
                    f"{len([c for c in row if c.strip()])} column(s) {row!r}"
                )


def _from_jsonl(path: Path) -> Examples:
    queries: dict[str, int] = {}
    items: dict[str, int] = {}
    pos: dict[int, dict[int, int]] = {}
    neg: dict[int, list[int]] = {}
    for lineno, rec in read_jsonl(path):
        q, d, label = rec.get("query"), rec.get("item"), rec.get("label")
        if not isinstance(q, str) or not isinstance(d, str):
            raise ValueError(f"{path}:{lineno}: expected string 'query' and 'item'")
        if isinstance(label, bool) or not isinstance(label, (int, float)) or label < 0:
            raise ValueError(f"{path}:{lineno}: expected a number 'label' >= 0; got {label!r}")
        qi = queries.setdefault(q, len(queries))
        di = items.setdefault(d, len(items))
        if label > 0:
            pos.setdefault(qi, {})[di] = max(1, int(round(label)))
        else:
            neg.setdefault(qi, []).append(di)
    texts = list(queries)
    ex = Examples([], [], list(items), list(items), [], [], [])
    without = 0
    for qi, q in enumerate(texts):
        rel = pos.get(qi)
        if not rel:
            without += 1
            continue
        ex.query_ids.append(q)
        ex.query_texts.append(q)
        ex.positives.append(np.array(sorted(rel), dtype=np.int64))
        ex.relevance.append(rel)
        negs = [d for d in dict.fromkeys(neg.get(qi, [])) if d not in rel]
        ex.negatives.append(np.array(negs, dtype=np.int64))
    if without:
        ex.skipped = {"no positive pair": without}
    if not ex.query_ids:
        raise ValueError(f"{path}: no query has a pair with label > 0")
    return ex
