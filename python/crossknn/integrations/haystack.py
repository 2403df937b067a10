"""crossknn in Haystack 2 (``pip install 'crossknn[haystack]'``)::

    from haystack import Pipeline
    from crossknn.integrations.haystack import CrossknnRanker, CrossknnRetriever
    pipe = Pipeline()
    pipe.add_component("retriever", CrossknnRetriever("INDEX_DIR", top_k=5))   # or a URL
    pipe.add_component("ranker", CrossknnRanker("INDEX_DIR", top_k=3))
    pipe.connect("retriever.documents", "ranker.documents")
    filters = {"field": "meta.lang", "operator": "==", "value": "en"}
    pipe.run({"retriever": {"query": q, "filters": filters}, "ranker": {"query": q}})

:class:`CrossknnRetriever` is a ``@component`` (``run(query, filters, top_k, budget)`` ->
``{"documents": [...]}``): each ``Document`` has the item's id, text (``content``), CE score
and metadata fields (``meta``, with ``rank``). Filters are Haystack's
(:mod:`crossknn.integrations.haystack_filters`), combined with the init filters by the
``filter_policy``. :class:`CrossknnRanker` orders documents by the CE's score (``/rerank`` on a
server). Both round-trip through ``to_dict``/``from_dict`` (a saved ``Pipeline``); the API key
is a Haystack ``Secret`` (default: the ``CROSSKNN_API_KEY`` variable, when set), never written
out. A local index opens its models in ``warm_up`` (or at the first run).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from crossknn.client import API_KEY_ENV
from crossknn.integrations.haystack_filters import translate
from crossknn.integrations.source import Item, Source, missing_framework

try:
    from haystack import Document, component, default_from_dict, default_to_dict
    from haystack.document_stores.types import FilterPolicy, apply_filter_policy
    from haystack.utils import Secret
except ModuleNotFoundError as exc:  # the extra is not installed: one line naming it
    if (exc.name or "").split(".")[0] == "haystack":
        raise missing_framework("haystack", "haystack") from None
    raise

__all__ = ["CrossknnRanker", "CrossknnRetriever", "to_document"]


def _default_key() -> Secret:
    return Secret.from_env_var(API_KEY_ENV, strict=False)


def to_document(item: Item) -> Document:
    """A Haystack ``Document`` of one result."""
    meta = {**item.metadata, "rank": item.rank}
    return Document(id=item.id, content=item.text, meta=meta, score=item.score)


class _Sourced:
    """What the two components share: the source, opened at ``warm_up`` or first use."""

    source: Any
    api_key: Secret | None
    timeout: float
    searcher_options: dict[str, Any] | None
    _source: Source | None

    def _set_source(self, source, api_key, timeout, searcher_options) -> None:
        self.source = source
        self.api_key = api_key if api_key is not None else _default_key()
        self.timeout, self.searcher_options = float(timeout), searcher_options
        self._source = None

    def _to_dict(self, **own: Any) -> dict[str, Any]:
        """``default_to_dict`` of the component: the source, its own fields, then the key,
        timeout and searcher options."""
        return default_to_dict(
            self,
            source=self._saved_source(),
            **own,
            api_key=self.api_key,
            timeout=self.timeout,
            searcher_options=self.searcher_options,
        )

    def warm_up(self) -> None:
        if self._source is None:
            key = self.api_key.resolve_value() if self.api_key is not None else None
            self._source = (
                self.source
                if isinstance(self.source, Source)
                else Source(
                    self.source,
                    api_key=key,
                    timeout=self.timeout,
                    searcher_options=self.searcher_options,
                )
            )

    def _opened(self) -> Source:
        self.warm_up()
        return self._source

    def _saved_source(self) -> str:
        if isinstance(self.source, os.PathLike):
            return os.fspath(self.source)
        if not isinstance(self.source, str):
            raise TypeError(
                f"{type(self).__name__}.to_dict: a {type(self.source).__name__} cannot be saved; "
                "give the component an index folder or a server URL"
            )
        return self.source


@component
class CrossknnRetriever(_Sourced):
    """Top-k items by exact CE score from a crossknn index or server.

    Args:
        source: an index folder or a server URL (``http://host:port``); also a
            ``crossknn.Searcher`` (not saved by ``to_dict``).
        filters: Haystack filters applied to every run (see ``filter_policy``).
        top_k: items returned.
        budget: CE calls per query.
        method, rounds, seed: ``Searcher.search``'s (None: the defaults).
        filter_policy: ``REPLACE`` (a run's filters replace the init filters) or ``MERGE``.
        api_key: a server's key (default: ``$CROSSKNN_API_KEY`` when set).
        timeout: seconds per request to a server.
        searcher_options: ``crossknn.Searcher`` keywords for a local folder.
    """

    def __init__(
        self,
        source: Any,
        *,
        filters: dict[str, Any] | None = None,
        top_k: int = 10,
        budget: int = 100,
        method: str | None = None,
        rounds: int | None = None,
        seed: int | None = None,
        filter_policy: FilterPolicy | str = FilterPolicy.REPLACE,
        api_key: Secret | None = None,
        timeout: float = 60.0,
        searcher_options: dict[str, Any] | None = None,
    ) -> None:
        if top_k <= 0:
            raise ValueError(f"top_k must be > 0; got {top_k}")
        translate(filters)  # a filter with no crossknn equivalent is refused here
        self._set_source(source, api_key, timeout, searcher_options)
        self.filters, self.top_k, self.budget = filters, top_k, budget
        self.method, self.rounds, self.seed = method, rounds, seed
        self.filter_policy = (
            FilterPolicy.from_str(filter_policy)
            if isinstance(filter_policy, str)
            else filter_policy
        )

    def to_dict(self) -> dict[str, Any]:
        return self._to_dict(
            filters=self.filters,
            top_k=self.top_k,
            budget=self.budget,
            method=self.method,
            rounds=self.rounds,
            seed=self.seed,
            filter_policy=self.filter_policy.value,
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CrossknnRetriever:
        return default_from_dict(cls, data)

    def _options(self, filters, top_k, budget) -> dict[str, Any]:
        flt = apply_filter_policy(self.filter_policy, self.filters, filters)
        return {
            "k": top_k or self.top_k,
            "budget": budget or self.budget,
            "filter": translate(flt),
            "method": self.method,
            "rounds": self.rounds,
            "seed": self.seed,
        }

    @component.output_types(documents=list[Document])
    def run(
        self,
        query: str,
        filters: dict[str, Any] | None = None,
        top_k: int | None = None,
        budget: int | None = None,
    ) -> dict[str, list[Document]]:
        """The top-k documents of ``query``; ``filters`` in Haystack's syntax."""
        items = self._opened().search(query, **self._options(filters, top_k, budget))
        return {"documents": [to_document(it) for it in items]}

    @component.output_types(documents=list[Document])
    async def run_async(
        self,
        query: str,
        filters: dict[str, Any] | None = None,
        top_k: int | None = None,
        budget: int | None = None,
    ) -> dict[str, list[Document]]:
        items = await self._opened().asearch(query, **self._options(filters, top_k, budget))
        return {"documents": [to_document(it) for it in items]}


@component
class CrossknnRanker(_Sourced):
    """Orders documents by the CE's score against the query, best first (the best ``top_k``;
    None: all), each with its CE score: the index's CE locally, ``/rerank`` on a server.
    ``source``, ``api_key``, ``timeout``, ``searcher_options`` as :class:`CrossknnRetriever`'s.
    """

    def __init__(
        self,
        source: Any,
        *,
        top_k: int | None = None,
        api_key: Secret | None = None,
        timeout: float = 60.0,
        searcher_options: dict[str, Any] | None = None,
    ) -> None:
        self._set_source(source, api_key, timeout, searcher_options)
        self.top_k = top_k

    def to_dict(self) -> dict[str, Any]:
        return self._to_dict(top_k=self.top_k)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CrossknnRanker:
        return default_from_dict(cls, data)

    def _ranked(self, documents: list[Document], order, top_k) -> list[Document]:
        n = top_k if top_k is not None else self.top_k
        keep = order if n is None else order[:n]
        return [dataclasses.replace(documents[i], score=s) for i, s in keep]

    @component.output_types(documents=list[Document])
    def run(
        self, query: str, documents: list[Document], top_k: int | None = None
    ) -> dict[str, list[Document]]:
        """``documents`` by the CE's score against ``query``, best first."""
        order = self._opened().rerank(query, [d.content or "" for d in documents])
        return {"documents": self._ranked(documents, order, top_k)}

    @component.output_types(documents=list[Document])
    async def run_async(
        self, query: str, documents: list[Document], top_k: int | None = None
    ) -> dict[str, list[Document]]:
        order = await self._opened().arerank(query, [d.content or "" for d in documents])
        return {"documents": self._ranked(documents, order, top_k)}
