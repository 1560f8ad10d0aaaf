"""Linear layers with a oneDNN-packed copy of their weight, for matmuls of several rows on CPU.

`F.linear` on CPU calls MKL's sgemm, which is at its best for one row (a matrix-vector product, bound by
reading the weight) and poor for a few: on SmolLM2-135M's layers with 2 threads, 1 / 4 / 9 / 32 / 72 rows
took 20 / 35 / 47 / 54 / 92 ms through it, and 22 / 23 / 28 / 44 / 84 ms through oneDNN with weights
reordered once into its blocked layout; from about 128 rows (prefill chunks) the two are even, and at 1577
rows sgemm was 10% faster.  In bfloat16 (on a CPU with AVX512-BF16) the packed product wins from one row:
1 / 9 / 32 / 128 rows took 20 / 21 / 22 / 34 ms through F.linear and 13 / 13 / 16 / 25 ms packed, and lost
by 7-9% from 512 rows.  Speculative verification (a few rows per sequence) and batched decoding multiply a few
to a hundred rows, so each layer keeps both: the packed copy serves the passes of `PACKED_ROWS[dtype]` rows,
its weight the others.  That costs a second copy of the weights' memory, which is why the engine lets it be
turned off (`EngineConfig.pack_weights`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

# The rows of a pass the packed copy serves, by dtype (measured as above).
PACKED_ROWS = {torch.float32: range(4, 128), torch.bfloat16: range(1, 128)}
# The row count oneDNN picks the blocked layout for: measured, a layout for 256 rows is as fast as one for 16
# or 64 at 4-32 rows.
_LAYOUT_ROWS = 256


def packing_supported(weight: torch.Tensor) -> bool:
    """Whether this torch can pack `weight`: float32, or bfloat16 where oneDNN has it, on a CPU torch built
    with oneDNN."""
    if weight.device.type != "cpu" or weight.dtype not in PACKED_ROWS or not torch.backends.mkldnn.is_available():
        return False
    if not hasattr(torch.ops.mkldnn, "_reorder_linear_weight"):
        return False
    return weight.dtype != torch.bfloat16 or torch.ops.mkldnn._is_mkldnn_bf16_supported()


def pack_weight(weight: torch.Tensor) -> torch.Tensor | None:
    """`weight [out, in]` reordered into oneDNN's layout (a new tensor, only `packed_linear` reads it); None
    where packing is not supported."""
    if not packing_supported(weight):
        return None
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), _LAYOUT_ROWS)


def packed_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                  packed: torch.Tensor | None) -> torch.Tensor:
    """`F.linear(x, weight, bias)`, through the packed copy when there is one and `x [rows, in]` has a number of
    rows it serves faster."""
    if packed is not None and x.dim() == 2 and x.shape[0] in PACKED_ROWS.get(x.dtype, ()):
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), packed, bias, "none", [], "")
    return F.linear(x, weight, bias)


class Linear(nn.Linear):
    """`nn.Linear` that uses a packed copy of its weight once `pack()` made one."""

    packed: torch.Tensor | None = None

    def pack(self) -> int:
        """Make the packed copy; the bytes it takes (0 where packing is not supported)."""
        self.packed = pack_weight(self.weight)
        return 0 if self.packed is None else self.weight.numel() * self.weight.element_size()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return packed_linear(x, self.weight, self.bias, self.packed)
