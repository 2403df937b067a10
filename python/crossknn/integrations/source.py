"""Where the framework adapters search and rerank: a local index (a folder, an opened index or a
``Searcher``) or a ``crossknn serve`` URL. Each search is one ``Searcher.search`` call or one
``/search`` request (:mod:`crossknn.client`), each rerank one ``ce.predict`` call or one
``/rerank`` request; the adapters only translate what goes in and what comes out.
"""

from __future__ import annotations

import asyncio
import os
import threading
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from crossknn import client as _client
from crossknn.searcher import Searcher

__all__ = ["Item", "Source", "missing_framework"]

# the /search field that adds each result's metadata fields, on a server that has it (its
# /openapi.json lists it); without it, a server source's documents carry no metadata fields
METADATA_FIELD = "return_metadata"


def missing_framework(module: str, extra: str) -> ImportError:
    """The one-line error of an adapter whose framework is not installed."""
    return ImportError(
        f"crossknn.integrations.{module} needs the {extra} extra: pip install 'crossknn[{extra}]'"
    )


@dataclass
class Item:
    """One result: the item's id, its CE score, rank (1 = best), text and metadata fields."""

    id: str
    score: float
    rank: int
    text: str
    metadata: dict[str, Any] = field(default_factory=dict)


def is_url(where: Any) -> bool:
    return isinstance(where, str) and where.startswith(("http://", "https://"))


class Source:
    """A local index or a server, searched and reranked the same way.

    Args:
        where: an index folder, a ``CorpusIndex`` (:func:`crossknn.open_index`), a
            :class:`crossknn.Searcher`, or a server URL (``http://host:port``).
        api_key: the server's key (default: ``$CROSSKNN_API_KEY``); URL only.
        timeout: seconds per request; URL only.
        searcher_options: keywords of :class:`crossknn.Searcher` for a folder or an index.
    """

    def __init__(
        self,
        where: Any,
        *,
        api_key: str | None = None,
        timeout: float = 60.0,
        searcher_options: Mapping[str, Any] | None = None,
    ) -> None:
        self.where = where
        self.url: str | None = where.rstrip("/") if is_url(where) else None
        self._fields: dict[str, str] | None = None
        self._sends_metadata: bool | None = None  # the server takes METADATA_FIELD (asked once)
        self._lock = threading.Lock()  # one search at a time on a local Searcher
        if self.url is not None:
            self.api_key, self.timeout = api_key, float(timeout)
            self.client = _client.Client(self.url, api_key=api_key, timeout=timeout)
            weakref.finalize(self, self.client.close)  # its connections, when the source goes
            self.searcher = None
        else:
            if isinstance(where, Searcher):
                self.searcher = where
            elif isinstance(where, (str, os.PathLike)) or hasattr(where, "metadata"):
                self.searcher = Searcher(where, **dict(searcher_options or {}))
            else:
                raise TypeError(
                    "expected an index folder, an opened index, a crossknn.Searcher or a server "
                    f"URL (http://host:port); got {type(where).__name__}"
                )
            self.client = None

    def __repr__(self) -> str:
        return f"Source({self.url!r})" if self.url else f"Source({self.searcher!r})"

    @property
    def fields(self) -> dict[str, str]:
        """The metadata fields a filter may name (name -> kind: string, strings, number, date,
        bool); from the server's ``/info`` once."""
        if self._fields is None:
            if self.searcher is not None:
                self._fields = dict(self.searcher.index.metadata.fields)
            else:
                idx = self.client.info().get("index") or {}
                self._fields = dict(idx.get("metadata_fields") or {})
        return self._fields

    # -- search ---------------------------------------------------------------------------------
    def search(self, query: str, **options: Any) -> list[Item]:
        """The top-k items of ``query`` (``options``: ``Searcher.search``'s and ``/search``'s:
        k, budget, method, rounds, seed, filter, ids ...; None: the default)."""
        opts = _options(options)
        if self.client is not None:
            if self._sends_metadata is None:
                self._sends_metadata = _takes_metadata(_spec(self.client.request))
            if self._sends_metadata:
                opts[METADATA_FIELD] = True
            out = self.client.search(query, return_documents=True, **opts)
            return remote_items(out)
        with self._lock:
            hits = self.searcher.search(query, return_documents=True, **opts)
        return self.local_items(hits)

    async def asearch(self, query: str, **options: Any) -> list[Item]:
        opts = _options(options)
        if self.client is None:
            return await asyncio.to_thread(self.search, query, **opts)
        async with _client.AsyncClient(self.url, api_key=self.api_key, timeout=self.timeout) as c:
            if self._sends_metadata is None:
                self._sends_metadata = _takes_metadata(await _aspec(c.request))
            if self._sends_metadata:
                opts[METADATA_FIELD] = True
            out = await c.search(query, return_documents=True, **opts)
        return remote_items(out)

    def local_items(self, hits) -> list[Item]:
        columns = self.searcher.index.metadata.columns
        out = []
        for r, (iid, pos, score, text) in enumerate(
            zip(hits.ids, hits.indices.tolist(), hits.scores.tolist(), hits.texts, strict=True),
            start=1,
        ):
            meta = {}
            for name, col in columns.items():
                v = col.value(pos)
                if v is not None:
                    meta[name] = v
            out.append(Item(iid, score, r, text, meta))
        return out

    # -- rerank ---------------------------------------------------------------------------------
    def rerank(self, query: str, texts: Sequence[str]) -> list[tuple[int, float]]:
        """``(position in texts, CE score)`` of every text, best first (ties: the earlier
        text first), as ``/rerank`` orders them."""
        texts = list(texts)
        if not texts:
            return []
        if self.client is not None:
            return [(r["index"], r["score"]) for r in self.client.rerank(query, texts)]
        with self._lock:
            scores = self.searcher.ce.predict([(query, t) for t in texts])
        return _order([float(s) for s in scores])

    async def arerank(self, query: str, texts: Sequence[str]) -> list[tuple[int, float]]:
        texts = list(texts)
        if self.client is None or not texts:
            return await asyncio.to_thread(self.rerank, query, texts)
        async with _client.AsyncClient(self.url, api_key=self.api_key, timeout=self.timeout) as c:
            out = await c.rerank(query, texts)
        return [(r["index"], r["score"]) for r in out]

    def close(self) -> None:
        if self.client is not None:
            self.client.close()


