"""The Llama family as leapgen runs it: Llama, Mistral, Qwen2 (qkv bias) and Qwen3 (q/k RMSNorm).

The four differ only in flags carried by `ModelConfig`, so one module covers them.  Parameter
names mirror the HF checkpoints (`model.layers.N.self_attn...`), except that q/k/v and
gate/up are merged projections that the loader fills shard by shard.
"""

from __future__ import annotations

import torch
from torch import nn

from leapgen.engine.attention_metadata import AttentionMetadata
from leapgen.engine.config import ModelConfig
from leapgen.engine.models.layers import PagedAttention, RMSNorm, RotaryEmbedding, SiluMLP
from leapgen.engine.models.packed_linear import Linear, pack_weight, packed_linear


class DecoderLayer(nn.Module):
    """Pre-norm attention block followed by a pre-norm MLP block, each with a residual."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = PagedAttention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = SiluMLP(config.hidden_size, config.intermediate_size, config.mlp_bias)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                metadata: AttentionMetadata) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, metadata)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    """Embedding, decoder stack and final norm: token ids to last hidden states."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.rotary = RotaryEmbedding(config.head_dim, config.rope_theta, config.rope_scaling)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, metadata: AttentionMetadata) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        cos, sin = self.rotary(positions, x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin, metadata)
        return self.norm(x)


class LlamaForCausalLM(nn.Module):
    """leapgen's causal LM for the Llama family: `model(ids, positions, metadata)` -> hidden, then `compute_logits`."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.model = LlamaModel(config)
        # Tied checkpoints reuse the embedding matrix; no separate module means no tie to lose
        # when the model is materialised from the meta device.
        self.lm_head = None if config.tie_word_embeddings else Linear(config.hidden_size, config.vocab_size,
                                                                       bias=False)
        self.packed_head: torch.Tensor | None = None      # the tied head's packed copy (see packed_linear)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, metadata: AttentionMetadata) -> torch.Tensor:
        """Hidden states `[num_tokens, hidden]` of a packed step (tokens of several sequences back to back)."""
        window = self.config.sliding_window
        if window is not None and metadata.max_seqlen_k > window:
            raise ValueError(f"a sequence of {metadata.max_seqlen_k} tokens exceeds the {window}-token sliding window "
                             f"of this {self.config.model_type} model; leapgen implements full attention only, "
                             f"so sequences are limited to max_model_len={self.config.max_model_len}")
        return self.model(input_ids, positions, metadata)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Float32 logits `[n, vocab_size]` for selected hidden states."""
        if self.lm_head is not None:
            return self.lm_head(hidden).float()
        return packed_linear(hidden, self.model.embed_tokens.weight, None, self.packed_head).float()

    def pack_weights(self) -> int:
        """Give every linear layer (and a tied head) a packed copy for multi-row matmuls on CPU; the bytes
        added (0 where packing is not supported)."""
        added = sum(module.pack() for module in self.modules() if isinstance(module, Linear))
        embedding = self.model.embed_tokens.weight
        if self.lm_head is None:
            self.packed_head = pack_weight(embedding)
            added += 0 if self.packed_head is None else embedding.numel() * embedding.element_size()
        return added

    @property
    def attention_layers(self) -> list[PagedAttention]:
        """The layers whose `k_cache`/`v_cache` the runner assigns, in order."""
        return [layer.self_attn for layer in self.model.layers]
