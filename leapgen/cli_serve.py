"""`leapgen serve`: the OpenAI-compatible server's command (arguments, checks before the model loads, the run)."""

from __future__ import annotations

import argparse
import ipaddress
import os
import signal
import socket
import sys
from typing import TYPE_CHECKING, Any

from leapgen.cli_common import (CliError, add_max_num_seqs_argument, add_model_arguments, check_device, check_dtype,
                                frozen_startup_heap, load_llm, memory_size, positive_int, speculative_method)

if TYPE_CHECKING:
    from leapgen.server.engine_loop import EngineLoop

_SERVE_DESCRIPTION = """Serve the model over HTTP with OpenAI's API: GET /v1/models, POST /v1/completions,
POST /v1/chat/completions (streaming with stream: true) and GET /health.  Requests from every connection
share one continuously batched engine.  Leapgen's extras go in the body: top_k, min_p, repetition_penalty,
min_tokens, num_beams, length_penalty, regex, grammar (a lark grammar)."""


def add_serve_parser(commands: Any) -> None:
    from leapgen.server.app import DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_CONCURRENT_REQUESTS

    serve = commands.add_parser("serve", help="serve the model with OpenAI's HTTP API",
                                description=_SERVE_DESCRIPTION)
    add_model_arguments(serve)
    add_max_num_seqs_argument(serve)
    serve.add_argument("--served-model-name", metavar="NAME",
                       help="the model id clients ask for (default: the checkpoint's name)")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default: loopback only)")
    serve.add_argument("--port", type=_port, default=8000)
    serve.add_argument("--api-key", metavar="KEY", default=os.environ.get("LEAPGEN_API_KEY"),
                       help="require 'Authorization: Bearer KEY' (default: $LEAPGEN_API_KEY, else none)")
    serve.add_argument("--max-concurrent-requests", type=positive_int, default=DEFAULT_MAX_CONCURRENT_REQUESTS,
                       metavar="N", help="requests answered at once; more get HTTP 429 (default %(default)s)")
    serve.add_argument("--max-body-size", type=memory_size, default=str(DEFAULT_MAX_BODY_BYTES), metavar="SIZE",
                       help="the largest request body, in bytes or like '8MiB' (default %(default)s bytes)")
    serve.add_argument("--speculative", metavar="METHOD", type=speculative_method,
                       help="speculative decoding for every request: 'ngram' (prompt lookup) or 'draft:PATH'")
    serve.add_argument("--num-speculative-tokens", type=positive_int, metavar="K")
    serve.add_argument("--seed", type=int, help="seed of the engine's sampler for requests without their own")


def run_serve(args: argparse.Namespace) -> int:
    from leapgen.engine.llm_engine import parse_memory
    from leapgen.grammars import warm_up
    from leapgen.server.app import SHUTDOWN_GRACE_SECONDS, OpenAIServer, default_model_name, serve_in_thread

    check_device(args.device)
    check_dtype(args.dtype)
    if args.api_key is not None and not args.api_key.strip():
        raise CliError("--api-key: the key is empty")
    sock = _listen(args.host, args.port)      # a taken port fails now, not after a slow load
    llm = load_llm(args, seed=args.seed)
    warm_up(llm.engine.vocabulary)           # the first constrained request does not load the compiler's kernels
    name = args.served_model_name or default_model_name(llm)
    server = OpenAIServer(llm, name, api_key=args.api_key, max_concurrent_requests=args.max_concurrent_requests,
                          max_body_bytes=parse_memory(args.max_body_size), engine_thread=False)
    if args.api_key is None and not _is_loopback(args.host):
        print(f"leapgen: warning: serving on {args.host} without --api-key: anyone who reaches it can use it",
              file=sys.stderr)
    # HTTP on a thread, the engine on the main thread (torch's CPU kernels are fastest there), where the first
    # Ctrl-C or SIGTERM lets the running requests finish (SHUTDOWN_GRACE_SECONDS at most) and a second ends them
    stopping = _Stopping(server.engine_loop, SHUTDOWN_GRACE_SECONDS)
    signal.signal(signal.SIGTERM, stopping)
    signal.signal(signal.SIGINT, stopping)
    try:
        http, http_thread = serve_in_thread(server.app(), sock)
    except RuntimeError as exc:
        raise CliError(str(exc)) from None
    print(f"leapgen: serving {name!r} at http://{args.host}:{sock.getsockname()[1]}/v1", file=sys.stderr)
    try:
        with frozen_startup_heap():
            server.engine_loop.run()          # until the app shuts down, or an interrupt
    except KeyboardInterrupt:
        print("leapgen: stopping the server now", file=sys.stderr)
    finally:
        http.should_exit = True
        # The grace for running responses, plus uvicorn's own steps; past that the (daemon) thread is left behind
        # so that Ctrl-C always ends the process.  A signal from here on stops the wait, and the exit is still 0.
        try:
            http_thread.join(timeout=SHUTDOWN_GRACE_SECONDS + 5)
        except KeyboardInterrupt:
            pass
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if http_thread.is_alive():
            print("leapgen: the HTTP server did not stop in time; exiting without it", file=sys.stderr)
    return 0


class _Stopping:
    """The serve command's handler of SIGINT and SIGTERM: the first drains the engine loop, the next interrupts."""

    def __init__(self, engine_loop: EngineLoop, grace_seconds: float):
        self.engine_loop = engine_loop
        self.grace_seconds = grace_seconds
        self.asked = False

    def __call__(self, signum: int, frame: object) -> None:
        if self.asked:
            raise KeyboardInterrupt
        self.asked = True
        print(f"leapgen: stopping the server: running requests get {self.grace_seconds} s to finish (again to stop "
              "now)", file=sys.stderr)
        self.engine_loop.drain(self.grace_seconds)


def _listen(host: str, port: int) -> socket.socket:
    """A socket bound to `host:port` (uvicorn listens on it)."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as exc:               # the port is taken, the address is not this machine's, ...
        raise CliError(f"--host {host} --port {port}: cannot listen there ({exc.strerror or exc})") from None
    return sock


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port number in [0, 65535], got {text!r}")
    return port


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
