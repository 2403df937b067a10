"""crossknn in LlamaIndex (``pip install 'crossknn[llamaindex]'``)::

    from llama_index.core.vector_stores import MetadataFilter, MetadataFilters
    from crossknn.integrations.llamaindex import CrossknnRetriever, CrossknnReranker
    retriever = CrossknnRetriever("INDEX_DIR", similarity_top_k=5, budget=100,   # or a URL
                                  filters=MetadataFilters(filters=[MetadataFilter(key="lang",
                                                                                  value="en")]))
    nodes = retriever.retrieve("parse a date string")    # [NodeWithScore], aretrieve too

:class:`CrossknnRetriever` is a ``BaseRetriever``: each ``NodeWithScore`` has the CE score and
a ``TextNode`` whose ``id_`` is the item id, ``text`` its text and ``metadata`` its metadata
fields (and ``rank``). ``filters`` are LlamaIndex's ``MetadataFilters``
(:mod:`crossknn.integrations.llamaindex_filters`). :class:`CrossknnReranker` is a
``BaseNodePostprocessor`` ordering nodes by the CE's score (``/rerank`` on a server).
"""

from __future__ import annotations

from typing import Any

from crossknn.integrations.llamaindex_filters import translate
from crossknn.integrations.source import Item, Source, missing_framework

try:
    from llama_index.core.bridge.pydantic import Field, PrivateAttr
    from llama_index.core.callbacks import CallbackManager
    from llama_index.core.postprocessor.types import BaseNodePostprocessor
    from llama_index.core.retrievers import BaseRetriever
    from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode
except ModuleNotFoundError as exc:  # the extra is not installed: one line naming it
    if (exc.name or "").split(".")[0] == "llama_index":
        raise missing_framework("llamaindex", "llamaindex") from None
    raise

__all__ = ["CrossknnReranker", "CrossknnRetriever", "to_node"]


def _source(where: Any, api_key, timeout: float, searcher_options) -> Source:
    if isinstance(where, Source):
        return where
    return Source(where, api_key=api_key, timeout=timeout, searcher_options=searcher_options)


def to_node(item: Item) -> NodeWithScore:
    """A ``NodeWithScore`` of one result."""
    node = TextNode(id_=item.id, text=item.text, metadata={**item.metadata, "rank": item.rank})
    return NodeWithScore(node=node, score=item.score)


class CrossknnRetriever(BaseRetriever):
    """Top-k items by exact CE score from a crossknn index or server.

    Args:
        source: an index folder, an opened index, a ``crossknn.Searcher``, a server URL or a
            :class:`~crossknn.integrations.source.Source`.
        similarity_top_k: k, the items returned.
        budget: CE calls per query.
        filters: LlamaIndex ``MetadataFilters`` (or None).
        ids: an id allow-list.
        method, rounds, seed: ``Searcher.search``'s (None: the defaults).
        api_key: a server's key (default ``$CROSSKNN_API_KEY``).
        timeout: seconds per request to a server.
        searcher_options: ``crossknn.Searcher`` keywords for a local folder.
    """

    def __init__(
        self,
        source: Any,
        *,
        similarity_top_k: int = 10,
        budget: int = 100,
        filters: Any = None,
        ids: list[str] | None = None,
        method: str | None = None,
        rounds: int | None = None,
        seed: int | None = None,
        api_key: str | None = None,
        timeout: float = 60.0,
        searcher_options: dict[str, Any] | None = None,
        callback_manager: CallbackManager | None = None,
        verbose: bool = False,
    ) -> None:
        super().__init__(callback_manager=callback_manager, verbose=verbose)
        self.source = _source(source, api_key, timeout, searcher_options)
        self.similarity_top_k, self.budget = similarity_top_k, budget
        self.filters, self.ids = filters, ids
        self.method, self.rounds, self.seed = method, rounds, seed

    def _options(self) -> dict[str, Any]:
        fields = self.source.fields if self.filters is not None else None
        return {
            "k": self.similarity_top_k,
            "budget": self.budget,
            "filter": translate(self.filters, fields),
            "ids": self.ids,
            "method": self.method,
            "rounds": self.rounds,
            "seed": self.seed,
        }

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return [to_node(it) for it in self.source.search(query_bundle.query_str, **self._options())]

    async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        items = await self.source.asearch(query_bundle.query_str, **self._options())
        return [to_node(it) for it in items]


class CrossknnReranker(BaseNodePostprocessor):
    """Orders nodes by the CE's score against the query (best first, the best ``top_n``;
    None: all): the index's CE locally, ``/rerank`` on a server. ``source`` as
    :class:`CrossknnRetriever`'s."""

    top_n: int | None = Field(default=None, description="nodes kept (None: all)")
    _source: Source = PrivateAttr()

    def __init__(
        self,
        source: Any,
        *,
        top_n: int | None = None,
        api_key: str | None = None,
        timeout: float = 60.0,
        searcher_options: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(top_n=top_n)
        self._source = _source(source, api_key, timeout, searcher_options)

    @classmethod
    def class_name(cls) -> str:
        return "CrossknnReranker"

    def _ranked(self, nodes: list[NodeWithScore], order) -> list[NodeWithScore]:
        keep = order if self.top_n is None else order[: self.top_n]
        return [NodeWithScore(node=nodes[i].node, score=s) for i, s in keep]

    @staticmethod
    def _query(query_bundle: QueryBundle | None) -> str:
        if query_bundle is None:
            raise ValueError("CrossknnReranker needs the query: pass query_bundle or query_str")
        return query_bundle.query_str

    def _postprocess_nodes(
        self, nodes: list[NodeWithScore], query_bundle: QueryBundle | None = None
    ) -> list[NodeWithScore]:
        texts = [n.node.get_content() for n in nodes]
        return self._ranked(nodes, self._source.rerank(self._query(query_bundle), texts))

    async def _apostprocess_nodes(
        self, nodes: list[NodeWithScore], query_bundle: QueryBundle | None = None
    ) -> list[NodeWithScore]:
        texts = [n.node.get_content() for n in nodes]
        order = await self._source.arerank(self._query(query_bundle), texts)
        return self._ranked(nodes, order)
