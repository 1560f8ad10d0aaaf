"""Full-vocabulary scratch tensors that the sampler keeps from one step to the next.

On CPU a fresh `[batch, vocab]` tensor can cost more than the operation that fills it: glibc serves
allocations this large with new pages from the kernel, and the page faults on first touch are paid
again at every step.  Measured with 32 x 100k float32 logits and 2 threads: a clone plus a
log_softmax took 6.7 ms in fresh memory and 1.5 ms in reused memory.
"""

from __future__ import annotations

import torch

DEFAULT_MAX_BYTES = 64 << 20    # per buffer: enough for 128 rows of a 128k vocabulary in float32


class Workspace:
    """Named buffers grown to the largest request seen, up to `max_bytes` each.

    A tensor handed out stays valid until the next request for the same name; a request larger than
    `max_bytes` gets fresh memory that is not kept.
    """

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES):
        self.max_bytes = max_bytes
        self._buffers: dict[str, torch.Tensor] = {}

    def tensor(self, name: str, shape: tuple[int, ...] | torch.Size, dtype: torch.dtype,
               device: torch.device) -> torch.Tensor:
        """An uninitialised tensor of `shape`, backed by the buffer `name` when it fits."""
        numel = 1
        for size in shape:
            numel *= size
        buffer = self._buffers.get(name)
        if buffer is None or buffer.numel() < numel or buffer.dtype != dtype or buffer.device != device:
            buffer = torch.empty(numel, dtype=dtype, device=device)
            if numel * buffer.element_size() <= self.max_bytes:
                self._buffers[name] = buffer
        return buffer[:numel].view(shape)

    def copy(self, name: str, source: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
        """`source` copied (and cast to `dtype`) into the buffer `name`."""
        return self.tensor(name, source.shape, dtype or source.dtype, source.device).copy_(source)

    def rows(self, name: str, source: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """Rows `index` of a 2-d `source`, gathered into the buffer `name`."""
        out = self.tensor(name, (index.numel(), source.shape[1]), source.dtype, source.device)
        return torch.index_select(source, 0, index, out=out)
