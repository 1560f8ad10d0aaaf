"""Triton kernel that writes new K/V rows into the paged cache."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from leapgen.kernels.triton_launch import check_integer, check_rank, check_same_device, next_pow2, unit_last_stride


@triton.jit
def _store_kv_kernel(k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
                     stride_kt, stride_kh, stride_vt, stride_vh,
                     stride_kcb, stride_kcs, stride_kch, stride_vcb, stride_vcs, stride_vch,
                     head_dim, block_size, BLOCK_D: tl.constexpr):
    # One program per (token, KV head): a single contiguous head_dim row in and out.
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    slot = tl.load(slot_ptr + token).to(tl.int64)
    if slot >= 0:
        block = slot // block_size
        offset = slot % block_size
        dims = tl.arange(0, BLOCK_D)
        in_dim = dims < head_dim
        k = tl.load(k_ptr + token * stride_kt + head * stride_kh + dims, mask=in_dim)
        v = tl.load(v_ptr + token * stride_vt + head * stride_vh + dims, mask=in_dim)
        k_dst = k_cache_ptr + block * stride_kcb + offset * stride_kcs + head * stride_kch + dims
        v_dst = v_cache_ptr + block * stride_vcb + offset * stride_vcs + head * stride_vch + dims
        tl.store(k_dst, k.to(k_cache_ptr.dtype.element_ty), mask=in_dim)
        tl.store(v_dst, v.to(v_cache_ptr.dtype.element_ty), mask=in_dim)


def store_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """Write `k`/`v` `[n, kv_heads, dim]` into paged caches `[blocks, block_size, kv_heads, dim]` at flat slots.

    Slot `-1` skips a token.  Slots are not range-checked (that would cost a device sync); an out-of-range
    slot is a caller bug, as in the reference where `index_copy_` rejects it.
    """
    check_rank("k", k, 3, "[tokens, kv_heads, head_dim]")
    check_rank("k_cache", k_cache, 4, "[num_blocks, block_size, kv_heads, head_dim]")
    check_rank("slot_mapping", slot_mapping, 1, "[tokens]")
    check_integer("slot_mapping", slot_mapping)
    check_same_device(k.device, v=v, k_cache=k_cache, v_cache=v_cache, slot_mapping=slot_mapping)
    if v.shape != k.shape:
        raise ValueError(f"k and v shapes differ: {tuple(k.shape)} vs {tuple(v.shape)}")
    if v_cache.shape != k_cache.shape:
        raise ValueError(f"k_cache and v_cache shapes differ: {tuple(k_cache.shape)} vs {tuple(v_cache.shape)}")
    if k_cache.shape[2:] != k.shape[1:]:
        raise ValueError(f"k rows {tuple(k.shape[1:])} do not fit cache rows {tuple(k_cache.shape[2:])}")
    if slot_mapping.shape[0] != k.shape[0]:
        raise ValueError(f"slot_mapping has {slot_mapping.shape[0]} slots for {k.shape[0]} tokens")
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("k_cache/v_cache must be contiguous in head_dim (they are written in place)")
    tokens, kv_heads, head_dim = k.shape
    if tokens == 0:
        return
    k, v = unit_last_stride(k), unit_last_stride(v)
    _store_kv_kernel[(tokens, kv_heads)](
        k, v, k_cache, v_cache, slot_mapping,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        head_dim, k_cache.shape[1], BLOCK_D=next_pow2(head_dim))
