"""crossknn inside RAG frameworks: a retriever and a reranker for each of LangChain, LlamaIndex
and Haystack, over a local index folder or a ``crossknn serve`` URL (docs/frameworks.md).

- :mod:`crossknn.integrations.langchain` (``pip install 'crossknn[langchain]'``):
  ``CrossknnRetriever`` (a ``BaseRetriever``), ``CrossknnReranker`` (a
  ``BaseDocumentCompressor``);
- :mod:`crossknn.integrations.llamaindex` (``crossknn[llamaindex]``): ``CrossknnRetriever``
  (a ``BaseRetriever`` returning ``NodeWithScore``), ``CrossknnReranker`` (a
  ``BaseNodePostprocessor``);
- :mod:`crossknn.integrations.haystack` (``crossknn[haystack]``): ``CrossknnRetriever`` and
  ``CrossknnRanker`` (``@component``\\ s that round-trip through ``to_dict``/``from_dict``).

Each takes filters in its framework's own idiom; ``*_filters`` modules translate them to
crossknn's filter language (:mod:`crossknn.filters`) and refuse, in one line, a construct that
has no equivalent. An adapter is a translation: every search is one ``Searcher.search`` or one
``client.search`` call (:mod:`crossknn.integrations.source`). Importing this package imports no
framework.
"""

from __future__ import annotations

__all__: list[str] = []
