"""``crossknn serve INDEX_DIR``: the search service over HTTP (FastAPI + uvicorn).

One process: uvicorn on ``--host:--port`` (loopback by default), the models and index loaded in
the background (``/readyz`` says when), one CE worker merging the CE calls of concurrent
requests. ``--ray --replicas R`` deploys the same app on Ray Serve instead. See docs/serve.md.
"""

from __future__ import annotations

import argparse
import faulthandler
import signal
import socket
import sys

import crossknn
from crossknn.commands._common import config_from
from crossknn.commands._printing import terminal_safe
from crossknn.corpus.query_log import QueryLog


def config_from_args(args: argparse.Namespace):
    # crossknn.serve imports fastapi and prometheus_client (serve extra)
    from crossknn.serve.service import ServeConfig

    # the options named as its fields, and those named otherwise or computed
    return config_from(
        ServeConfig,
        args,
        index=args.index_dir,
        max_body_bytes=args.max_body_kb * 1024,
        latency_target_ms="auto" if args.latency_target_ms is None else args.latency_target_ms,
        # without shards the address is Ray Serve's (--ray); the searcher needs none
        ray_address=args.ray_address if args.shards else None,
        watch_index_s=args.watch_index,
        cors=tuple(o.strip() for o in (args.cors or "").split(",") if o.strip()),
    )


def run(args: argparse.Namespace) -> int:
    try:
        # uvicorn and crossknn.serve (fastapi, prometheus_client): the serve extra
        import uvicorn

        from crossknn.serve.app import create_app, http_protocol
        from crossknn.serve.service import SearchService
    except ModuleNotFoundError as exc:
        raise ValueError(
            f"crossknn serve needs the 'serve' extra ({exc.name} is missing): "
            "pip install 'crossknn[serve]'"
        ) from None

    config = config_from_args(args)
    if config.api_key_file:  # a missing or empty key file is one clear line, before loading
        # crossknn.serve imports fastapi and prometheus_client (serve extra)
        from crossknn.serve.app import key_file_warning, read_api_key

        warning = key_file_warning(config.api_key_file)
        if warning:
            print(f"crossknn serve: warning: {warning}", file=sys.stderr)
        read_api_key(config.api_key_file)
    if args.workers < 1:
        raise ValueError(f"--workers must be >= 1; got {args.workers}")
    if args.workers > 1 and (args.ray or args.shards):
        raise ValueError(
            "--workers runs local processes; it cannot be combined with --ray or --shards"
        )
    if args.ray:
        # crossknn.serve imports fastapi and prometheus_client (serve extra)
        from crossknn.serve.ray_app import run_ray

        return run_ray(
            config, host=args.host, port=args.port, replicas=args.replicas, address=args.ray_address
        )
    # the serve package imports fastapi at its top (the serve extra)
    from crossknn.serve.log_format import configure

    configure(args.log_level)
    # a served index file cut or overwritten in place (cp, rsync --inplace over the folder) makes
    # the next read of its memory map a SIGBUS: say so (a traceback on stderr), never die silently
    faulthandler.enable()
    # a query log that cannot be written is one line now, before any model loads
    query_log = QueryLog(config.log_queries) if config.log_queries else None
    # a wrong path or a corrupt index is one clear line now, not a failed /readyz later
    index = crossknn.open_index(args.index_dir)
    # and so is a port in use: bound here, before loading (uvicorn serves on this socket)
    sock = bind_socket(args.host, args.port)
    print(listening_line(args.host, args.port, args.index_dir), file=sys.stderr, flush=True)
    if args.workers > 1:
        sock.close()  # uvicorn's supervisor binds it again for its workers
        # the serve package imports fastapi at its top (the serve extra)
        from crossknn.serve.workers import run_workers

        del index  # each worker opens its own (and its own query log)
        if query_log is not None:
            query_log.close()
        return run_workers(
            config,
            host=args.host,
            port=args.port,
            workers=args.workers,
            log_level=args.log_level,
        )
    service = SearchService(config, index=index, query_log=query_log)
    del index  # the service holds it only while it serves it (a swap releases it)
    if query_log is not None:  # SIGHUP: start the log again at its path (after a rotation)
        signal.signal(signal.SIGHUP, lambda *_: query_log.reopen())
    server: uvicorn.Server | None = None
    failed = []

    def on_load_error(exc: BaseException) -> None:
        failed.append(exc)
        if server is not None:
            server.should_exit = True

    # the key file's warning was printed above, once
    app = create_app(config, service=service, on_load_error=on_load_error, warn_key_file=False)
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host=args.host,
            port=args.port,
            log_level=args.log_level,
            access_log=args.log_level == "debug",
            http=http_protocol(),  # its 400s to malformed HTTP in the JSON error shape
            server_header=False,  # no "server: uvicorn" on every answer
            # SIGTERM: stop accepting, let in-flight requests finish (they end by --timeout-s)
            timeout_graceful_shutdown=int(config.timeout_s) + 5,
            timeout_keep_alive=30,
        )
    )
    server.run(sockets=[sock])
    if failed:
        print(f"crossknn serve: error: loading failed: {failed[0]}", file=sys.stderr)
        return 1
    return 0


def listening_line(host: str, port: int, index_dir) -> str:
    """The one line ``serve`` prints once its port is bound: where to send requests."""
    where = f"[{host}]" if ":" in host else host
    return (
        f"crossknn serve: listening on http://{where}:{port} (index {terminal_safe(index_dir)}; "
        "GET /readyz answers 200 once the models are loaded)"
    )


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening-ready socket on ``host:port`` (as uvicorn binds it); a port in use or an
    address that is not this machine's is one line (ValueError)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        what = (
            "is in use (another server?)"
            if exc.errno == 98
            else f"cannot be bound ({exc.strerror})"
        )
        raise ValueError(f"--host {host} --port {port}: the address {what}") from None
    sock.set_inheritable(True)
    return sock
