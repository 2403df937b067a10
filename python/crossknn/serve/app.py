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
without ``--allow-exact``; 401 a missing or wrong key (or more than one ``Authorization`` header)
with ``--api-key-file``; 408 a body that stops coming for ``body_timeout_s``; 415 a body that is
not declared ``application/json`` (a browser's form or ``text/plain`` post, which needs no CORS
preflight, never reaches the CE). A request alone in the server whose own expected CE work is
over ``timeout_s`` is 429 at once too (it would only end in a 504).

Malformed HTTP (a negative ``Content-Length``, a CR or LF inside a header) is answered by
uvicorn's parser before the app sees it: :func:`http_protocol` is uvicorn's protocol with the
same JSON error shape (``{"detail": ...}``) on those 400s.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import os
import socket
import stat
import time
from contextlib import asynccontextmanager
from typing import Any

import h11
from fastapi import FastAPI, Request
from uvicorn.protocols.http.h11_impl import H11Protocol

try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # no httptools: uvicorn's pure-Python parser (h11) only
    HttpToolsProtocol = None
from fastapi.responses import JSONResponse, Response
from starlette.requests import ClientDisconnect

import crossknn
from crossknn.serve.batcher import Cancelled
from crossknn.serve.metrics import CONTENT_TYPE_LATEST, Metrics
from crossknn.serve.reload import VERSION_HEADER, add_reload_routes
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

__all__ = ["create_app", "http_protocol", "key_file_warning", "read_api_key"]

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
BODY_TIMEOUT_S = 10.0  # the longest pause while a request body comes (ServeConfig.body_timeout_s)
_HEALTH = {"type": "object", "required": ["status"], "properties": {"status": {"type": "string"}}}
_READY = {
    "type": "object",
    "required": ["status"],
    "properties": {"status": {"type": "string"}, "n_items": {"type": "integer"}},
}


OPEN_PATHS = ("/healthz", "/readyz")  # the only paths answered without the key


class _StatusMetrics:
    """Pure ASGI middleware: counts every response by path and status code, and names the
    process that answered (``x-served-by: host:pid``; which replica, behind Ray Serve). With a
    key (``keyed``) that name is only on the answers to requests that carried the key: never on
    a 401 nor on the open probes."""

    def __init__(self, app, metrics: Metrics, keyed: bool = False) -> None:
        self.app = app
        self.metrics = metrics
        self.keyed = keyed
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
                if not self.keyed or (status["code"] != 401 and path not in OPEN_PATHS):
                    headers = list(message.get("headers", []))
                    headers.append((b"x-served-by", self.served_by))
                    message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            self.metrics.requests.labels(label, str(status["code"])).inc()


INTERNAL_ERROR = "internal error (logged)"  # a 500's detail: never a traceback or a path


def _error(status: int, detail: Any, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"detail": detail}, status_code=status, headers=headers)


async def _internal_error(request: Request, exc: Exception) -> JSONResponse:
    """Anything that escapes a route: ``500`` in the JSON shape of every other error (not
    Starlette's ``text/plain``), with no traceback in the body (the log has it)."""
    return _error(500, INTERNAL_ERROR)


async def _read_body(request: Request, limit: int, timeout: float) -> bytes:
    """The body, at most ``limit`` bytes (413 beyond); 408 when no part of it comes for
    ``timeout`` seconds (a client announcing 100 bytes and sending 9 holds no connection
    forever)."""
    size = request.headers.get("content-length")
    if size is not None and size.isdigit() and int(size) > limit:
        raise RequestError(
            [{"loc": ["body"], "msg": f"body over {limit} bytes", "type": "too_large"}], 413
        )
    parts, n = [], 0
    stream = request.stream()
    while True:
        try:
            chunk = await asyncio.wait_for(stream.__anext__(), timeout)
        except StopAsyncIteration:
            break
        except asyncio.TimeoutError:
            msg = f"the body stopped coming: nothing for {timeout:g} s after {n} bytes"
            raise RequestError([{"loc": ["body"], "msg": msg, "type": "timeout"}], 408) from None
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


