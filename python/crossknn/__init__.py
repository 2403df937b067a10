"""crossknn: k-nearest-neighbor search with cross-encoders on a small budget of CE calls.

Three lines for the main job (an index from ``crossknn build``)::

    index = crossknn.open_index("INDEX_DIR")
    searcher = crossknn.Searcher(index)
    hits = searcher.search("how do I parse a date?", k=10, budget=100)

The pieces (docs/design/architecture.md maps them): :mod:`crossknn.core` (the C++ core: item
features, least squares, top-k), :mod:`crossknn.search` (RNR, ANNCUR, ADACUR, AXN on one round
loop), :mod:`crossknn.scorers` (budgeted CE scoring), :mod:`crossknn.ce` (ONNX Runtime
cross-encoders), :mod:`crossknn.index` (offline index files and their math),
:mod:`crossknn.corpus` (a corpus index's life: build, versions, add/remove, query log, refine),
:mod:`crossknn.cmc` (the CMC reranker), :mod:`crossknn.eval` (Top-k-Recall@B).
"""

from __future__ import annotations

__version__ = "0.1.0"

from crossknn.core import ItemFeatures, RoundState
from crossknn.corpus import build_corpus_index
from crossknn.corpus_folder import open_index
from crossknn.cross_encoder import CrossEncoder
from crossknn.score_map import ScoreMap
from crossknn.scorers import BudgetedScorer, BudgetExceededError, MatrixScorer
from crossknn.search import ADACUR, ANNCUR, AXN, RNR, CurIndex, SearchResult, make_method
from crossknn.searcher import Hits, Searcher

__all__ = [
    "ADACUR",
    "ANNCUR",
    "AXN",
    "RNR",
    "BudgetExceededError",
    "BudgetedScorer",
    "CrossEncoder",
    "CurIndex",
    "Hits",
    "ItemFeatures",
    "MatrixScorer",
    "RoundState",
    "ScoreMap",
    "SearchResult",
    "Searcher",
    "__version__",
    "build_corpus_index",
    "make_method",
    "open_index",
]
