"""What one forward step tells every attention layer: where new K/V go and what each query attends to.

Built once per step by the model runner, read by the attention layers, so that
model code keeps the plain signature `forward(input_ids, positions, metadata)`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class AttentionMetadata:
    """Tensors describing one packed step.

    Prefill (`is_prefill=True`): each sequence contributes `q_len` new tokens that continue its
    first `k_len - q_len` cached tokens; `cu_seqlens_q`/`cu_seqlens_k` are the cumulative
    `[batch+1]` int32 boundaries.  `block_tables` is set when some sequence attends to K/V
    already in the cache (prefix-cache hit, chunked prefill, multi-token verification); then
    attention reads K/V from the cache through it, else from the freshly computed K/V.
    Decode (`is_prefill=False`): one new token per sequence; `context_lens` `[batch]` counts the
    cached positions including the new one and `block_tables` `[batch, max_blocks]` locates them.
    """

    is_prefill: bool
    slot_mapping: torch.Tensor                 # [num_tokens] int64 flat cache slots of the new tokens
    cu_seqlens_q: torch.Tensor | None = None
    cu_seqlens_k: torch.Tensor | None = None
    max_seqlen_q: int = 0
    max_seqlen_k: int = 0
    block_tables: torch.Tensor | None = None
    context_lens: torch.Tensor | None = None
