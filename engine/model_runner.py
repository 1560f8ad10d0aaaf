"""Turn a scheduled step into one forward pass: packed inputs, attention metadata, logits.

`PagedModelRunner` drives leapgen's own models over the paged KV cache; `FallbackRunner`
drives the transformers fallback with the same interface, so the step loop never cares which.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

from leapgen.engine.attention_metadata import AttentionMetadata
from leapgen.engine.decode_graphs import CudaGraphRecorder, DecodeGraphs, GraphRecordingError
from leapgen.engine.fallback import FallbackModel
from leapgen.engine.loader import LoadedModel
from leapgen.engine.scheduler import SchedulerOutput
from leapgen.engine.sequence import Sequence
from leapgen.engine.step_profile import phase


@dataclass
class StepLogits:
    """Logits of one step.  `rows[seq_id]` is the slice of `logits` holding that sequence's rows:
    its last position when the step reaches the end of its tokens, or every new position when
    it was asked for all of them (speculative verification, prompt logprobs)."""

    logits: torch.Tensor
    rows: dict[int, slice]


def cache_block_bytes(loaded: LoadedModel, block_size: int) -> int:
    """Bytes one KV block takes across all layers (K and V)."""
    cfg = loaded.config
    element = torch.empty((), dtype=loaded.dtype).element_size()
    return 2 * cfg.num_layers * block_size * cfg.num_kv_heads * cfg.head_dim * element


class PagedModelRunner:
    """Owns the KV cache tensors and runs leapgen's paged model one scheduled step at a time."""

    def __init__(self, loaded: LoadedModel, num_blocks: int, block_size: int, pack_weights: bool = False,
                 graph_batch: int = 0) -> None:
        """`pack_weights`: give the model's linear layers packed copies for the passes they serve faster (CPU).
        `graph_batch`: replay decode steps of up to that many sequences from CUDA graphs (0: none)."""
        cfg = loaded.config
        self.model = loaded.model
        if pack_weights:
            self.model.pack_weights()
        self.device = loaded.device
        self.block_size = block_size
        # One allocation for every layer's K and V: [layers, 2, blocks, block_size, kv_heads, head_dim].
        shape = (cfg.num_layers, 2, num_blocks, block_size, cfg.num_kv_heads, cfg.head_dim)
        try:
            self.kv_cache = torch.zeros(shape, dtype=loaded.dtype, device=self.device)
        except (RuntimeError, MemoryError) as exc:  # (torch.OutOfMemoryError is a RuntimeError)
            size = num_blocks * cache_block_bytes(loaded, block_size) / 2**30
            raise ValueError(f"kv_cache_memory={size:.2f}GiB ({num_blocks} KV blocks) cannot be allocated on "
                             f"{self.device}: ask for less") from exc
        for i, layer in enumerate(self.model.attention_layers):
            layer.k_cache, layer.v_cache = self.kv_cache[i, 0], self.kv_cache[i, 1]
        self.graphs = None if graph_batch < 1 else DecodeGraphs(self.model, self.device, graph_batch,
                                                                 loaded.max_model_len, block_size, CudaGraphRecorder())

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy-on-write: duplicate cache blocks `src -> dst` in every layer."""
        if pairs:
            src = torch.tensor([s for s, _ in pairs], device=self.device)
            dst = torch.tensor([d for _, d in pairs], device=self.device)
            self.kv_cache[:, :, dst] = self.kv_cache[:, :, src]

    @torch.inference_mode()
    def execute(self, step: SchedulerOutput, all_positions: frozenset[int] = frozenset()) -> StepLogits:
        """Run the step's forward pass; `all_positions` names sequences that want logits for every new token."""
        self.copy_blocks(step.copies)
        with phase("inputs"):
            ids, positions, slots, cu_q, cu_k = [], [], [], [0], [0]
            gather, rows = [], {}
            bs = self.block_size
            for seq, n in step.scheduled:
                start, end = seq.num_computed_tokens, seq.num_computed_tokens + n
                table = seq.block_table
                ids.extend(seq.token_ids[start:end])
                positions.extend(range(start, end))
                slots.extend(table[p // bs] * bs + p % bs for p in range(start, end))
                cu_q.append(cu_q[-1] + n)
                cu_k.append(cu_k[-1] + end)
                if seq.seq_id in all_positions:
                    rows[seq.seq_id] = slice(len(gather), len(gather) + n)
                    gather.extend(range(cu_q[-2], cu_q[-1]))
                elif end == seq.num_tokens:
                    rows[seq.seq_id] = slice(len(gather), len(gather) + 1)
                    gather.append(cu_q[-1] - 1)
            seqs = [seq for seq, _ in step.scheduled]
            to_device = dict(dtype=torch.long, device=self.device)
        hidden = self._replay(ids, positions, slots, seqs) if step.is_decode else None
        if hidden is None:
            with phase("inputs"):
                metadata = self._metadata(step, slots, cu_q, cu_k)
            hidden = self.model(torch.tensor(ids, **to_device), torch.tensor(positions, **to_device), metadata)
        if not gather:
            return StepLogits(hidden.new_empty(0), rows)
        with phase("lm_head", self.device):
            # `gather` is increasing, so as long as `ids` it names every row in order.
            selected = hidden if len(gather) == len(ids) else hidden[torch.tensor(gather, **to_device)]
            logits = self.model.compute_logits(selected)
        return StepLogits(logits, rows)

    def _replay(self, ids: list[int], positions: list[int], slots: list[int], seqs: list[Sequence]
                ) -> torch.Tensor | None:
        """A decode step's hidden states from its CUDA graph; None where it runs eagerly: no graphs, a batch or
        a block table they do not fit, or graphs turned off because recording one failed (a warning then says
        why, where every later decode step would otherwise fail the same way)."""
        if self.graphs is None or not self.graphs.fits(len(seqs), max(len(seq.block_table) for seq in seqs)):
            return None
        try:
            with phase("graph replay", self.device):
                return self.graphs.run(ids, positions, slots, [seq.num_computed_tokens + 1 for seq in seqs],
                                       [seq.block_table for seq in seqs])
        except GraphRecordingError as exc:
            warnings.warn(f"{exc}; CUDA graphs are off for this engine and decode steps run eagerly",
                          RuntimeWarning, stacklevel=2)
            self.graphs = None
            return None

    def _metadata(self, step: SchedulerOutput, slots: list[int], cu_q: list[int], cu_k: list[int]) -> AttentionMetadata:
        device = self.device
        slot_mapping = torch.tensor(slots, dtype=torch.long, device=device)
        seqs = [seq for seq, _ in step.scheduled]
        if step.is_decode:
            lens = [seq.num_computed_tokens + 1 for seq in seqs]
            return AttentionMetadata(False, slot_mapping, block_tables=self._block_tables(seqs),
                                     context_lens=torch.tensor(lens, dtype=torch.int32, device=device),
                                     max_seqlen_k=max(lens))
        q_lens = [b - a for a, b in zip(cu_q, cu_q[1:])]
        k_lens = [b - a for a, b in zip(cu_k, cu_k[1:])]
        has_context = any(k != q for q, k in zip(q_lens, k_lens))
        return AttentionMetadata(
            True, slot_mapping,
            cu_seqlens_q=torch.tensor(cu_q, dtype=torch.int32, device=device),
            cu_seqlens_k=torch.tensor(cu_k if has_context else cu_q, dtype=torch.int32, device=device),
            max_seqlen_q=max(q_lens), max_seqlen_k=max(k_lens),
            block_tables=self._block_tables(seqs) if has_context else None)

    def _block_tables(self, seqs: list[Sequence]) -> torch.Tensor:
        width = max(len(seq.block_table) for seq in seqs)
        table = [seq.block_table + [-1] * (width - len(seq.block_table)) for seq in seqs]
        return torch.tensor(table, dtype=torch.int32, device=self.device)


class FallbackRunner:
    """The same interface over `FallbackModel` (no paged cache; the model keeps per-sequence HF caches)."""

    def __init__(self, loaded: LoadedModel) -> None:
        self.model: FallbackModel = loaded.model

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Nothing to copy: the fallback keeps no paged cache."""

    def release(self, seq: Sequence) -> None:
        """Drop the HF cache of a finished sequence."""
        self.model.release(seq.seq_id)

    @torch.inference_mode()
    def execute(self, step: SchedulerOutput, all_positions: frozenset[int] = frozenset()) -> StepLogits:
        """Logits for the step's sequences, recomputed through transformers."""
        tokens, num_new, seq_ids = [], [], []
        for seq, n in step.scheduled:
            end = seq.num_computed_tokens + n
            if seq.seq_id in all_positions or end == seq.num_tokens:
                tokens.append(seq.token_ids[:end])
                num_new.append(n if seq.seq_id in all_positions else 1)
                seq_ids.append(seq.seq_id)
        rows, start = {}, 0
        for seq_id, n in zip(seq_ids, num_new):
            rows[seq_id] = slice(start, start + n)
            start += n
        if not tokens:
            return StepLogits(torch.empty(0), rows)
        return StepLogits(self.model.forward_sequences(tokens, num_new, seq_ids), rows)
