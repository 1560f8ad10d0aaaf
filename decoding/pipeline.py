"""The logits processor protocol and the default ordered pipeline."""

from __future__ import annotations

from typing import Protocol, Sequence

import torch

from leapgen.decoding.batch import SamplingBatch
from leapgen.decoding.hf_interop import RequestProcessors
from leapgen.decoding.penalties import (
    ConstraintMask,
    FrequencyPresencePenalty,
    LogitBias,
    MinTokens,
    NoRepeatNGram,
    RepetitionPenalty,
)
from leapgen.decoding.warpers import MinP, Temperature, TopKTopP, TypicalP


class BatchLogitsProcessor(Protocol):
    """Works on the whole batch at once; may modify `logits` ([B, V] float32) in place and returns the result."""

    def is_active(self, batch: SamplingBatch) -> bool:
        """False when no row of this batch needs the processor (the pipeline then skips it)."""

    def __call__(self, logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
        """The processed logits."""


def default_processors() -> list[BatchLogitsProcessor]:
    """The standard order: hard masks and biases on raw logits, then history penalties, then the warpers.

    Constraint mask, logit_bias, min_tokens, no_repeat_ngram, repetition penalty, frequency/presence
    penalties, per-request transformers processors (where transformers puts user processors: after its
    own, before the warpers), temperature, top-k + top-p, min-p, typical-p.
    """
    return [
        ConstraintMask(), LogitBias(), MinTokens(), NoRepeatNGram(), RepetitionPenalty(),
        FrequencyPresencePenalty(), RequestProcessors(), Temperature(), TopKTopP(), MinP(), TypicalP(),
    ]


class LogitsPipeline:
    """Runs processors in order, skipping those no row uses."""

    def __init__(self, processors: Sequence[BatchLogitsProcessor] | None = None):
        self.processors = list(default_processors() if processors is None else processors)

    def is_active(self, batch: SamplingBatch) -> bool:
        """True when some processor would change this batch's logits."""
        return any(p.is_active(batch) for p in self.processors)

    def __call__(self, logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
        """Process `logits` [B, V] float32 in place (callers that need the raw values copy them first)."""
        if logits.dim() != 2 or logits.shape[0] != batch.size:
            raise ValueError(f"logits must be [batch={batch.size}, vocab], got shape {tuple(logits.shape)}")
        if logits.dtype != torch.float32:
            raise ValueError(f"logits must be float32 for processing, got {logits.dtype}")
        for processor in self.processors:
            if processor.is_active(batch):
                logits = processor(logits, batch)
        return logits
