"""Paged decode attention in Triton, split along the context (flash-decoding) with a reduce kernel.

One program per (sequence, KV head, context partition) attends the whole query group of that KV head
to its partition, so each K/V row is read once for all the query heads sharing it; a second kernel
merges the partitions' partial softmax results.  Partitions let a small batch still fill the GPU.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from leapgen.kernels.triton_launch import (check_attention_inputs, check_integer, check_rank, check_same_device,
                                           dot_precision, next_pow2, parallel_workers, softmax_scale_log2,
                                           unit_last_stride)
from leapgen.kernels.triton_tiles import NEG_BIG, kv_row_offsets, load_rows, online_softmax_step


@triton.jit
def _decode_split_kernel(q_ptr, k_cache_ptr, v_cache_ptr, table_ptr, seq_lens_ptr, out_ptr,
                         part_acc_ptr, part_m_ptr, part_l_ptr,
                         stride_qb, stride_qh, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
                         stride_table, stride_ob, stride_oh, block_size, partition_size, num_parts, scale_log2,
                         GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_G: tl.constexpr,
                         BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, SINGLE: tl.constexpr,
                         DOT_PRECISION: tl.constexpr):
    seq = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    part = tl.program_id(2)
    num_kv_heads = tl.num_programs(1)
    seq_len = tl.load(seq_lens_ptr + seq)
    lo = part * partition_size
    # The grid covers the block table's capacity; partitions past this sequence's end have nothing to do.
    # Partition 0 always runs so that an empty sequence still gets its (zero) output written.
    if (lo < seq_len) | (part == 0):
        hi = tl.minimum(lo + partition_size, seq_len)
        group_rows = tl.arange(0, BLOCK_G)
        group_ok = group_rows < GROUP
        heads = kv_head * GROUP + group_rows
        dims = tl.arange(0, BLOCK_D)
        q = load_rows(q_ptr + seq * stride_qb + heads[:, None] * stride_qh + dims[None, :], group_ok, dims,
                      HEAD_DIM, BLOCK_D, True)
        table_row_ptr = table_ptr + seq * stride_table
        m_i = tl.full([BLOCK_G], NEG_BIG, tl.float32)
        l_i = tl.zeros([BLOCK_G], tl.float32)
        acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
        for start in range(lo, hi, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            col_ok = cols < hi
            k_rows, v_rows = kv_row_offsets(cols, col_ok, 0, table_row_ptr, block_size,
                                            stride_ks, stride_kb, stride_vs, stride_vb, True)
            k = load_rows(k_cache_ptr + k_rows[:, None] + kv_head * stride_kh + dims[None, :], col_ok, dims,
                          HEAD_DIM, BLOCK_D, True)
            v = load_rows(v_cache_ptr + v_rows[:, None] + kv_head * stride_vh + dims[None, :], col_ok, dims,
                          HEAD_DIM, BLOCK_D, True)
            m_i, l_i, acc = online_softmax_step(q, k.to(q.dtype), v.to(q.dtype), col_ok[None, :], m_i, l_i, acc,
                                                scale_log2, DOT_PRECISION)
        store_mask = group_ok[:, None] & (dims[None, :] < HEAD_DIM)
        if SINGLE:
            out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
            out_ptrs = out_ptr + seq * stride_ob + heads[:, None] * stride_oh + dims[None, :]
            tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=store_mask)
        else:
            # Partials are [batch, kv_heads, num_parts, GROUP] (+ [HEAD_DIM] for acc), contiguous fp32.
            rows = ((seq * num_kv_heads + kv_head) * num_parts + part) * GROUP + group_rows
            tl.store(part_m_ptr + rows, m_i, mask=group_ok)
            tl.store(part_l_ptr + rows, l_i, mask=group_ok)
            tl.store(part_acc_ptr + rows[:, None] * HEAD_DIM + dims[None, :], acc, mask=store_mask)


@triton.jit
def _decode_reduce_kernel(part_acc_ptr, part_m_ptr, part_l_ptr, seq_lens_ptr, out_ptr, stride_ob, stride_oh,
                          partition_size, num_parts, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
                          BLOCK_P: tl.constexpr, BLOCK_D: tl.constexpr):
    seq = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    num_kv_heads = tl.num_programs(1) // GROUP
    seq_len = tl.load(seq_lens_ptr + seq)
    used = tl.maximum(tl.cdiv(seq_len, partition_size), 1)
    first = (seq * num_kv_heads + head // GROUP) * num_parts
    member = head % GROUP
    # Pass 1: the global running max; pass 2: rescale each partition's sum and output to it.
    m_max = tl.full([BLOCK_P], NEG_BIG, tl.float32)
    for p0 in range(0, used, BLOCK_P):
        parts = p0 + tl.arange(0, BLOCK_P)
        m_max = tl.maximum(m_max, tl.load(part_m_ptr + (first + parts) * GROUP + member, mask=parts < used,
                                          other=NEG_BIG))
    m_all = tl.max(m_max, 0)
    dims = tl.arange(0, BLOCK_D)
    total = tl.zeros([BLOCK_P], tl.float32)
    acc = tl.zeros([BLOCK_D], tl.float32)
    for p0 in range(0, used, BLOCK_P):
        parts = p0 + tl.arange(0, BLOCK_P)
        ok = parts < used
        rows = (first + parts) * GROUP + member
        weight = tl.math.exp2(tl.load(part_m_ptr + rows, mask=ok, other=NEG_BIG) - m_all)
        weight = tl.where(ok, weight, 0.0)
        total += weight * tl.load(part_l_ptr + rows, mask=ok, other=0.0)
        part_acc = tl.load(part_acc_ptr + rows[:, None] * HEAD_DIM + dims[None, :],
                           mask=ok[:, None] & (dims[None, :] < HEAD_DIM), other=0.0)
        acc += tl.sum(part_acc * weight[:, None], 0)
    denom = tl.sum(total, 0)
    out = acc / tl.where(denom > 0, denom, 1.0)
    tl.store(out_ptr + seq * stride_ob + head * stride_oh + dims, out.to(out_ptr.dtype.element_ty),
             mask=dims < HEAD_DIM)


def _tiles(head_dim: int, dtype: torch.dtype, device: torch.device) -> tuple[int, int, int, int]:
    """(BLOCK_N, minimum partition length, num_warps, num_stages) for the split kernel."""
    if device.type != "cuda":
        return 16, 16, 4, 1  # the CPU interpreter: small tiles so short test contexts span several partitions
    wide = dtype == torch.float32
    block_n = 64 if head_dim <= 128 else 32
    if wide:
        block_n //= 2
    return block_n, 256, 4, 2


def partition_size(batch: int, kv_heads: int, max_context: int, block_n: int, min_partition: int,
                   workers: int) -> int:
    """Context tokens per partition: enough partitions for about two programs per worker, none shorter
    than `min_partition` (each partition costs a partial write and its share of the reduce)."""
    tiles = triton.cdiv(max_context, block_n)
    wanted_parts = max(1, triton.cdiv(2 * workers, batch * kv_heads))
    tiles_per_part = max(triton.cdiv(min_partition, block_n), triton.cdiv(tiles, wanted_parts))
    return tiles_per_part * block_n


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_table: torch.Tensor, seq_lens: torch.Tensor,
                           softmax_scale: float | None = None) -> torch.Tensor:
    """One query token per sequence, `q [batch, q_heads, dim]`, over its first `seq_lens[i]` cached positions.

    The grid spans the block table's capacity (`block_table.shape[1] * block_size`), known without a
    device sync; `seq_lens` must not exceed it (not checked, for the same reason).  An empty context yields zeros.
    """
    layout = "[num_blocks, block_size, kv_heads, head_dim]"
    check_rank("q", q, 3, "[batch, q_heads, head_dim]")
    check_rank("k_cache", k_cache, 4, layout)
    group, head_dim = check_attention_inputs(q, k_cache, v_cache, layout)
    check_rank("block_table", block_table, 2, "[batch, max_blocks]")
    check_rank("seq_lens", seq_lens, 1, "[batch]")
    check_integer("block_table", block_table)
    check_integer("seq_lens", seq_lens)
    batch = q.shape[0]
    if block_table.shape[0] < batch or seq_lens.shape[0] != batch:
        raise ValueError(f"batch of {batch} queries needs as many block_table rows (got {block_table.shape[0]}) "
                         f"and seq_lens (got {seq_lens.shape[0]})")
    check_same_device(q.device, k_cache=k_cache, v_cache=v_cache, block_table=block_table, seq_lens=seq_lens)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if batch == 0:
        return out
    q, k_cache, v_cache = unit_last_stride(q), unit_last_stride(k_cache), unit_last_stride(v_cache)
    block_table = unit_last_stride(block_table)
    kv_heads, block_size = k_cache.shape[2], k_cache.shape[1]
    block_n, min_partition, num_warps, num_stages = _tiles(head_dim, q.dtype, q.device)
    max_context = max(block_table.shape[1] * block_size, 1)
    part_len = partition_size(batch, kv_heads, max_context, block_n, min_partition, parallel_workers(q.device))
    num_parts = triton.cdiv(max_context, part_len)
    single = num_parts == 1
    partials = (out, out, out)  # placeholders: the single-partition kernel writes `out` directly
    if not single:
        rows = (batch, kv_heads, num_parts, group)
        partials = (torch.empty(*rows, head_dim, dtype=torch.float32, device=q.device),
                    torch.empty(rows, dtype=torch.float32, device=q.device),
                    torch.empty(rows, dtype=torch.float32, device=q.device))
    scale_log2 = softmax_scale_log2(softmax_scale, head_dim)
    block_d = next_pow2(head_dim)
    _decode_split_kernel[(batch, kv_heads, num_parts)](
        q, k_cache, v_cache, block_table, seq_lens, out, *partials,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), block_table.stride(0),
        out.stride(0), out.stride(1), block_size, part_len, num_parts, scale_log2,
        GROUP=group, HEAD_DIM=head_dim, BLOCK_G=next_pow2(group), BLOCK_N=block_n, BLOCK_D=block_d,
        SINGLE=single, DOT_PRECISION=dot_precision(q.dtype), num_warps=num_warps, num_stages=num_stages)
    if not single:
        _decode_reduce_kernel[(batch, q.shape[1])](
            *partials, seq_lens, out, out.stride(0), out.stride(1), part_len, num_parts,
            GROUP=group, HEAD_DIM=head_dim, BLOCK_P=16, BLOCK_D=block_d, num_warps=4)
    return out
