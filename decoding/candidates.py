"""Top-k / top-p / min-p sampling on each row's best candidates instead of the whole vocabulary.

A language model's nucleus is nearly always a few dozen tokens out of 50k-200k, so a row with
top-k or top-p needs one `topk` of its logits, plus one softmax when top-p is measured against the
whole row; temperature, the cuts and the draw then run on the candidates.  The result is the
distribution the warpers define (`warpers.Temperature`, `TopKTopP`, `MinP`, in that order): rows
whose cut does not end strictly inside their window are reported uncovered and the sampler takes
its full path for them.

Which rows are covered depends only on each row's own settings and logits (its windows are fixed by
its own top_k / top_p, never by the batch), and the draw inverts the CDF in token-id order, so a
seeded request draws the same token whatever shares its batch.  A top-p row first tries a small
window (most nuclei are tiny), then the sampler's full window.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from leapgen.decoding.batch import SamplingBatch
from leapgen.decoding.workspace import Workspace

_NEG_INF = -float("inf")
# Most nuclei fit in 128 tokens, and [32, 128] candidate tensors are small enough for torch to keep on one
# thread (on a busy machine every multi-threaded op waits for a free core); wider nuclei get a second try.
FIRST_WINDOW = 128


class RowLogSumExp(Protocol):
    """log(sum_j exp(scale_r * x[r, j])) per row of float32 `x` [R, V] as float64 [R], given each row's
    maximum `shift` [R] and `scale` [R] > 0 (-inf for a row whose maximum is -inf).  The engine passes
    a compiled one on CPU (`kernels.cpu_rows`), which reads the row without writing a softmax."""

    def __call__(self, x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor: ...


def torch_row_logsumexp(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """`RowLogSumExp` with torch's `logsumexp` (any device)."""
    return torch.logsumexp(x * scale[:, None].to(x.dtype), dim=-1).double()


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
                           window: int, workspace: Workspace | None = None,
                           row_logsumexp: RowLogSumExp = torch_row_logsumexp) -> CandidateDraw:
    """Draw rows `rows` of `logits` [B, V] (processed up to the warpers) with `uniform` [len(rows)] float64 in [0, 1).

    A top-p row looks for its nucleus among its FIRST_WINDOW best tokens, then among its `window` best;
    a top-k-only row among its 2k best (room for ties at the k-th value).  `logits` is only read; `workspace`
    holds the full-vocabulary temporaries (the sampler passes its own, so they are not allocated each step);
    `row_logsumexp` gives the whole-row mass a top-p cut without top_k is measured against.
    """
    workspace = workspace or Workspace()
    token_ids = torch.zeros(len(rows), dtype=torch.long, device=logits.device)
    covered = torch.zeros(len(rows), dtype=torch.bool, device=logits.device)
    pending = list(range(len(rows)))
    for tier, size in enumerate(sorted({min(FIRST_WINDOW, window), window})):
        joining = [i for i in pending if _joins(batch, rows[i], size, first=tier == 0)]
        if not joining:
            continue
        draw = _draw_in_window(logits, batch, [rows[i] for i in joining], uniform[joining], size, workspace,
                               row_logsumexp)
        done = [i for i, ok in zip(joining, draw.covered.tolist()) if ok]
        token_ids[done] = draw.token_ids[draw.covered]
        covered[done] = True
        pending = sorted(set(pending) - set(done))
    return CandidateDraw(token_ids, covered)


def _joins(batch: SamplingBatch, row: int, size: int, first: bool) -> bool:
    """Whether a row tries a window of `size`: a top-p row when its top_k fits, a top-k-only row once (its 2k)."""
    params = batch.rows[row].params
    if params.top_p >= 1.0:
        return first
    return not 0 < params.top_k < batch.vocab_size or params.top_k <= size


def _draw_in_window(logits: torch.Tensor, batch: SamplingBatch, rows: list[int], uniform: torch.Tensor,
                    window: int, workspace: Workspace, row_logsumexp: RowLogSumExp) -> CandidateDraw:
    """One attempt: top-p rows within `window` candidates, top-k-only rows within 2k."""
    vocab = logits.shape[-1]
    index = torch.tensor(rows, dtype=torch.long, device=logits.device)
    x = logits if len(rows) == logits.shape[0] else workspace.rows("candidate rows", logits, index)
    temperature = batch.temperature[index][:, None]
    top_k, top_p, min_p = batch.top_k[index], batch.top_p[index], batch.min_p[index]
    nucleus, limited = top_p < 1, top_k < vocab
    row_window = torch.where(nucleus, torch.full_like(top_k, min(window, vocab)), (2 * top_k).clamp(max=vocab))
    raw, ids = top_candidates(x, int(row_window.max()))
    # Dividing the candidates gives exactly the values Temperature would write into the full row.
    scaled = raw / temperature
    kth = scaled.gather(1, (top_k.clamp(max=scaled.shape[1]) - 1)[:, None])
    kth.masked_fill_(~limited[:, None], _NEG_INF)
    # Float64 probabilities within the candidates: the cuts and the draw use only their ratios, exact up to
    # float64 rounding.  (softmax rather than exp: torch runs exp on any 2048 values multi-threaded.)
    weights = scaled.double().softmax(dim=-1)
    threshold = kth
    if bool(nucleus.any()):
        threshold = torch.where(nucleus[:, None], _nucleus_threshold(x, raw, scaled, weights, kth, temperature, top_p,
                                                                     nucleus & ~limited, workspace, row_logsumexp),
                                kth)
    # min-p keeps p >= min_p * p_max; masked (-inf) candidates are never kept.
    keep = (scaled >= threshold) & (weights >= min_p[:, None].double() * weights[:, :1]) & (scaled > _NEG_INF)
    # Covered when everything past the window is cut: below the threshold, and below the k-th value when
    # top_k is set (top-p renormalises over the whole top-k set, ties at the k-th value included).
    edge = scaled.gather(1, (row_window - 1)[:, None])
    bound = torch.where(limited[:, None], kth, threshold)
    covered = ((row_window >= vocab) | (edge < bound)[:, 0] | (edge == _NEG_INF)[:, 0]) & keep[:, 0]
    return CandidateDraw(_draw_in_id_order(ids, weights, keep, uniform, vocab), covered)


