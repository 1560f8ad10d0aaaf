"""Paged decode attention for float32 CPU tensors, compiled with numba.

The torch reference gathers every sequence's K/V out of the block table before attending, which on
a CPU costs several times the arithmetic.  This kernel reads each cached position's K/V rows in
place through the block table, all heads at once, so every row is read once and in memory order; at
batch 32 it is bound by reading the cache from memory.  A large batch may be cut into parts of equal
context run by Python threads (the kernel releases the GIL; `_Threads` says when that pays): numba's
own thread pool woke up erratically (10 ms stalls) beside torch's threads on a 2-core machine.  Other
dtypes and devices use the reference (numba has no bf16/fp16 math).
"""

from __future__ import annotations

import math
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np
import torch
from llvmlite import ir
from numba import types
from numba.core.extending import intrinsic


@intrinsic
def _float32_from_bits(typingctx, bits):  # pragma: no cover - compiled
    """The float32 whose IEEE bits are the int32 `bits` (a no-op for LLVM, so loops using it vectorize)."""
    if bits != types.int32:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())
    return types.float32(types.int32), codegen


# 2**f on [0, 1) as a degree-6 polynomial (least squares on the relative error at Chebyshev points):
# within 1.1e-7 in float32.
_C0, _C1, _C2, _C3, _C4, _C5, _C6 = (np.float32(c) for c in (
    1.0, 0.6931470036506653, 0.2402298003435135, 0.05548352375626564, 0.009678472764790058,
    0.0012443081941455603, 0.00021690608991775662))
_LOG2_E = np.float32(1.4426950408889634)


@numba.njit(fastmath=True, inline="always")
def _exp(x):  # pragma: no cover - compiled
    """exp(x) for float32 x <= 0 within 1.5e-7 * max(1, |x|) relative (below -87 about 1e-38, not 0).

    numba calls libm's scalar expf, which keeps the softmax loop from vectorizing; this polynomial
    vectorizes and is about 10x faster.
    """
    t = max(x * _LOG2_E, np.float32(-126.0))
    whole = np.floor(t)
    f = t - whole
    power = (((((_C6 * f + _C5) * f + _C4) * f + _C3) * f + _C2) * f + _C1) * f + _C0
    return power * _float32_from_bits(np.int32((np.int32(whole) + np.int32(127)) << np.int32(23)))


@numba.njit(fastmath=True, cache=True, nogil=True)
def _decode(q, k_cache, v_cache, block_table, seq_lens, scale, out):  # pragma: no cover - compiled
    batch, num_heads, dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    longest = 0
    for b in range(batch):
        longest = max(longest, seq_lens[b])
    # Scratch shared by every sequence; a cached position's rows of all KV heads are contiguous, so the
    # passes over K and over V each walk the sequence's blocks in memory order.
    scores = np.empty((num_heads, longest), dtype=np.float32)
    acc = np.empty((num_heads, dim), dtype=np.float32)
    peaks = np.empty(num_heads, dtype=np.float32)
    for b in range(batch):
        length = seq_lens[b]
        queries = q[b]
        peaks[:] = -np.inf
        for pos in range(length):
            keys = k_cache[block_table[b, pos // block_size], pos % block_size]
            for head in range(num_heads):
                key = keys[head // group]
                dot = np.float32(0.0)
                for d in range(dim):
                    dot += queries[head, d] * key[d]
                dot *= scale
                scores[head, pos] = dot
                # The running maximum here, not in a loop of its own: numba's max loops do not vectorize.
                if dot > peaks[head]:
                    peaks[head] = dot
        for head in range(num_heads):
            row, peak, total = scores[head], peaks[head], np.float32(0.0)
            for pos in range(length):
                weight = _exp(row[pos] - peak)
                row[pos] = weight
                total += weight
            peaks[head] = np.float32(1.0) / total if total > 0 else np.float32(0.0)   # now the normaliser
        acc[:, :] = 0.0
        for pos in range(length):
            values = v_cache[block_table[b, pos // block_size], pos % block_size]
            for head in range(num_heads):
                weight, value = scores[head, pos], values[head // group]
                for d in range(dim):
                    acc[head, d] += weight * value[d]
        for head in range(num_heads):
            for d in range(dim):
                out[b, head, d] = acc[head, d] * peaks[head]


class _Threads:
    """Whether a large batch is cut across torch's thread count: timed on the first large calls, then kept.

    A second thread pays only while torch's OpenMP workers sleep: libgomp spins for GOMP_SPINCOUNT
    iterations after each parallel region (by default long enough to cover the whole kernel), and a
    spinning worker takes half the core the second part runs on.  leapgen shortens the spin when it is
    imported before torch (leapgen/__init__.py); otherwise one thread stays faster.  So the first large
    calls alternate one thread and all of them, and the faster per unit of work is kept.
    """

    # A part costs a thread hand-off (tens of microseconds): worth it from this many (query head,
    # cached position) pairs per part, about 0.15 ms of the kernel's work.
    MIN_PART_WORK = 8_000
    TRIALS = 8

    def __init__(self) -> None:
        self.pool: ThreadPoolExecutor | None = None
        self.trials: dict[bool, list[float]] = {False: [], True: []}    # split? -> seconds per unit of work
        self.split: bool | None = None

    def count(self, work: int) -> int:
        """Threads for a call with `work` (query head, cached position) pairs."""
        most = min(torch.get_num_threads(), work // self.MIN_PART_WORK)
        if most <= 1:
            return 1
        split = self.split if self.split is not None else len(self.trials[True]) < len(self.trials[False])
        return most if split else 1

    def observe(self, threads: int, work: int, seconds: float) -> None:
        """Record a trial; once both ways have enough, keep the faster."""
        if self.split is not None or work < 2 * self.MIN_PART_WORK:
            return
        self.trials[threads > 1].append(seconds / work)
        if min(len(t) for t in self.trials.values()) >= self.TRIALS:
            self.split = statistics.median(self.trials[True]) < statistics.median(self.trials[False])

    def run(self, parts: list[tuple]) -> None:
        """`_decode` over each argument tuple: the first on this thread, the others on the pool."""
        if self.pool is None and len(parts) > 1:
            self.pool = ThreadPoolExecutor(torch.get_num_threads() - 1, thread_name_prefix="leapgen-decode")
        others = [self.pool.submit(_decode, *args) for args in parts[1:]]
        _decode(*parts[0])
        for other in others:
            other.result()


_THREADS = _Threads()


def _cuts(seq_lens: np.ndarray, count: int) -> list[slice]:
    """`count` consecutive batch slices of about equal total context."""
    cumulative = np.cumsum(seq_lens, dtype=np.int64)
    cuts = [0, *np.searchsorted(cumulative, cumulative[-1] * np.arange(1, count) / count).tolist(), len(seq_lens)]
    return [slice(a, b) for a, b in zip(cuts, cuts[1:]) if b > a]


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
    work = int(lengths.sum()) * q.shape[1]
    threads = _THREADS.count(work)
    start = time.perf_counter()
    _THREADS.run([(queries[part], keys, values, tables[part], lengths[part], scale, results[part])
                  for part in _cuts(lengths, threads)])
    _THREADS.observe(threads, work, time.perf_counter() - start)
    return out
