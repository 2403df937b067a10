"""k-NN search with a cross-encoder on a budget: RNR, ANNCUR, ADACUR, AXN on one round loop.

Quick use (a precomputed score matrix as the CE)::

    from crossknn.scorers import MatrixScorer
    from crossknn.search import ADACUR, CurIndex

    index = CurIndex.from_matrix(scores, train_rows, test_rows=test_rows)
    scores_k, items_k = ADACUR(index, rounds=5).search(MatrixScorer(scores), test_rows,
                                                       budget=100, k=10)

Modules: ``engine`` (the C++ round loop), ``rounds`` (plans and seeds), ``methods`` (what each
method scores), ``registry`` (the one list of methods), ``factory`` (methods by name), ``tuning``
(free parameters chosen on held-out train rows).
"""

from crossknn.search.engine import search_rounds
from crossknn.search.factory import METHODS, make_method
from crossknn.search.methods import (
    ADACUR,
    ANNCUR,
    AXN,
    DEFAULT_MIX,
    RNR,
    CurIndex,
    RoundMethod,
)
from crossknn.search.registry import REGISTRY, MethodSpec
from crossknn.search.rounds import SearchResult, Step, query_seed, split_sizes
from crossknn.search.tuning import choose_on_dev, dev_split

__all__ = [
    "ADACUR",
    "ANNCUR",
    "AXN",
    "DEFAULT_MIX",
    "METHODS",
    "REGISTRY",
    "MethodSpec",
    "RNR",
    "CurIndex",
    "RoundMethod",
    "SearchResult",
    "Step",
    "choose_on_dev",
    "dev_split",
    "make_method",
    "query_seed",
    "search_rounds",
    "split_sizes",
]
