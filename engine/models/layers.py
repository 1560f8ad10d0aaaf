"""Building blocks shared by the decoder-only families: RMSNorm, RoPE, merged projections, SiLU MLP, paged attention.

Numerics follow transformers' implementations step by step (norms in float32, cos/sin cast
to the activation dtype) so that logits agree to rounding in fp32 and closely in bf16.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from leapgen.engine.attention_metadata import AttentionMetadata
from leapgen.engine.config import ModelConfig, RopeScaling
from leapgen.engine.models.packed_linear import Linear
from leapgen.engine.step_profile import phase
from leapgen.kernels import flash_attn_varlen, paged_decode_attention, store_kv


class RMSNorm(nn.Module):
    """Root-mean-square norm over the last dimension, computed in float32."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32 and self.weight.dtype == torch.float32:
            # torch's fused norm gives HF's float32 result to the bit in one op instead of six; in half
            # precision it rounds once where HF rounds twice, so those take HF's steps.
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope_inverse_frequencies(head_dim: int, theta: float, scaling: RopeScaling | None) -> torch.Tensor:
    """Per-pair rotation frequencies `[head_dim // 2]` (float32, CPU), with linear or Llama-3 scaling."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").float() / head_dim)
    if scaling is None:
        return inv_freq
    if scaling.kind == "linear":
        return inv_freq / scaling.factor
    # Llama 3: long wavelengths are slowed by `factor`, short ones kept, the band between interpolated.
    context = scaling.original_max_position_embeddings
    wavelength = 2 * math.pi / inv_freq
    long_limit = context / scaling.low_freq_factor
    short_limit = context / scaling.high_freq_factor
    scaled = torch.where(wavelength > long_limit, inv_freq / scaling.factor, inv_freq)
    smooth = (context / wavelength - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor)
    blended = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    in_band = (wavelength >= short_limit) & (wavelength <= long_limit)
    return torch.where(in_band, blended, scaled)


class RotaryEmbedding(nn.Module):
    """cos/sin tables for the positions of one step, computed on the fly (no max-length table)."""

    def __init__(self, head_dim: int, theta: float, scaling: RopeScaling | None) -> None:
        super().__init__()
        # A plain attribute rather than a buffer: it survives meta-device construction and
        # `to_empty` untouched, and moves to the activations' device on first use.
        self._inv_freq = rope_inverse_frequencies(head_dim, theta, scaling)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """`(cos, signed_sin)`, both `[tokens, 1, head_dim]`, for `apply_rotary`; the sine's first half is
        negated once here so that every layer's rotation skips the negation."""
        if self._inv_freq.device != positions.device:
            self._inv_freq = self._inv_freq.to(positions.device)
        freqs = positions.float().unsqueeze(1) * self._inv_freq.unsqueeze(0)
        angles = torch.cat((freqs, freqs), dim=-1)
        sin = angles.sin()
        sin[:, :freqs.shape[1]].neg_()
        return angles.cos().to(dtype).unsqueeze(1), sin.to(dtype).unsqueeze(1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """Rotate `x [tokens, heads, head_dim]` by its positions' angles (halves layout, as in HF checkpoints).

    HF computes `x * cos + cat(-x2, x1) * sin`; `cat(x2, x1) * cat(-sin1, sin2)` is the same product to the
    bit (negation is exact), and swapping the halves is one flip where HF's form takes a split, a negation
    and a concatenation.
    """
    swapped = x.unflatten(-1, (2, -1)).flip(-2).flatten(-2)
    return x * cos + swapped * signed_sin


class MergedLinear(Linear):
    """Several projections of one input in a single matmul (q/k/v, gate/up); checkpoints load it shard by shard."""

    def __init__(self, in_features: int, shard_sizes: dict[str, int], bias: bool) -> None:
        super().__init__(in_features, sum(shard_sizes.values()), bias=bias)
        self.shards: dict[str, tuple[int, int]] = {}
        start = 0
        for name, size in shard_sizes.items():
            self.shards[name] = (start, size)
            start += size

    def shard(self, shard_name: str, param_name: str) -> torch.Tensor:
        """The rows of `weight` or `bias` that checkpoint tensor `<shard_name>.<param_name>` fills."""
        start, size = self.shards[shard_name]
        return getattr(self, param_name).narrow(0, start, size)


class SiluMLP(nn.Module):
    """down(silu(gate(x)) * up(x)) with gate and up merged."""

    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool) -> None:
        super().__init__()
        self.gate_up_proj = MergedLinear(hidden_size, {"gate_proj": intermediate_size, "up_proj": intermediate_size},
                                         bias=bias)
        self.down_proj = Linear(intermediate_size, hidden_size, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class PagedAttention(nn.Module):
    """Grouped-query self-attention over the paged KV cache.

    The runner assigns `k_cache`/`v_cache` (`[num_blocks, block_size, num_kv_heads, head_dim]` views
    into one preallocated cache).  Each step stores the new K/V through `metadata.slot_mapping`, then
    attends: prefill over the fresh K/V, or through `metadata.block_tables` when cached context
    exists; decode with one query per sequence through the block tables.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_heads, config.num_kv_heads, config.head_dim
        self.scale = self.head_dim ** -0.5
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.qkv_proj = MergedLinear(config.hidden_size, {"q_proj": q_size, "k_proj": kv_size, "v_proj": kv_size},
                                     bias=config.qkv_bias)
        self.o_proj = Linear(q_size, config.hidden_size, bias=config.o_bias)
        if config.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        self.qk_norm = config.qk_norm
        self.k_cache: torch.Tensor | None = None
        self.v_cache: torch.Tensor | None = None

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                metadata: AttentionMetadata) -> torch.Tensor:
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        qkv = self.qkv_proj(x)
        v = qkv[:, q_size + kv_size:].view(-1, self.num_kv_heads, self.head_dim)
        if self.qk_norm:
            q, k = qkv[:, :q_size + kv_size].split((q_size, kv_size), dim=-1)
            q = apply_rotary(self.q_norm(q.view(-1, self.num_heads, self.head_dim)), cos, sin)
            k = apply_rotary(self.k_norm(k.view(-1, self.num_kv_heads, self.head_dim)), cos, sin)
        else:       # q and k rotate as one tensor of num_heads + num_kv_heads heads
            qk = apply_rotary(qkv[:, :q_size + kv_size].view(-1, self.num_heads + self.num_kv_heads, self.head_dim),
                              cos, sin)
            q, k = qk[:, :self.num_heads], qk[:, self.num_heads:]

        with phase("attention", x.device):
            out = self._attend(q, k, v, metadata)
        return self.o_proj(out.reshape(-1, q_size))

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, metadata: AttentionMetadata) -> torch.Tensor:
        has_cache = self.k_cache is not None and self.v_cache is not None
        if has_cache:
            store_kv(k, v, self.k_cache, self.v_cache, metadata.slot_mapping)
        if metadata.is_prefill:
            if metadata.block_tables is not None:
                self._require_cache(has_cache, "a prefill that reads cached context (block_tables set)")
                k, v = self.k_cache, self.v_cache
            return flash_attn_varlen(q, k, v, metadata.cu_seqlens_q, metadata.cu_seqlens_k, metadata.max_seqlen_q,
                                     metadata.max_seqlen_k, causal=True, softmax_scale=self.scale,
                                     block_table=metadata.block_tables)
        self._require_cache(has_cache, "decode")
        return paged_decode_attention(q, self.k_cache, self.v_cache, metadata.block_tables, metadata.context_lens,
                                      softmax_scale=self.scale)

    @staticmethod
    def _require_cache(has_cache: bool, what: str) -> None:
        if not has_cache:
            raise RuntimeError(f"{what} needs the KV cache: assign k_cache/v_cache to the attention layers first")
