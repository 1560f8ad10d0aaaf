"""Choose the next token of every row: processing pipeline, then argmax or seeded sampling, plus logprobs.

Logprobs (like vLLM's default): by default they come from the raw model distribution
(log_softmax of the logits before any processor), so they are comparable across settings;
`Sampler(logprobs_mode="processed")` reports the distribution actually sampled from instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from leapgen.decoding.batch import SamplingBatch
from leapgen.decoding.pipeline import LogitsPipeline

_SEED_STRIDE = 0x9E3779B97F4A7C15   # spreads (seed, sample index) pairs far apart in seed space
_SEED_MASK = (1 << 63) - 1


def request_generator(seed: int, sample_index: int = 0, device: torch.device | str = "cpu") -> torch.Generator:
    """The generator of one request's sample (`n > 1` samples of a seeded request differ by `sample_index`)."""
    generator = torch.Generator(device=device)
    generator.manual_seed((seed + sample_index * _SEED_STRIDE) & _SEED_MASK)
    return generator


@dataclass
class SamplerOutput:
    """One step's choices: `token_ids` [B] long; logprobs only when some row asked (`params.logprobs`).

    `logprobs` [B] is the chosen token's; `top_logprob_ids`/`top_logprobs` are [B, max n] best first,
    a row uses its first `params.logprobs` columns.
    """

    token_ids: torch.Tensor
    logprobs: torch.Tensor | None = None
    top_logprob_ids: torch.Tensor | None = None
    top_logprobs: torch.Tensor | None = None


class Sampler:
    """Processes a step's logits and picks tokens; seeded rows draw only from their own generator.

    Sampling inverts the row's CDF at one uniform draw, taken from the row's own generator when it
    has one, so a seeded request's tokens do not depend on which other requests share the batch.
    """

    def __init__(self, pipeline: LogitsPipeline | None = None, logprobs_mode: Literal["raw", "processed"] = "raw",
                 seed: int | None = None, device: torch.device | str = "cpu"):
        if logprobs_mode not in ("raw", "processed"):
            raise ValueError(f"logprobs_mode must be 'raw' or 'processed', got {logprobs_mode!r}")
        self.pipeline = pipeline or LogitsPipeline()
        self.logprobs_mode = logprobs_mode
        self.generator = torch.Generator(device=device)
        if seed is None:
            self.generator.seed()
        else:
            self.generator.manual_seed(seed)

    def __call__(self, logits: torch.Tensor, batch: SamplingBatch) -> SamplerOutput:
        """Sample one token per row of `logits` [B, V] (any float dtype; the caller's tensor is not modified)."""
        num_logprobs = max((r.params.logprobs or 0) for r in batch.rows)
        wants_logprobs = any(r.params.logprobs is not None for r in batch.rows)
        # The pipeline works in place: copy only when it will run.
        logits = logits.to(torch.float32, copy=self.pipeline.is_active(batch))
        raw_logprobs = logits.log_softmax(dim=-1) if wants_logprobs and self.logprobs_mode == "raw" else None
        processed = self.pipeline(logits, batch)
        token_ids = self._choose(processed, batch)
        if not wants_logprobs:
            return SamplerOutput(token_ids)
        source = raw_logprobs if raw_logprobs is not None else processed.log_softmax(dim=-1)
        chosen = source.gather(1, token_ids[:, None])[:, 0]
        top_values, top_ids = source.topk(num_logprobs, dim=-1) if num_logprobs else (None, None)
        return SamplerOutput(token_ids, chosen, top_ids, top_values)

    def _choose(self, logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
        greedy_ids = logits.argmax(dim=-1)
        if batch.all_greedy:
            return greedy_ids
        uniform = torch.empty(batch.size, dtype=torch.float64, device=logits.device)
        shared = []
        for i, row in enumerate(batch.rows):
            if row.params.greedy:
                continue
            if row.generator is None:
                shared.append(i)
            else:
                uniform[i] = torch.rand((), dtype=torch.float64, generator=row.generator, device=logits.device)
        if shared:
            uniform[shared] = torch.rand(len(shared), dtype=torch.float64, generator=self.generator,
                                         device=logits.device)
        # Inverse CDF in float64: exact up to rounding, and a zero-probability token is never picked
        # (searching to the right of a flat step lands on the token that makes the step).
        cumulative = logits.softmax(dim=-1).double().cumsum_(dim=-1)
        target = uniform.masked_fill_(batch.greedy, 0.0)[:, None] * cumulative[:, -1:]
        sampled_ids = torch.searchsorted(cumulative, target, right=True)[:, 0].clamp_(max=logits.shape[-1] - 1)
        return torch.where(batch.greedy, greedy_ids, sampled_ids)


@dataclass
class PromptLogprobs:
    """Per prompt position i >= 1: logprob of prompt token i given tokens < i, and the top-n alternatives."""

    logprobs: torch.Tensor          # [L - 1]
    top_ids: torch.Tensor | None    # [L - 1, n]
    top_logprobs: torch.Tensor | None


def prompt_logprobs(logits: torch.Tensor, prompt_ids: torch.Tensor | list[int], top_n: int = 0) -> PromptLogprobs:
    """From the prompt's logits `[L, V]` (position j predicts token j + 1); the first token has none."""
    ids = torch.as_tensor(prompt_ids, dtype=torch.long, device=logits.device)
    if logits.dim() != 2 or logits.shape[0] != ids.numel():
        raise ValueError(f"prompt logits must be [len(prompt)={ids.numel()}, vocab], got {tuple(logits.shape)}")
    logp = logits[:-1].float().log_softmax(dim=-1)
    chosen = logp.gather(1, ids[1:, None])[:, 0]
    if top_n == 0:
        return PromptLogprobs(chosen, None, None)
    values, top_ids = logp.topk(top_n, dim=-1)
    return PromptLogprobs(chosen, top_ids, values)
