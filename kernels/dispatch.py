"""Pick the implementation by device: Triton kernels for CUDA tensors, the torch reference otherwise
(with a compiled numba decode kernel for float32 CPU tensors).

`LEAPGEN_KERNELS=triton|reference` forces one choice (e.g. Triton under `TRITON_INTERPRET=1` on CPU
tensors, or the reference on a GPU to bisect a kernel bug); unset or `auto` picks by device.
"""

from __future__ import annotations

import os
from typing import Callable

import torch

from leapgen.kernels import cpu_decode, cpu_rows, reference


def _triton():
    """The Triton kernels module, or None where Triton is unavailable."""
    try:
        from leapgen.kernels import triton_attention
    except ImportError:
        return None
    return triton_attention


def _impl(tensor: torch.Tensor):
    choice = os.environ.get("LEAPGEN_KERNELS", "auto")
    if choice == "reference":
        return reference
    if choice == "triton":
        module = _triton()
        if module is None:
            raise ImportError("LEAPGEN_KERNELS=triton but leapgen.kernels.triton_attention cannot be imported")
        return module
    if choice != "auto":
        raise ValueError(f"LEAPGEN_KERNELS must be 'triton', 'reference' or 'auto', got {choice!r}")
    if tensor.is_cuda:
        module = _triton()
        if module is not None:
            return module
    return reference


def flash_attn_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=True,
                      softmax_scale=None, block_table=None) -> torch.Tensor:
    """Packed (varlen) attention; see `reference.flash_attn_varlen` for the contract."""
    return _impl(q).flash_attn_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                      causal=causal, softmax_scale=softmax_scale, block_table=block_table)


def paged_decode_attention(q, k_cache, v_cache, block_table, seq_lens, softmax_scale=None) -> torch.Tensor:
    """Decode attention through block tables; see `reference.paged_decode_attention`."""
    impl = _impl(q)
    if impl is reference and os.environ.get("LEAPGEN_KERNELS", "auto") == "auto" and cpu_decode.supports(q, k_cache):
        impl = cpu_decode
    return impl.paged_decode_attention(q, k_cache, v_cache, block_table, seq_lens, softmax_scale=softmax_scale)


def compiled_row_logsumexp(device: torch.device) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor] | None:
    """The compiled per-row log-sum-exp for a sampler on `device` (CPU, kernels not forced), else None."""
    if device.type == "cpu" and os.environ.get("LEAPGEN_KERNELS", "auto") == "auto":
        return cpu_rows.row_logsumexp
    return None


def store_kv(k, v, k_cache, v_cache, slot_mapping) -> None:
    """Write new K/V into the paged cache; see `reference.store_kv`."""
    _impl(k).store_kv(k, v, k_cache, v_cache, slot_mapping)
