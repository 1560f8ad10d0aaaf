"""The OpenAI-compatible HTTP API over one `LLM`: a Starlette app whose handlers feed one `EngineLoop`."""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import socket
import threading
import time
from typing import AsyncIterator, Callable

import uvicorn

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from leapgen.engine.outputs import RequestOutput
from leapgen.llm import LLM
from leapgen.server.engine_loop import EngineLoop, Job, Update
from leapgen.server.protocol import ApiError, ParsedRequest, parse_chat, parse_completion
from leapgen.server.responses import ResponseShape

DEFAULT_MAX_CONCURRENT_REQUESTS = 256
DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024


class ClientGone(Exception):
    """The client closed the connection before its response was ready."""


class OpenAIServer:
    """Routes, checks and the bridge from HTTP requests to engine jobs.  `model_name` is the id clients
    ask for; `api_key`, when set, is required as `Authorization: Bearer KEY` on every /v1 route.

    With `engine_thread` the app's startup runs the engine loop on a thread of its own; otherwise the caller
    runs `engine_loop.run()` (on the main thread, where torch is fastest) and the app's shutdown ends it.
    """

    def __init__(self, llm: LLM, model_name: str, api_key: str | None = None,
                 max_concurrent_requests: int = DEFAULT_MAX_CONCURRENT_REQUESTS,
                 max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, engine_thread: bool = True) -> None:
        self.llm = llm
        self.model_name = model_name
        self.api_key = api_key
        self.max_concurrent_requests = max_concurrent_requests
        self.max_body_bytes = max_body_bytes
        self.engine_loop = EngineLoop(llm.engine)
        self.engine_thread = engine_thread
        self.active = 0                       # requests admitted and not yet answered (the event loop's thread only)
        vocabulary = llm.engine.vocabulary
        self._token_bytes: Callable[[int], bytes] = lambda t: vocabulary.text_bytes(t, skip_special_tokens=False)

    def app(self) -> Starlette:
        routes = [Route("/health", self.health, methods=["GET"]),
                  Route("/v1/models", self.models, methods=["GET"]),
                  Route("/v1/completions", self.completions, methods=["POST"]),
                  Route("/v1/chat/completions", self.chat_completions, methods=["POST"])]
        handlers = {ApiError: _api_error, HTTPException: _http_error}
        return Starlette(routes=routes, exception_handlers=handlers, lifespan=self._lifespan)

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        if self.engine_thread:
            self.engine_loop.start()
        try:
            yield
        finally:
            self.engine_loop.stop()

    # --- routes -------------------------------------------------------------------------------------

    async def health(self, request: Request) -> Response:
        if not self.engine_loop.accepting:       # draining: a load balancer sends new requests elsewhere
            return JSONResponse({"status": "shutting down", "running_requests": self.active}, status_code=503)
        return JSONResponse({"status": "ok", "running_requests": self.active})

    async def models(self, request: Request) -> Response:
        self._authorize(request)
        model = {"id": self.model_name, "object": "model", "created": 0, "owned_by": "leapgen",
                 "max_model_len": self.llm.engine.limits.max_model_len}
        return JSONResponse({"object": "list", "data": [model]})

    async def completions(self, request: Request) -> Response:
        self._authorize(request)
        return await self._generate(request, parse_completion(await self._body(request)), chat=False)

    async def chat_completions(self, request: Request) -> Response:
        self._authorize(request)
        return await self._generate(request, parse_chat(await self._body(request), self.llm.render_chat), chat=True)

    # --- checks before any work ---------------------------------------------------------------------

    def _authorize(self, request: Request) -> None:
        if self.api_key is None:
            return
        scheme, _, key = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(key.strip().encode(), self.api_key.encode()):
            raise ApiError("invalid API key: send it as 'Authorization: Bearer KEY'", status=401,
                           code="invalid_api_key")

    async def _body(self, request: Request) -> object:
        """The body as JSON, refused past `max_body_bytes` without reading further."""
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_body_bytes:
            raise _too_large(self.max_body_bytes)
        data = bytearray()
        try:
            async for chunk in request.stream():
                data += chunk
                if len(data) > self.max_body_bytes:
                    raise _too_large(self.max_body_bytes)
        except ClientDisconnect:     # (the answer goes nowhere; it only ends the request quietly)
            raise ApiError("the client went away before sending its whole body") from None
        try:
            return json.loads(data)
        except ValueError as exc:    # (also an integer past Python's 4,300 digits)
            raise ApiError(f"the request body is not valid JSON: {exc}") from None
        except RecursionError:
            raise ApiError("the request body is not valid JSON: its arrays and objects nest too deeply") from None

    def _check_model(self, model: str | None) -> None:
        if model is not None and model != self.model_name:
            raise ApiError(f"model: {model!r} is not served here; this server serves {self.model_name!r}",
                           status=404, param="model", code="model_not_found")

    # --- running ------------------------------------------------------------------------------------

    async def _generate(self, request: Request, parsed: ParsedRequest, chat: bool) -> Response:
        self._check_model(parsed.model)
        if self.active >= self.max_concurrent_requests:
            raise ApiError(f"the server is at its limit of {self.max_concurrent_requests} concurrent requests; "
                           f"retry later", status=429, code="too_many_requests")
        self.active += 1
        updates: asyncio.Queue[Update] = asyncio.Queue()
        loop = asyncio.get_running_loop()
        jobs = [Job(i, prompt, parsed.params, parsed.fields, not parsed.max_tokens_given, updates, loop)
                for i, prompt in enumerate(parsed.prompts)]
        shape = ResponseShape(parsed, self.model_name, self._token_bytes, chat)
        handed_over = False
        try:
            for job in jobs:
                self.engine_loop.submit(job)
            early = await self._admitted(request, jobs, updates)
            if parsed.stream:
                handed_over = True
                return _EventStream(self._events(shape, jobs, updates, early), on_close=lambda: self._close(jobs))
            return JSONResponse(shape.body(await self._outputs(request, jobs, updates, early)))
        except ClientGone:
            return Response(status_code=499)  # nobody reads it; the status only shows in the access log
        finally:
            if not handed_over:
                self._close(jobs)

    def _close(self, jobs: list[Job]) -> None:
        """The request is over: whatever of it still runs is aborted and its slot freed."""
        self.engine_loop.cancel(jobs)
        self.active -= 1

    @staticmethod
    async def _admitted(request: Request, jobs: list[Job], updates: asyncio.Queue[Update]) -> list[Update]:
        """Wait until the engine took or refused every job; a refusal fails the whole request before any
        response starts.  Returns the updates of admitted jobs that came meanwhile, in order.  ClientGone where
        the client leaves first (its jobs' constraints, waiting to compile, are then passed over)."""
        waiting = {job.index for job in jobs}
        early: list[Update] = []
        gone = asyncio.ensure_future(_disconnect(request))
        step: asyncio.Future[Update] | None = None
        try:
            while waiting:
                step = asyncio.ensure_future(updates.get())
                done, _ = await asyncio.wait({step, gone}, return_when=asyncio.FIRST_COMPLETED)
                if step not in done:
                    raise ClientGone
                update = step.result()
                if update.error is not None:
                    raise update.error
                if update.admitted:
                    waiting.discard(update.job)
                else:
                    early.append(update)
        finally:
            await _cancelled(gone, step)
        return early

    async def _outputs(self, request: Request, jobs: list[Job], updates: asyncio.Queue[Update],
                       early: list[Update]) -> list[RequestOutput]:
        """Every job's final output; the client going away meanwhile ends the wait (and the jobs)."""
        finals: dict[int, RequestOutput] = {}
        async for update in _until_disconnected(request, early, updates, len(jobs)):
            if update.error is not None:
                raise update.error
            if update.final is not None:
                finals[update.job] = update.final
        return [finals[job.index] for job in jobs]

    async def _events(self, shape: ResponseShape, jobs: list[Job], updates: asyncio.Queue[Update],
                      early: list[Update]) -> AsyncIterator[str]:
        """Server-sent events: a chunk per piece, the usage chunk when asked for, then `[DONE]`.  An error
        while running ends the stream with an error event, as OpenAI's API does."""
        finals: dict[int, RequestOutput] = {}
        started: set[tuple[int, int]] = set()
        async for update in _updates(early, updates, len(jobs)):
            if update.error is not None:
                yield _event(update.error.body())
                break
            for piece in update.pieces:
                yield _event(shape.chunk(update.job, piece, first=(update.job, piece.index) not in started))
                started.add((update.job, piece.index))
            if update.final is not None:
                finals[update.job] = update.final
        else:
            if shape.request.include_usage:
                yield _event(shape.usage_chunk([finals[job.index] for job in jobs]))
        yield "data: [DONE]\n\n"


