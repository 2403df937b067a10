"""crossknn in LangChain (``pip install 'crossknn[langchain]'``)::

    from crossknn.integrations.langchain import CrossknnRetriever, CrossknnReranker
    retriever = CrossknnRetriever(source="INDEX_DIR",            # or "http://127.0.0.1:8080"
                                  search_kwargs={"k": 5, "budget": 100, "filter": {"lang": "en"}})
    docs = retriever.invoke("parse a date string")   # ainvoke, batch; per call: filter=..., k=...
    chain = retriever | (lambda docs: "\\n".join(d.page_content for d in docs))

:class:`CrossknnRetriever` is a ``BaseRetriever``: each ``Document`` holds the item's text
(``page_content``), its id (``id`` and ``metadata["id"]``), its CE score (``metadata["score"]``),
its rank and its metadata fields. ``search_kwargs`` (and keywords of ``invoke``) are
``Searcher.search``'s: ``k``, ``budget``, ``method``, ``rounds``, ``seed``, ``filter``, ``ids``;
the filter is LangChain's (:mod:`crossknn.integrations.langchain_filters`: the vector stores'
MongoDB-style dict or a ``structured_query`` directive). :class:`CrossknnReranker` is a
``BaseDocumentCompressor`` that orders documents by the CE's score (``/rerank`` on a server),
each with ``metadata["relevance_score"]``. :class:`CrossknnTranslator` is the self-query
``Visitor``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from crossknn.integrations.langchain_filters import translate
from crossknn.integrations.source import Item, Source, missing_framework

try:
    from langchain_core.callbacks import (
        AsyncCallbackManagerForRetrieverRun,
        CallbackManagerForRetrieverRun,
        Callbacks,
    )
    from langchain_core.documents import BaseDocumentCompressor, Document
    from langchain_core.retrievers import BaseRetriever
    from langchain_core.structured_query import Visitor
    from pydantic import ConfigDict, Field, PrivateAttr
except ModuleNotFoundError as exc:  # the extra is not installed: one line naming it
    if (exc.name or "").split(".")[0] in ("langchain_core", "pydantic"):
        raise missing_framework("langchain", "langchain") from None
    raise

__all__ = ["CrossknnReranker", "CrossknnRetriever", "CrossknnTranslator", "to_document"]


def _source(where: Any, api_key, timeout: float, searcher_options) -> Source:
    if isinstance(where, Source):
        return where
    return Source(where, api_key=api_key, timeout=timeout, searcher_options=searcher_options)


def to_document(item: Item) -> Document:
    """A LangChain ``Document`` of one result."""
    meta = {**item.metadata, "id": item.id, "score": item.score, "rank": item.rank}
    return Document(page_content=item.text, metadata=meta, id=item.id)


class CrossknnRetriever(BaseRetriever):
    """Top-k items by exact CE score from a crossknn index or server.

    Args:
        source: an index folder, an opened index, a ``crossknn.Searcher``, a server URL or a
            :class:`~crossknn.integrations.source.Source`.
        search_kwargs: ``k`` (default 10), ``budget`` (100), ``method``, ``rounds``, ``seed``,
            ``filter`` (LangChain's idiom), ``ids``; keywords of ``invoke`` override them.
        api_key: a server's key (default ``$CROSSKNN_API_KEY``).
        timeout: seconds per request to a server.
        searcher_options: ``crossknn.Searcher`` keywords for a local folder.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    source: Any
    search_kwargs: dict[str, Any] = Field(default_factory=dict)
    api_key: str | None = Field(default=None, repr=False)
    timeout: float = 60.0
    searcher_options: dict[str, Any] = Field(default_factory=dict)
    _source: Source = PrivateAttr()

    def model_post_init(self, context: Any, /) -> None:
        self._source = _source(self.source, self.api_key, self.timeout, self.searcher_options)

    def _options(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        opts = {"k": 10, "budget": 100, **self.search_kwargs, **kwargs}
        opts["filter"] = translate(opts.get("filter"))
        return opts

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun, **kwargs: Any
    ) -> list[Document]:
        return [to_document(it) for it in self._source.search(query, **self._options(kwargs))]

    async def _aget_relevant_documents(
        self, query: str, *, run_manager: AsyncCallbackManagerForRetrieverRun, **kwargs: Any
    ) -> list[Document]:
        items = await self._source.asearch(query, **self._options(kwargs))
        return [to_document(it) for it in items]


class CrossknnReranker(BaseDocumentCompressor):
    """Orders documents by the CE's score against the query (best first, the best ``top_n``;
    None: all), each with ``metadata["relevance_score"]``: the index's CE locally, ``/rerank``
    on a server. ``source`` as :class:`CrossknnRetriever`'s."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    source: Any
    top_n: int | None = None
    api_key: str | None = Field(default=None, repr=False)
    timeout: float = 60.0
    searcher_options: dict[str, Any] = Field(default_factory=dict)
    _source: Source = PrivateAttr()

    def model_post_init(self, context: Any, /) -> None:
        self._source = _source(self.source, self.api_key, self.timeout, self.searcher_options)

    def _ranked(self, documents: Sequence[Document], order) -> list[Document]:
        keep = order if self.top_n is None else order[: self.top_n]
        out = []
        for i, score in keep:
            d = documents[i]
            meta = {**d.metadata, "relevance_score": score}
            out.append(Document(page_content=d.page_content, metadata=meta, id=d.id))
        return out

    def compress_documents(
        self, documents: Sequence[Document], query: str, callbacks: Callbacks | None = None
    ) -> Sequence[Document]:
        order = self._source.rerank(query, [d.page_content for d in documents])
        return self._ranked(documents, order)

    async def acompress_documents(
        self, documents: Sequence[Document], query: str, callbacks: Callbacks | None = None
    ) -> Sequence[Document]:
        order = await self._source.arerank(query, [d.page_content for d in documents])
        return self._ranked(documents, order)


class CrossknnTranslator(Visitor):
    """LangChain's self-query IR (``StructuredQuery``) as a crossknn filter: the
    ``structured_query_translator`` of a self-query retriever; ``like`` and ``contain`` are
    refused."""

    def visit_operation(self, operation) -> dict[str, Any]:
        return translate(operation)

    def visit_comparison(self, comparison) -> dict[str, Any]:
        return translate(comparison)

    def visit_structured_query(self, structured_query) -> tuple[str, dict[str, Any]]:
        flt = structured_query.filter
        return structured_query.query, ({} if flt is None else {"filter": translate(flt)})
