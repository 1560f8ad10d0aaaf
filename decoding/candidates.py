"""Top-k / top-p / min-p sampling on each row's best candidates instead of the whole vocabulary.

A language model's nucleus is nearly always a few dozen tokens out of 50k-200k, so a row with
top-k or top-p needs one `topk` of its logits, plus one softmax when top-p is measured against the
whole row; temperature, the cuts and the draw then run on the candidates.  The result is the
distribution the warpers define (`warpers.Temperature`, `TopKTopP`, `MinP`, in that order): rows
whose cut does not end strictly inside their window are reported uncovered and the sampler takes
its full path for them.

Which rows are covered depends only on each row's own settings and logits (its window is fixed by
its own top_k / top_p, never by the batch), and the draw inverts the CDF in token-id order, so a
seeded request draws the same token whatever shares its batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from leapgen.decoding.batch import SamplingBatch

_NEG_INF = -float("inf")


@dataclass
class CandidateDraw:
    """Tokens of the rows sampled on their candidates; `covered[i]` False means row i's draw must be redone in full."""

    token_ids: torch.Tensor     # [R] long
    covered: torch.Tensor       # [R] bool


def candidate_rows(batch: SamplingBatch, window: int) -> list[int]:
    """Sampled rows whose settings the candidate path implements: top-k and/or top-p, no typical-p, top_k <= window."""
    rows = []
    for i, row in enumerate(batch.rows):
        p = row.params
        top_k = p.top_k if 0 < p.top_k < batch.vocab_size else 0
        if p.greedy or p.typical_p < 1.0 or top_k > window or (top_k == 0 and p.top_p >= 1.0):
            continue
        rows.append(i)
    return rows


def sample_from_candidates(logits: torch.Tensor, batch: SamplingBatch, rows: list[int], uniform: torch.Tensor,
                           window: int) -> CandidateDraw:
    """Draw rows `rows` of `logits` [B, V] (processed up to the warpers) with `uniform` [len(rows)] float64 in [0, 1).

    A top-p row looks for its nucleus among its `window` best tokens; a top-k-only row among its 2k best
    (room for ties at the k-th value).  `logits` is only read.
    """
    vocab = logits.shape[-1]
    index = torch.tensor(rows, dtype=torch.long, device=logits.device)
    x = logits if len(rows) == logits.shape[0] else logits.index_select(0, index)
    temperature = batch.temperature[index][:, None]
    top_k, top_p, min_p = batch.top_k[index], batch.top_p[index], batch.min_p[index]
    nucleus, limited = top_p < 1, top_k < vocab
    row_window = torch.where(nucleus, torch.full_like(top_k, min(window, vocab)), (2 * top_k).clamp(max=vocab))
    raw, ids = x.topk(int(row_window.max()), dim=-1)
    # Dividing the candidates gives exactly the values Temperature would write into the full row.
    scaled = raw / temperature
    kth = scaled.gather(1, (top_k.clamp(max=scaled.shape[1]) - 1)[:, None])
    kth.masked_fill_(~limited[:, None], _NEG_INF)
    # Float64 ratios to the best token: cuts and draw are then exact up to float64 rounding.
    relative = (scaled.double() - scaled[:, :1].double()).exp_()
    threshold = kth
    if bool(nucleus.any()):
        threshold = torch.where(nucleus[:, None], _nucleus_threshold(x, scaled, ids, relative, kth, temperature,
                                                                     top_p, nucleus & ~limited), kth)
    keep = (scaled >= threshold) & (relative >= min_p[:, None].double())   # min-p: p >= min_p * p_max
    edge = scaled.gather(1, (row_window - 1)[:, None])
    covered = (row_window >= vocab) | (edge < threshold)[:, 0] | (edge == _NEG_INF)[:, 0]
    return CandidateDraw(_draw_in_id_order(ids, relative, keep, uniform, vocab), covered)


def _nucleus_threshold(x: torch.Tensor, scaled: torch.Tensor, ids: torch.Tensor, relative: torch.Tensor,
                       kth: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor,
                       whole_row: torch.Tensor) -> torch.Tensor:
    """The smallest kept logit under top-p (transformers' rule), on the top-k-renormalised distribution if top_k is set.

    Without top_k the mass is relative to the whole row, so those rows take one softmax over the vocabulary.
    """
    in_k = relative.masked_fill(scaled < kth, 0.0)
    probs = in_k / in_k.sum(dim=-1, keepdim=True)
    if bool(whole_row.any()):
        rows = whole_row.nonzero()[:, 0]
        full = x.index_select(0, rows).div_(temperature[rows]).softmax(dim=-1)
        probs[rows] = full.gather(1, ids[rows]).double()
    cumulative = probs.cumsum(dim=-1)
    # A token stays while the mass strictly above it is below top_p.
    last = ((cumulative - probs) < top_p[:, None].double()).sum(dim=-1, keepdim=True) - 1
    return scaled.gather(1, last)


def _draw_in_id_order(ids: torch.Tensor, weights: torch.Tensor, keep: torch.Tensor, uniform: torch.Tensor,
                      vocab: int) -> torch.Tensor:
    """Invert each row's CDF over its kept candidates taken in token-id order (the order the full path uses)."""
    # Kept candidates are a prefix (the cuts are thresholds on sorted values), so the first n columns hold them all.
    n = int(keep.sum(dim=-1).max())
    key = ids[:, :n].masked_fill(~keep[:, :n], vocab)
    sorted_ids, order = key.sort(dim=-1)
    cumulative = weights[:, :n].masked_fill(~keep[:, :n], 0.0).gather(1, order).cumsum_(dim=-1)
    total = cumulative[:, -1:]
    # Stay below the total so the search always lands on a kept token with non-zero weight.
    target = torch.minimum(uniform[:, None] * total, total.nextafter(torch.zeros_like(total)))
    position = torch.searchsorted(cumulative, target, right=True)
    return sorted_ids.gather(1, position)[:, 0]
