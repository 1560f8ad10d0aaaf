"""The step loop: admit requests, run scheduled steps, sample, detect stops, report outputs.

One `step()` = schedule -> forward -> commit computed tokens -> sample the sequences that
reached the end of their tokens (verifying their speculative drafts) -> stop checks -> finished
requests leave the batch -> draft the next tokens of the speculating ones.
"""

from __future__ import annotations

import itertools
import re
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Literal, Sequence as Seq, TypeVar

import numpy as np
import torch

from leapgen.decoding.batch import SamplingBatch, SamplingRow
from leapgen.decoding.bitmask import bitmask_words
from leapgen.decoding.candidates import torch_row_logsumexp
from leapgen.decoding.constraint import ConstraintSpec, TokenConstraint
from leapgen.decoding.detokenizer import IncrementalDetokenizer
from leapgen.decoding.sampler import (Sampler, SamplerOutput, note_rows_without_a_token, prompt_logprobs,
                                      request_generator)
from leapgen.decoding.sampling_params import SamplingParams
from leapgen.decoding.speculative import (DraftRequest, NgramProposer, Proposer, SpeculativeConfig,
                                          accepted_length, constrain_draft)
from leapgen.decoding.stop import StopChecker
from leapgen.engine.admission import CheckedRequest, EngineLimits, RequestError, check_request
from leapgen.engine.beams import advance_beams
from leapgen.engine.block_manager import BlockManager
from leapgen.engine.constraint_state import ConstraintState, MasksAhead, step_bitmask
from leapgen.engine.step_profile import phase
from leapgen.engine.loader import LoadedModel
from leapgen.engine.model_runner import FallbackRunner, PagedModelRunner, StepLogits, cache_block_bytes
from leapgen.engine.outputs import CompletionOutput, RequestOutput, TokenLogprob
from leapgen.engine.request_state import EngineRequest, SequenceState
from leapgen.engine.scheduler import Scheduler, SchedulerOutput
from leapgen.engine.sequence import Sequence
from leapgen.grammars.vocab import vocabulary_for
from leapgen.kernels.dispatch import compiled_row_logsumexp

CPU_KV_CACHE_CAP = 512 * 2**20
# Compiled constraints kept for the requests after, the most recently used: a server meeting a new schema in every
# request kept each grammar, with its caches of masks (up to hundreds of MB each), for the life of the process.
# A request holds its own grammar while it runs, so one dropped here only compiles again for a later request.
CONSTRAINTS_KEPT = 64
_UNITS = {"": 1, "b": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "kb": 10**3, "mb": 10**6,
          "gb": 10**9, "tb": 10**12}


