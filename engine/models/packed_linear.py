"""Linear layers with a oneDNN-packed copy of their weight, for matmuls of several rows on CPU.

`F.linear` on CPU calls MKL's sgemm, which is at its best for one row (a matrix-vector product, bound by
reading the weight) and poor for a few: on SmolLM2-135M's layers with 2 threads, 1 / 4 / 9 / 32 rows took
20 / 35 / 47 / 54 ms through it, and 22 / 23 / 28 / 44 ms through oneDNN with weights reordered once
into its blocked layout.  Speculative verification (a few rows per sequence), batched decoding and prefill
all multiply several rows, so each layer keeps both: its weight for passes of fewer than `MIN_PACKED_ROWS`
rows, the packed copy for the others.  That costs a second copy of the weights' memory, which is why the
engine lets it be turned off (`EngineConfig.pack_weights`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

MIN_PACKED_ROWS = 4       # measured: below it the packed product is slower than sgemm's
# The row count oneDNN picks the blocked layout for: measured, a layout for 256 rows is as fast as one for 16
# at 4-32 rows and 1.35x faster at 256 (prefill chunks).
_LAYOUT_ROWS = 256


def packing_supported(weight: torch.Tensor) -> bool:
    """Whether this torch can pack `weight`: float32 on a CPU torch built with oneDNN."""
    return (weight.device.type == "cpu" and weight.dtype == torch.float32 and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight"))


def pack_weight(weight: torch.Tensor) -> torch.Tensor:
    """`weight [out, in]` reordered into oneDNN's layout (a new tensor, only `packed_linear` reads it)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), _LAYOUT_ROWS)


def packed_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                  packed: torch.Tensor | None) -> torch.Tensor:
    """`F.linear(x, weight, bias)`, through the packed copy when there is one and `x [rows, in]` has enough rows."""
    if packed is not None and x.dim() == 2 and x.shape[0] >= MIN_PACKED_ROWS:
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), packed, bias, "none", [], "")
    return F.linear(x, weight, bias)


class Linear(nn.Linear):
    """`nn.Linear` that uses a packed copy of its weight once `pack()` made one."""

    packed: torch.Tensor | None = None

    def pack(self) -> int:
        """Make the packed copy; the bytes it takes (0 where packing is not supported)."""
        if not packing_supported(self.weight):
            return 0
        self.packed = pack_weight(self.weight)
        return self.weight.numel() * self.weight.element_size()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return packed_linear(x, self.weight, self.bias, self.packed)
