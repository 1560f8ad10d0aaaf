"""Choose the next token of every row: processing pipeline, then argmax or seeded sampling, plus logprobs.

Logprobs (like vLLM's default): by default they come from the raw model distribution
(log_softmax of the logits before any processor), so they are comparable across settings;
`Sampler(logprobs_mode="processed")` reports the distribution actually sampled from instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from leapgen.decoding.batch import SamplingBatch
from leapgen.decoding.candidates import (RowLogSumExp, candidate_rows, sample_from_candidates, top_candidates,
                                         torch_row_logsumexp)
from leapgen.decoding.pipeline import LogitsPipeline
from leapgen.decoding.warpers import MinP, Temperature, TopKTopP, TypicalP
from leapgen.decoding.workspace import Workspace

_SEED_STRIDE = 0x9E3779B97F4A7C15   # spreads (seed, sample index) pairs far apart in seed space
_SEED_MASK = (1 << 63) - 1
_WARPERS = (Temperature, TopKTopP, MinP, TypicalP)   # the pipeline tail the candidate path stands in for


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

    Every sampled row inverts its CDF at one uniform draw, taken from the row's own generator when it
    has one, so a seeded request's tokens do not depend on which other requests share the batch.
    Rows with top-k / top-p are warped and drawn on their best candidates (`decoding.candidates`)
    when the pipeline ends with the standard warpers; the other rows, and those whose nucleus is
    wider than the candidate window, are warped and drawn over the whole vocabulary.
    """

    def __init__(self, pipeline: LogitsPipeline | None = None, logprobs_mode: Literal["raw", "processed"] = "raw",
                 seed: int | None = None, device: torch.device | str = "cpu",
                 row_logsumexp: RowLogSumExp = torch_row_logsumexp):
        if logprobs_mode not in ("raw", "processed"):
            raise ValueError(f"logprobs_mode must be 'raw' or 'processed', got {logprobs_mode!r}")
        self.pipeline = pipeline or LogitsPipeline()
        self.logprobs_mode = logprobs_mode
        self.row_logsumexp = row_logsumexp
        self.generator = torch.Generator(device=device)
        self.workspace = Workspace()
        if seed is None:
            self.generator.seed()
        else:
            self.generator.manual_seed(seed)

    def __call__(self, logits: torch.Tensor, batch: SamplingBatch) -> SamplerOutput:
        """Sample one token per row of `logits` [B, V] (any float dtype; the caller's tensor is not modified)."""
        num_logprobs = max((r.params.logprobs or 0) for r in batch.rows)
        wants_logprobs = any(r.params.logprobs is not None for r in batch.rows)
        head, warpers, window = _split_warpers(self.pipeline)
        # Processors work in place: copy only when some stage before the warpers will run.
        given = logits
        if head.is_active(batch) or logits.dtype != torch.float32:
            logits = self.workspace.copy("logits", logits, torch.float32)
        raw_best = None
        if wants_logprobs and self.logprobs_mode == "raw":
            # Before the head rewrites `logits`: the best raw logits and each row's normaliser, no log_softmax.
            raw_best = top_candidates(logits, max(num_logprobs, 1))
            raw_total = self.row_logsumexp(logits, raw_best[0][:, 0], torch.ones_like(raw_best[0][:, 0]))
        logits = head(logits, batch)
        processed = None
        if wants_logprobs and self.logprobs_mode == "processed":
            processed = warpers(self.workspace.copy("processed", logits), batch)
        token_ids = self._choose(logits, logits is not given, processed, batch, warpers, window)
        if not wants_logprobs:
            return SamplerOutput(token_ids)
        if raw_best is None:
            source = processed.log_softmax(dim=-1)
            chosen = source.gather(1, token_ids[:, None])[:, 0]
            top_values, top_ids = top_candidates(source, num_logprobs) if num_logprobs else (None, None)
            return SamplerOutput(token_ids, chosen, top_ids, top_values)
        chosen = (given.gather(1, token_ids[:, None])[:, 0].double() - raw_total).float()
        if not num_logprobs:
            return SamplerOutput(token_ids, chosen)
        best_values, best_ids = raw_best
        top_values = (best_values[:, :num_logprobs].double() - raw_total[:, None]).float()
        return SamplerOutput(token_ids, chosen, best_ids[:, :num_logprobs], top_values)

    def _choose(self, logits: torch.Tensor, owned: bool, processed: torch.Tensor | None, batch: SamplingBatch,
                warpers: LogitsPipeline, window: int | None) -> torch.Tensor:
        """Argmax for greedy rows, candidate draws where they apply, full-vocabulary draws for the rest.

        `logits` are processed up to the warpers (`owned`: a copy the sampler may overwrite); `processed`,
        when given, went through the warpers too.
        """
        if batch.all_greedy:
            return _greedy(logits, range(batch.size), batch.row_errors)
        uniform = self._uniform(batch, logits.device)
        token_ids = torch.zeros(batch.size, dtype=torch.long, device=logits.device)
        greedy = batch.greedy.nonzero()[:, 0]
        if greedy.numel():
            token_ids[greedy] = _greedy(logits[greedy], greedy.tolist(), batch.row_errors)
        full = [i for i, row in enumerate(batch.rows) if not row.params.greedy]
        if window is not None:
            rows = candidate_rows(batch, window)
            if rows:
                draw = sample_from_candidates(logits, batch, rows, uniform[rows], window, self.workspace,
                                              self.row_logsumexp)
                done = [r for r, ok in zip(rows, draw.covered.tolist()) if ok]
                token_ids[done] = draw.token_ids[draw.covered]
                full = sorted(set(full) - set(done))
        if full:
            if processed is not None:
                processed_rows = processed[full]
            elif len(full) == batch.size:
                # Nothing reads `logits` after this, so the warpers may overwrite the sampler's own copy.
                processed_rows = warpers(logits if owned else self.workspace.copy("warped", logits), batch)
            else:
                index = torch.tensor(full, dtype=torch.long, device=logits.device)
                processed_rows = warpers(self.workspace.rows("warped", logits, index), batch.subset(full))
            token_ids[full] = _inverse_cdf(processed_rows, uniform[full], full, self.workspace, batch.row_errors)
        return token_ids

    def _uniform(self, batch: SamplingBatch, device: torch.device) -> torch.Tensor:
        """One float64 draw in [0, 1) per sampled row (0 for greedy rows): seeded rows from their own generator."""
        uniform = torch.zeros(batch.size, dtype=torch.float64, device=device)
        shared = []
        for i, row in enumerate(batch.rows):
            if row.params.greedy:
                continue
            if row.generator is None:
                shared.append(i)
            else:
                uniform[i] = torch.rand((), dtype=torch.float64, generator=row.generator, device=device)
        if shared:
            uniform[shared] = torch.rand(len(shared), dtype=torch.float64, generator=self.generator, device=device)
        return uniform


