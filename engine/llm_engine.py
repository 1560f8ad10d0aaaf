"""The step loop: admit requests, run scheduled steps, sample, detect stops, report outputs.

One `step()` = schedule -> forward -> commit computed tokens -> sample the sequences that
reached the end of their tokens -> stop checks -> finished requests leave the batch.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence as Seq

import torch

from leapgen.decoding.batch import SamplingBatch, SamplingRow
from leapgen.decoding.detokenizer import IncrementalDetokenizer
from leapgen.decoding.sampler import Sampler, request_generator
from leapgen.decoding.sampling_params import SamplingParams
from leapgen.decoding.stop import StopChecker
from leapgen.engine.block_manager import BlockManager
from leapgen.engine.loader import LoadedModel, load_model
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
class _Request:
    """Engine-side state of one request (n = 1 sequence for now)."""

    request_id: int
    prompt: str | None
    seq: Sequence
    stop: StopChecker
    generator: torch.Generator | None
    logprobs: list[TokenLogprob] | None = None
    cumulative_logprob: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def output(self) -> RequestOutput:
        seq = self.seq
        completion = CompletionOutput(0, self.stop.text, seq.output_token_ids, self.stop.finish_reason,
                                      self.stop.stop_reason, self.logprobs,
                                      self.cumulative_logprob if self.logprobs is not None else None)
        return RequestOutput(self.request_id, self.prompt, seq.prompt_token_ids, [completion],
                             finished=self.stop.finished)


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
        self._ids = itertools.count()
        self.num_steps = 0

    @classmethod
    def from_path(cls, path: str | Path, dtype: str | torch.dtype = "auto", device: str = "cpu",
                  **config: Any) -> LLMEngine:
        """Load a checkpoint directory or `.gguf` file and build an engine around it."""
        return cls(load_model(path, dtype, device), EngineConfig(**config))

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

    def add_request(self, prompt: str | Seq[int], params: SamplingParams | None = None) -> int:
        """Queue a prompt; returns its request id.  Errors name the request's problem before anything runs."""
        params = params or SamplingParams()
        if params.n != 1 or params.num_beams != 1:
            raise NotImplementedError("n > 1 and beam search are not supported by the engine yet")
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
        request_id = next(self._ids)
        # Never generate past the model's context: clip max_tokens (finish_reason "length" as usual).
        room = limit - len(ids)
        if params.max_tokens > room:
            params = _with(params, max_tokens=room, min_tokens=min(params.min_tokens, room))
        seq = Sequence(request_id, ids, params)
        detok = IncrementalDetokenizer(self.tokenizer, ids, params.skip_special_tokens)
        generator = request_generator(params.seed, 0, self.loaded.device) if params.seed is not None else None
        request = _Request(request_id, text, seq, StopChecker(params, self.loaded.eos_token_ids, detok), generator,
                           [] if params.logprobs is not None else None)
        self.scheduler.add(seq)
        self.requests[request_id] = request
        return request_id

    def abort(self, request_id: int) -> None:
        """Drop a request that has not finished."""
        request = self.requests.pop(request_id)
        self._release(request, "abort")

    def step(self) -> list[RequestOutput]:
        """Run one scheduled step; returns the outputs of the requests that advanced."""
        out = self.scheduler.schedule()
        if out.is_empty:
            return []
        step_logits = self.runner.execute(out)
        self.scheduler.commit(out)
        self.num_steps += 1
        ready = [self.requests[seq.seq_id] for seq, _ in out.scheduled if seq.seq_id in step_logits.rows]
        if not ready:
            return []
        logits = step_logits.logits[[step_logits.rows[r.seq.seq_id].stop - 1 for r in ready]]
        rows = [SamplingRow(r.seq.params, r.seq.prompt_token_ids, r.seq.output_token_ids, r.generator) for r in ready]
        batch = SamplingBatch.build(rows, logits.shape[-1], self.loaded.eos_token_ids, logits.device)
        sampled = self.sampler(logits, batch)
        token_ids = sampled.token_ids.tolist()
        outputs = []
        for i, (request, token) in enumerate(zip(ready, token_ids)):
            request.seq.append_token(token)
            if request.logprobs is not None:
                self._record_logprobs(request, sampled, i, token)
            request.stop.append(token)
            if request.stop.finished:
                self.requests.pop(request.request_id)
                self._release(request, request.stop.finish_reason)
            outputs.append(request.output())
        return outputs

    def _record_logprobs(self, request: _Request, sampled, row: int, token: int) -> None:
        value = float(sampled.logprobs[row])
        top_n = request.seq.params.logprobs
        top = {}
        if top_n:
            top = dict(zip(sampled.top_logprob_ids[row, :top_n].tolist(), sampled.top_logprobs[row, :top_n].tolist()))
        request.logprobs.append(TokenLogprob(token, value, top))
        request.cumulative_logprob += value

    def _release(self, request: _Request, reason: str) -> None:
        self.scheduler.finish(request.seq, reason)
        if isinstance(self.runner, FallbackRunner):
            self.runner.release(request.seq)

    def generate(self, prompts: Seq[str | Seq[int]], params: SamplingParams | Seq[SamplingParams] | None = None,
                 progress=None) -> list[RequestOutput]:
        """Run prompts to completion (continuous batching); outputs in prompt order."""
        params_list = list(params) if isinstance(params, (list, tuple)) else [params] * len(prompts)
        if len(params_list) != len(prompts):
            raise ValueError(f"got {len(params_list)} SamplingParams for {len(prompts)} prompts")
        ids = [self.add_request(p, sp) for p, sp in zip(prompts, params_list)]
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