class _EventStream(StreamingResponse):
    """A text/event-stream response that runs `on_close` however it ends: done, failed, or cut off by the
    client (Starlette then cancels the stream while it waits for the next piece)."""

    def __init__(self, events: AsyncIterator[str], on_close: Callable[[], None]) -> None:
        super().__init__(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self._on_close = on_close

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()


async def _updates(early: list[Update], updates: asyncio.Queue[Update], jobs: int) -> AsyncIterator[Update]:
    """The updates of a request until each of its `jobs` has ended (or one failed: the caller stops there)."""
    ended = 0
    pending = list(early)
    while ended < jobs:
        update = pending.pop(0) if pending else await updates.get()
        if update.final is not None or update.error is not None:
            ended += 1
        yield update


async def _until_disconnected(request: Request, early: list[Update], updates: asyncio.Queue[Update],
                              jobs: int) -> AsyncIterator[Update]:
    """`_updates`, raising ClientGone as soon as the client closes the connection."""
    gone = asyncio.ensure_future(_disconnect(request))
    stream = _updates(early, updates, jobs)
    step: asyncio.Future[Update] | None = None
    try:
        while True:
            step = asyncio.ensure_future(anext(stream))
            done, _ = await asyncio.wait({step, gone}, return_when=asyncio.FIRST_COMPLETED)
            if step not in done:
                raise ClientGone
            try:
                yield step.result()
            except StopAsyncIteration:
                return
    finally:
        # a step still waiting runs inside `stream`, which refuses to close until that step has ended
        await _cancelled(gone, step)
        await stream.aclose()


async def _cancelled(*tasks: asyncio.Future | None) -> None:
    """Cancel the `tasks` still running and wait until they have ended.  Their CancelledError is theirs, not
    the caller's: it is not raised here (a cancellation of the caller still is)."""
    running = {task for task in tasks if task is not None and not task.done()}
    for task in running:
        task.cancel()
    if running:
        await asyncio.wait(running)


async def _disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _event(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


def _too_large(limit: int) -> ApiError:
    return ApiError(f"the request body is larger than the server's limit of {limit} bytes", status=413,
                    code="request_too_large")


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return JSONResponse(exc.body(), status_code=exc.status)


async def _http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own refusals (unknown route, wrong method) in the API's error shape."""
    assert isinstance(exc, HTTPException)
    return JSONResponse(ApiError(f"{request.method} {request.url.path}: {exc.detail}", status=exc.status_code).body(),
                        status_code=exc.status_code)


def build_app(llm: LLM, model_name: str | None = None, **options: object) -> Starlette:
    """The ASGI app serving `llm` under `model_name` (default: its checkpoint's name); `options`:
    `api_key`, `max_concurrent_requests`, `max_body_bytes`."""
    return OpenAIServer(llm, model_name or default_model_name(llm), **options).app()


def default_model_name(llm: LLM) -> str:
    """The checkpoint's folder or file name, without a .gguf suffix."""
    return llm.path.name.removesuffix(".gguf")


SHUTDOWN_GRACE_SECONDS = 5


def serve_in_thread(app: Starlette, sock: socket.socket) -> tuple[uvicorn.Server, threading.Thread]:
    """uvicorn serving `app` on the bound `sock` from a thread of its own, returned once it accepts
    connections (set `should_exit` and join the thread to stop it); RuntimeError when it did not start.
    Off the main thread uvicorn installs no signal handlers: the caller's thread keeps Ctrl-C.  On shutdown,
    responses still running get SHUTDOWN_GRACE_SECONDS to finish before they are cancelled."""
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False,
                                           timeout_graceful_shutdown=SHUTDOWN_GRACE_SECONDS))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="leapgen-http", daemon=True)
    thread.start()
    while not server.started and thread.is_alive():
        time.sleep(0.01)
    if not server.started:
        raise RuntimeError("the HTTP server did not start (see uvicorn's message above)")
    return server, thread
