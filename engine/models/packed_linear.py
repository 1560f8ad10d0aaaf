"""Linear layers with a oneDNN-packed copy of their weight, for the matmuls where it beats MKL's sgemm.

`F.linear` on CPU calls MKL's sgemm; `packed_linear` can instead call oneDNN with the weight reordered once into
its blocked layout.  Which is faster depends on the CPU's maker, because MKL takes its fast code paths on Intel
CPUs only.  Measured on SmolLM2-135M's layers with 2 threads:
- Intel Xeon: sgemm was at its best for one row (a matrix-vector product bound by reading the weight) and poor
  for a few: 1 / 4 / 9 / 32 / 72 rows took 20 / 35 / 47 / 54 / 92 ms through it and 22 / 23 / 28 / 44 / 84 ms
  packed; from about 128 rows (prefill chunks) the two were even, and at 1577 rows sgemm was 10% faster.  In
  bfloat16 the packed product won from one row (1 / 9 / 32 / 128 rows: 20 / 21 / 22 / 34 ms against
  13 / 13 / 16 / 25) and lost by 7-9% from 512 rows.
- AMD EPYC (AVX-512): sgemm was 2.3-3x slower than oneDNN at every row count, 1 / 32 / 128 / 2048 rows taking
  31 / 70 / 178 / 2079 ms against 13 / 22 / 65 / 899 (one row read the weights at 17 GB/s against oneDNN's 41,
  of about 50 the machine reads); in bfloat16 1 / 32 / 512 / 2048 rows took 9.1 / 19.5 / 132 / 510 ms against
  5.1 / 11.8 / 113 / 439.
So on AMD CPUs (and Hygon's, built on AMD's design) the packed copy serves every row count, and on other CPUs
the row counts in `PACKED_ROWS`, measured on the Xeon (what leapgen did everywhere before the EPYC was measured;
on non-x86 CPUs torch does not call MKL at all).  The AMD rule rests on that one AVX-512 EPYC: AVX2-only AMD
CPUs and Hygon's were not measured.  Both products are float32 dot products summed in different orders, so
outputs agree to rounding; keeping both weights costs a second copy of their memory, which is why the engine
lets packing be turned off (`EngineConfig.pack_weights`).
"""

from __future__ import annotations

import sys
from functools import cache

import torch
import torch.nn.functional as F
from torch import nn

# The row counts the packed copy serves, measured on an Intel Xeon (every CPU but AMD's and Hygon's).
PACKED_ROWS = {torch.float32: range(4, 128), torch.bfloat16: range(1, 128)}
_PACKED_DTYPES = tuple(PACKED_ROWS)
_ALL_ROWS = range(1, sys.maxsize)
# x86 vendors whose CPUs MKL serves through its slow generic paths.
MKL_SLOW_VENDORS = ("AuthenticAMD", "HygonGenuine")
# The row count oneDNN picks the blocked layout for: measured, a layout for 256 rows is as fast as one for 16
# or 64 at 4-32 rows.
_LAYOUT_ROWS = 256


@cache
def cpu_vendor() -> str:
    """The CPU's vendor id as Linux reports it (`GenuineIntel`, `AuthenticAMD`, ...), or '' where unknown."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as info:
            for line in info:
                if line.startswith("vendor_id"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return ""


def packed_rows(dtype: torch.dtype) -> range:
    """The row counts of a pass that the packed copy serves on this CPU (empty for dtypes it does not pack)."""
    if dtype not in _PACKED_DTYPES:
        return range(0)
    return _ALL_ROWS if cpu_vendor() in MKL_SLOW_VENDORS else PACKED_ROWS[dtype]


def packing_supported(weight: torch.Tensor) -> bool:
    """Whether this torch can pack `weight`: float32, or bfloat16 where oneDNN has it, on a CPU torch built
    with oneDNN."""
    if weight.device.type != "cpu" or weight.dtype not in _PACKED_DTYPES or not torch.backends.mkldnn.is_available():
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
    """`F.linear(x, weight, bias)`, through the packed copy when there is one and this CPU serves `x [rows, in]`'s
    number of rows faster through it."""
    if packed is not None and x.dim() == 2 and x.shape[0] in packed_rows(x.dtype):
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