def _options(options: Mapping[str, Any]) -> dict[str, Any]:
    """The options given (None: the default), passed on as they are: an option a newer
    ``Searcher.search`` or server takes goes through; an unknown one is refused there."""
    return {k: v for k, v in options.items() if v is not None}


def _spec(request) -> Any:
    try:
        return request("GET", "/openapi.json")
    except _client.ServeError:  # no schema served: take the fields every server has
        return None


async def _aspec(request) -> Any:
    try:
        return await request("GET", "/openapi.json")
    except _client.ServeError:
        return None


def _takes_metadata(spec: Any) -> bool:
    """Whether the server's ``/search`` takes :data:`METADATA_FIELD` (its OpenAPI schema)."""
    try:
        body = spec["paths"]["/search"]["post"]["requestBody"]["content"]["application/json"]
        return METADATA_FIELD in body["schema"]["properties"]
    except (KeyError, TypeError):
        return False


def _order(scores: list[float]) -> list[tuple[int, float]]:
    return sorted(enumerate(scores), key=lambda p: -p[1])  # stable: ties keep their order


def remote_items(out: Mapping[str, Any]) -> list[Item]:
    """The items of a ``/search`` answer of one query (with ``return_documents``); a result's
    ``metadata`` object, when the server sends one, is its metadata; fields this code does not
    know are left alone."""
    hits = out["hits"][0]
    items = []
    for r, row in enumerate(hits["results"], start=1):
        meta = row.get("metadata")
        items.append(
            Item(
                row["id"],
                float(row["score"]),
                int(row.get("rank", r)),
                row.get("text") or "",
                dict(meta) if isinstance(meta, Mapping) else {},
            )
        )
    return items