def parse_memory(value: int | str) -> int:
    """Bytes from an int or a string like '2GiB' / '512 MiB'."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]i?b|b)?\s*", str(value), re.IGNORECASE)
    if not match:
        raise ValueError(f"kv_cache_memory must be a positive number of bytes or a size like '2GiB', got {value!r}")
    return int(float(match.group(1)) * _UNITS[(match.group(2) or "").lower()])


@dataclass
class EngineConfig:
    """Knobs of the engine; every value is checked when the engine starts."""

    kv_cache_memory: int | str | None = None     # None: see cache_bytes
    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = None   # None: 2048, or max_num_seqs where that is more (one token each)
    enable_prefix_caching: bool = True
    enable_forced_tokens: bool = True            # constraints: append forced continuations without sampling
    speculative: SpeculativeConfig | None = None  # draft tokens by prompt lookup or a draft model
    # CPU: a oneDNN-packed copy of every linear weight (twice their memory) for the passes it serves faster
    # than MKL's sgemm (float32 passes of 4-127 tokens and bfloat16 of 1-127; on AMD CPUs every pass);
    # see engine/models/packed_linear.py
    pack_weights: bool = True
    # CUDA: replay decode steps from graphs recorded per padded batch size (engine/decode_graphs.py), where
    # launching each kernel from Python would bound the step
    cuda_graphs: bool = True

    def __post_init__(self) -> None:
        if self.max_num_batched_tokens is None and isinstance(self.max_num_seqs, int):
            self.max_num_batched_tokens = max(2048, self.max_num_seqs)
        for name in ("block_size", "max_num_seqs", "max_num_batched_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"EngineConfig.{name} must be an int >= 1, got {value!r}")
        if self.max_num_batched_tokens < self.max_num_seqs:     # (here: before a model loads)
            raise ValueError(f"EngineConfig.max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= "
                             f"max_num_seqs ({self.max_num_seqs}), a decode step's token each: lower max_num_seqs "
                             "with it")

    def cache_bytes(self, device: torch.device, bytes_per_token: int, max_model_len: int) -> int:
        """The KV cache budget in bytes: as configured; on CUDA 85% of free memory; on CPU room for every
        sequence at full context, capped at CPU_KV_CACHE_CAP (host memory is shared with everything else)."""
        if self.kv_cache_memory is not None:
            return parse_memory(self.kv_cache_memory)
        if device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(device)
            return int(free * 0.85)
        return min(self.max_num_seqs * max_model_len * bytes_per_token, CPU_KV_CACHE_CAP)


class LLMEngine:
    """Continuous-batching generation over a paged KV cache (or the transformers fallback).

    A request that fails while it is stepped (a matcher error, a user logits processor that
    raises, a failed forward pass) ends alone with finish_reason "error": its blocks are freed and
    the other requests go on.

    Several callers may share one engine (threads, or a stream left open while `generate` runs): each step
    advances every running request, whoever takes it, and outputs are updated in place, so each caller reads
    its own requests' progress from their outputs (`iter_generate`, `stream`).  The engine's state changes
    under one lock.
    """

    def __init__(self, loaded: LoadedModel, config: EngineConfig | None = None, seed: int | None = None) -> None:
        self.loaded = loaded
        self.tokenizer = loaded.tokenizer
        self.config = config = config or EngineConfig()
        # a draft model's cache holds as many blocks as the target's, out of the same budget: loaded first, its
        # weights are out of the free memory a GPU's budget is taken from
        draft = self._draft_model(config.speculative)
        block_bytes = 0 if loaded.is_fallback else cache_block_bytes(loaded, config.block_size)
        block_bytes += 0 if draft is None else cache_block_bytes(draft, config.block_size)
        budget = config.cache_bytes(loaded.device, block_bytes // config.block_size or 4096, loaded.max_model_len)
        if loaded.is_fallback:
            # The fallback keeps HF caches itself; blocks only bound how many tokens are in flight.
            num_blocks = max(budget // (config.block_size * 4096), 1)
            self.runner: PagedModelRunner | FallbackRunner = FallbackRunner(loaded)
        else:
            num_blocks = budget // block_bytes
            if num_blocks < 1:
                held = " (with the draft model's)" if draft is not None else ""
                raise ValueError(f"kv_cache_memory={config.kv_cache_memory!r} holds no KV block: one block of "
                                 f"{config.block_size} tokens takes {block_bytes} bytes{held}")
            graph_batch = config.max_num_seqs if config.cuda_graphs and loaded.device.type == "cuda" else 0
            self.runner = PagedModelRunner(loaded, num_blocks, config.block_size, config.pack_weights, graph_batch)
        self.block_manager = BlockManager(num_blocks, config.block_size, config.enable_prefix_caching)
        self.scheduler = Scheduler(self.block_manager, config.max_num_seqs, config.max_num_batched_tokens)
        self.sampler = Sampler(seed=seed, device=loaded.device,
                               row_logsumexp=compiled_row_logsumexp(loaded.device) or torch_row_logsumexp)
        self.vocabulary = vocabulary_for(loaded.tokenizer, size=loaded.vocab_size, eos_ids=loaded.eos_token_ids)
        windowed = loaded.config is not None and loaded.config.sliding_window is not None
        self.limits = EngineLimits(loaded.vocab_size, loaded.max_model_len, self.block_manager.capacity_tokens,
                                   self.block_manager.block_size, config.max_num_seqs,
                                   "sliding_window" if windowed else "max_position_embeddings")
        self.proposer = self._proposer(config.speculative, draft)
        self._to_propose: list[tuple[EngineRequest, SequenceState]] = []   # accepted a token this step
        self.requests: dict[int, EngineRequest] = {}
        self._owner: dict[int, tuple[EngineRequest, SequenceState]] = {}      # seq_id -> its request and state
        # per constraint spec: its compiled constraint and the tokens of its shortest output (see `_constraint`)
        self._compiled: OrderedDict[tuple, tuple[TokenConstraint, int | None]] = OrderedDict()
        self._advanced: dict[int, EngineRequest] = {}    # requests whose outputs the current step returns
        self._masks_ahead = MasksAhead()
        self._step_masks: dict[int, np.ndarray] = {}     # seq_id -> its mask for this step, computed during the pass
        self._request_ids = itertools.count()
        self._seq_ids = itertools.count()
        self.num_steps = 0                       # forward passes
        self._lock = threading.RLock()
        self._steps_taken = 0                    # calls of step(), by any caller (see iter_generate)
        self.num_forced_tokens = 0               # tokens appended by forced-token jumps, without sampling

    @property
    def has_unfinished(self) -> bool:
        """True while some request is waiting or running."""
        return self.scheduler.has_unfinished

    def _draft_model(self, speculative: SpeculativeConfig | None) -> LoadedModel | None:
        """The draft model a speculative config names, loaded and checked against the target."""
        if speculative is None:
            return None
        if self.loaded.is_fallback:
            raise ValueError("speculative decoding needs leapgen's own model code; this model runs through the "
                             "transformers fallback, which cannot roll back its cache")
        if speculative.method != "draft":
            return None
        from leapgen.engine.draft_model import load_draft

        return load_draft(speculative.model, self.loaded)

    def _proposer(self, speculative: SpeculativeConfig | None, draft: LoadedModel | None) -> Proposer | None:
        if speculative is None:
            return None
        if draft is None:
            return NgramProposer(speculative.prompt_lookup_min, speculative.prompt_lookup_max)
        from leapgen.engine.draft_model import DraftModelProposer

        return DraftModelProposer(draft, self.loaded, self.block_manager.num_blocks, self.config.block_size,
                                  self.config.pack_weights)

    # --- admission ---------------------------------------------------------------------------------

    def check(self, prompt: str | Seq[int], params: SamplingParams | None = None) -> CheckedRequest:
        """Encode and check a request and compile its constraint, queueing nothing; errors say what is wrong.
        Touches no engine state but the memos of constraints, under the lock only to read and write them: another
        thread's steps go on while a constraint compiles."""
        checked = check_request(prompt, params or SamplingParams(), self.tokenizer, self.limits)
        if checked.params.constraint is not None:
            checked.constraint, shortest = self._constraint(checked.params.constraint)
            if shortest is not None and shortest > checked.params.max_tokens:
                raise RequestError(f"max_tokens={checked.params.max_tokens} is too small for the constraint: its "
                                   f"shortest output takes {shortest} tokens")
        return checked

    def compile(self, spec: ConstraintSpec) -> TokenConstraint:
        """`spec` compiled for this model's vocabulary; RequestError when no token of the vocabulary can even start
        an output inside it."""
        return self._constraint(spec)[0]

    def _constraint(self, spec: ConstraintSpec) -> tuple[TokenConstraint, int | None]:
        """`spec` compiled, with the tokens of its shortest output, once per spec while it stays among the
        `CONSTRAINTS_KEPT` used last.  The compile and the search for the shortest output run outside the lock, so
        another thread's steps go on meanwhile (a server's loop; the constraint compiler shares its memos between
        threads), on a grammar no other thread holds yet: a compiled grammar's parser takes no lock of its own, and
        once kept it is used under the engine's lock only (its steps, the masks computed during a forward pass).
        (Searched on the kept grammar, two requests with one new schema could be inside it at once.)"""
        key = spec.key()
        with self._lock:
            kept = self._compiled.get(key)
            if kept is not None:
                self._compiled.move_to_end(key)
                return kept
        compiled = spec.compile(self.vocabulary)
        start = compiled.matcher()
        if not len(start.allowed_token_ids()):
            raise RequestError("constraint: no token of this model's vocabulary can start an output that "
                               "matches it (the vocabulary cannot spell it)")
        closing = start.completion_tokens()
        with self._lock:
            return _kept(self._compiled, key, (compiled, None if closing is None else len(closing)))

    def prepare(self, spec: ConstraintSpec) -> None:
        """Compile `spec` and work out its shortest output, as a request holding it will ask: for another thread
        to do ahead of the request while this engine steps (RequestError / ValueError where it is refused)."""
        self._constraint(spec)

    def add_request(self, prompt: str | Seq[int] | CheckedRequest, params: SamplingParams | None = None) -> int:
        """Queue a prompt (or an already checked request); returns its request id."""
        return self._add(prompt, params).request_id

    def _add(self, prompt: str | Seq[int] | CheckedRequest, params: SamplingParams | None) -> EngineRequest:
        """`add_request`, returning the request itself, whose output its caller reads."""
        # checked before the lock is taken: a constraint's compile must not hold other callers' steps
        checked = prompt if isinstance(prompt, CheckedRequest) else self.check(prompt, params)
        params = checked.params
        with self._lock:
            request_id = next(self._request_ids)
            output = RequestOutput(request_id, checked.prompt, checked.prompt_token_ids, [],
                                   prompt_logprobs=[None] if params.prompt_logprobs is not None else None)
            request = EngineRequest(request_id, params, output, checked.constraint)
            seq = Sequence(next(self._seq_ids), checked.prompt_token_ids, params)
            self.scheduler.add(seq)
            constraint = ConstraintState(checked.constraint, max_tokens=params.max_tokens) if checked.constraint \
                else None
            self._new_state(request, seq, constraint=constraint)
            self.requests[request_id] = request
            return request

    def _new_state(self, request: EngineRequest, seq: Sequence, constraint: ConstraintState | None) -> SequenceState:
        params, index = request.params, len(request.samples)
        completion = CompletionOutput(index, "", [])
        stop = generator = None
        if params.num_beams == 1:                # beams decide their own end; their outputs come at the end
            request.output.outputs.append(completion)
            if params.logprobs is not None:
                completion.logprobs, completion.cumulative_logprob = [], 0.0
            detokenizer = IncrementalDetokenizer(self.vocabulary, request.prompt_token_ids, params.skip_special_tokens)
            stop = StopChecker(params, self.vocabulary.eos_ids, detokenizer)
            if params.seed is not None:
                generator = request_generator(params.seed, index, self.loaded.device)
        state = SequenceState(seq, completion, stop, generator, constraint)
        for token in seq.output_token_ids:      # a fork: its checks and output start from the parent's text
            state.record(token)
        request.samples.append(state)
        self._owner[seq.seq_id] = (request, state)
        return state

    def _fork(self, request: EngineRequest, parent: SequenceState) -> SequenceState:
        """A new sample or beam sharing `parent`'s KV blocks and text."""
        child = self.scheduler.fork(parent.seq, next(self._seq_ids))
        constraint = parent.constraint.fork(child.output_token_ids) if parent.constraint else None
        return self._new_state(request, child, constraint)

    # --- the step loop -----------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """Run one scheduled step; returns the outputs of the requests that advanced (updated in place,
        `delta` = the text this step released)."""
        with self._lock, phase("step"):
            self._steps_taken += 1
            return self._step()

    def _step(self) -> list[RequestOutput]:
        for request in self._advanced.values():
            request.clear_deltas()
        self._advanced = {}
        with phase("schedule"):
            out = self.scheduler.schedule()
        for seq in out.preempted:                # recomputed later without its draft
            request, state = self._owner[seq.seq_id]
            state.drop_draft()
            # and from its first token (a prompt whose logprobs are asked takes no cached block): the prompt rows
            # gathered so far come again
            request.prompt_rows = []
        if out.unfit:
            bm = self.block_manager
            why = "" if bm.enable_prefix_caching else " (without prefix caching, preempted beams share no block)"
            self._fail(self._owner[out.unfit[0].seq_id][0], RequestError(
                f"the KV cache ({bm.num_blocks} blocks of {bm.block_size} tokens) cannot hold the request's "
                f"{len(out.unfit)} beams of up to {max(seq.num_tokens for seq in out.unfit)} tokens at once, with "
                f"nothing else running{why}"))
        if out.is_empty:
            return self._outputs()
        prompt_rows = frozenset(seq.seq_id for seq, _ in out.scheduled
                                if _prompt_logprobs_due(self._owner[seq.seq_id][0])
                                and seq.num_computed_tokens < seq.num_prompt_tokens)
        draft_rows = frozenset(seq.seq_id for seq, _ in out.scheduled if self._owner[seq.seq_id][1].draft)
        try:
            step_logits = self._forward(out, prompt_rows | draft_rows)
        except Exception as exc:                 # the step's requests fail; the engine stays usable
            for seq, _ in out.scheduled:
                if seq.seq_id in self._owner:
                    self._fail(self._owner[seq.seq_id][0], exc)
            return self._outputs()
        self.scheduler.commit(out)
        self.num_steps += 1
        for request in {id(self._owner[s.seq_id][0]): self._owner[s.seq_id][0] for s, _ in out.scheduled}.values():
            request.output.metrics.forward_passes += 1
        ready = self._fork_samples(self._ready_rows(out, step_logits, prompt_rows))
        self._sample_plain([entry for entry in ready if entry[0].params.num_beams == 1])
        self._advance_beams([entry for entry in ready if entry[0].params.num_beams > 1])
        self._step_masks = {}
        with phase("propose"):
            self._propose()
        return self._outputs()

    def _forward(self, out: SchedulerOutput, all_positions: frozenset[int]) -> StepLogits:
        """The step's forward pass, with the masks of the constrained sequences it makes due computed meanwhile."""
        due = {}
        for seq, n in out.scheduled:
            state = self._owner[seq.seq_id][1] if seq.seq_id in self._owner else None
            if (state is not None and state.constraint is not None and not state.draft
                    and seq.num_computed_tokens + n == seq.num_tokens):
                due[seq.seq_id] = state.constraint
        with phase("forward", self.loaded.device):
            # The rows as wide as the step's bitmask (the model's vocabulary, which may pad the tokenizer's).
            masks = self._masks_ahead.start(due, bitmask_words(self.loaded.vocab_size))
            try:
                return self.runner.execute(out, all_positions)
            finally:                             # a worker that overruns the pass is waited for inside it
                self._step_masks = masks.result()

    def _ready_rows(self, out: SchedulerOutput, step_logits: StepLogits, prompt_rows: frozenset[int]) -> list[_Entry]:
        """The sequences whose next token is due, with their logits rows (one, or one per draft token and one
        more); prompt logprobs collected on the way."""
        ready = []
        for seq, _ in out.scheduled:
            rows = step_logits.rows.get(seq.seq_id)
            if rows is None or seq.seq_id not in self._owner:
                continue
            request, state = self._owner[seq.seq_id]
            logits = step_logits.logits[rows]
            if seq.seq_id in prompt_rows and not self._guarded(request, self._collect_prompt_logits, request, seq,
                                                               logits):
                continue
            if state.draft:
                state.pending_rows.append(logits)
                if seq.num_uncomputed == 0:     # the whole draft is computed: its rows are the last ones
                    logits = torch.cat(state.pending_rows)[-(len(state.draft) + 1):]
                    state.pending_rows = []
                    ready.append((request, state, logits))
            elif seq.num_uncomputed == 0:
                ready.append((request, state, logits[-1:]))
        return ready

    def _fork_samples(self, ready: list[_Entry]) -> list[_Entry]:
        """n > 1: when the prompt's logits arrive, fork the other samples so they share its KV blocks."""
        expanded = []
        for request, state, row in ready:
            expanded.append((request, state, row))
            if request.params.n > 1 and request.params.num_beams == 1 and not request.forked:
                for _ in range(1, request.params.n):
                    expanded.append((request, self._fork(request, state), row))
        return expanded

    def _sample_plain(self, entries: list[_Entry]) -> None:
        for group, (sampled, row_errors) in self._compute_isolated(entries, self._draw):
            tokens, first = sampled.token_ids.tolist(), 0
            for request, state, rows in group:
                span = range(first, first + len(rows))
                first = span.stop
                drawn = tokens[span.start:span.stop]
                failed = next((row - span.start for row in span if row in row_errors), None)
                # a row past the first draft token verification rejects is one plain decoding never computes: its
                # error (a user processor meeting a token it would never see) goes with it
                if failed is not None and failed <= accepted_length(state.draft, drawn):
                    self._fail(request, row_errors[span.start + failed])
                elif not request.finished:      # a sibling sample may have failed it this step
                    with phase("accept"):
                        self._guarded(request, self._accept, request, state, drawn, sampled, span.start)

    def _draw(self, entries: list[_Entry]) -> tuple[SamplerOutput, dict[int, Exception]]:
        logits, batch = self._batch(entries)
        with phase("sampling", self.loaded.device):
            return self.sampler(logits, batch), batch.row_errors

    def _accept(self, request: EngineRequest, state: SequenceState, sampled_tokens: list[int], sampled: SamplerOutput,
                first_row: int) -> None:
        """Take the tokens sampled at a sequence's rows: its draft's longest matching prefix and the first
        token sampled past it (the one row of a sequence without a draft); rejected draft tokens leave the
        sequence and the KV cache."""
        metrics = request.output.metrics
        accepted = accepted_length(state.draft, sampled_tokens)
        if state.draft:
            metrics.drafted_tokens += len(state.draft)
            self.block_manager.truncate(state.seq, state.seq.num_tokens - len(state.draft) + accepted)
            state.draft, state.draft_masks = [], None
        if metrics.time_to_first_token is None:
            metrics.time_to_first_token = time.perf_counter() - request.arrival
        for i, token in enumerate(sampled_tokens[:accepted + 1]):
            if i == accepted and state.constraint is not None:
                if i and self._jumps(state.seq.params) and state.constraint.is_forced():
                    break                       # the draft ended where the text is forced: the jump below appends it
                token = state.constraint.admissible(token, self.vocabulary.eos_ids)    # closes in time
            if state.completion.logprobs is not None:
                state.record_logprob(_token_logprob(sampled, first_row + i, token, state.seq.params.logprobs))
            if i < accepted:
                state.accept(token)             # a verified draft token: already in the sequence and the cache
                metrics.accepted_tokens += 1    # (counted as it joins the output: none past a stop)
            else:
                state.append(token)
            if state.finished:
                break
        self._advanced[request.request_id] = request
        # jumps until the next token is a choice: a forced text that completes the output leaves eos forced next
        # (one jump a step took a forward pass of its own to sample the eos, the only token allowed)
        while state.constraint is not None and not state.finished and self._jumps(state.seq.params):
            room = state.seq.params.max_tokens - state.seq.num_output_tokens
            jumped = state.constraint.jump(self.vocabulary.eos_ids, room)
            if not jumped:
                break
            for forced in jumped:
                if state.completion.logprobs is not None:   # one entry per output token, this one without a forward
                    top = {forced: 0.0} if state.seq.params.logprobs else {}    # its one alternative: itself
                    state.record_logprob(TokenLogprob(forced, 0.0, top, forced=True))
                state.append(forced)
                self.num_forced_tokens += 1
                metrics.forced_tokens += 1
                if state.finished:
                    break
        if state.finished:
            self._retire(state, state.stop.finish_reason)
            self._maybe_finish(request)
        elif self.proposer is not None and state.seq.params.speculative and state.seq.params.num_beams == 1:
            # (beams read one token a step: each step ranks all of a request's candidates together)
            self._to_propose.append((request, state))

    def _jumps(self, params: SamplingParams) -> bool:
        """Whether a constrained request's forced continuations are appended without sampling: not where its own
        processors may rule tokens out (`logit_bias`, `no_repeat_ngram_size`, `logits_processors`), which a jump's
        tokens would pass by (a banned token came out in the forced text's canonical spelling)."""
        return self.config.enable_forced_tokens and not (params.logit_bias or params.no_repeat_ngram_size
                                                         or params.logits_processors)

    def _propose(self) -> None:
        """Draft the next tokens of every speculating sequence that accepted tokens this step, in one batch."""
        batch, self._to_propose = self._to_propose, []
        spec = self.config.speculative
        wanted = []
        for request, state in batch:
            room = state.seq.params.max_tokens - state.seq.num_output_tokens - 1   # the step also adds one token
            if not request.finished and not state.seq.is_finished and room >= 1:
                matcher = state.constraint.matcher if state.constraint is not None else None
                wanted.append((request, state, DraftRequest(state.seq.seq_id, state.seq.token_ids,
                                                            min(spec.num_speculative_tokens, room), matcher)))
        if not wanted:
            return
        try:
            drafts = self.proposer.propose([draft_request for _, _, draft_request in wanted])
        except Exception:                        # the proposer failed for the batch: each request asks alone, and
            drafts = []                          # only those it fails for again fail
            for request, _, draft_request in wanted:
                draft = False if request.finished else self._guarded(request, self.proposer.propose, [draft_request])
                drafts.append(draft[0] if draft else [])
        for (request, state, _), draft in zip(wanted, drafts):
            if draft and not request.finished:   # (another sample of it may have failed its draft meanwhile)
                self._guarded(request, self._set_draft, state, draft)

    def _set_draft(self, state: SequenceState, draft: list[int]) -> None:
        masks = None
        if state.constraint is not None:         # cut at the first token the constraint rejects
            draft, masks = constrain_draft(state.constraint.matcher, draft, self.vocabulary.mask_words,
                                           self.vocabulary.eos_ids, self._jumps(state.seq.params))
        if draft:
            state.set_draft(draft, masks)

    def _advance_beams(self, entries: list[_Entry]) -> None:
        """Beam rows get processed log-probs; each request steps once all its live beams have theirs."""
        for group, (log_probs, row_errors) in self._compute_isolated(entries, self._beam_log_probs):
            for row, ((request, state, _), row_log_probs) in enumerate(zip(group, log_probs)):
                if row in row_errors:
                    self._fail(request, row_errors[row])
                elif not request.finished:
                    request.beam_rows[state.seq.seq_id] = row_log_probs
            for request in {id(r): r for r, _, _ in group}.values():
                if request.finished:
                    continue
                self._advanced[request.request_id] = request
                metrics = request.output.metrics
                if metrics.time_to_first_token is None:     # the beams' first tokens
                    metrics.time_to_first_token = time.perf_counter() - request.arrival
                if self._guarded(request, advance_beams, request, self.vocabulary.eos_ids, self._fork,
                                 self._retire, self._decode) is True:
                    self._maybe_finish(request)

    def _beam_log_probs(self, entries: list[_Entry]) -> tuple[torch.Tensor, dict[int, Exception]]:
        # the processors act on the log-probs, which stay as they leave them (transformers' beam search): a penalty
        # scales a log-prob, and what a ban or a constraint takes away is not handed to the tokens left
        logits, batch = self._batch(entries)
        log_probs = self.sampler.pipeline(logits.float().log_softmax(dim=-1), batch)
        # a row with nothing to take fails its request, as a sampled row's does (beam search would rank a NaN, and
        # end a request whose beams all met -inf without a word)
        note_rows_without_a_token(log_probs, range(len(log_probs)), batch.row_errors)
        return log_probs, batch.row_errors

    def _batch(self, entries: list[_Entry]) -> tuple[torch.Tensor, SamplingBatch]:
        """The step's logits rows and what the processors need for each: a drafted sequence's row i sees its
        output plus the first i draft tokens, and the constraint's mask after them."""
        logits = torch.cat([rows for _, _, rows in entries])
        rows: list[SamplingRow] = []
        masks: list[ConstraintState | np.ndarray | None] = []
        for _, state, entry_rows in entries:
            seq = state.seq
            ids, prompt = seq.token_array(), seq.num_prompt_tokens
            accepted = seq.num_tokens - len(state.draft)
            for i in range(len(entry_rows)):
                rows.append(SamplingRow(seq.params, ids[:prompt], ids[prompt:accepted + i], state.generator))
                masks.append(state.draft_masks[i] if state.draft_masks is not None
                             else self._step_masks.get(seq.seq_id, state.constraint))
        with phase("masks"):
            bitmask, mask_errors = step_bitmask(masks, logits.shape[-1])
        with phase("sampling"):
            batch = SamplingBatch.build(rows, logits.shape[-1], self.vocabulary.eos_ids, logits.device, bitmask)
        batch.row_errors.update(mask_errors)
        return logits, batch

    # --- failure isolation -------------------------------------------------------------------------

    def _compute_isolated(self, entries: list[_Entry], compute: Callable[[list[_Entry]], T]
                          ) -> list[tuple[list[_Entry], T]]:
        """`compute` over the batch; if it raises, over each request's rows apart, so only the failing
        request fails.  Returns the groups that succeeded with their results."""
        if not entries:
            return []
        try:
            return [(entries, compute(entries))]
        except Exception as exc:
            requests = list({id(r): r for r, _, _ in entries}.values())
            if len(requests) == 1:
                self._fail(requests[0], exc)
                return []
        return [part for request in requests
                for part in self._compute_isolated([e for e in entries if e[0] is request], compute)]

    def _guarded(self, request: EngineRequest, action: Callable[..., Any], *args: Any) -> Any:
        """Run one request's `action`; a failure ends that request alone (returns False then)."""
        try:
            result = action(*args)
        except Exception as exc:
            self._fail(request, exc)
            return False
        return True if result is None else result

    def _fail(self, request: EngineRequest, exc: BaseException) -> None:
        if request.finished:
            return
        for state in request.samples:
            if not state.seq.is_finished:
                self._retire(state, "error")
        # (a refusal says what is wrong in its own words; anything else is named by its kind)
        request.fail(str(exc) if isinstance(exc, RequestError) else f"{type(exc).__name__}: {exc}")
        self.requests.pop(request.request_id, None)
        self._advanced[request.request_id] = request

    # --- bookkeeping ---------------------------------------------------------------------------------

    def _collect_prompt_logits(self, request: EngineRequest, seq: Sequence, logits: torch.Tensor) -> None:
        request.prompt_rows.append(logits[: max(0, seq.num_prompt_tokens - (seq.num_computed_tokens - len(logits)))])
        if seq.num_computed_tokens < seq.num_prompt_tokens:
            return
        rows = torch.cat(request.prompt_rows)
        request.prompt_rows = []
        top_n = request.params.prompt_logprobs
        result = prompt_logprobs(rows, request.prompt_token_ids, top_n)
        for i, value in enumerate(result.logprobs.tolist()):
            top = dict(zip(result.top_ids[i].tolist(), result.top_logprobs[i].tolist())) if top_n else {}
            request.output.prompt_logprobs.append(TokenLogprob(request.prompt_token_ids[i + 1], value, top))

    def _decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    def _maybe_finish(self, request: EngineRequest) -> None:
        if request.params.num_beams > 1:
            finished = request.beams is not None and request.beams.done
        else:
            finished = len(request.samples) == request.params.n and all(s.finished for s in request.samples)
        if finished:
            request.finish()
            self.requests.pop(request.request_id, None)

    def _retire(self, state: SequenceState, reason: str) -> None:
        self.scheduler.finish(state.seq, reason)
        self._owner.pop(state.seq.seq_id, None)
        if self.proposer is not None:
            self.proposer.release(state.seq.seq_id)
        if isinstance(self.runner, FallbackRunner):
            self.runner.release(state.seq)

    def _outputs(self) -> list[RequestOutput]:
        return [request.output for request in self._advanced.values()]

    def abort(self, request_id: int) -> None:
        """Drop a request that has not finished; its blocks are freed."""
        with self._lock:
            request = self.requests.pop(request_id, None)
            if request is None:
                return
            for state in request.samples:
                if not state.seq.is_finished:
                    self._retire(state, "abort")
            request.output.finished = True

    def reset_prefix_cache(self) -> int:
        """Forget the cached KV blocks of finished prompts (e.g. to time prefills from cold, or after the text
        they cached stops recurring); returns how many blocks were forgotten.  Running requests keep theirs."""
        with self._lock:
            return self.block_manager.reset_prefix_cache()

    # --- whole batches -------------------------------------------------------------------------------

    def generate(self, prompts: Seq[str | Seq[int]], params: SamplingParams | Seq[SamplingParams] | None = None,
                 progress: Callable[[int, int], None] | None = None,
                 on_error: Literal["raise", "return"] = "raise") -> list[RequestOutput]:
        """Run prompts to completion (continuous batching); outputs in prompt order.

        Every request is checked before any is queued: a bad one raises RequestError naming
        `prompts[i]`, or with `on_error="return"` comes back with finish_reason "error" while the
        rest run.  A request that fails while running comes back that way in either mode (its error
        names `prompts[i]` too), so the rest of the batch is not lost.
        """
        results: dict[int, RequestOutput] = {}
        for index, output in self.iter_generate(prompts, params, on_error):
            results[index] = output
            if progress is not None:
                progress(len(results), len(prompts))
        return [results[i] for i in range(len(prompts))]

    def iter_generate(self, prompts: Seq[str | Seq[int]], params: SamplingParams | Seq[SamplingParams] | None = None,
                      on_error: Literal["raise", "return"] = "raise", max_pending: int | None = None
                      ) -> Iterator[tuple[int, RequestOutput]]:
        """Like `generate`, but yields `(prompt index, output)` as each request finishes, so a pipeline can
        write results while the rest run.  With `max_pending`, prompts are checked and queued as room
        frees up, at most that many at a time (a long input starts at once and memory stays bounded; a bad
        prompt is then met when its turn comes).  Closing the iterator early aborts what still runs."""
        if on_error not in ("raise", "return"):
            raise ValueError(f"on_error must be 'raise' or 'return', got {on_error!r}")
        params_list = list(params) if isinstance(params, (list, tuple)) else [params] * len(prompts)
        if len(params_list) != len(prompts):
            raise ValueError(f"got {len(params_list)} SamplingParams for {len(prompts)} prompts")
        window = len(prompts) if max_pending is None else max(1, max_pending)
        checked = None                           # without a bound, every request is checked before any runs
        if max_pending is None:
            checked = [self._checked(index, prompt, sampling, on_error)
                       for index, (prompt, sampling) in enumerate(zip(prompts, params_list))]
        pending: dict[int, tuple[int, RequestOutput]] = {}     # request id -> prompt index, output
        queued = 0
        seen = self._steps_taken
        try:
            while queued < len(prompts) or pending:
                while queued < len(prompts) and len(pending) < window:
                    request = checked[queued] if checked is not None else \
                        self._checked(queued, prompts[queued], params_list[queued], on_error)
                    if isinstance(request, RequestOutput):
                        yield queued, request
                    else:
                        added = self._add(request, None)
                        pending[added.request_id] = queued, added.output
                    queued += 1
                with self._lock:
                    if self._steps_taken == seen and self.has_unfinished:
                        outputs = self.step()
                    else:   # another caller stepped since (some of ours may have finished there), or nothing runs
                        outputs = [output for _, output in pending.values() if output.finished]
                        if not outputs and not self.has_unfinished:
                            break
                    seen = self._steps_taken
                for output in outputs:
                    if output.finished and output.request_id in pending:
                        index = pending.pop(output.request_id)[0]
                        if output.error is not None:    # named as a refusal is: by the prompt it came from
                            output.error = str(RequestError(output.error, index))
                        yield index, output
        finally:                                 # an interrupted call leaves nothing running
            for request_id in pending:
                self.abort(request_id)

    def stream(self, prompt: str | Seq[int] | CheckedRequest, params: SamplingParams | None = None) -> Iterator[str]:
        """Queue one request (n = 1) and yield its text as it is released; the pieces join to its final text.
        RuntimeError with its error (after the text so far) where it fails; closing the iterator aborts it."""
        added = self._add(prompt, params)
        request_id, output = added.request_id, added.output
        sent = 0
        try:
            while True:
                # whether it ended before its text, which another caller's step may finish between the two reads;
                # and the text, not the step's delta: another caller's steps may have advanced it too
                finished, error = output.finished, output.error
                text = output.outputs[0].text if output.outputs else ""
                if len(text) > sent:
                    piece, sent = text[sent:], len(text)
                    yield piece
                    continue    # (read again: more may have come while the caller held this piece)
                if error is not None:
                    raise RuntimeError(error)
                if finished:
                    return
                with self._lock:
                    if not output.finished:
                        if not self.has_unfinished:
                            raise RuntimeError(f"request {request_id} left the engine unfinished")
                        self.step()
        finally:
            self.abort(request_id)

    def _checked(self, index: int, prompt: str | Seq[int], params: SamplingParams | None,
                 on_error: Literal["raise", "return"]) -> CheckedRequest | RequestOutput:
        """The checked request, or (on_error="return") its refusal as a finished output."""
        try:
            return self.check(prompt, params)
        except (ValueError, TypeError, RecursionError) as exc:
            error, cause = RequestError(str(exc), index), None
        except Exception as exc:    # a bug met checking one request (a constraint spec of the user's) is its alone
            error, cause = RequestError(f"the request could not be checked: {exc!r}", index), exc
        if on_error == "raise":
            raise error from cause
        return self._refused(prompt, error)

    def _refused(self, prompt: object, error: Exception) -> RequestOutput:
        text = prompt if isinstance(prompt, str) else None
        ids = list(prompt) if isinstance(prompt, (list, tuple)) else []
        return RequestOutput(next(self._request_ids), text, ids, [CompletionOutput(0, "", [], "error")],
                             finished=True, error=str(error))


_Entry = tuple[EngineRequest, SequenceState, torch.Tensor]   # a sequence due for tokens, with its [rows, V] logits
T = TypeVar("T")


def _prompt_logprobs_due(request: EngineRequest) -> bool:
    """Whether the request asked for its prompt's logprobs and has not got them all yet (a preempted request
    computes its prompt again, whose logprobs it already holds once it got that far)."""
    logprobs = request.output.prompt_logprobs
    return logprobs is not None and len(logprobs) < len(request.prompt_token_ids)


def _token_logprob(sampled: SamplerOutput, row: int, token: int, top_n: int | None) -> TokenLogprob:
    top = {}
    if top_n:
        top = dict(zip(sampled.top_logprob_ids[row, :top_n].tolist(), sampled.top_logprobs[row, :top_n].tolist()))
    return TokenLogprob(token, float(sampled.logprobs[row]), top)


def _kept(cache: OrderedDict[tuple, T], key: tuple, value: T) -> T:
    """`value` kept under `key` as the most recently used entry of `cache`, the least recently used dropped past
    CONSTRAINTS_KEPT entries."""
    while len(cache) >= CONSTRAINTS_KEPT:
        cache.popitem(last=False)
    cache[key] = value
    return value