def _json_is(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (
        media.startswith("application/") and media.endswith("+json")
    )


_ERROR_SCHEMA = {
    "type": "object",
    "required": ["detail"],
    "properties": {
        "detail": {
            "anyOf": [
                {"type": "string"},
                {"type": "object"},
                {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["loc", "msg", "type"],
                        "properties": {
                            "loc": {"type": "array", "items": {"type": ["string", "integer"]}},
                            "msg": {"type": "string"},
                            "type": {"type": "string"},
                        },
                    },
                },
            ]
        }
    },
}


def _err_doc(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/json": {"schema": _ERROR_SCHEMA}},
    }


_UNAUTHORIZED = {
    401: _err_doc("missing or wrong API key, or two Authorization headers (with --api-key-file)")
}
_ERRORS: dict[int | str, dict[str, Any]] = {
    **_UNAUTHORIZED,
    408: _err_doc("the body stopped coming (nothing for the body-read timeout)"),
    413: _err_doc("body too large"),
    415: _err_doc("the body is not declared application/json"),
    422: _err_doc("malformed JSON or a field out of range (detail names it)"),
    429: _err_doc(
        "queue full, or the request is not expected to be answered within its deadline (alone: "
        "its own CE work is over the limit); Retry-After seconds"
    ),
    503: _err_doc("still loading, or shutting down"),
    504: _err_doc("over the server's timeout; its CE work was cancelled"),
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
    """Pure ASGI middleware: every path but /healthz and /readyz needs exactly one
    ``Authorization: Bearer <key>`` header; 401 otherwise (constant-time comparison; two
    headers are refused whatever they hold: proxies and servers disagree on which one wins)."""

    OPEN = OPEN_PATHS

    def __init__(self, app, key: str) -> None:
        self.app = app
        self.key = key.encode()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope.get("path") in self.OPEN:
            await self.app(scope, receive, send)
            return
        given = [v for n, v in scope.get("headers", []) if n == b"authorization"]
        ok = False
        if len(given) == 1:
            scheme, _, token = given[0].partition(b" ")
            ok = scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self.key)
        if not ok:
            msg = (
                "missing API key"
                if not given
                else "wrong API key"
                if len(given) == 1
                else "more than one Authorization header"
            )
            resp = _error(401, f"{msg}: send 'Authorization: Bearer <key>'")
            resp.headers["WWW-Authenticate"] = "Bearer"
            await resp(scope, receive, send)
            return
        await self.app(scope, receive, send)


