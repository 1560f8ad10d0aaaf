"""Paged decode attention for float32 CPU tensors, compiled with numba.

The torch reference gathers every sequence's K/V out of the block table before attending, which on
a CPU costs several times the arithmetic.  This kernel reads each sequence's K/V blocks in place
through the block table, in memory order.  A large batch may be cut into parts of equal
context run by Python threads (`cpu_threads.Threads` says when that pays): numba's own thread pool
woke up erratically (10 ms stalls) beside torch's threads on a 2-core machine.  Other dtypes and
devices use the reference (numba has no bf16/fp16 math).
"""

from __future__ import annotations

import math

import numba
import numpy as np
import torch

from leapgen.kernels.cpu_exp import exp_nonpositive
from leapgen.kernels.cpu_threads import Threads, cuts


@numba.njit(fastmath=True, cache=True, nogil=True)
def _decode(q, k_cache, v_cache, block_table, seq_lens, scale, out):  # pragma: no cover - compiled
    batch, num_heads, dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    longest = 0
    for b in range(batch):
        longest = max(longest, seq_lens[b])
    # Scratch shared by every sequence.  Both passes walk a sequence block by block (each block's K or V
    # rows are contiguous) and, within a block, head by head: a head's query, or its accumulator, then
    # stays in registers across the block's positions instead of being reloaded at every position
    # (1.4x faster than position by position at batch 32).
    scores = np.empty((num_heads, longest), dtype=np.float32)
    acc = np.empty((num_heads, dim), dtype=np.float32)
    peaks = np.empty(num_heads, dtype=np.float32)
    for b in range(batch):
        length = seq_lens[b]
        queries = q[b]
        peaks[:] = -np.inf
        num_blocks = (length + block_size - 1) // block_size
        for block in range(num_blocks):
            keys = k_cache[block_table[b, block]]
            first = block * block_size
            for head in range(num_heads):
                query, kv_head = queries[head], head // group
                for i in range(min(block_size, length - first)):
                    key = keys[i, kv_head]
                    dot = np.float32(0.0)
                    for d in range(dim):
                        dot += query[d] * key[d]
                    dot *= scale
                    scores[head, first + i] = dot
                    # The running maximum here, not in a loop of its own: numba's max loops do not vectorize.
                    if dot > peaks[head]:
                        peaks[head] = dot
        for head in range(num_heads):
            row, peak, total = scores[head], peaks[head], np.float32(0.0)
            for pos in range(length):
                weight = exp_nonpositive(row[pos] - peak)
                row[pos] = weight
                total += weight
            peaks[head] = np.float32(1.0) / total if total > 0 else np.float32(0.0)   # now the normaliser
        acc[:, :] = 0.0
        for block in range(num_blocks):
            values = v_cache[block_table[b, block]]
            first = block * block_size
            for head in range(num_heads):
                head_acc, kv_head = acc[head], head // group
                for i in range(min(block_size, length - first)):
                    weight, value = scores[head, first + i], values[i, kv_head]
                    for d in range(dim):
                        head_acc[d] += weight * value[d]
        for head in range(num_heads):
            for d in range(dim):
                out[b, head, d] = acc[head, d] * peaks[head]


# A part is worth a thread from this many (query head, cached position) pairs, about 0.15 ms of work.
_THREADS = Threads(_decode, min_part_work=8_000)


def supports(q: torch.Tensor, k_cache: torch.Tensor) -> bool:
    """True when the compiled kernel applies: float32 CPU tensors."""
    return (q.device.type == "cpu" and q.dtype == torch.float32 and k_cache.dtype == torch.float32
            and q.shape[1] % k_cache.shape[2] == 0)


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_table: torch.Tensor, seq_lens: torch.Tensor,
                           softmax_scale: float | None = None) -> torch.Tensor:
    """Same contract as `reference.paged_decode_attention`, for float32 CPU tensors."""
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    out = torch.empty_like(q)
    if not q.shape[0]:
        return out
    queries, results = q.contiguous().numpy(), out.numpy()
    tables, lengths = block_table.to(torch.int32).contiguous().numpy(), seq_lens.to(torch.int32).contiguous().numpy()
    keys, values, scale = k_cache.numpy(), v_cache.numpy(), np.float32(scale)
    _THREADS.run(int(lengths.sum()) * q.shape[1], lambda count: [
        (queries[part], keys, values, tables[part], lengths[part], scale, results[part])
        for part in cuts(lengths, count)])
    return out
