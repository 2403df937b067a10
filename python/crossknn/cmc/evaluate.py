"""Downstream metrics against qrels (nDCG@10, recall@100) for DE, BE -> CMC and (optional) CE.

nDCG uses linear gains (the relevance grade) and ``log2(rank + 1)`` discounts, the ideal DCG over
all of the query's relevant items (as BEIR's pytrec_eval setup); recall@k is the share of the
relevant items (grade > 0) in the top k.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from crossknn.cmc.data import CmcData

__all__ = ["ndcg_at", "qrels_metrics", "recall_at", "rank_de", "rank_cmc"]


def ndcg_at(ranked: Sequence[int], relevant: dict[int, int], k: int) -> float:
    gains = np.array([relevant.get(int(i), 0) for i in ranked[:k]], np.float64)
    dcg = float((gains / np.log2(np.arange(2, gains.size + 2))).sum())
    ideal = np.sort(np.array(list(relevant.values()), np.float64))[::-1][:k]
    idcg = float((ideal / np.log2(np.arange(2, ideal.size + 2))).sum())
    return dcg / idcg if idcg > 0 else 0.0


def recall_at(ranked: Sequence[int], relevant: dict[int, int], k: int) -> float:
    rel = {i for i, g in relevant.items() if g > 0}
    if not rel:
        return 0.0
    return len(rel.intersection(int(i) for i in ranked[:k])) / len(rel)


def qrels_metrics(rankings: np.ndarray, rows: Sequence[int], data: CmcData) -> dict[str, float]:
    nd = [ndcg_at(r, data.relevant[q], 10) for r, q in zip(rankings, rows, strict=True)]
    rc = [recall_at(r, data.relevant[q], 100) for r, q in zip(rankings, rows, strict=True)]
    return {"ndcg@10": float(np.mean(nd)), "recall@100": float(np.mean(rc)), "n_queries": len(rows)}


def rank_de(data: CmcData, rows, depth: int) -> np.ndarray:
    from crossknn.retrievers import DenseRetriever

    return DenseRetriever(data.item_vectors, query_vectors=data.query_vectors).retrieve(
        [int(r) for r in rows], depth
    )


def rank_cmc(data: CmcData, rows, depth: int, reranker, candidates: int) -> np.ndarray:
    from crossknn.cmc.runtime import CmcRetriever

    ret = CmcRetriever(
        reranker,
        data.item_vectors,
        query_vectors=data.query_vectors,
        candidates=candidates,
        encoder_id=data.encoder_id,
    )
    return ret.retrieve([int(r) for r in rows], depth)
