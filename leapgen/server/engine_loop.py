"""One thread owns the engine and steps it for every connection; asyncio handlers talk to it by messages.

Everything that changes the engine (adding, stepping, aborting) happens on the loop's thread.  A job's new
constraint compiles on a thread of its own meanwhile (`LLMEngine.prepare`), and the job joins the batch once it is
ready: a schema that takes 100 ms to compile no longer holds every running stream for that long.  Handlers submit
jobs through a queue and receive `Update`s on an asyncio queue: after each engine step, the text, token logprobs
and finish reasons each completion gained.  A handler that goes away aborts its jobs; their KV blocks are freed at
the next turn.
"""

from __future__ import annotations

import asyncio
import dataclasses
import queue
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from leapgen.decoding.sampling_params import SamplingParams
from leapgen.engine.admission import encode_prompt
from leapgen.engine.block_manager import beam_search_room
from leapgen.engine.llm_engine import LLMEngine
from leapgen.engine.outputs import RequestOutput, TokenLogprob
from leapgen.server.protocol import ApiError, Prompt, RequestFields


@dataclass(frozen=True)
class Piece:
    """What one completion gained in one engine step."""

    index: int                                # the completion's index within its prompt (n > 1)
    text: str
    logprobs: list[TokenLogprob]
    finish_reason: str | None


@dataclass(frozen=True)
class Update:
    """A job's news: that the engine `admitted` it (its first update, unless it was refused with `error`),
    then its pieces and, when it ended, its `final` output (no longer touched by the engine) or the `error`
    that ended it."""

    job: int                                  # the prompt's index within its HTTP request
    pieces: list[Piece]
    final: RequestOutput | None = None
    error: ApiError | None = None
    admitted: bool = False


@dataclass(eq=False)
class Job:
    """One prompt of an HTTP request, as the loop tracks it.  `fill_max_tokens`: give it the rest of the context."""

    index: int
    prompt: Prompt
    params: SamplingParams
    fields: RequestFields
    fill_max_tokens: bool
    updates: asyncio.Queue
    loop: asyncio.AbstractEventLoop
    cancelled: bool = False
    request_id: int | None = None
    sent_text: dict[int, int] = field(default_factory=dict)        # completion index -> characters sent
    sent_logprobs: dict[int, int] = field(default_factory=dict)    # completion index -> logprobs sent
    sent_finish: set[int] = field(default_factory=set)


@dataclass(frozen=True)
class _Prepared:
    """A job whose constraint's compile has ended (`compiled`, None for a job without one), back in the inbox."""

    job: Job
    compiled: Future | None = None


_IDLE_WAKE_SECONDS = 0.25