def top_candidates(x: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The values of `x.topk(width)` (descending) and their ids; among equal values any ids may be chosen.

    `topk` over a whole 100k row is slow on CPU, so the row is cut into interleaved groups (ids j,
    j + size, j + 2 size, ...): the top `width` values all lie in the `width` groups with the largest
    maxima, whose members (plus the few ids past the last whole group) are few enough for a small `topk`.
    """
    rows, vocab = x.shape
    groups = 16 if width <= 128 else 8      # fastest on a 100k vocabulary: both topk inputs stay small
    if width * groups * 4 > vocab:
        return x.topk(width, dim=-1)
    size = vocab // groups
    grouped = x[:, : groups * size].view(rows, groups, size)
    best = grouped.amax(dim=1).topk(width, dim=-1, sorted=False).indices                # [R, width] group ids
    members = grouped.gather(2, best[:, None, :].expand(rows, groups, width)).view(rows, groups * width)
    if groups * size < vocab:
        members = torch.cat([members, x[:, groups * size:]], dim=1)
    values, order = members.topk(width, dim=-1)
    # Column c of `members` is member c // width of group best[c % width]; the rest follow in id order.
    in_group = order < groups * width
    group = best.gather(1, (order % width).masked_fill_(~in_group, 0))
    ids = torch.where(in_group, group + size * (order // width), order - groups * width + groups * size)
    return values, ids


def _nucleus_threshold(x: torch.Tensor, raw: torch.Tensor, scaled: torch.Tensor, weights: torch.Tensor,
                       kth: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor, whole_row: torch.Tensor,
                       workspace: Workspace, row_logsumexp: RowLogSumExp) -> torch.Tensor:
    """The smallest kept logit under top-p (transformers' rule), on the top-k-renormalised distribution if top_k is set.

    Without top_k the mass is relative to the whole row: those rows take one log-sum-exp over the vocabulary
    (`raw` are the candidates' logits, best first, so the first is the row's maximum).
    """
    in_k = weights.masked_fill(scaled < kth, 0.0)
    probs = in_k / in_k.sum(dim=-1, keepdim=True)
    if bool(whole_row.any()):
        rows = None if bool(whole_row.all()) else whole_row.nonzero()[:, 0]
        full = x if rows is None else workspace.rows("nucleus rows", x, rows)
        pick = slice(None) if rows is None else rows
        total = row_logsumexp(full, raw[pick, 0], 1.0 / temperature[pick, 0])
        row_probs = torch.exp(scaled[pick].double() - total[:, None])
        if rows is None:
            probs = row_probs
        else:
            probs[rows] = row_probs
    cumulative = probs.cumsum(dim=-1)
    # A token stays while the mass strictly above it is below top_p (a row of NaN keeps none; it is not covered).
    last = (((cumulative - probs) < top_p[:, None].double()).sum(dim=-1, keepdim=True) - 1).clamp_(min=0)
    return scaled.gather(1, last)


def _draw_in_id_order(ids: torch.Tensor, weights: torch.Tensor, keep: torch.Tensor, uniform: torch.Tensor,
                      vocab: int) -> torch.Tensor:
    """Invert each row's CDF over its kept candidates taken in token-id order (the order the full path uses)."""
    # Kept candidates are a prefix (the cuts are thresholds on sorted values), so the first n columns hold them all.
    n = max(1, int(keep.sum(dim=-1).max()))
    key = ids[:, :n].masked_fill(~keep[:, :n], vocab)
    sorted_ids, order = key.sort(dim=-1)
    cumulative = weights[:, :n].masked_fill(~keep[:, :n], 0.0).gather(1, order).cumsum_(dim=-1)
    total = cumulative[:, -1:]
    # Stay below the total so the search always lands on a kept token with non-zero weight.
    target = torch.minimum(uniform[:, None] * total, total.nextafter(torch.zeros_like(total)))
    # (A row that kept nothing is not covered; clamping only keeps its index valid.)
    position = torch.searchsorted(cumulative, target, right=True).clamp_(max=n - 1)
    return sorted_ids.gather(1, position)[:, 0]
