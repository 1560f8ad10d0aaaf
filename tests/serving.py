"""Running leapgen's OpenAI server in the test process: uvicorn on a loopback port picked by the OS."""

from __future__ import annotations

import contextlib
import socket
from typing import Iterator

from leapgen.server.app import OpenAIServer, serve_in_thread


@contextlib.contextmanager
def serving(server: OpenAIServer) -> Iterator[str]:
    """Serve `server` on 127.0.0.1 in a thread; yields its base URL (`http://127.0.0.1:PORT/v1`) and stops it
    (its engine loop included) on exit."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    http, thread = serve_in_thread(server.app(), sock)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    finally:
        http.should_exit = True
        thread.join(timeout=30)
        sock.close()
