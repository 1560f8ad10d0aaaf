"""FlashAttention-2 style packed (varlen) prefill in Triton, reading K/V packed or from the paged cache."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from leapgen.kernels.triton_launch import (check_attention_inputs, check_integer, check_rank, check_same_device,
                                           dot_precision, next_pow2, softmax_scale_log2, unit_last_stride)
from leapgen.kernels.triton_tiles import NEG_BIG, kv_row_offsets, load_rows, online_softmax_step


@triton.jit
def _prefill_span(q, m_i, l_i, acc, lo, hi, rows_m, dims, k_ptr, v_ptr, k_start, k_len, diag, table_row_ptr,
                  block_size, kv_head, stride_kt, stride_kh, stride_kb, stride_vt, stride_vh, stride_vb, scale_log2,
                  HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, PAGED: tl.constexpr,
                  MASKED: tl.constexpr, CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Attend the query tile to key positions [lo, hi); MASKED tiles check length and causality per score."""
    for start in range(lo, hi, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        col_ok = cols < k_len
        k_rows, v_rows = kv_row_offsets(cols, col_ok, k_start, table_row_ptr, block_size,
                                        stride_kt, stride_kb, stride_vt, stride_vb, PAGED)
        k = load_rows(k_ptr + k_rows[:, None] + kv_head * stride_kh + dims[None, :], col_ok, dims,
                      HEAD_DIM, BLOCK_D, MASKED)
        v = load_rows(v_ptr + v_rows[:, None] + kv_head * stride_vh + dims[None, :], col_ok, dims,
                      HEAD_DIM, BLOCK_D, MASKED)
        keep = col_ok[None, :]
        if MASKED and CAUSAL:
            # Bottom-right alignment: query row r is key position r + diag.
            keep = keep & (cols[None, :] <= rows_m[:, None] + diag)
        m_i, l_i, acc = online_softmax_step(q, k.to(q.dtype), v.to(q.dtype), keep, m_i, l_i, acc, scale_log2,
                                            DOT_PRECISION)
    return m_i, l_i, acc


@triton.jit
def _prefill_kernel(q_ptr, k_ptr, v_ptr, out_ptr, cu_q_ptr, cu_k_ptr, table_ptr,
                    stride_qt, stride_qh, stride_kt, stride_kh, stride_kb, stride_vt, stride_vh, stride_vb,
                    stride_ot, stride_oh, stride_table, block_size, scale_log2,
                    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, PAGED: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                    DOT_PRECISION: tl.constexpr):
    m_block = tl.program_id(0)
    seq = tl.program_id(1)
    head = tl.program_id(2)
    q_start = tl.load(cu_q_ptr + seq)
    q_len = tl.load(cu_q_ptr + seq + 1) - q_start
    # The grid is sized by the longest sequence; shorter ones leave their extra tiles idle.
    if m_block * BLOCK_M < q_len:
        k_start = tl.load(cu_k_ptr + seq)
        k_len = tl.load(cu_k_ptr + seq + 1) - k_start
        kv_head = head // GROUP
        table_row_ptr = table_ptr + seq.to(tl.int64) * stride_table
        rows_m = m_block * BLOCK_M + tl.arange(0, BLOCK_M)
        row_ok = rows_m < q_len
        dims = tl.arange(0, BLOCK_D)
        q_rows = (q_start + rows_m).to(tl.int64)
        q = load_rows(q_ptr + q_rows[:, None] * stride_qt + head * stride_qh + dims[None, :], row_ok, dims,
                      HEAD_DIM, BLOCK_D, True)
        diag = k_len - q_len
        if CAUSAL:
            # Tiles before `full` are visible to every row of this query tile; tiles up to `hi` to some rows.
            hi = tl.minimum(k_len, (m_block + 1) * BLOCK_M + diag)
            full = tl.minimum(k_len, m_block * BLOCK_M + diag + 1)
        else:
            hi = k_len
            full = k_len
        full = tl.maximum(full, 0) // BLOCK_N * BLOCK_N
        m_i = tl.full([BLOCK_M], NEG_BIG, tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        m_i, l_i, acc = _prefill_span(q, m_i, l_i, acc, 0, full, rows_m, dims, k_ptr, v_ptr, k_start, k_len, diag,
                                      table_row_ptr, block_size, kv_head, stride_kt, stride_kh, stride_kb,
                                      stride_vt, stride_vh, stride_vb, scale_log2, HEAD_DIM, BLOCK_N, BLOCK_D,
                                      PAGED, False, CAUSAL, DOT_PRECISION)
        m_i, l_i, acc = _prefill_span(q, m_i, l_i, acc, full, hi, rows_m, dims, k_ptr, v_ptr, k_start, k_len, diag,
                                      table_row_ptr, block_size, kv_head, stride_kt, stride_kh, stride_kb,
                                      stride_vt, stride_vh, stride_vb, scale_log2, HEAD_DIM, BLOCK_N, BLOCK_D,
                                      PAGED, True, CAUSAL, DOT_PRECISION)
        # A row that sees no key at all (more queries than keys) yields zeros, as in flash-attn.
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        out_ptrs = out_ptr + q_rows[:, None] * stride_ot + head * stride_oh + dims[None, :]
        tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & (dims[None, :] < HEAD_DIM))


def _tiles(head_dim: int, dtype: torch.dtype, device: torch.device) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) for this head_dim and dtype, sized to fit shared memory."""
    if device.type != "cuda":
        return 16, 16, 4, 1  # the CPU interpreter: small tiles so short test sequences cross tile edges
    wide = dtype == torch.float32
    if head_dim <= 64:
        return (64, 64, 4, 3) if wide else (128, 64, 4, 3)
    if head_dim <= 128:
        return (64, 32, 4, 2) if wide else (128, 64, 8, 2)
    return (32, 32, 4, 2) if wide else (64, 32, 4, 2)


def flash_attn_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                      cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, causal: bool = True,
                      softmax_scale: float | None = None, block_table: torch.Tensor | None = None) -> torch.Tensor:
    """Packed attention over several sequences; the contract of `reference.flash_attn_varlen`.

    `max_seqlen_q` sizes the grid and must bound every query length (not checked: that needs a device sync);
    `max_seqlen_k` is accepted for flash-attn compatibility.  Rows that see no key return zeros.
    """
    check_rank("q", q, 3, "[total_q, q_heads, head_dim]")
    paged = block_table is not None
    kv_layout = "[num_blocks, block_size, kv_heads, head_dim]" if paged else "[total_k, kv_heads, head_dim]"
    check_rank("k", k, 4 if paged else 3, kv_layout)
    group, head_dim = check_attention_inputs(q, k, v, kv_layout)
    for name, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        check_rank(name, cu, 1, "[batch + 1]")
        check_integer(name, cu)
    if cu_seqlens_q.shape != cu_seqlens_k.shape:
        raise ValueError(f"cu_seqlens_q {tuple(cu_seqlens_q.shape)} and cu_seqlens_k "
                         f"{tuple(cu_seqlens_k.shape)} describe different batch sizes")
    batch = cu_seqlens_q.shape[0] - 1
    if paged:
        check_rank("block_table", block_table, 2, "[batch, max_blocks]")
        check_integer("block_table", block_table)
        if block_table.shape[0] < batch:
            raise ValueError(f"block_table has {block_table.shape[0]} rows for a batch of {batch}")
        block_table = unit_last_stride(block_table)
    check_same_device(q.device, k=k, v=v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                      block_table=block_table)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if batch <= 0 or q.shape[0] == 0 or max_seqlen_q <= 0:
        return out
    q, k, v = unit_last_stride(q), unit_last_stride(k), unit_last_stride(v)
    block_m, block_n, num_warps, num_stages = _tiles(head_dim, q.dtype, q.device)
    if paged:
        row_strides = (k.stride(1), k.stride(2), k.stride(0), v.stride(1), v.stride(2), v.stride(0))
        table, table_stride, block_size = block_table, block_table.stride(0), k.shape[1]
    else:
        row_strides = (k.stride(0), k.stride(1), 0, v.stride(0), v.stride(1), 0)
        table, table_stride, block_size = cu_seqlens_k, 0, 1  # unused by the packed path
    grid = (triton.cdiv(max_seqlen_q, block_m), batch, q.shape[1])
    _prefill_kernel[grid](
        q, k, v, out, cu_seqlens_q, cu_seqlens_k, table,
        q.stride(0), q.stride(1), *row_strides, out.stride(0), out.stride(1), table_stride, block_size,
        softmax_scale_log2(softmax_scale, head_dim),
        GROUP=group, HEAD_DIM=head_dim, CAUSAL=bool(causal), PAGED=paged, BLOCK_M=block_m, BLOCK_N=block_n,
        BLOCK_D=next_pow2(head_dim), DOT_PRECISION=dot_precision(q.dtype), num_warps=num_warps,
        num_stages=num_stages)
    return out