def _split_warpers(pipeline: LogitsPipeline) -> tuple[LogitsPipeline, LogitsPipeline, int | None]:
    """(stages before the warpers, the warpers, the candidate window).

    The candidate path stands in for exactly the standard warper tail; a pipeline that does not end
    with it gets window None and every sampled row goes through its own processors.
    """
    processors = pipeline.processors
    tail = processors[-len(_WARPERS):]
    if len(tail) == len(_WARPERS) and all(type(p) is kind for p, kind in zip(tail, _WARPERS)):
        return LogitsPipeline(processors[:-len(_WARPERS)]), LogitsPipeline(tail), tail[1].candidates
    return pipeline, LogitsPipeline([]), None


_ARGMAX_CHUNK = 128


def note_rows_without_a_token(scores: torch.Tensor, rows: Sequence[int], errors: dict[int, Exception]) -> None:
    """Put a ValueError in `errors`, by batch row (`rows`: those of `scores`), for each row of processed `scores`
    with no token to take: all -inf, or holding a NaN (which argmax, and beam search's ranking, would take as the
    best).  Such a row's failure is its request's alone (and not even that where the row checks a speculative
    draft past a token verification rejects); an error the row met before stays its error."""
    takeable = scores.amax(dim=-1) > float("-inf")      # (false for a NaN too)
    if not bool(takeable.all()):
        for i in (~takeable).nonzero()[:, 0].tolist():
            errors.setdefault(rows[i], ValueError("no token can be taken (every logit is -inf after processing, or "
                                                  "the logits hold NaN)"))


def _greedy(logits: torch.Tensor, rows: Sequence[int], errors: dict[int, Exception]) -> torch.Tensor:
    """Each row's argmax (`_argmax`); a row with no token to take gets its error in `errors` (see
    `note_rows_without_a_token`) and a token that means nothing."""
    note_rows_without_a_token(logits, rows, errors)
    return _argmax(logits)


def _argmax(logits: torch.Tensor) -> torch.Tensor:
    """Each row's first maximum, as `argmax` picks it (a NaN counting as the maximum).

    On CPU `argmax` and `max` over a dimension carry an index through a scalar loop (2.1 and 0.8 ms over 32 x
    100k logits, 2 threads) where `amax` vectorises (0.09 ms): so the row's maximum is found among the maxima
    of 128-wide chunks, and its index within the first chunk that holds it (0.2 ms).
    """
    rows, vocab = logits.shape
    whole = vocab - vocab % _ARGMAX_CHUNK
    if logits.device.type != "cpu" or not logits.is_contiguous() or whole < 16 * _ARGMAX_CHUNK:
        return logits.max(dim=-1).indices
    chunks = logits[:, :whole].view(rows, -1, _ARGMAX_CHUNK)
    best, chunk = chunks.amax(dim=2).max(dim=1)
    ids = chunk * _ARGMAX_CHUNK + chunks[torch.arange(rows), chunk].max(dim=1).indices
    if whole < vocab:
        tail_best, tail_ids = logits[:, whole:].max(dim=1)
        # Strictly greater: on a tie the chunks hold the first occurrence.
        later = (tail_best > best) | (tail_best.isnan() & ~best.isnan())
        ids = torch.where(later, tail_ids + whole, ids)
    return ids


def _inverse_cdf(logits: torch.Tensor, uniform: torch.Tensor, rows: list[int], workspace: Workspace,
                 errors: dict[int, Exception]) -> torch.Tensor:
    """Token at `uniform` [R] of each row's CDF over the vocabulary in id order (float64, exact up to rounding).

    A row with no token left to sample gets a ValueError in `errors` by its batch row (`rows`: those of `logits`)
    and a token that means nothing, as in `_greedy`.
    """
    # Searching to the right of a flat step lands on the token that makes the step, so a zero-probability
    # token is never picked; the target stays below the total for the same reason.
    probs = torch.softmax(logits, dim=-1, out=workspace.tensor("probs", logits.shape, torch.float32, logits.device))
    cumulative = torch.cumsum(probs, dim=-1, dtype=torch.float64,
                              out=workspace.tensor("cdf", logits.shape, torch.float64, logits.device))
    total = cumulative[:, -1:]
    for i in (~total.isfinite())[:, 0].nonzero()[:, 0].tolist():
        errors[rows[i]] = ValueError("no token can be sampled (every logit is -inf after processing, or the logits "
                                     "hold NaN)")
    target = torch.minimum(uniform[:, None] * total, total.nextafter(torch.zeros_like(total)))
    return torch.searchsorted(cumulative, target, right=True)[:, 0].clamp_(max=logits.shape[-1] - 1)


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