class EngineLoop:
    """Continuous batching for a server: jobs from any connection join the running batch at the next step."""

    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._jobs: dict[int, Job] = {}                       # engine request id -> job
        # updates of this turn, per event loop: delivered in one wake-up each, not one per job and step
        self._outbox: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue, Update]]] = {}
        self._thread: threading.Thread | None = None
        self._accepting = True                # jobs submitted before `run` starts wait in the inbox
        self._drain_until: float | None = None    # once `drain` is asked: when what still runs is aborted
        self._compiling = 0                   # jobs whose constraint is compiling (taken, not yet admitted)
        # new constraints compile here, one at a time, while the loop steps the batch; the job comes back to the
        # inbox as a `_Prepared` once its constraint is ready (or refused)
        self._compiler = ThreadPoolExecutor(max_workers=1, thread_name_prefix="leapgen-compile")

    def run(self) -> None:
        """Run the loop on this thread until `stop()`.  The main thread is the place for it where there is a
        choice: torch's CPU kernels run about a third slower when called from another thread (OpenMP keeps
        its warm worker team for the main thread)."""
        try:
            while self._receive(block=not self.engine.has_unfinished):
                self._flush()                 # admissions and refusals need not wait for the step
                if self.engine.has_unfinished:
                    self._step()
                    self._flush()
                if self._drain_until is not None and (self._drained() or time.monotonic() > self._drain_until):
                    break
        finally:
            self._accepting = False
            self._fail_all(ApiError("the server is shutting down", status=503))
            self._compiler.shutdown(wait=True, cancel_futures=True)     # (a compile under way finishes first)
            self._refuse_waiting()
            self._flush()

    def start(self) -> None:
        """Run the loop on a thread of its own."""
        self._thread = threading.Thread(target=self.run, name="leapgen-engine", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """End the loop (aborting what runs) and, when it has a thread of its own, wait for it."""
        self._inbox.put(None)
        if self._thread is not None:
            self._thread.join()

    def _drained(self) -> bool:
        """Whether every job taken has ended: none running, compiling, or still in the inbox."""
        return not self._jobs and not self._compiling and self._inbox.empty()

    def drain(self, seconds: float) -> None:
        """Take no more jobs, and end `run` once the running ones finish, or `seconds` from now (aborting the rest):
        a server told to stop lets its responses complete.  Safe from a signal handler on the loop's thread."""
        self._accepting = False
        self._drain_until = time.monotonic() + seconds

    @property
    def accepting(self) -> bool:
        """Whether new jobs are taken (False once draining or stopped)."""
        return self._accepting

    def submit(self, job: Job) -> None:
        if not self._accepting:
            raise ApiError("the server is shutting down", status=503)
        self._inbox.put(job)

    def cancel(self, jobs: list[Job]) -> None:
        """Abort `jobs` (finished ones are left alone); safe from any thread."""
        for job in jobs:
            job.cancelled = True
        self._inbox.put(jobs)

    # --- on the loop's thread ---------------------------------------------------------------------------

    def _receive(self, block: bool) -> bool:
        """Take every waiting message (waiting for one when `block`, a while at most); False once told to stop."""
        try:
            # Never wait without a bound: Ctrl-C delivered to another thread (uvicorn's, torch's) only sets a
            # flag, and a main thread asleep in a lock would never get back to run Python's handler.
            message = self._inbox.get(block=block, timeout=_IDLE_WAKE_SECONDS if block else None)
        except queue.Empty:
            return True
        while True:
            if message is None:
                return False
            if isinstance(message, Job):
                self._add(message)
            elif isinstance(message, _Prepared):
                self._admit(message)
            else:
                self._abort(message)
            try:
                message = self._inbox.get_nowait()
            except queue.Empty:
                return True

    def _refuse_waiting(self) -> None:
        """Jobs submitted while the loop was ending get an answer too."""
        while True:
            try:
                message = self._inbox.get_nowait()
            except queue.Empty:
                return
            job = message.job if isinstance(message, _Prepared) else message
            if isinstance(job, Job):
                self._post(job, Update(job.index, [], error=ApiError("the server is shutting down", status=503)))

    def _add(self, job: Job) -> None:
        if job.cancelled:
            return
        if job.params.constraint is None:
            self._admit(_Prepared(job))
            return
        self._compiling += 1
        future = self._compiler.submit(self._prepare, job)
        future.add_done_callback(lambda done: self._inbox.put(_Prepared(job, done)))

    def _prepare(self, job: Job) -> None:
        """On the compiling thread: the job's constraint, unless its client has gone meanwhile (cancelled compiles
        queued ahead of the live ones)."""
        if not job.cancelled:
            self.engine.prepare(job.params.constraint)      # once per spec

    def _admit(self, prepared: _Prepared) -> None:
        job = prepared.job
        if prepared.compiled is not None:
            self._compiling -= 1
        if job.cancelled:
            return
        refused = (ValueError, TypeError, RecursionError)      # the compiler's and the admission's refusals
        error = None if prepared.compiled is None or prepared.compiled.cancelled() else \
            prepared.compiled.exception()
        if isinstance(error, refused):
            self._post(job, Update(job.index, [], error=job.fields.constraint_error(str(error))))
            return
        if error is not None:            # a bug met while compiling one request's constraint must not end the loop
            self._post(job, Update(job.index, [], error=ApiError(f"the constraint could not be compiled: {error!r}",
                                                                  status=500)))
            return
        try:
            prompt, params = self._with_length(job)
            job.request_id = self.engine.add_request(prompt, params)
        except refused as exc:
            self._post(job, Update(job.index, [], error=job.fields.refusal(str(exc), job.index)))
            return
        except Exception as exc:         # a bug met while admitting one request must not end the loop
            self._post(job, Update(job.index, [], error=ApiError(f"the request could not be admitted: {exc!r}",
                                                                  status=500)))
            return
        self._jobs[job.request_id] = job
        self._post(job, Update(job.index, [], admitted=True))

    def _with_length(self, job: Job) -> tuple[Prompt, SamplingParams]:
        """The job's prompt (as token ids once it had to be counted) and params; an open length is the rest
        of the context and the KV cache."""
        if not job.fill_max_tokens:
            return job.prompt, job.params
        _, ids = encode_prompt(job.prompt, self.engine.tokenizer)
        limits = self.engine.limits
        room = min(limits.max_model_len, limits.kv_capacity_tokens) - len(ids)
        if job.params.num_beams > 1:      # every beam holds its own copy of the output
            room = min(room, beam_search_room(len(ids), job.params.num_beams, limits.kv_block_size,
                                              limits.kv_capacity_tokens))
        return ids, dataclasses.replace(job.params, max_tokens=max(room, 1))

    def _abort(self, jobs: list[Job]) -> None:
        for job in jobs:
            if job.request_id is not None and self._jobs.pop(job.request_id, None) is not None:
                self.engine.abort(job.request_id)

    def _step(self) -> None:
        try:
            outputs = self.engine.step()
        except Exception as exc:     # a failure outside any one request: every running request ends with it
            self._fail_all(ApiError(f"the engine failed: {exc}", status=500))
            return
        for output in outputs:
            job = self._jobs.get(output.request_id)
            if job is None:
                continue
            if output.finished:
                error = ApiError(output.error, status=500) if output.error is not None else None
                self._end(output.request_id, output, error)
            else:
                pieces = self._pieces(job, output)
                if pieces:
                    self._post(job, Update(job.index, pieces))

    def _fail_all(self, error: ApiError) -> None:
        """Abort every running job, each ending with `error`."""
        for request_id in list(self._jobs):
            self.engine.abort(request_id)
            self._end(request_id, error=error)

    def _end(self, request_id: int, output: RequestOutput | None = None, error: ApiError | None = None) -> None:
        job = self._jobs.pop(request_id)
        pieces = self._pieces(job, output) if output is not None and error is None else []
        self._post(job, Update(job.index, pieces, final=output, error=error))

    def _post(self, job: Job, update: Update) -> None:
        self._outbox.setdefault(job.loop, []).append((job.updates, update))

    def _flush(self) -> None:
        for loop, batch in self._outbox.items():
            try:
                loop.call_soon_threadsafe(_deliver, batch)
            except RuntimeError:              # that event loop has closed: nobody is listening
                pass
        self._outbox = {}

    @staticmethod
    def _pieces(job: Job, output: RequestOutput) -> list[Piece]:
        """What each completion gained since the job's last update (a completion's text only ever grows by
        what the engine releases, so the characters past those sent are new; beams' appear at the end)."""
        pieces = []
        for completion in output.outputs:
            index = completion.index
            sent_text, sent_logprobs = job.sent_text.get(index, 0), job.sent_logprobs.get(index, 0)
            text = completion.text[sent_text:]
            logprobs = (completion.logprobs or [])[sent_logprobs:]
            finish = completion.finish_reason if index not in job.sent_finish else None
            if not text and not logprobs and finish is None:
                continue
            job.sent_text[index] = sent_text + len(text)
            job.sent_logprobs[index] = sent_logprobs + len(logprobs)
            if finish is not None:
                job.sent_finish.add(index)
            pieces.append(Piece(index, text, logprobs, finish))
        return pieces


def _deliver(batch: list[tuple[asyncio.Queue, Update]]) -> None:
    for updates, update in batch:
        updates.put_nowait(update)
