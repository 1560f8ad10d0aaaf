"""Paged decode attention for float32 CPU tensors, compiled with numba.

The torch reference gathers every sequence's K/V out of the block table before attending, which on
a CPU costs several times the arithmetic.  This kernel reads each cached row in place through the
block table, one (sequence, KV head) at a time, with the query heads of the group together so every
K/V row is read once.  It runs on one thread: numba's thread pool woke up erratically (10 ms stalls)
beside torch's own threads on a 2-core machine.  Other dtypes and devices use the reference (numba
has no bf16/fp16 math).
"""

from __future__ import annotations

import math

import numba
import numpy as np
import torch


@numba.njit(fastmath=True, cache=True, nogil=True)
def _decode(q, k_cache, v_cache, block_table, seq_lens, scale, out):  # pragma: no cover - compiled
    batch, num_heads, dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    longest = 0
    for b in range(batch):
        longest = max(longest, seq_lens[b])
    # Scratch shared by every (sequence, KV head): row slices of the caches keep the inner loops contiguous.
    scores = np.empty((group, longest), dtype=np.float32)
    acc = np.empty((group, dim), dtype=np.float32)
    totals = np.empty(group, dtype=np.float32)
    for b in range(batch):
        length = seq_lens[b]
        for h in range(num_kv_heads):
            queries = q[b, h * group:(h + 1) * group]
            for pos in range(length):
                key = k_cache[block_table[b, pos // block_size], pos % block_size, h]
                for g in range(group):
                    dot = np.float32(0.0)
                    for d in range(dim):
                        dot += queries[g, d] * key[d]
                    scores[g, pos] = dot * scale
            for g in range(group):
                peak = np.float32(-np.inf)
                for pos in range(length):
                    peak = max(peak, scores[g, pos])
                total = np.float32(0.0)
                for pos in range(length):
                    weight = np.exp(scores[g, pos] - peak)
                    scores[g, pos] = weight
                    total += weight
                totals[g] = total
            acc[:, :] = 0.0
            for pos in range(length):
                value = v_cache[block_table[b, pos // block_size], pos % block_size, h]
                for g in range(group):
                    weight = scores[g, pos]
                    for d in range(dim):
                        acc[g, d] += weight * value[d]
            for g in range(group):
                inverse = np.float32(1.0) / totals[g] if totals[g] > 0 else np.float32(0.0)
                for d in range(dim):
                    out[b, h * group + g, d] = acc[g, d] * inverse


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
    if q.shape[0]:
        _decode(q.contiguous().numpy(), k_cache.numpy(), v_cache.numpy(),
                block_table.to(torch.int32).contiguous().numpy(), seq_lens.to(torch.int32).contiguous().numpy(),
                np.float32(scale), out.numpy())
    return out
