"""The step loop: admit requests, run scheduled steps, sample, detect stops, report outputs.

One `step()` = schedule -> forward -> commit computed tokens -> sample the sequences that
reached the end of their tokens -> stop checks -> finished requests leave the batch.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field
from typing import Any, Sequence as Seq

import numpy as np
import torch

from leapgen.decoding.batch import SamplingBatch, SamplingRow
from leapgen.decoding.bitmask import bitmask_words
from leapgen.decoding.detokenizer import IncrementalDetokenizer
from leapgen.decoding.beam_search import BeamSearch
from leapgen.decoding.sampler import Sampler, prompt_logprobs, request_generator
from leapgen.decoding.sampling_params import SamplingParams
from leapgen.decoding.stop import StopChecker
from leapgen.engine.block_manager import BlockManager
from leapgen.engine.loader import LoadedModel
from leapgen.engine.model_runner import FallbackRunner, PagedModelRunner, cache_block_bytes
from leapgen.engine.outputs import CompletionOutput, RequestOutput, TokenLogprob
from leapgen.engine.scheduler import Scheduler
from leapgen.engine.sequence import Sequence

_UNITS = {"": 1, "b": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30, "kb": 10**3, "mb": 10**6, "gb": 10**9}


def parse_memory(value: int | str) -> int:
    """Bytes from an int or a string like '2GiB' / '512 MiB'."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmg]i?b|b)?\s*", str(value), re.IGNORECASE)
    if not match:
        raise ValueError(f"kv_cache_memory must be a positive number of bytes or a size like '2GiB', got {value!r}")
    return int(float(match.group(1)) * _UNITS[(match.group(2) or "").lower()])


