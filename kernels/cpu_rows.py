"""Per-row log-sum-exp of float32 CPU logits in one read, compiled with numba.

A sampler needs each row's normaliser (logprobs; the mass a top-p cut is measured against) but not
the normalised row: torch's `log_softmax` / `softmax` write a full [rows, vocab] tensor to get it, and
`logsumexp` writes two.  This kernel only reads the row, through the vectorizable exp, summing in
float32 chunks added up in float64 (as exact as torch's pairwise sums).
"""

from __future__ import annotations

import numba
import numpy as np
import torch

from leapgen.kernels.cpu_exp import exp_nonpositive
from leapgen.kernels.cpu_threads import Threads, cuts

_CHUNK = 1024


# Fast-math without its no-NaN / no-inf promises: masked logits are -inf.
@numba.njit(fastmath={"reassoc", "nsz", "arcp", "contract", "afn"}, cache=True, nogil=True)
def _exp_sums(x, shift, scale, out):  # pragma: no cover - compiled
    for r in range(x.shape[0]):
        row, peak, factor = x[r], shift[r], scale[r]
        total = 0.0
        for start in range(0, row.shape[0], _CHUNK):
            chunk = row[start:start + _CHUNK]
            part = np.float32(0.0)
            for j in range(chunk.shape[0]):
                part += exp_nonpositive((chunk[j] - peak) * factor)
            total += part
        out[r] = total


# A part is worth a thread from this many logits, about 0.15 ms of work.
_THREADS = Threads(_exp_sums, min_part_work=600_000)


def row_logsumexp(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """log(sum_j exp(scale_r * x[r, j])) per row of float32 CPU `x` [R, V], as float64 [R].

    `shift` [R] must be each row's maximum (or above it); `scale` [R] > 0 (an inverse temperature).
    A row whose maximum is -inf (nothing allowed) gets -inf, one holding NaN or +inf gets NaN.
    """
    x = x.contiguous()
    shift, scale = shift.to(torch.float32).contiguous(), scale.to(torch.float32).contiguous()
    sums = torch.empty(x.shape[0], dtype=torch.float64)
    rows, peaks, factors, totals = x.numpy(), shift.numpy(), scale.numpy(), sums.numpy()
    _THREADS.run(x.numel(), lambda count: [
        (rows[part], peaks[part], factors[part], totals[part])
        for part in cuts(np.full(x.shape[0], x.shape[1]), count)])
    result = sums.log_() + shift.double() * scale.double()
    # A -inf or NaN maximum makes every term NaN; such rows are given their limits here.
    return torch.where(torch.isfinite(shift), result, torch.where(shift == -torch.inf, -torch.inf, torch.nan))
