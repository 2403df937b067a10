"""The client of ``crossknn serve`` (httpx): every ``/search`` and ``/rerank`` field, the API key,
a bounded retry of ``429`` after its ``Retry-After``, one typed error, and an async twin::

    from crossknn import client
    out = client.search("http://127.0.0.1:8080", "parse a date string", k=10, budget=100,
                        filter={"lang": "en"})
    out["hits"][0]["results"]        # [{"rank": 1, "id": ..., "score": ...}, ...]

    with client.Client("http://127.0.0.1:8080", api_key="...") as c:     # one connection pool
        c.search(["q1", "q2"], k=5, budget=50, filter=[{"lang": "en"}, None])  # per query
        c.rerank("a query", ["text a", "text b"], top_n=1)

    async with client.AsyncClient(url) as c:
        out = await c.search("parse a date string")

The answers are the server's JSON as it came (fields a newer server adds pass through). The key is
``api_key=`` or else ``$CROSSKNN_API_KEY`` (sent as ``Authorization: Bearer``). A ``429`` with a
``Retry-After`` of at most ``max_retry_wait`` seconds is sent again after that wait, at most
``retries`` times; any other non-200 answer (and the last 429) raises :class:`ServeError` with
the status, the server's message and the ``loc`` of the field it names. A list of filters (or of
id lists), one per query, is sent as one request per distinct (filter, ids), and the hits come
back in the order of the queries.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "API_KEY_ENV",
    "AsyncClient",
    "Client",
    "ServeError",
    "health",
    "info",
    "rerank",
    "rerank_body",
    "search",
    "search_body",
    "wait_ready",
]

API_KEY_ENV = "CROSSKNN_API_KEY"
RETRIES = 2  # times a 429 is sent again
MAX_RETRY_WAIT = 30.0  # the longest Retry-After (seconds) waited for; longer: raised at once


class ServeError(RuntimeError):
    """A non-200 answer of the server, in one line (``HTTP 422 at body.filter.lang2: unknown
    field 'lang2' ...``).

    Attributes: ``status`` (the HTTP code), ``detail`` (the server's ``detail`` as it came: a
    FastAPI list of ``{loc, msg, type}``, a string or an object), ``message`` (the server's
    message: the first ``msg``, or the text), ``loc`` (the first error's ``loc`` as a tuple, such
    as ``("body", "filter", "lang2")``; None without one) and ``retry_after`` (seconds, from the
    ``Retry-After`` header of a 429 or 503; None without one)."""

    def __init__(self, status: int, detail: Any, retry_after: float | None = None) -> None:
        self.status, self.detail, self.retry_after = status, detail, retry_after
        self.loc: tuple | None = None
        if isinstance(detail, list) and detail and isinstance(detail[0], Mapping):
            first = detail[0]
            self.message = str(first.get("msg", ""))
            loc = first.get("loc")
            self.loc = tuple(loc) if isinstance(loc, (list, tuple)) else None
        elif isinstance(detail, str):
            self.message = detail
        else:
            self.message = json.dumps(detail, ensure_ascii=False)
        where = "" if not self.loc else " at " + ".".join(str(x) for x in self.loc)
        text = " ".join(self.message.split())  # one line
        super().__init__(f"HTTP {status}{where}: {text}")


def _retry_after(headers) -> float | None:
    raw = headers.get("retry-after")
    try:
        value = float(raw) if raw is not None else None
    except ValueError:  # an HTTP date: not sent by crossknn serve
        return None
    return value if value is not None and value >= 0 else None


def _check(resp) -> Any:
    if resp.status_code == 200:
        return resp.json()
    try:
        body = resp.json()
        detail = body.get("detail", body) if isinstance(body, dict) else body
    except ValueError:
        detail = resp.text
    raise ServeError(resp.status_code, detail, _retry_after(resp.headers))


def _api_key(api_key: str | None) -> str | None:
    key = api_key if api_key is not None else os.environ.get(API_KEY_ENV)
    return key.strip() if key and key.strip() else None


def search_body(
    query: str | Sequence[str],
    *,
    k: int = 10,
    budget: int = 100,
    method: str | None = None,
    rounds: int | None = None,
    exact: bool = False,
    seed: int = 0,
    filter: Mapping[str, Any] | None = None,
    ids: Sequence[str] | None = None,
    return_documents: bool = False,
    return_metadata: bool = False,
    target_recall: float | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """The JSON body of ``POST /search`` (one filter and one id list for all its queries);
    None fields are left out (the server's defaults); ``extra``: fields a newer server takes,
    sent as given (a server that does not know one answers 422 naming it)."""
    body: dict[str, Any] = {"k": k, "budget": budget, "exact": exact, "seed": seed}
    if isinstance(query, str):
        body["query"] = query
    else:
        body["queries"] = list(query)
    for name, value in (("method", method), ("rounds", rounds), ("target_recall", target_recall)):
        if value is not None:
            body[name] = value
    if filter is not None:
        body["filter"] = dict(filter)
    if ids is not None:
        if isinstance(ids, str):
            raise TypeError(f"ids must be a list of item ids; got the string {ids[:40]!r}")
        body["ids"] = list(ids)
    if return_documents:
        body["return_documents"] = True
    if return_metadata:
        body["return_metadata"] = True
    body.update({name: value for name, value in extra.items() if value is not None})
    return body


def rerank_body(
    query: str,
    texts: Sequence[str] | None = None,
    *,
    documents: Sequence[str] | None = None,
    top_n: int | None = None,
    top_k: int | None = None,
    return_documents: bool | None = None,
    return_text: bool | None = None,
    raw_scores: bool | None = None,
    truncate: bool | None = None,
    model: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """The JSON body of ``POST /rerank``: ``texts`` (TEI; the answer is a list of ``{index,
    score, text?}``) or ``documents`` (Cohere; the answer is ``{results: [...]}``); None fields
    are left out."""
    body: dict[str, Any] = {"query": query}
    if texts is not None:
        if isinstance(texts, str):
            raise TypeError("texts must be a list of strings; got one string")
        body["texts"] = list(texts)
    if documents is not None:
        body["documents"] = list(documents)
    for name, value in (
        ("top_n", top_n),
        ("top_k", top_k),
        ("return_documents", return_documents),
        ("return_text", return_text),
        ("raw_scores", raw_scores),
        ("truncate", truncate),
        ("model", model),
        *extra.items(),
    ):
        if value is not None:
            body[name] = value
    return body


def _per_query(queries, filter, ids) -> list[tuple[list[int], Any, Any]] | None:
    """Requests for per-query filters / id lists: ``[(positions, filter, ids)]`` in first-seen
    order, one per distinct pair; None when one filter and one id list serve every query."""
    per_filter = isinstance(filter, (list, tuple))
    per_ids = isinstance(ids, (list, tuple)) and bool(ids) and not isinstance(ids[0], str)
    if not per_filter and not per_ids:
        return None
    if isinstance(queries, str):
        raise TypeError("a list of filters or of id lists needs a list of queries (one each)")
    n = len(queries)
    for name, given, per in (("filter", filter, per_filter), ("ids", ids, per_ids)):
        if per and len(given) != n:
            raise ValueError(f"{name}: {len(given)} entries for {n} queries; give one per query")
    groups: dict[str, tuple[list[int], Any, Any]] = {}
    for i in range(n):
        f = filter[i] if per_filter else filter
        d = ids[i] if per_ids else ids
        key = json.dumps([f, d], sort_keys=True, default=list)
        groups.setdefault(key, ([], f, d))[0].append(i)
    return list(groups.values())


def _merge(n: int, parts: list[tuple[list[int], dict]]) -> dict[str, Any]:
    """One answer from the answers of the per-filter requests: the first one's fields, the hits
    in the order of the queries (each ``qid`` its position, "1", "2", ..., as one request of
    all the queries numbers them)."""
    hits: list[Any] = [None] * n
    for positions, out in parts:
        for i, h in zip(positions, out["hits"], strict=True):
            hits[i] = {**h, "qid": str(i + 1)} if isinstance(h, dict) and "qid" in h else h
    return {**parts[0][1], "hits": hits}


class _Base:
    def __init__(
        self,
        url: str,
        *,
        api_key: str | None = None,
        timeout: float = 60.0,
        retries: int = RETRIES,
        max_retry_wait: float = MAX_RETRY_WAIT,
        http: Any = None,
    ) -> None:
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ValueError(f"url must start with http:// or https://; got {url!r}")
        if retries < 0:
            raise ValueError(f"retries must be >= 0; got {retries}")
        self.url = url.rstrip("/")
        self.timeout = float(timeout)
        self.retries, self.max_retry_wait = int(retries), float(max_retry_wait)
        key = _api_key(api_key)
        self.headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._http, self._own = http, http is None
        self.retried = 0  # 429s sent again (all calls)

    def __repr__(self) -> str:
        key = ", api_key=***" if self.headers else ""
        return f"{type(self).__name__}({self.url!r}{key})"

    def _wait(self, resp, attempt: int) -> float | None:
        """Seconds to wait before sending a 429'd request again; None: raise it."""
        if resp.status_code != 429 or attempt >= self.retries:
            return None
        wait = _retry_after(resp.headers)
        if wait is None or wait > self.max_retry_wait:  # no Retry-After: retrying cannot help
            return None
        self.retried += 1
        return wait


class Client(_Base):
    """A connection pool to one server (``http=``: an ``httpx.Client`` of yours, kept open).

    Args:
        url: the server, ``http://host:port``.
        api_key: the key of a server started with ``--api-key-file`` (default:
            ``$CROSSKNN_API_KEY``; none when unset).
        timeout: seconds per request.
        retries: how many times a ``429`` is sent again after its ``Retry-After``.
        max_retry_wait: a longer ``Retry-After`` raises at once.
        http: an ``httpx.Client`` to send with (its headers and transport are used).
    """

    @property
    def http(self):
        if self._http is None:
            # httpx: optional (serve extra): crossknn.client only
            import httpx

            self._http = httpx.Client(timeout=self.timeout)
        return self._http

    def close(self) -> None:
        if self._own and self._http is not None:
            self._http.close()
            self._http = None

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def request(self, method: str, path: str, body: Any = None) -> Any:
        """``method`` ``path`` with the JSON ``body``: the answer's JSON, 429 retried."""
        attempt = 0
        while True:
            resp = self.http.request(
                method,
                self.url + path,
                json=body,
                headers=self.headers,
                timeout=self.timeout,
            )
            wait = self._wait(resp, attempt)
            if wait is None:
                return _check(resp)
            time.sleep(wait)
            attempt += 1

    def search(self, query: str | Sequence[str], **fields: Any) -> dict[str, Any]:
        """``POST /search``: one query (a string) or several (a list); ``fields`` as
        :func:`search_body` takes them (``filter`` and ``ids`` may also be lists, one per
        query)."""
        groups = _per_query(query, fields.get("filter"), fields.get("ids"))
        if groups is None:
            return self.request("POST", "/search", search_body(query, **fields))
        parts = []
        for positions, f, d in groups:
            body = search_body([query[i] for i in positions], **{**fields, "filter": f, "ids": d})
            parts.append((positions, self.request("POST", "/search", body)))
        return _merge(len(query), parts)

    def rerank(self, query: str, texts: Sequence[str] | None = None, **fields: Any) -> Any:
        """``POST /rerank``: the texts by CE score, best first (``fields`` as
        :func:`rerank_body` takes them)."""
        return self.request("POST", "/rerank", rerank_body(query, texts, **fields))

    def info(self) -> dict[str, Any]:
        """``GET /info``: index size, metadata fields, models and hashes, limits."""
        return self.request("GET", "/info")

    def health(self) -> bool:
        """True if ``GET /readyz`` says ready."""
        try:
            self.request("GET", "/readyz")
            return True
        except ServeError:
            return False


class AsyncClient(_Base):
    """:class:`Client`'s twin for asyncio (``httpx.AsyncClient``); the same arguments and
    answers, each method a coroutine."""

    @property
    def http(self):
        if self._http is None:
            # httpx: optional (serve extra): crossknn.client only
            import httpx

            self._http = httpx.AsyncClient(timeout=self.timeout)
        return self._http

    async def aclose(self) -> None:
        if self._own and self._http is not None:
            await self._http.aclose()
            self._http = None

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()

    async def request(self, method: str, path: str, body: Any = None) -> Any:
        attempt = 0
        while True:
            resp = await self.http.request(
                method,
                self.url + path,
                json=body,
                headers=self.headers,
                timeout=self.timeout,
            )
            wait = self._wait(resp, attempt)
            if wait is None:
                return _check(resp)
            await asyncio.sleep(wait)
            attempt += 1

    async def search(self, query: str | Sequence[str], **fields: Any) -> dict[str, Any]:
        groups = _per_query(query, fields.get("filter"), fields.get("ids"))
        if groups is None:
            return await self.request("POST", "/search", search_body(query, **fields))
        bodies = [
            search_body([query[i] for i in pos], **{**fields, "filter": f, "ids": d})
            for pos, f, d in groups
        ]
        outs = await asyncio.gather(*(self.request("POST", "/search", b) for b in bodies))
        return _merge(len(query), [(g[0], o) for g, o in zip(groups, outs, strict=True)])

    async def rerank(self, query: str, texts: Sequence[str] | None = None, **fields: Any) -> Any:
        return await self.request("POST", "/rerank", rerank_body(query, texts, **fields))

    async def info(self) -> dict[str, Any]:
        return await self.request("GET", "/info")

    async def health(self) -> bool:
        try:
            await self.request("GET", "/readyz")
            return True
        except ServeError:
            return False


def _one_call(url: str, options: dict, call):
    http = options.pop("http", None)
    c = Client(url, http=http, **options)
    try:
        return call(c)
    finally:
        c.close()


def search(
    url: str,
    query: str | Sequence[str],
    *,
    k: int = 10,
    budget: int = 100,
    method: str | None = None,
    rounds: int | None = None,
    exact: bool = False,
    seed: int = 0,
    filter: Mapping[str, Any] | Sequence[Mapping[str, Any] | None] | None = None,
    ids: Sequence[str] | Sequence[Sequence[str] | None] | None = None,
    return_documents: bool = False,
    return_metadata: bool = False,
    target_recall: float | None = None,
    api_key: str | None = None,
    timeout: float = 60.0,
    retries: int = RETRIES,
    http: Any = None,
    **extra: Any,
) -> dict[str, Any]:
    """``POST {url}/search``: one query (a string) or several (a list). ``method`` and
    ``rounds`` None: the server's defaults (its ``--method``, else the index's default path);
    ``filter``: a JSON filter on the items' metadata (docs: Filtered search) or a list of them,
    one per query; ``ids``: an id allow-list (or one per query); ``return_documents``: each
    result also carries its item's ``text`` (``return_metadata``: its metadata fields);
    ``target_recall``: stop a query early once its top-k is likely found (auto on a calibrated
    index; the budget stays the ceiling); ``extra``: fields a newer server takes, sent as
    given. Raises :class:`ServeError` on a non-200 answer."""
    fields = {
        "k": k,
        "budget": budget,
        "method": method,
        "rounds": rounds,
        "exact": exact,
        "seed": seed,
        "filter": filter,
        "ids": ids,
        "return_documents": return_documents,
        "return_metadata": return_metadata,
        "target_recall": target_recall,
        **extra,
    }
    opts = {"api_key": api_key, "timeout": timeout, "retries": retries, "http": http}
    return _one_call(url, opts, lambda c: c.search(query, **fields))


def rerank(
    url: str,
    query: str,
    texts: Sequence[str] | None = None,
    *,
    api_key: str | None = None,
    timeout: float = 60.0,
    retries: int = RETRIES,
    http: Any = None,
    **fields: Any,
) -> Any:
    """``POST {url}/rerank``: the texts by CE score, best first (TEI's list of ``{index, score,
    text?}``; Cohere's ``{results}`` with ``documents=``); ``fields``: :func:`rerank_body`'s."""
    opts = {"api_key": api_key, "timeout": timeout, "retries": retries, "http": http}
    return _one_call(url, opts, lambda c: c.rerank(query, texts, **fields))


def info(
    url: str, *, api_key: str | None = None, timeout: float = 10.0, http: Any = None
) -> dict[str, Any]:
    """``GET {url}/info``: index size, models and hashes, precision, provider, limits."""
    return _one_call(url, {"api_key": api_key, "timeout": timeout, "http": http}, Client.info)


def health(url: str, *, timeout: float = 5.0, http: Any = None) -> bool:
    """True if ``GET {url}/readyz`` says ready."""
    return _one_call(url, {"timeout": timeout, "http": http}, Client.health)


def wait_ready(url: str, *, timeout: float = 120.0, interval: float = 0.1) -> float:
    """Poll ``/readyz`` until ready (returns the seconds waited); ``TimeoutError`` after
    ``timeout``. Connection errors (server not listening yet) are retried."""
    # httpx: optional (serve extra): crossknn.client only
    import httpx

    t0 = time.monotonic()
    while True:
        try:
            if health(url, timeout=min(5.0, timeout)):
                return time.monotonic() - t0
        except httpx.TransportError:
            pass
        if time.monotonic() - t0 > timeout:
            raise TimeoutError(f"{url} not ready after {timeout:.0f} s")
        time.sleep(interval)
