"""k-NN search with a cross-encoder on a budget: RNR, ANNCUR, ADACUR, AXN on one round loop.

Quick use (a precomputed score matrix as the CE)::

    from crossknn.scorers import MatrixScorer
    from crossknn.search import ADACUR, CurIndex

    index = CurIndex.from_matrix(scores, train_rows, test_rows=test_rows)
    scores_k, items_k = ADACUR(index, rounds=5).search(MatrixScorer(scores), test_rows,
                                                       budget=100, k=10)
"""

from crossknn.search.engine import SearchResult, Step, query_seed, run_rounds, split_sizes
from crossknn.search.methods import (
    ADACUR,
    ANNCUR,
    AXN,
    RNR,
    CurIndex,
    RoundMethod,
    fit_score_affine,
)
from crossknn.search.tuning import choose_on_dev, dev_split, exact_top_k, topk_recall

__all__ = [
    "ADACUR",
    "ANNCUR",
    "AXN",
    "RNR",
    "CurIndex",
    "RoundMethod",
    "SearchResult",
    "Step",
    "choose_on_dev",
    "dev_split",
    "exact_top_k",
    "fit_score_affine",
    "query_seed",
    "run_rounds",
    "split_sizes",
    "topk_recall",
]
