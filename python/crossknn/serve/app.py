"""The FastAPI app of ``crossknn serve``: ``/search``, ``/rerank``, ``/healthz``, ``/readyz``,
``/metrics``, ``/info`` (and FastAPI's ``/docs`` and ``/openapi.json``).

Status codes of ``POST /search``: 200 the answer of ``crossknn search --json``; 413 a body over
``max_body_bytes``; 422 malformed JSON (nested too deeply included), a text that is not valid
Unicode or a field out of range (``detail`` names it); 429 at once, with ``Retry-After``, when the
queue is full or the request is not expected to be answered within its deadline (see
:mod:`crossknn.serve.admission`); 503 still loading; 504 over ``timeout_s`` (its pending CE work is
dropped; admission makes this rare); 500 anything unexpected (logged; the server keeps running).
A client that goes away, mid-body or mid-request, gets its CE work dropped too (counted as 499).
``/rerank`` answers the same codes; 403 is ``"exact": true`` in /search on a server started
without ``--allow-exact``; 401 a missing or wrong key with ``--api-key-file``.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import os
import socket
import time
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.requests import ClientDisconnect

import crossknn
from crossknn.serve.batcher import Cancelled
from crossknn.serve.metrics import CONTENT_TYPE_LATEST, Metrics
from crossknn.serve.schema import (
    CohereRerankResponse,
    RequestError,
    RerankRequest,
    RerankResult,
    SearchRequest,
    SearchResponse,
    parse_rerank_request,
    parse_search_request,
)
from crossknn.serve.service import SearchService, ServeConfig

__all__ = ["create_app"]

log = logging.getLogger("crossknn.serve")

_PATHS = (
    "/search",
    "/rerank",
    "/healthz",
    "/readyz",
    "/metrics",
    "/info",
    "/docs",
    "/openapi.json",
)
CLIENT_GONE = 499  # nginx's code for "client closed request"; never reaches the client


class _StatusMetrics:
    """Pure ASGI middleware: counts every response by path and status code, and names the
    process that answered (``x-served-by: host:pid``; which replica, behind Ray Serve)."""

    def __init__(self, app, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics
        self.served_by = f"{socket.gethostname()}:{os.getpid()}".encode()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        label = path if path in _PATHS else "other"
        status = {"code": 500}

        async def send_wrapper(message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
                headers = list(message.get("headers", []))
                headers.append((b"x-served-by", self.served_by))
                message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            self.metrics.requests.labels(label, str(status["code"])).inc()


def _error(status: int, detail: Any, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"detail": detail}, status_code=status, headers=headers)


async def _read_body(request: Request, limit: int) -> bytes:
    size = request.headers.get("content-length")
    if size is not None and size.isdigit() and int(size) > limit:
        raise RequestError(
            [{"loc": ["body"], "msg": f"body over {limit} bytes", "type": "too_large"}], 413
        )
    parts, n = [], 0
    async for chunk in request.stream():
        n += len(chunk)
        if n > limit:
            raise RequestError(
                [{"loc": ["body"], "msg": f"body over {limit} bytes", "type": "too_large"}], 413
            )
        parts.append(chunk)
    return b"".join(parts)


async def _client_gone(receive) -> None:
    """Returns when the client disconnects (the body has been read already)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


def _openapi_body(model) -> dict[str, Any]:
    schema = model.model_json_schema()
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": schema}},
        }
    }


_ERRORS: dict[int | str, dict[str, Any]] = {
    413: {"description": "body too large"},
    422: {"description": "malformed JSON or a field out of range (detail names it)"},
    429: {"description": "queue full; retry after Retry-After seconds"},
    503: {"description": "still loading"},
    504: {"description": "over the server's timeout; its CE work was cancelled"},
}


def _ref(model) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{model.__name__}"}


def _add_schemas(app: FastAPI, models) -> None:
    """Put ``models`` (and the models they use) in the OpenAPI components (for ``_ref``)."""
    # fastapi: optional (serve extra)
    from fastapi.openapi.utils import get_openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title,
                version=app.version,
                description=app.description,
                routes=app.routes,
            )
            comps = schema.setdefault("components", {}).setdefault("schemas", {})
            for m in models:
                js = m.model_json_schema(ref_template="#/components/schemas/{model}")
                comps.update(js.pop("$defs", {}))
                comps[m.__name__] = js
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi


