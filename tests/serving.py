"""Running leapgen's OpenAI server in the test process: uvicorn on a loopback port picked by the OS."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from typing import Iterator

import uvicorn

from leapgen.server.app import OpenAIServer


@contextlib.contextmanager
def serving(server: OpenAIServer) -> Iterator[str]:
    """Serve `server` on 127.0.0.1 in a thread; yields its base URL (`http://127.0.0.1:PORT/v1`) and stops it
    (its engine loop included) on exit."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    uvicorn_server = uvicorn.Server(uvicorn.Config(server.app(), log_level="warning", access_log=False))
    thread = threading.Thread(target=uvicorn_server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not uvicorn_server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the test server did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    finally:
        uvicorn_server.should_exit = True
        thread.join(timeout=30)
        sock.close()
