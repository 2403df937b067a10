"""A corpus index's life, in one place: build it (:mod:`~crossknn.corpus.build`), the versions
it goes through (:mod:`~crossknn.corpus.versions`), items added and removed
(:mod:`~crossknn.corpus.edit`), the query log a service writes (:mod:`~crossknn.corpus.query_log`)
and the refit on it (:mod:`~crossknn.corpus.refine`), the pseudo-queries of a build without train
queries (:mod:`~crossknn.corpus.pseudo_keywords`).

The floors beneath it: :mod:`crossknn.corpus_folder` (a built folder, opened), the
:class:`crossknn.searcher.Searcher` that searches one, and :mod:`crossknn.index` (index files and
the math of the method indexes), which knows nothing of corpora. Nothing below this package
imports from it (tests/test_layers.py).
"""

from crossknn.corpus.build import build_corpus_index
from crossknn.corpus.edit import add_items, remove_items
from crossknn.corpus.query_log import LoggedQuery, QueryLog, read_log
from crossknn.corpus.refine import refine_index

__all__ = [
    "LoggedQuery",
    "QueryLog",
    "add_items",
    "build_corpus_index",
    "read_log",
    "refine_index",
    "remove_items",
]