@dataclass
class EngineConfig:
    """Knobs of the engine; every value is checked when the engine starts."""

    kv_cache_memory: int | str | None = None     # None: 2 GiB on CPU, 85% of free memory on CUDA
    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    enable_prefix_caching: bool = True
    enable_forced_tokens: bool = True            # constraints: append forced continuations without sampling

    def __post_init__(self) -> None:
        for name in ("block_size", "max_num_seqs", "max_num_batched_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"EngineConfig.{name} must be an int >= 1, got {value!r}")

    def cache_bytes(self, device: torch.device) -> int:
        """The KV cache budget in bytes."""
        if self.kv_cache_memory is not None:
            return parse_memory(self.kv_cache_memory)
        if device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(device)
            return int(free * 0.85)
        return 2 * 2**30


@dataclass
class _Sample:
    """One sequence of a request: a sample (n > 1 gives several) or a live beam."""

    seq: Sequence
    stop: StopChecker | None
    generator: torch.Generator | None
    logprobs: list[TokenLogprob] | None = None
    cumulative_logprob: float = 0.0
    matcher: Any = None                          # the constraint's per-sequence state (grammars.Matcher)

    def completion(self, index: int, decode) -> CompletionOutput:
        stop = self.stop
        if stop is None:                         # a running beam: no stop checker, decode what it has
            return CompletionOutput(index, decode(self.seq.output_token_ids), self.seq.output_token_ids)
        return CompletionOutput(index, stop.text, self.seq.output_token_ids, stop.finish_reason, stop.stop_reason,
                                self.logprobs, self.cumulative_logprob if self.logprobs is not None else None)


@dataclass
class _Request:
    """Engine-side state of one request: its samples, or its beams and their search."""

    request_id: int
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    samples: list[_Sample]
    constraint: Any = None                       # a compiled grammar (grammars.CompiledGrammar)
    beams: BeamSearch | None = None
    beam_rows: dict[int, torch.Tensor] = field(default_factory=dict)   # log-probs of beams waiting for siblings
    prompt_rows: list[torch.Tensor] = field(default_factory=list)       # prompt logits gathered chunk by chunk
    prompt_logprobs: list[TokenLogprob | None] | None = None
    finished: bool = False
    beam_outputs: list[CompletionOutput] = field(default_factory=list)

    @property
    def forked(self) -> bool:
        """True once the request's samples or beams exist beyond the first sequence."""
        return len(self.samples) > 1 or self.beams is not None

    def output(self, decode) -> RequestOutput:
        completions = self.beam_outputs or [s.completion(i, decode) for i, s in enumerate(self.samples)]
        return RequestOutput(self.request_id, self.prompt, self.prompt_token_ids, completions,
                             finished=self.finished, prompt_logprobs=self.prompt_logprobs)


class LLMEngine:
    """Continuous-batching generation over a paged KV cache (or the transformers fallback)."""

    def __init__(self, loaded: LoadedModel, config: EngineConfig | None = None, seed: int | None = None) -> None:
        self.loaded = loaded
        self.tokenizer = loaded.tokenizer
        self.config = config = config or EngineConfig()
        budget = config.cache_bytes(loaded.device)
        if loaded.is_fallback:
            # The fallback keeps HF caches itself; blocks only bound how many tokens are in flight.
            num_blocks = max(budget // (config.block_size * 4096), 1)
            self.runner: PagedModelRunner | FallbackRunner = FallbackRunner(loaded)
        else:
            num_blocks = budget // cache_block_bytes(loaded, config.block_size)
            if num_blocks < 1:
                raise ValueError(f"kv_cache_memory={config.kv_cache_memory!r} holds no KV block: one block of "
                                 f"{config.block_size} tokens takes {cache_block_bytes(loaded, config.block_size)} bytes")
            self.runner = PagedModelRunner(loaded, num_blocks, config.block_size)
        self.block_manager = BlockManager(num_blocks, config.block_size, config.enable_prefix_caching)
        self.scheduler = Scheduler(self.block_manager, config.max_num_seqs, config.max_num_batched_tokens)
        self.sampler = Sampler(seed=seed, device=loaded.device)
        self.requests: dict[int, _Request] = {}
        self._owner: dict[int, tuple[_Request, _Sample]] = {}      # seq_id -> its request and sample
        self._request_ids = itertools.count()
        self._seq_ids = itertools.count()
        self.num_steps = 0                       # forward passes
        self.num_forced_tokens = 0               # tokens appended by forced-token jumps, without sampling

    @property
    def has_unfinished(self) -> bool:
        """True while some request is waiting or running."""
        return self.scheduler.has_unfinished

    def encode(self, prompt: str | Seq[int]) -> tuple[str | None, list[int]]:
        """The prompt's text (when given as text) and token ids."""
        if isinstance(prompt, str):
            return prompt, self.tokenizer.encode(prompt)
        if isinstance(prompt, (list, tuple)) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return None, list(prompt)
        raise TypeError(f"a prompt must be a string or a list of token ids, got {type(prompt).__name__}")

    def add_request(self, prompt: str | Seq[int], params: SamplingParams | None = None, constraint: Any = None) -> int:
        """Queue a prompt; returns its request id.  Errors name the request's problem before anything runs.

        `constraint` is a compiled grammar (`leapgen.grammars.compile_*`): every output is kept inside it,
        and where it admits one continuation only, those tokens are appended without sampling.
        """
        params = params or SamplingParams()
        text, ids = self.encode(prompt)
        limit = self.loaded.max_model_len
        if not ids:
            raise ValueError("the prompt is empty: at least one token is needed")
        if len(ids) >= limit:
            raise ValueError(f"the prompt has {len(ids)} tokens; the model's context is {limit} tokens "
                             f"(max_position_embeddings), so at most {limit - 1} prompt tokens fit")
        vocab = self.loaded.vocab_size
        bad = next((t for t in ids if t >= vocab), None)
        if bad is not None:
            raise ValueError(f"prompt token id {bad} is outside the model's vocabulary of {vocab}")
        if constraint is not None and params.ignore_eos:
            raise ValueError("ignore_eos cannot be combined with a constraint: the constraint decides where the "
                             "text ends, and eos is the only token allowed there")
        if params.num_beams > 1 and (params.stop or params.temperature > 0 or params.logprobs is not None):
            raise ValueError("beam search (num_beams > 1) is deterministic: it takes no stop strings, "
                             "temperature or logprobs; use n > 1 with sampling for those")
        # Never generate past the model's context: clip max_tokens (finish_reason "length" as usual).
        room = limit - len(ids)
        if params.max_tokens > room:
            params = _with(params, max_tokens=room, min_tokens=min(params.min_tokens, room))
        request = _Request(next(self._request_ids), text, ids, params, [], constraint,
                           prompt_logprobs=[None] if params.prompt_logprobs is not None else None)
        first = self._new_sample(request, Sequence(next(self._seq_ids), ids, params), 0)
        self.scheduler.add(first.seq)
        self.requests[request.request_id] = request
        return request.request_id

    def _new_sample(self, request: _Request, seq: Sequence, index: int) -> _Sample:
        params = request.params
        stop = None
        if params.num_beams == 1:
            detok = IncrementalDetokenizer(self.tokenizer, request.prompt_token_ids, params.skip_special_tokens)
            stop = StopChecker(params, self.loaded.eos_token_ids, detok)
            if seq.num_output_tokens:            # a fork: replay the parent's output into its own checker
                for token in seq.output_token_ids:
                    stop.append(token)
        generator = (request_generator(params.seed, index, self.loaded.device)
                     if params.seed is not None and params.num_beams == 1 else None)
        matcher = None
        if request.constraint is not None:
            matcher = request.constraint.matcher()
            for token in seq.output_token_ids:     # a fork: bring its own matcher to the shared text
                matcher.advance(token)
        sample = _Sample(seq, stop, generator, [] if params.logprobs is not None else None, matcher=matcher)
        request.samples.append(sample)
        self._owner[seq.seq_id] = (request, sample)
        return sample

    def abort(self, request_id: int) -> None:
        """Drop a request that has not finished."""
        request = self.requests.pop(request_id)
        for sample in request.samples:
            if not sample.seq.is_finished:
                self._retire(sample, "abort")

    def step(self) -> list[RequestOutput]:
        """Run one scheduled step; returns the outputs of the requests that advanced."""
        out = self.scheduler.schedule()
        if out.is_empty:
            return []
        want_all = frozenset(seq.seq_id for seq, _ in out.scheduled
                             if self._owner[seq.seq_id][0].prompt_logprobs is not None
                             and seq.num_computed_tokens < seq.num_prompt_tokens)
        step_logits = self.runner.execute(out, want_all)
        self.scheduler.commit(out)
        self.num_steps += 1
        ready: list[tuple[_Request, _Sample, torch.Tensor]] = []
        for seq, n in out.scheduled:
            rows = step_logits.rows.get(seq.seq_id)
            if rows is None:
                continue
            request, sample = self._owner[seq.seq_id]
            logits = step_logits.logits[rows]
            if seq.seq_id in want_all:
                self._collect_prompt_logits(request, seq, logits)
            if seq.num_uncomputed == 0:
                ready.append((request, sample, logits[-1]))
        ready = self._fork_samples(ready)
        advanced = self._sample(ready)
        return [r.output(self._decode) for r in advanced]

    def _collect_prompt_logits(self, request: _Request, seq: Sequence, logits: torch.Tensor) -> None:
        request.prompt_rows.append(logits[: max(0, seq.num_prompt_tokens - (seq.num_computed_tokens - len(logits)))])
        if seq.num_computed_tokens >= seq.num_prompt_tokens:
            rows = torch.cat(request.prompt_rows)
            request.prompt_rows = []
            top_n = request.params.prompt_logprobs
            result = prompt_logprobs(rows, request.prompt_token_ids, top_n)
            for i, value in enumerate(result.logprobs.tolist()):
                top = {}
                if top_n:
                    top = dict(zip(result.top_ids[i].tolist(), result.top_logprobs[i].tolist()))
                request.prompt_logprobs.append(TokenLogprob(request.prompt_token_ids[i + 1], value, top))

    def _fork_samples(self, ready: list[tuple[_Request, _Sample, torch.Tensor]]):
        """n > 1: when the prompt's logits arrive, fork the other samples so they share its KV blocks."""
        expanded = []
        for request, sample, row in ready:
            expanded.append((request, sample, row))
            if request.params.n > 1 and request.params.num_beams == 1 and not request.forked:
                for index in range(1, request.params.n):
                    child = self.scheduler.fork(sample.seq, next(self._seq_ids))
                    expanded.append((request, self._new_sample(request, child, index), row))
        return expanded

    def _sample(self, ready: list[tuple[_Request, _Sample, torch.Tensor]]) -> list[_Request]:
        """Choose the next token of every ready sequence; returns the requests that advanced."""
        beams = [entry for entry in ready if entry[0].params.num_beams > 1]
        plain = [entry for entry in ready if entry[0].params.num_beams == 1]
        if beams:
            self._advance_beams(beams)
        if plain:
            self._sample_plain(plain)
        return list({id(request): request for request, _, _ in ready}.values())

    def _batch(self, entries: list[tuple[_Request, _Sample, torch.Tensor]]) -> tuple[torch.Tensor, SamplingBatch]:
        logits = torch.stack([row for _, _, row in entries])
        rows = [SamplingRow(s.seq.params, s.seq.prompt_token_ids, s.seq.output_token_ids, s.generator)
                for _, s, _ in entries]
        bitmask = self._bitmask([s for _, s, _ in entries], logits.shape[-1])
        return logits, SamplingBatch.build(rows, logits.shape[-1], self.loaded.eos_token_ids, logits.device, bitmask)

    def _sample_plain(self, entries: list[tuple[_Request, _Sample, torch.Tensor]]) -> None:
        logits, batch = self._batch(entries)
        sampled = self.sampler(logits, batch)
        for row, ((request, sample, _), token) in enumerate(zip(entries, sampled.token_ids.tolist())):
            if sample.logprobs is not None:
                self._record_logprobs(sample, sampled, row, token)
            self._append(sample, token)
            if sample.matcher is not None and not sample.stop.finished and self.config.enable_forced_tokens:
                self._jump_forward(sample)
            if sample.stop.finished:
                self._retire(sample, sample.stop.finish_reason)
                self._maybe_finish(request)

    def _advance_beams(self, entries: list[tuple[_Request, _Sample, torch.Tensor]]) -> None:
        """Beam rows get processed log-probs; each request steps once all its live beams have theirs."""
        logits, batch = self._batch(entries)
        log_probs = self.sampler.pipeline(logits, batch).log_softmax(dim=-1)
        for (request, sample, _), row in zip(entries, log_probs):
            request.beam_rows[sample.seq.seq_id] = row
        for request in {id(request): request for request, _, _ in entries}.values():
            self._beam_step(request)

    def _beam_step(self, request: _Request) -> None:
        """Advance a request's beams once every live beam has its next-token log-probs."""
        live = [s for s in request.samples if not s.seq.is_finished]
        if any(s.seq.seq_id not in request.beam_rows for s in live):
            return                                   # a sibling was preempted; wait for its recomputation
        params = request.params
        if request.beams is None:
            request.beams = BeamSearch(params.num_beams, params.max_tokens,
                                       () if params.ignore_eos else self.loaded.eos_token_ids,
                                       params.length_penalty, params.early_stopping)
        log_probs = torch.stack([request.beam_rows.pop(s.seq.seq_id) for s in live])
        step = request.beams.step(log_probs)
        # Fork before appending: several new beams may continue the same parent.
        children: list[_Sample] = []
        taken: set[int] = set()
        for parent_index in step.parents:
            parent = live[parent_index]
            if parent_index not in taken:
                taken.add(parent_index)
                children.append(parent)
            else:
                forked = self.scheduler.fork(parent.seq, next(self._seq_ids))
                children.append(self._new_sample(request, forked, len(request.samples)))
        for index, sample in enumerate(live):
            if index not in taken:
                self._retire(sample, "pruned")
        for sample, token in zip(children, step.token_ids):
            sample.seq.append_token(token)
            if sample.matcher is not None:
                sample.matcher.advance(token)
        request.samples = children              # the order of the search's running beams
        if request.beams.done:
            for sample in request.samples:
                self._retire(sample, "pruned")
            request.beam_outputs = [self._beam_completion(i, h) for i, h in enumerate(request.beams.best(params.n))]
            self._maybe_finish(request)

    def _bitmask(self, samples: list[_Sample], vocab_size: int) -> torch.Tensor | None:
        """Allowed-token words of the constrained rows (all ones for the others); None without constraints."""
        constrained = [(i, s.matcher) for i, s in enumerate(samples) if s.matcher is not None]
        if not constrained:
            return None
        words = max(bitmask_words(vocab_size), max(m.grammar.vocab.mask_words for _, m in constrained))
        buffer = np.full((len(samples), words), -1, dtype=np.int32)
        for i, matcher in constrained:
            matcher.fill_bitmask(buffer[i])
        return torch.from_numpy(buffer)

    def _append(self, sample: _Sample, token: int) -> None:
        """One more output token: the sequence, its constraint state and its stop checks."""
        sample.seq.append_token(token)
        if sample.matcher is not None:
            sample.matcher.advance(token)
        sample.stop.append(token)

    def _jump_forward(self, sample: _Sample) -> None:
        """Append the constraint's only possible continuation at once; the next step computes it in one pass.

        When the text is complete and only eos may follow, eos is appended and the sequence ends
        without another forward pass.
        """
        matcher, stop = sample.matcher, sample.stop
        if matcher.is_finished():
            eos = [t for t in matcher.allowed_token_ids().tolist() if t in self.loaded.eos_token_ids]
            if eos:
                self._append(sample, eos[0])
            return
        room = sample.seq.params.max_tokens - sample.seq.num_output_tokens
        for token in matcher.forced_tokens()[:room]:
            self._append(sample, token)
            self.num_forced_tokens += 1
            if stop.finished:
                return

    def _beam_completion(self, index: int, hypothesis) -> CompletionOutput:
        ids = hypothesis.token_ids
        reason = "stop" if ids and ids[-1] in self.loaded.eos_token_ids else "length"
        return CompletionOutput(index, self._decode(ids), list(ids), reason, score=hypothesis.score)

    def _decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    def _maybe_finish(self, request: _Request) -> None:
        if request.params.num_beams > 1:
            request.finished = bool(request.beam_outputs)
        else:
            request.finished = all(s.stop.finished for s in request.samples) and len(request.samples) == request.params.n
        if request.finished:
            self.requests.pop(request.request_id, None)

    def _record_logprobs(self, sample: _Sample, sampled, row: int, token: int) -> None:
        value = float(sampled.logprobs[row])
        top_n = sample.seq.params.logprobs
        top = {}
        if top_n:
            top = dict(zip(sampled.top_logprob_ids[row, :top_n].tolist(), sampled.top_logprobs[row, :top_n].tolist()))
        sample.logprobs.append(TokenLogprob(token, value, top))
        sample.cumulative_logprob += value

    def _retire(self, sample: _Sample, reason: str) -> None:
        self.scheduler.finish(sample.seq, reason)
        self._owner.pop(sample.seq.seq_id, None)
        if isinstance(self.runner, FallbackRunner):
            self.runner.release(sample.seq)

    def generate(self, prompts: Seq[str | Seq[int]], params: SamplingParams | Seq[SamplingParams] | None = None,
                 progress=None, constraint: Any = None) -> list[RequestOutput]:
        """Run prompts to completion (continuous batching); outputs in prompt order."""
        params_list = list(params) if isinstance(params, (list, tuple)) else [params] * len(prompts)
        if len(params_list) != len(prompts):
            raise ValueError(f"got {len(params_list)} SamplingParams for {len(prompts)} prompts")
        ids = [self.add_request(p, sp, constraint) for p, sp in zip(prompts, params_list)]
        results: dict[int, RequestOutput] = {}
        while self.has_unfinished:
            for output in self.step():
                if output.finished:
                    results[output.request_id] = output
                    if progress is not None:
                        progress(len(results), len(ids))
        return [results[i] for i in ids]


def _with(params: SamplingParams, **changes: Any) -> SamplingParams:
    """A validated copy of `params` with some fields changed."""
    values = {name: getattr(params, name) for name in params.__dataclass_fields__}
    values.update(changes)
    return SamplingParams(**values)
