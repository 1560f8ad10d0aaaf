"""What every Triton launcher shares: argument checks, tile helpers and device facts."""

from __future__ import annotations

import functools

import torch

ATTENTION_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_HEAD_DIM = 256


def next_pow2(n: int, floor: int = 16) -> int:
    """The smallest power of two >= `n` and >= `floor` (tl.arange and tl.dot need powers of two >= 16)."""
    size = floor
    while size < n:
        size *= 2
    return size


def dot_precision(dtype: torch.dtype) -> str:
    """`tl.dot` input precision: full fp32 for fp32 inputs so results match the reference, else the default."""
    return "ieee" if dtype == torch.float32 else "tf32"


@functools.lru_cache(maxsize=None)
def _cuda_sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def parallel_workers(device: torch.device) -> int:
    """How many programs run at once: the SM count on CUDA; a small stand-in under the CPU interpreter."""
    if device.type == "cuda":
        return _cuda_sm_count(device.index if device.index is not None else torch.cuda.current_device())
    return 4


def check_rank(name: str, tensor: torch.Tensor, rank: int, layout: str) -> None:
    """Raise if `tensor` does not have `rank` dimensions."""
    if tensor.dim() != rank:
        raise ValueError(f"{name} must be {layout}, got shape {tuple(tensor.shape)}")


def check_same_device(device: torch.device, **tensors: torch.Tensor | None) -> None:
    """Raise if any given tensor lives on another device than `device`."""
    for name, tensor in tensors.items():
        if tensor is not None and tensor.device != device:
            raise ValueError(f"{name} is on {tensor.device} but the query/inputs are on {device}")


def check_integer(name: str, tensor: torch.Tensor) -> None:
    """Raise unless `tensor` holds int32 or int64 indices."""
    if tensor.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{name} must be int32 or int64, got {tensor.dtype}")


def check_attention_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_layout: str) -> tuple[int, int]:
    """Check query/key/value dtypes and head shapes; return (query heads per KV head, head_dim)."""
    if q.dtype not in ATTENTION_DTYPES:
        raise TypeError(f"q dtype must be one of {ATTENTION_DTYPES}, got {q.dtype}")
    if k.dtype != v.dtype:
        raise TypeError(f"k and v dtypes differ: {k.dtype} vs {v.dtype}")
    if k.shape != v.shape:
        raise ValueError(f"k and v shapes differ: {tuple(k.shape)} vs {tuple(v.shape)}")
    head_dim, q_heads, kv_heads = q.shape[-1], q.shape[-2], k.shape[-2]
    if k.shape[-1] != head_dim:
        raise ValueError(f"head_dim of q ({head_dim}) and {kv_layout} ({k.shape[-1]}) differ")
    if not 0 < head_dim <= MAX_HEAD_DIM:
        raise ValueError(f"head_dim must be in 1..{MAX_HEAD_DIM}, got {head_dim}")
    if kv_heads == 0 or q_heads % kv_heads:
        raise ValueError(f"query heads ({q_heads}) must be a multiple of KV heads ({kv_heads})")
    return q_heads // kv_heads, head_dim


def unit_last_stride(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` itself when its last dimension is contiguous (the kernels index it with stride 1), else a copy."""
    return tensor if tensor.stride(-1) == 1 else tensor.contiguous()


def softmax_scale_log2(softmax_scale: float | None, head_dim: int) -> float:
    """The score scale folded with log2(e), since the kernels use exp2."""
    scale = softmax_scale if softmax_scale is not None else head_dim ** -0.5
    return scale * 1.4426950408889634
