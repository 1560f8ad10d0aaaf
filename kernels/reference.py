"""Torch reference implementations of the attention and cache kernels.

These are the ground truth the Triton kernels are tested against, and the path
used on CPU.  Layouts follow flash-attn: packed tokens `[total, heads, head_dim]`,
paged cache `[num_blocks, block_size, num_kv_heads, head_dim]`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def store_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """Write `k`/`v` `[n, kv_heads, dim]` into the paged caches at flat slots (`-1` = skip)."""
    keep = slot_mapping >= 0
    if not bool(keep.all()):
        k, v, slot_mapping = k[keep], v[keep], slot_mapping[keep]
    k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, slot_mapping, k.to(k_cache.dtype))
    v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, slot_mapping, v.to(v_cache.dtype))


def _gather_paged(cache: torch.Tensor, blocks: torch.Tensor, length: int) -> torch.Tensor:
    """The first `length` positions of one sequence's K or V from its block list."""
    block_size = cache.shape[1]
    needed = blocks[: (length + block_size - 1) // block_size]
    # index_select, not cache[needed]: on CPU advanced indexing took 2-3x as long for the same copy
    return cache.index_select(0, needed).flatten(0, 1)[:length]


# torch's CPU flash-attention kernel with its log-sum-exp, which lets a chunk's attention be taken in two
# parts and merged; an internal op, so its absence (another torch) falls back to one masked call.
_CPU_FLASH_WITH_LSE = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
_SPLIT_MIN_QUERIES = 1024     # measured: below this one masked call is as fast as two and a merge


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float) -> torch.Tensor:
    """Attention of `q [lq, hq, d]` over `k, v [lk, hkv, d]`; causal is bottom-right aligned."""
    lq, lk = q.shape[0], k.shape[0]
    # [1, heads, len, dim]: with a batch dimension, torch's CPU SDPA takes its flash kernel (tiled, no score
    # matrix); 3-d inputs fall back to the math kernel, 5-10x slower at a 2k-token prefill.
    qh, kh, vh = q.transpose(0, 1)[None], k.transpose(0, 1)[None].to(q.dtype), v.transpose(0, 1)[None].to(q.dtype)
    if causal and lk > lq >= _SPLIT_MIN_QUERIES and q.device.type == "cpu" and _CPU_FLASH_WITH_LSE is not None:
        return _attend_after_prefix(qh, kh, vh, scale)[0].transpose(0, 1)
    mask, square = None, causal and lq == lk and lq > 1
    if causal and lq > 1 and not square:
        rows = torch.arange(lq, device=q.device).unsqueeze(1) + (lk - lq)
        mask = torch.arange(lk, device=q.device).unsqueeze(0) <= rows
    # A square causal block takes SDPA's is_causal path, which skips building and reading a mask.
    out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, is_causal=square, scale=scale,
                                         enable_gqa=kh.shape[1] != qh.shape[1])
    return out[0].transpose(0, 1)


def _attend_after_prefix(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """Causal attention of a chunk of queries `[1, hq, lq, d]` that follows `lk - lq` earlier positions:
    the earlier positions without a mask, the chunk's own as a square causal block (the kernel skips its
    upper half), merged by their log-sum-exps.  One masked call would compute and mask the whole rectangle."""
    prefix = k.shape[2] - q.shape[2]
    if k.shape[1] != q.shape[1]:              # the kernel takes no grouped heads: repeat each K/V head
        k, v = (t.repeat_interleave(q.shape[1] // k.shape[1], dim=1) for t in (k, v))
    before, lse_before = _CPU_FLASH_WITH_LSE(q, k[:, :, :prefix], v[:, :, :prefix], scale=scale)
    own, lse_own = _CPU_FLASH_WITH_LSE(q, k[:, :, prefix:], v[:, :, prefix:], is_causal=True, scale=scale)
    lse = torch.logaddexp(lse_before, lse_own)
    return (before * (lse_before - lse).exp().unsqueeze(-1).to(before.dtype)
            + own * (lse_own - lse).exp().unsqueeze(-1).to(own.dtype))


def flash_attn_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                      cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, causal: bool = True,
                      softmax_scale: float | None = None, block_table: torch.Tensor | None = None) -> torch.Tensor:
    """Packed attention over several sequences (reference).

    `q [total_q, hq, d]`.  Without `block_table`, `k`/`v` are packed `[total_k, hkv, d]`; with it they are
    paged caches and sequence i reads its first `cu_seqlens_k[i+1]-cu_seqlens_k[i]` positions through
    `block_table[i]`.  Queries are the last positions of their sequence (causal mask aligned bottom-right).
    """
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    out = torch.empty_like(q)
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    for i in range(len(cq) - 1):
        if cq[i + 1] == cq[i]:
            continue
        length = ck[i + 1] - ck[i]
        if block_table is None:
            ks, vs = k[ck[i]:ck[i + 1]], v[ck[i]:ck[i + 1]]
        else:
            ks, vs = _gather_paged(k, block_table[i], length), _gather_paged(v, block_table[i], length)
        out[cq[i]:cq[i + 1]] = _attend(q[cq[i]:cq[i + 1]], ks, vs, causal, scale)
    return out


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_table: torch.Tensor, seq_lens: torch.Tensor,
                           softmax_scale: float | None = None) -> torch.Tensor:
    """One query token per sequence, `q [batch, hq, d]`, over its first `seq_lens[i]` cached positions."""
    batch, hq, dim = q.shape
    if batch == 0:
        return torch.empty_like(q)
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(dim)
    block_size, hkv = k_cache.shape[1], k_cache.shape[2]
    max_len = int(seq_lens.max())
    n_blocks = (max_len + block_size - 1) // block_size
    blocks = block_table[:, :n_blocks].long().clamp_min(0)
    # [b, hkv, L, d]: a KV head's query group attends as that head's queries, so K/V are never repeated.
    k = k_cache[blocks].flatten(1, 2)[:, :max_len].to(q.dtype).transpose(1, 2)
    v = v_cache[blocks].flatten(1, 2)[:, :max_len].to(q.dtype).transpose(1, 2)
    valid = torch.arange(max_len, device=q.device).unsqueeze(0) < seq_lens.unsqueeze(1).to(q.device)
    out = F.scaled_dot_product_attention(q.view(batch, hkv, hq // hkv, dim), k, v, attn_mask=valid[:, None, None, :],
                                         scale=scale)
    return out.reshape(batch, hq, dim)