class _BearerAuth:
    """Pure ASGI middleware: every path but /healthz and /readyz (and CORS preflights) needs
    ``Authorization: Bearer <key>``; 401 otherwise (constant-time comparison)."""

    OPEN = ("/healthz", "/readyz")

    def __init__(self, app, key: str) -> None:
        self.app = app
        self.key = key.encode()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope.get("path") in self.OPEN:
            await self.app(scope, receive, send)
            return
        given = b""
        for name, value in scope.get("headers", []):
            if name == b"authorization":
                given = value
        scheme, _, token = given.partition(b" ")
        ok = scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self.key)
        if not ok:
            msg = "missing API key" if not given else "wrong API key"
            resp = _error(401, f"{msg}: send 'Authorization: Bearer <key>'")
            resp.headers["WWW-Authenticate"] = "Bearer"
            await resp(scope, receive, send)
            return
        await self.app(scope, receive, send)


def read_api_key(path: str) -> str:
    """The key in ``path`` (its first line, stripped); an error naming the file otherwise."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise ValueError(f"--api-key-file {path}: cannot read it ({exc.strerror})") from None
    key = text.strip().splitlines()[0].strip() if text.strip() else ""
    if not key:
        raise ValueError(f"--api-key-file {path}: the file is empty; expected one API key")
    return key


def create_app(
    config: ServeConfig,
    *,
    service: SearchService | None = None,
    load: str = "background",
    on_load_error=None,
) -> FastAPI:
    """The app. ``load``: ``"background"`` (start loading at startup; ``/readyz`` says when
    done), ``"now"`` (load before returning: Ray Serve replicas) or ``"none"`` (the caller
    does it)."""
    service = service or SearchService(config)
    metrics = service.metrics
    if load == "now":
        service.load()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        if load == "background" and not service.ready.is_set() and service._loader is None:
            service.start_loading(on_error=on_load_error)
        yield
        # uvicorn has drained the in-flight requests by now (SIGTERM: graceful shutdown)
        await asyncio.get_running_loop().run_in_executor(None, service.close)

    app = FastAPI(
        title="crossknn",
        version=crossknn.__version__,
        description="k-NN search with a cross-encoder on a budget of CE calls per query; "
        "CE calls of concurrent requests are merged into shared, length-sorted batches.",
        lifespan=lifespan,
    )
    app.state.service = service
    if config.api_key_file:
        app.add_middleware(_BearerAuth, key=read_api_key(config.api_key_file))
    if config.cors:
        # fastapi: optional (serve extra)
        from fastapi.middleware.cors import CORSMiddleware

        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(config.cors),
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type"],
        )
    app.add_middleware(_StatusMetrics, metrics=metrics)

    @app.get("/healthz", summary="the process is alive")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", summary="the index and the models are loaded")
    async def readyz():
        if service.ready.is_set():
            return {"status": "ready", "n_items": service.n_items}
        if service.load_error is not None:
            return _error(503, {"status": "failed", "error": str(service.load_error)})
        return _error(503, {"status": "loading"}, {"Retry-After": "1"})

    @app.get("/metrics", summary="Prometheus metrics")
    async def metrics_endpoint() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/info", summary="index size, models, hashes, precision, provider, limits")
    async def info() -> dict[str, Any]:
        return service.info()

    async def run_request(request: Request, parse, admit, work, what: str):
        """Shared by /search and /rerank: read and parse the body, admit it, run ``work(req,
        ctx)`` in a request thread under the deadline, drop its CE work if the client leaves."""
        t0 = time.perf_counter()
        try:
            body = await _read_body(request, config.max_body_bytes)
        except ClientDisconnect:  # the client left before sending its whole body
            metrics.disconnects.inc()
            return Response(status_code=CLIENT_GONE)
        except RequestError as exc:
            return _error(exc.status, exc.detail)
        try:
            if not service.ready.is_set():
                return _error(503, "the index and models are still loading", {"Retry-After": "1"})
            req = parse(body)
        except RequestError as exc:
            return _error(exc.status, exc.detail)
        decision = admit(req)
        if not decision.admitted:
            metrics.rejected.inc()
            retry = {"Retry-After": str(decision.retry_after_s)}
            if decision.reason == "queue_full":
                return _error(
                    429, f"queue full ({config.max_queue} requests in flight); retry later", retry
                )
            metrics.rejected_deadline.inc()
            return _error(
                429,
                f"busy: this request is expected to take {decision.expected_s:.1f} s here, over "
                f"{config.admit_within:g} x the {config.timeout_s:g} s limit; retry after "
                f"{decision.retry_after_s} s"
                if decision.expected_s is not None
                else "busy: the service time is not measured yet; retry after 1 s",
                retry,
            )
        ticket = decision.ticket
        ctx = service.new_context()
        loop = asyncio.get_running_loop()
        try:
            fut = loop.run_in_executor(service.executor, work, req, ctx)
        except RuntimeError:  # executor shut down: we are stopping
            service.release(ticket, ctx, failed=True)
            return _error(503, "the server is shutting down", {"Retry-After": "1"})

        def finished(f) -> None:
            service.release(ticket, ctx, failed=f.cancelled() or f.exception() is not None)

        fut.add_done_callback(finished)
        gone = asyncio.ensure_future(_client_gone(request.receive))
        try:
            left = max(ctx.deadline - time.monotonic(), 0.0)
            done, _ = await asyncio.wait(
                {fut, gone}, timeout=left, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            gone.cancel()
        too_long = f"the {what} took longer than {config.timeout_s} s; cancelled"
        if fut not in done:
            reason = "client gone" if gone in done else "timeout"
            ctx.cancel(reason)
            service.admission.cancel(ticket)  # its pending work no longer delays newcomers
            fut.add_done_callback(lambda f: f.exception())  # never "exception never retrieved"
            if gone in done:
                metrics.disconnects.inc()
                return Response(status_code=CLIENT_GONE)
            metrics.timeouts.inc()
            return _error(504, too_long)
        try:
            result = fut.result()
        except Cancelled:
            metrics.timeouts.inc()
            return _error(504, too_long)
        except ValueError as exc:  # what the searcher refuses (checked, but to be safe)
            return _error(422, [{"loc": ["body"], "msg": str(exc), "type": "value_error"}])
        except Exception:
            log.exception("crossknn serve: %s failed", what)
            return _error(500, "internal error (logged)")
        metrics.latency.observe(time.perf_counter() - t0)
        return JSONResponse(result, headers={"Server-Timing": ctx.server_timing(t0)})

    def parse_search(body: bytes) -> SearchRequest:
        req = parse_search_request(
            body,
            n_items=service.n_items,
            has_cur=service.has_cur,
            max_rounds=config.max_rounds,
            indexes=service.index_kinds,
        )
        if req.exact and not config.allow_exact:
            raise RequestError(
                [
                    {
                        "loc": ["body", "exact"],
                        "msg": "exact=true (one CE call per item per query) is off on this "
                        "server; start it with --allow-exact",
                        "type": "forbidden",
                    }
                ],
                403,
            )
        return req

    @app.post(
        "/search",
        summary="top-k items by exact CE score on a budget of CE calls per query",
        openapi_extra=_openapi_body(SearchRequest),
        response_model=None,
        responses={
            200: {"model": SearchResponse, "description": "the hits of each query"},
            401: {"description": "missing or wrong API key (with --api-key-file)"},
            403: {"description": "exact=true on a server started without --allow-exact"},
            **_ERRORS,
        },
    )
    async def search(request: Request):
        return await run_request(request, parse_search, service.try_admit, service.search, "search")

    @app.post(
        "/rerank",
        summary="the texts sorted by CE score against the query (TEI / Cohere style)",
        openapi_extra=_openapi_body(RerankRequest),
        response_model=None,
        responses={
            200: {
                "description": "best first: a list of {index, score, text?} (TEI); with "
                "'documents' in the request, Cohere's {results: [{index, relevance_score, "
                "document?}]}",
                "content": {
                    "application/json": {
                        "schema": {
                            "anyOf": [
                                {"type": "array", "items": _ref(RerankResult)},
                                _ref(CohereRerankResponse),
                            ]
                        }
                    }
                },
            },
            401: {"description": "missing or wrong API key (with --api-key-file)"},
            **_ERRORS,
        },
    )
    async def rerank(request: Request):
        def parse(body: bytes) -> RerankRequest:
            return parse_rerank_request(body, max_texts=config.max_rerank_texts)

        return await run_request(
            request,
            parse,
            lambda req: service.try_admit_pairs(len(req.all_texts())),
            service.rerank,
            "rerank",
        )

    _add_schemas(app, [RerankResult, CohereRerankResponse])

    return app
