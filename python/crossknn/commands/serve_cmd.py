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
from crossknn.commands._common import add_model_arguments, add_round_arguments, config_from
from crossknn.commands._numbers import fraction
from crossknn.commands._printing import terminal_safe
from crossknn.corpus.query_log import QueryLog
from crossknn.search.registry import names as method_names

HELP = "serve an index over HTTP (FastAPI + uvicorn; --ray for Ray Serve replicas)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("index_dir", help="index directory from 'crossknn build' (opened read-only)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8080, help="port (default 8080)")
    p.add_argument(
        "--model",
        metavar="DIR",
        help="the CE: a crossknn or Hugging Face folder (default: the one the index was built "
        "with)",
    )
    p.add_argument(
        "--de-model",
        metavar="DIR",
        help="the DE: a crossknn or sentence-transformers folder (default: the index's)",
    )
    # --precision/--de-precision (fp16 on a GPU), --provider, --backend, --threads,
    # --max-batch-tokens
    add_model_arguments(p, precision_default=None, batch_size=False, models=False)
    p.add_argument(
        "--max-batch-pairs",
        type=int,
        default=None,
        metavar="P",
        help="most CE pairs merged into one batch across requests; "
        "0 = no cross-request batching (default 256)",
    )
    p.add_argument(
        "--max-wait-ms",
        type=float,
        default=2.0,
        metavar="W",
        help="longest wait to fill a CE batch (default 2 ms)",
    )
    p.add_argument(
        "--ce-workers",
        type=int,
        default=None,
        metavar="T",
        help="threads of the CE batcher: 2 pipelines a GPU (one prepares the next batch while "
        "the other's runs); default 1 on a CPU, 2 on a GPU",
    )
    p.add_argument(
        "--de-thread",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="encode the queries with the DE in one thread of its own, not in the request "
        "threads (default: on a GPU, where each thread that runs a session gets its own "
        "provider context; off on a CPU)",
    )
    p.add_argument(
        "--engine-order",
        choices=("oldest", "any"),
        default="oldest",
        help="which waiting request (or query group) runs its next engine step: oldest (the "
        "request admitted first; the default) or any (a plain lock)",
    )
    p.add_argument(
        "--group-queries",
        type=int,
        default=None,
        metavar="N",
        help="requests that wait together for the engine start as one lockstep search of up to "
        "N queries (one pass over the items per round for all of them, one CE call per round); "
        "1 = every request alone (default 8; 1 with --engine-order any)",
    )
    p.add_argument(
        "--no-warmup",
        dest="warmup",
        action="store_false",
        help="on a GPU, do not capture every CUDA graph bucket and grow the device memory to the "
        "largest batch at load (by default they are, so no request pays a batch shape's first "
        "use); no effect on a CPU",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=1,
        metavar="W",
        help="server processes on the port, each with its own models and CE batcher (default 1; "
        "on a GPU, more than one lifts the one-process limit of Python's interpreter lock)",
    )
    p.add_argument(
        "--max-queue",
        type=int,
        default=64,
        metavar="Q",
        help="requests in flight at most; more get 429 (default 64)",
    )
    p.add_argument(
        "--timeout-s",
        type=float,
        default=30.0,
        metavar="T",
        help="per-request limit; over it: 504, CE work dropped (default 30)",
    )
    p.add_argument(
        "--admit-within",
        type=fraction,
        default=0.5,
        metavar="F",
        help="admit a request only if its expected time in the server (the work ahead of it "
        "and its own, at the measured service time) fits in F x --timeout-s; otherwise 429 "
        "with Retry-After at once. 0: no such check, only --max-queue (default 0.5)",
    )
    p.add_argument(
        "--max-body-kb",
        type=int,
        default=1024,
        metavar="KB",
        help="largest request body; more gets 413 (default 1024 KiB)",
    )
    p.add_argument(
        "--body-timeout-s",
        type=float,
        default=10.0,
        metavar="S",
        help="longest pause while a request body comes; then 408 and the connection is closed "
        "(default 10)",
    )
    p.add_argument(
        "--method",
        choices=method_names(),
        default=None,
        help="default method of requests that name none (default: auto when the index has "
        "auto's rows, as a default build of 100 items or more has; else axn)",
    )
    p.add_argument(
        "--rounds",
        type=int,
        help="default rounds (default: the method's own: 5 for axn; auto: its index's, or the "
        "most recall within --latency-target-ms)",
    )
    p.add_argument(
        "--latency-target-ms",
        type=float,
        metavar="MS",
        help="auto: choose its rounds for the most cross-validated recall predicted within MS "
        "per query, from the CE's cost per round measured at load (default: 8 on a GPU "
        "provider, none on a CPU; 0: none, the index's rounds)",
    )
    p.add_argument(
        "--allow-exact",
        action="store_true",
        help='accept "exact": true in /search (one CE call per item per query; refused with '
        "403 otherwise)",
    )
    p.add_argument(
        "--max-rerank-texts",
        type=int,
        default=1000,
        metavar="N",
        help="most texts in one /rerank request; more get 422 (default 1000)",
    )
    p.add_argument(
        "--max-query-chars",
        type=int,
        default=4096,
        metavar="N",
        help="most characters in one query of /search or /rerank; more get 422 (default 4096; "
        "the CE reads at most its max_length tokens of a pair)",
    )
    p.add_argument(
        "--api-key-file",
        metavar="FILE",
        help="require 'Authorization: Bearer KEY' (KEY: the file's first line) on every path "
        "but /healthz and /readyz; 401 otherwise (default: no key)",
    )
    p.add_argument(
        "--cors",
        metavar="ORIGIN[,ORIGIN]",
        help="origins allowed to call the server from a browser (CORS; default: none)",
    )
    p.add_argument(
        "--log-queries",
        metavar="FILE",
        help="append each answered query, its id and time and the CE scores it paid for to FILE "
        "(a query log for 'crossknn refine'; off by default: queries are user data)",
    )
    p.add_argument(
        "--watch-index",
        type=float,
        default=2.0,
        metavar="S",
        help="look for a new index version (refine, add, remove, rebuild) every S seconds and "
        "swap it in (default 2; 0: only on POST /admin/reload)",
    )
    p.add_argument(
        "--log-level", default="info", choices=("critical", "error", "warning", "info", "debug")
    )
    p.add_argument("--ray", action="store_true", help="deploy on Ray Serve (needs ray[serve])")
    p.add_argument(
        "--replicas",
        type=int,
        default=1,
        metavar="R",
        help="Ray Serve replicas, each with its own CE batcher (default 1)",
    )
    p.add_argument(
        "--ray-address",
        metavar="ADDR",
        help="an existing Ray cluster for --ray and --shards (default: start a local one)",
    )
    add_round_arguments(p)


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
