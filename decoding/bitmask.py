"""Packed allowed-token bitmasks (xgrammar/llguidance layout) in torch: allocate, unpack, apply to logits."""

from __future__ import annotations

import numpy as np
import torch

_SHIFTS = torch.arange(32, dtype=torch.int32)


def bitmask_words(vocab_size: int) -> int:
    """Number of int32 words holding one bit per token."""
    return (vocab_size + 31) // 32


def allocate_token_bitmask(batch_size: int, vocab_size: int) -> np.ndarray:
    """A `[batch, ceil(V/32)]` int32 array with every token allowed; matchers fill rows via `fill_bitmask(buf[i])`."""
    return np.full((batch_size, bitmask_words(vocab_size)), -1, dtype=np.int32)


def unpack_token_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """`[B, W]` int32 words → `[B, vocab_size]` bool (bit i % 32 of word i // 32 ⇔ token i allowed)."""
    if bitmask.dtype != torch.int32 or bitmask.dim() != 2:
        raise ValueError(f"token bitmask must be a 2-D int32 tensor, got {bitmask.dtype} with shape {tuple(bitmask.shape)}")
    bits = (bitmask[:, :, None] >> _SHIFTS.to(bitmask.device)) & 1
    allowed = bits.reshape(bitmask.shape[0], -1).bool()
    if allowed.shape[1] >= vocab_size:
        return allowed[:, :vocab_size]
    # Logit rows wider than the tokenizer (padded embeddings): the extra ids are never allowed.
    pad = torch.zeros(bitmask.shape[0], vocab_size - allowed.shape[1], dtype=torch.bool, device=bitmask.device)
    return torch.cat([allowed, pad], dim=1)


def apply_token_bitmask_(logits: torch.Tensor, bitmask: torch.Tensor | np.ndarray) -> torch.Tensor:
    """Set logits of disallowed tokens to -inf in place; `bitmask` is `[B, W]` int32 (numpy or torch)."""
    mask = torch.as_tensor(bitmask).to(logits.device)
    if mask.shape[0] != logits.shape[0]:
        raise ValueError(f"token bitmask has {mask.shape[0]} rows but logits have {logits.shape[0]}")
    allowed = unpack_token_bitmask(mask, logits.shape[-1])
    return logits.masked_fill_(~allowed, -float("inf"))
