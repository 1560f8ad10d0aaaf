"""Processors that reshape the sampling distribution: temperature, top-k, top-p, min-p, typical-p.

Each follows the transformers warper of the same name (min_tokens_to_keep=1, filtered tokens → -inf),
with the parameter taken per row; rows with the neutral value are left untouched.
"""

from __future__ import annotations

import torch

from leapgen.decoding.batch import SamplingBatch
from leapgen.decoding.candidates import top_candidates
from leapgen.decoding.workspace import Workspace

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
    """Top-k then top-p (nucleus) filtering, both decided on the row's best `candidates` tokens when possible.

    Sorting a 100k vocabulary is the expensive part of nucleus sampling, while the nucleus of a real
    model is nearly always far smaller: one `topk(candidates)` settles every row whose top-k limit
    or nucleus ends inside it, and only the other rows are fully sorted.  Tokens tied with the last
    kept one are all kept.
    """

    def __init__(self, candidates: int = 1024):
        self.candidates = candidates
        self.workspace = Workspace()

    def is_active(self, batch: SamplingBatch) -> bool:
        """True when some row sets top_k or top_p."""
        return batch.uses_top_k or batch.uses_top_p

    def __call__(self, logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
        """Masks everything below each row's threshold; falls back to a full sort for wide nuclei."""
        vocab = logits.shape[-1]
        top_k, top_p = batch.top_k, batch.top_p
        limited = top_k < vocab
        max_k = int(top_k.masked_fill(~limited, 0).max())
        width = min(vocab, max(self.candidates, max_k) if batch.uses_top_p else max_k)
        values, ids = top_candidates(logits, width)                      # descending
        kth = values.gather(1, (top_k.clamp(max=width) - 1)[:, None])
        kth.masked_fill_(~limited[:, None], _NEG_INF)
        if not batch.uses_top_p:
            return logits.masked_fill_(logits < kth, _NEG_INF)
        in_k = values >= kth
        masked = values.masked_fill(~in_k, _NEG_INF)
        log_total = torch.where(limited, masked.logsumexp(dim=-1), self._row_logsumexp(logits, ids[:, 0]))
        probs = (masked - log_total[:, None]).exp_()
        cumulative = probs.cumsum(dim=-1)
        # A token stays while the mass strictly above it is below top_p (transformers' rule, read from the top);
        # a row without finite logits has NaN mass and keeps its -inf.
        last = (((cumulative - probs) < top_p[:, None]).sum(dim=-1, keepdim=True) - 1).clamp_(min=0)
        threshold = torch.where((top_p < 1)[:, None], values.gather(1, last), kth)
        wide = (top_p < 1) & ~limited & (cumulative[:, -1] < top_p)    # nucleus reaches past the candidates
        logits.masked_fill_(logits < threshold.masked_fill_(wide[:, None], _NEG_INF), _NEG_INF)
        if bool(wide.any()):
            rows = wide.nonzero()[:, 0]
            logits[rows] = _sorted_top_p(logits[rows], top_p[rows])
        return logits


    def _row_logsumexp(self, logits: torch.Tensor, best: torch.Tensor) -> torch.Tensor:
        """Each row's logsumexp, read off its log_softmax at its best token (twice as fast as torch.logsumexp on CPU)."""
        logp = torch.log_softmax(logits, dim=-1, out=self.workspace.tensor("logp", logits.shape, logits.dtype,
                                                                            logits.device))
        best = best[:, None]
        return (logits.gather(1, best) - logp.gather(1, best))[:, 0]


def _sorted_top_p(logits: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Nucleus filtering by a full ascending sort, exactly as transformers' TopPLogitsWarper does it."""
    sorted_logits, order = logits.sort(dim=-1)
    cumulative = sorted_logits.softmax(dim=-1).cumsum_(dim=-1)
    remove = cumulative <= (1 - top_p)[:, None]
    remove[:, -1] = False                                # always keep the most likely token
    return logits.scatter(1, order, sorted_logits.masked_fill_(remove, _NEG_INF))


class MinP:
    """Drops tokens whose probability is below min_p times the row's top probability."""

    def is_active(self, batch: SamplingBatch) -> bool:
        """True when some row sets min_p > 0."""
        return batch.uses_min_p

    def __call__(self, logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
        """Decided on logits: p < min_p * p_max exactly when logit < max logit + log(min_p), so no softmax is
        needed (min_p = 0 rows get a threshold of -inf, which removes nothing)."""
        threshold = logits.amax(dim=-1, keepdim=True) + batch.min_p[:, None].log()
        return logits.masked_fill_(logits < threshold, _NEG_INF)


class TypicalP:
    """Locally typical sampling: keep the tokens whose surprisal is closest to the entropy, up to mass typical_p.

    Sorting the whole vocabulary by that distance is what makes typical-p slow; the kept set of a real
    model is small, so each row first looks for it among its `candidates` closest tokens (one partial
    selection) and only rows whose set reaches past them are sorted in full.
    """

    def __init__(self, candidates: int = 1024):
        self.candidates = candidates
        self.workspace = Workspace()

    def is_active(self, batch: SamplingBatch) -> bool:
        """True when some row sets typical_p < 1."""
        return batch.uses_typical_p

    def __call__(self, logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
        """Rows with typical_p = 1 are left as they are."""
        typical = batch.typical_p < 1
        if bool(typical.all()):
            return self._filter(logits, batch.typical_p)
        rows = typical.nonzero()[:, 0]
        logits[rows] = self._filter(logits[rows], batch.typical_p[rows])
        return logits

    def _filter(self, logits: torch.Tensor, mass: torch.Tensor) -> torch.Tensor:
        shape, device = logits.shape, logits.device
        logp = torch.log_softmax(logits, dim=-1, out=self.workspace.tensor("logp", shape, logits.dtype, device))
        # softmax rather than exp(logp): torch's exp slows down tenfold on -inf (masked) inputs.
        probs = torch.softmax(logits, dim=-1, out=self.workspace.tensor("probs", shape, logits.dtype, device))
        # nansum drops the 0 * -inf of masked tokens, as transformers does.
        entropy = -torch.mul(probs, logp, out=probs).nansum(dim=-1, keepdim=True)
        # Negated distance |-log p - H|, so the closest tokens are the largest values.
        closeness = torch.add(logp, entropy, out=self.workspace.tensor("closeness", shape, logits.dtype, device))
        closeness.abs_().neg_()
        width = min(self.candidates, shape[-1])
        nearest, ids = top_candidates(closeness, width)
        cumulative = logp.gather(1, ids).exp_().cumsum_(dim=-1)
        # transformers' rule: the kept set ends at the first token where the mass reaches typical_p.
        last = (cumulative < mass[:, None]).sum(dim=1, keepdim=True)
        threshold = -nearest.gather(1, last.clamp(max=width - 1))
        wide = (last[:, 0] >= width) & (width < shape[-1])
        if bool(wide.any()):
            threshold[wide] = _sorted_typical_threshold(logits[wide], -closeness[wide], mass[wide])
        return logits.masked_fill_(closeness < -threshold, _NEG_INF)


def _sorted_typical_threshold(logits: torch.Tensor, distance: torch.Tensor, mass: torch.Tensor) -> torch.Tensor:
    """The largest kept distance, from a full sort by distance (transformers' TypicalLogitsWarper)."""
    sorted_distance, order = distance.sort(dim=-1)
    cumulative = logits.gather(1, order).softmax(dim=-1).cumsum_(dim=-1)
    last = (cumulative < mass[:, None]).sum(dim=1, keepdim=True).clamp_(max=logits.shape[-1] - 1)
    return sorted_distance.gather(1, last)
