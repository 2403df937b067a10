"""Downstream metrics against qrels (nDCG@10, recall@100) for DE, BE -> CMC and (optional) CE.

Computed by ``ir_measures`` (the library ``crossknn search --metrics`` and ``crossknn evaluate``
use): nDCG with linear gains (the relevance grade) and ``log2(rank + 1)`` discounts, the ideal DCG
over all of the query's relevant items (BEIR's pytrec_eval setup); recall@k the share of the
relevant items (grade > 0) in the top k. A query without relevant items scores 0.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from crossknn.cmc.data import CmcData
from crossknn.cmc.runtime import CmcRetriever
from crossknn.retrievers import DenseRetriever
from crossknn.trec import parse_measures, query_metrics

__all__ = ["ndcg_at", "qrels_metrics", "recall_at", "rank_de", "rank_cmc"]


def _per_query(rankings, relevants, measure) -> list[float]:
    """``measure`` of each ranked list against its ``{item: grade}`` (:mod:`crossknn.trec`); 0
    for a list that is empty or has no relevant item."""
    run = {
        str(q): {str(int(d)): float(len(r) - p) for p, d in enumerate(r)}
        for q, r in enumerate(rankings)
        if len(r)
    }
    qrels = {
        str(q): {str(int(d)): int(g) for d, g in rel.items()}
        for q, rel in enumerate(relevants)
        if rel
    }
    got = query_metrics(run, qrels, [measure])[str(measure)]
    return [got.get(str(q), 0.0) for q in range(len(rankings))]


def ndcg_at(ranked: Sequence[int], relevant: dict[int, int], k: int) -> float:
    return _per_query([list(ranked)], [relevant], parse_measures(f"nDCG@{int(k)}")[0])[0]


def recall_at(ranked: Sequence[int], relevant: dict[int, int], k: int) -> float:
    return _per_query([list(ranked)], [relevant], parse_measures(f"R@{int(k)}")[0])[0]


def qrels_metrics(rankings: np.ndarray, rows: Sequence[int], data: CmcData) -> dict[str, float]:
    ranked = [list(r) for r in rankings]
    rel = [data.relevant[q] for q in rows]
    if len(ranked) != len(rel):
        raise ValueError(f"{len(ranked)} rankings for {len(rel)} query rows")
    ndcg10, r100 = parse_measures("nDCG@10 R@100")
    nd = _per_query(ranked, rel, ndcg10)
    rc = _per_query(ranked, rel, r100)
    return {"ndcg@10": float(np.mean(nd)), "recall@100": float(np.mean(rc)), "n_queries": len(rows)}


def rank_de(data: CmcData, rows, depth: int) -> np.ndarray:
    return DenseRetriever(data.item_vectors, query_vectors=data.query_vectors).retrieve(
        [int(r) for r in rows], depth
    )


def rank_cmc(data: CmcData, rows, depth: int, reranker, candidates: int) -> np.ndarray:
    ret = CmcRetriever(
        reranker,
        data.item_vectors,
        query_vectors=data.query_vectors,
        candidates=candidates,
        encoder_id=data.encoder_id,
    )
    return ret.retrieve([int(r) for r in rows], depth)
