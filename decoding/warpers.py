"""Processors that reshape the sampling distribution: temperature, top-k, top-p, min-p, typical-p.

Each follows the transformers warper of the same name (min_tokens_to_keep=1, filtered tokens → -inf),
with the parameter taken per row; rows with the neutral value are left untouched.
"""

from __future__ import annotations

import torch

from leapgen.decoding.batch import SamplingBatch

_NEG_INF = -float("inf")


class Temperature:
    """Divides each sampled row's logits by its temperature."""

    def is_active(self, batch: SamplingBatch) -> bool:
        """True when some row's temperature differs from 1."""
        return batch.uses_temperature

    def __call__(self, logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
        """In place."""
        return logits.div_(batch.temperature[:, None])


class TopKTopP:
    """Top-k then top-p (nucleus) filtering, sharing one sort when both are needed."""

    def is_active(self, batch: SamplingBatch) -> bool:
        """True when some row sets top_k or top_p."""
        return batch.uses_top_k or batch.uses_top_p

    def __call__(self, logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
        """Top-k alone uses topk(max k); with top-p the row is sorted once and both cuts happen in sorted order."""
        if not batch.uses_top_p:
            return _top_k_only(logits, batch.top_k)
        vocab = logits.shape[-1]
        sorted_logits, order = logits.sort(dim=-1)          # ascending, like transformers' TopPLogitsWarper
        if batch.uses_top_k:
            kth = sorted_logits.gather(1, (vocab - batch.top_k)[:, None])
            sorted_logits.masked_fill_(sorted_logits < kth, _NEG_INF)
        cumulative = sorted_logits.softmax(dim=-1).cumsum_(dim=-1)
        remove = cumulative <= (1 - batch.top_p)[:, None]
        remove[:, -1] = False                                # always keep the most likely token
        remove &= (batch.top_p < 1)[:, None]                 # top_p = 1 rows: keep even underflowed tokens
        sorted_logits.masked_fill_(remove, _NEG_INF)
        return logits.scatter_(1, order, sorted_logits)


def _top_k_only(logits: torch.Tensor, top_k: torch.Tensor) -> torch.Tensor:
    vocab = logits.shape[-1]
    max_k = int(top_k.max())
    values = logits.topk(max_k, dim=-1).values
    kth = values.gather(1, (top_k.clamp(max=max_k) - 1)[:, None])
    # Rows without top-k (k == vocab) keep everything.
    kth = kth.masked_fill_((top_k >= vocab)[:, None], _NEG_INF)
    return logits.masked_fill_(logits < kth, _NEG_INF)


class MinP:
    """Drops tokens whose probability is below min_p times the row's top probability."""

    def is_active(self, batch: SamplingBatch) -> bool:
        """True when some row sets min_p > 0."""
        return batch.uses_min_p

    def __call__(self, logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
        """min_p = 0 rows have threshold 0, which removes nothing."""
        probs = logits.softmax(dim=-1)
        threshold = batch.min_p[:, None] * probs.amax(dim=-1, keepdim=True)
        return logits.masked_fill_(probs < threshold, _NEG_INF)


class TypicalP:
    """Locally typical sampling: keep the tokens whose surprisal is closest to the entropy, up to mass typical_p."""

    def is_active(self, batch: SamplingBatch) -> bool:
        """True when some row sets typical_p < 1."""
        return batch.uses_typical_p

    def __call__(self, logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
        """Vectorised with a per-row mass; typical_p = 1 rows are left as they are."""
        logp = logits.log_softmax(dim=-1)
        entropy = -(logp * logp.exp()).nansum(dim=-1, keepdim=True)
        distance = (-logp - entropy).abs()
        sorted_distance, order = distance.sort(dim=-1)
        cumulative = logits.gather(1, order).softmax(dim=-1).cumsum_(dim=-1)
        last = (cumulative < batch.typical_p[:, None]).sum(dim=1).clamp_(max=logits.shape[-1] - 1)
        remove_sorted = sorted_distance > sorted_distance.gather(1, last[:, None])
        remove_sorted[:, 0] = False
        remove_sorted &= (batch.typical_p < 1)[:, None]
        remove = remove_sorted.scatter(1, order, remove_sorted)
        return logits.masked_fill_(remove, _NEG_INF)
