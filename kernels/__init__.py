"""Attention and paged-cache kernels: Triton on CUDA, the torch reference elsewhere."""

from __future__ import annotations

from leapgen.kernels import reference
from leapgen.kernels.dispatch import flash_attn_varlen, paged_decode_attention, store_kv

__all__ = ["flash_attn_varlen", "paged_decode_attention", "store_kv", "reference"]
