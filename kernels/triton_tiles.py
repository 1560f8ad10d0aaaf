"""Device-side pieces shared by the Triton attention kernels: paged addressing and the online-softmax step."""

from __future__ import annotations

import triton
import triton.language as tl

# A finite "minus infinity" for running maxima: exp2(m_old - m_new) stays 0 or 1 instead of NaN
# while a row has seen only masked keys.
NEG_BIG = tl.constexpr(-1.0e30)


@triton.jit
def paged_block_ids(table_row_ptr, positions, valid, block_size):
    """Physical cache block of each logical position, as int64 so row offsets cannot overflow."""
    return tl.load(table_row_ptr + positions // block_size, mask=valid, other=0).to(tl.int64)


@triton.jit
def online_softmax_step(q, k, v, keep, m_i, l_i, acc, scale_log2, DOT_PRECISION: tl.constexpr):
    """Fold one K/V tile into the running (max, sum, output) of FlashAttention's online softmax (base 2)."""
    scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale_log2
    scores = tl.where(keep, scores, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(scores, 1))
    alpha = tl.math.exp2(m_i - m_new)
    p = tl.math.exp2(scores - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=DOT_PRECISION)
    return m_new, l_i, acc


@triton.jit
def load_rows(ptrs, row_ok, dims, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, MASK_ROWS: tl.constexpr):
    """Load a [rows, BLOCK_D] tile, masking rows past the end and the head_dim padding only when needed."""
    if MASK_ROWS:
        tile = tl.load(ptrs, mask=row_ok[:, None] & (dims[None, :] < HEAD_DIM), other=0.0)
    elif BLOCK_D != HEAD_DIM:
        tile = tl.load(ptrs, mask=dims[None, :] < HEAD_DIM, other=0.0)
    else:
        tile = tl.load(ptrs)
    return tile


@triton.jit
def kv_row_offsets(positions, valid, seq_start, table_row_ptr, block_size,
                   stride_k_row, stride_k_block, stride_v_row, stride_v_block, PAGED: tl.constexpr):
    """Element offsets (int64) of the K and V rows at logical `positions` of one sequence.

    Packed: rows `seq_start + position` of `[tokens, heads, dim]`.  Paged: slot `position % block_size`
    of block `table[position // block_size]` in `[blocks, block_size, heads, dim]`.
    """
    if PAGED:
        blocks = paged_block_ids(table_row_ptr, positions, valid, block_size)
        slots = (positions % block_size).to(tl.int64)
        k_rows = blocks * stride_k_block + slots * stride_k_row
        v_rows = blocks * stride_v_block + slots * stride_v_row
    else:
        rows = (seq_start + positions).to(tl.int64)
        k_rows = rows * stride_k_row
        v_rows = rows * stride_v_row
    return k_rows, v_rows