def key_file_warning(path: str) -> str | None:
    """One line when the key file can be read by its group or by everyone, else None."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None  # read_api_key says why
    who = []
    if mode & stat.S_IRGRP:
        who.append("its group")
    if mode & stat.S_IROTH:
        who.append("everyone")
    if not who:
        return None
    return (
        f"--api-key-file {path} is readable by {' and '.join(who)} (mode "
        f"{stat.S_IMODE(mode):o}); chmod 600 {path}"
    )


def read_api_key(path: str) -> str:
    """The key in ``path`` (its first line, stripped); an error naming the file otherwise."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as exc:
        raise ValueError(f"--api-key-file {path}: cannot read it ({exc.strerror})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(
            f"--api-key-file {path}: not valid UTF-8 (byte 0x{raw[exc.start]:02x} at offset "
            f"{exc.start}); expected one API key on its first line"
        ) from None
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
    warn_key_file: bool = True,
) -> FastAPI:
    """The app. ``load``: ``"background"`` (start loading at startup; ``/readyz`` says when
    done), ``"now"`` (load before returning: Ray Serve replicas) or ``"none"`` (the caller
    does it). ``warn_key_file``: log the key file's mode warning (False: the caller, ``crossknn
    serve``, printed it already)."""
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
    # (Starlette's outermost middleware answers with it, then re-raises: uvicorn logs the error)
    app.add_exception_handler(Exception, _internal_error)
    if config.api_key_file:
        app.add_middleware(_BearerAuth, key=read_api_key(config.api_key_file))
        warning = key_file_warning(config.api_key_file) if warn_key_file else None
        if warning:
            log.warning("crossknn serve: %s", warning)
    if config.cors:
        # fastapi: optional (serve extra)
        from fastapi.middleware.cors import CORSMiddleware

        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(config.cors),
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type"],
        )
    app.add_middleware(_StatusMetrics, metrics=metrics, keyed=bool(config.api_key_file))
    body_timeout = float(getattr(config, "body_timeout_s", BODY_TIMEOUT_S))

    health_doc = {
        "summary": "the process is alive",
        "responses": {200: {"content": {"application/json": {"schema": _HEALTH}}}},
    }

    @app.get("/healthz", **health_doc)
    @app.head("/healthz", operation_id="healthz_head", **health_doc)
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    ready_doc = {
        "summary": "the index and the models are loaded",
        "response_model": None,
        "responses": {
            200: {"content": {"application/json": {"schema": _READY}}},
            503: _err_doc("still loading (Retry-After), or loading failed (see the log)"),
        },
    }

    @app.get("/readyz", **ready_doc)
    @app.head("/readyz", operation_id="readyz_head", **ready_doc)
    async def readyz():
        if service.ready.is_set():
            return {"status": "ready", "n_items": service.n_items}
        if service.load_error is not None:
            # the reason is in the server's log: it may name files, and /readyz needs no key
            return _error(503, {"status": "failed", "error": "loading failed; see the log"})
        return _error(503, {"status": "loading"}, {"Retry-After": "1"})

    @app.get(
        "/metrics",
        summary="Prometheus metrics",
        response_class=Response,
        responses={
            200: {"content": {CONTENT_TYPE_LATEST: {"schema": {"type": "string"}}}},
            **_UNAUTHORIZED,
        },
    )
    async def metrics_endpoint() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get(
        "/info",
        summary="index size, models, hashes, precision, provider, limits",
        responses={
            200: {"content": {"application/json": {"schema": {"type": "object"}}}},
            **_UNAUTHORIZED,
        },
    )
    async def info() -> JSONResponse:
        body = service.info()
        v = (body.get("index") or {}).get("version")
        # the header says the version the body describes
        return JSONResponse(body, headers=None if v is None else {VERSION_HEADER: str(v)})

    async def run_request(request: Request, parse, admit, work, what: str):
        """Shared by /search and /rerank: read and parse the body, admit it, run ``work(req,
        ctx)`` in a request thread under the deadline, drop its CE work if the client leaves."""
        t0 = time.perf_counter()
        ctype = request.headers.get("content-type", "")
        if not _json_is(ctype):
            got = json.dumps(ctype[:100]) if ctype else "none"
            msg = f"expected Content-Type: application/json; got {got}"
            return _error(415, msg, {"Connection": "close"})
        try:
            body = await _read_body(request, config.max_body_bytes, body_timeout)
        except ClientDisconnect:  # the client left before sending its whole body
            metrics.disconnects.inc()
            return Response(status_code=CLIENT_GONE)
        except RequestError as exc:
            close = {"Connection": "close"} if exc.status in (408, 413) else None
            return _error(exc.status, exc.detail, close)
        try:
            if not service.ready.is_set():
                return _error(503, "the index and models are still loading", {"Retry-After": "1"})
            req = parse(body)
        except RequestError as exc:
            return _error(exc.status, exc.detail)
        except Exception:  # a check that broke: logged, answered in the JSON error shape
            log.exception("crossknn serve: checking a %s request failed", what)
            return _error(500, INTERNAL_ERROR)
        decision = admit(req)
        if not decision.admitted:
            metrics.rejected.inc()
            # too large: retrying the same request cannot help, so no Retry-After
            retry = (
                None
                if decision.reason == "too_large"
                else {"Retry-After": str(decision.retry_after_s)}
            )
            if decision.reason == "queue_full":
                return _error(
                    429, f"queue full ({config.max_queue} requests in flight); retry later", retry
                )
            metrics.rejected_deadline.inc()
            if decision.reason == "too_large":
                return _error(
                    429,
                    f"too large: this request alone is expected to take "
                    f"{decision.expected_s:.1f} s here, over the {config.timeout_s:g} s limit; "
                    "send it in smaller parts",
                    retry,
                )
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
            return _error(500, INTERNAL_ERROR)
        metrics.latency.observe(time.perf_counter() - t0)
        headers = {"Server-Timing": ctx.server_timing(t0)}
        if isinstance(result, dict) and result.get("index_version") is not None:
            # the version the search ran on, as in the body (not the one serving now)
            headers[VERSION_HEADER] = str(result["index_version"])
        return JSONResponse(result, headers=headers)

    def parse_search(body: bytes) -> SearchRequest:
        req = parse_search_request(
            body,
            n_items=service.n_items,
            has_cur=service.has_cur,
            max_rounds=config.max_rounds,
            indexes=service.index_kinds,
            max_query_chars=config.max_query_chars,
            fields=service.metadata_fields,
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
            403: _err_doc("exact=true on a server started without --allow-exact"),
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
            **_ERRORS,
        },
    )
    async def rerank(request: Request):
        def parse(body: bytes) -> RerankRequest:
            return parse_rerank_request(
                body, max_texts=config.max_rerank_texts, max_query_chars=config.max_query_chars
            )

        return await run_request(
            request,
            parse,
            lambda req: service.try_admit_pairs(len(req.all_texts())),
            service.rerank,
            "rerank",
        )

    # POST /admin/reload, X-Index-Version on the answers to callers with the key
    # (crossknn.serve.reload)
    add_reload_routes(app, service, config)
    _add_schemas(app, [RerankResult, CohereRerankResponse])

    return app


