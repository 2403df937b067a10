"""A small client for ``crossknn serve`` (httpx)::

    from crossknn import client
    out = client.search("http://127.0.0.1:8080", "parse a date string", k=10, budget=100)
    out["hits"][0]["results"]        # [{"id": ..., "score": ...}, ...]

The answer is the JSON of ``crossknn search --json``. Errors raise :class:`ServeError` with the
status code and the server's ``detail``; pass ``http=`` an ``httpx.Client`` to reuse connections.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

__all__ = ["ServeError", "health", "info", "search", "wait_ready"]


class ServeError(RuntimeError):
    """A non-200 answer: ``status``, ``detail`` and ``retry_after`` (seconds, for 429/503)."""

    def __init__(self, status: int, detail: Any, retry_after: float | None = None) -> None:
        super().__init__(f"HTTP {status}: {detail}")
        self.status, self.detail, self.retry_after = status, detail, retry_after


def _client(http, timeout: float):
    # httpx: optional (serve extra)
    import httpx

    return (http, False) if http is not None else (httpx.Client(timeout=timeout), True)


def _check(resp) -> Any:
    if resp.status_code == 200:
        return resp.json()
    try:
        detail = resp.json().get("detail")
    except ValueError:
        detail = resp.text
    ra = resp.headers.get("retry-after")
    raise ServeError(resp.status_code, detail, float(ra) if ra and ra.isdigit() else None)


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
    timeout: float = 60.0,
    http=None,
) -> dict[str, Any]:
    """``POST {url}/search``: one query (a string) or several (a list); ``method`` and
    ``rounds`` None: the server's defaults (its ``--method``, else the index's default path)."""
    body: dict[str, Any] = {"k": k, "budget": budget, "exact": exact, "seed": seed}
    if method is not None:
        body["method"] = method
    if isinstance(query, str):
        body["query"] = query
    else:
        body["queries"] = list(query)
    if rounds is not None:
        body["rounds"] = rounds
    c, own = _client(http, timeout)
    try:
        return _check(c.post(url.rstrip("/") + "/search", json=body))
    finally:
        if own:
            c.close()


def _get(url: str, path: str, timeout: float, http=None) -> Any:
    c, own = _client(http, timeout)
    try:
        return _check(c.get(url.rstrip("/") + path))
    finally:
        if own:
            c.close()


def info(url: str, *, timeout: float = 10.0, http=None) -> dict[str, Any]:
    """``GET {url}/info``: index size, models and hashes, precision, provider, limits."""
    return _get(url, "/info", timeout, http)


def health(url: str, *, timeout: float = 5.0, http=None) -> bool:
    """True if ``GET {url}/readyz`` says ready."""
    try:
        _get(url, "/readyz", timeout, http)
        return True
    except ServeError:
        return False


def wait_ready(url: str, *, timeout: float = 120.0, interval: float = 0.1) -> float:
    """Poll ``/readyz`` until ready (returns the seconds waited); ``TimeoutError`` after
    ``timeout``. Connection errors (server not listening yet) are retried."""
    # httpx: optional (serve extra)
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
