"""Any `AutoModelForCausalLM` architecture, wrapped so the engine can still decode it — clearly slower.

leapgen's paged KV cache needs leapgen's own attention layers, so this wrapper does not use it.
Instead the runner hands it the sequences of a step as token lists, and it returns the logits
of each sequence's new tokens.  Design choice: a sequence given a `seq_id` keeps an HF KV cache
between steps, reused whenever the cached tokens are a prefix of the sequence's tokens before
this step (the plain decode case, O(1) new tokens per step); anything else (rollback, a forked
beam, an evicted entry, no `seq_id`) recomputes the sequence from scratch, which is always
correct.  Each sequence runs on its own (batch 1, no padding), so numerics equal a plain HF
forward of that sequence.  Call `release(seq_id)` when a sequence finishes.
"""

from __future__ import annotations

import inspect
from collections import OrderedDict
from pathlib import Path
from typing import Any, Hashable, Sequence

import torch
from torch import nn
from transformers import AutoModelForCausalLM, PreTrainedModel


class FallbackModel(nn.Module):
    """Slower path for non-native architectures: per-sequence HF forwards returning new-token logits."""

    def __init__(self, hf_model: PreTrainedModel, max_cached_sequences: int = 64) -> None:
        super().__init__()
        self.hf_model = hf_model.eval().requires_grad_(False)
        self.max_cached_sequences = max_cached_sequences
        self._caches: OrderedDict[Hashable, tuple[list[int], Any]] = OrderedDict()
        parameters = inspect.signature(hf_model.forward).parameters
        self._keeps_logits = "logits_to_keep" in parameters
        # transformers 5 renamed `past_key_values` (in and out) to `cache`, warning of the old name's removal
        self._cache_name = "cache" if "cache" in parameters else "past_key_values"

    @classmethod
    def from_pretrained(cls, directory: str | Path, dtype: torch.dtype, device: torch.device) -> FallbackModel:
        """Load a local checkpoint with transformers onto `device` in `dtype`."""
        hf_model = AutoModelForCausalLM.from_pretrained(directory, dtype=dtype)
        return cls(hf_model.to(device))

    @torch.inference_mode()
    def forward_sequences(self, token_ids: Sequence[Sequence[int]], num_new: Sequence[int],
                          seq_ids: Sequence[Hashable] | None = None) -> torch.Tensor:
        """Float32 logits `[sum(num_new), vocab]` for the last `num_new[i]` tokens of each `token_ids[i]`."""
        if len(num_new) != len(token_ids) or (seq_ids is not None and len(seq_ids) != len(token_ids)):
            raise ValueError(f"forward_sequences got {len(token_ids)} sequences, {len(num_new)} num_new "
                             f"and {len(seq_ids) if seq_ids is not None else 'no'} seq_ids; they must match")
        outputs = []
        for i, (tokens, new) in enumerate(zip(token_ids, num_new)):
            if not 1 <= new <= len(tokens):
                raise ValueError(f"sequence {i}: num_new={new} must be between 1 and its length {len(tokens)}")
            outputs.append(self._sequence_logits(list(tokens), new, None if seq_ids is None else seq_ids[i]))
        return torch.cat(outputs)

    def release(self, seq_id: Hashable) -> None:
        """Drop the KV cache kept for a finished sequence."""
        self._caches.pop(seq_id, None)

    def _sequence_logits(self, tokens: list[int], new: int, seq_id: Hashable | None) -> torch.Tensor:
        cached_tokens, past = self._caches.pop(seq_id, (None, None)) if seq_id is not None else (None, None)
        start = 0
        if cached_tokens is not None and len(cached_tokens) <= len(tokens) - new \
                and tokens[:len(cached_tokens)] == cached_tokens:
            start = len(cached_tokens)
        else:
            past = None
        device = self.hf_model.device
        kwargs: dict[str, Any] = {"use_cache": seq_id is not None}
        if self._keeps_logits:
            kwargs["logits_to_keep"] = new
        kwargs[self._cache_name] = past
        out = self.hf_model(input_ids=torch.tensor([tokens[start:]], device=device), **kwargs)
        if seq_id is not None:
            self._caches[seq_id] = (tokens, getattr(out, self._cache_name))
            while len(self._caches) > self.max_cached_sequences:
                self._caches.popitem(last=False)
        return out.logits[0, -new:].float()