# -- malformed HTTP: uvicorn's parser answers 400 before the app; the same JSON shape here -------


def _bad_request_body() -> bytes:
    return json.dumps(
        {"detail": "malformed HTTP request (request line, a header or the body framing)"}
    ).encode()


class JsonErrorH11Protocol(H11Protocol):
    """uvicorn's h11 protocol, its 400 to malformed HTTP in the app's JSON error shape (a
    module-level class: uvicorn's ``--workers`` pickles it into each worker process)."""

    def send_400_response(self, msg: str) -> None:
        body = _bad_request_body()
        headers = [
            (b"content-type", b"application/json"),
            (b"connection", b"close"),
            (b"content-length", str(len(body)).encode()),
        ]
        for event in (
            h11.Response(status_code=400, headers=headers, reason=b"Bad Request"),
            h11.Data(data=body),
            h11.EndOfMessage(),
        ):
            self.transport.write(self.conn.send(event))
        self.transport.close()


if HttpToolsProtocol is not None:

    class JsonErrorHttpToolsProtocol(HttpToolsProtocol):
        """uvicorn's httptools protocol, its 400 in the app's JSON error shape (module level,
        as :class:`JsonErrorH11Protocol`)."""

        def send_400_response(self, msg: str) -> None:
            body = _bad_request_body()
            head = [b"HTTP/1.1 400 Bad Request\r\n"]
            for name, value in self.server_state.default_headers:
                head += [name, b": ", value, b"\r\n"]
            head += [
                b"content-type: application/json\r\n",
                b"content-length: " + str(len(body)).encode() + b"\r\n",
                b"connection: close\r\n\r\n",
            ]
            self.transport.write(b"".join(head) + body)
            self.transport.close()


def http_protocol():
    """uvicorn's HTTP protocol class (``httptools`` when installed, as uvicorn's ``auto``, else
    ``h11``) with its 400 answer to malformed HTTP in the app's JSON error shape."""
    if HttpToolsProtocol is None:  # no httptools: uvicorn's pure-Python parser
        return JsonErrorH11Protocol
    return JsonErrorHttpToolsProtocol
