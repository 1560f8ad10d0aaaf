"""leapgen's own model code against transformers on tiny random checkpoints of every native family.

Each checkpoint runs a packed prefill of several sequences, a prefill step that continues cached
context through block tables, and decode steps through a paged cache set up by hand here (the
block manager is tested elsewhere); logits must equal transformers' full forward of each sequence.
"""

from __future__ import annotations

import sys

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, MistralConfig

from checkpoints import CHECKPOINTS, SMALL, VOCAB, build_checkpoint, save_tiny_tokenizer
from leapgen.engine.attention_metadata import AttentionMetadata
import leapgen
from leapgen import SamplingParams
from leapgen.engine.admission import RequestError
from leapgen.engine.llm_engine import EngineConfig, LLMEngine
from leapgen.engine.loader import load_model
import leapgen.engine.models.packed_linear as packing
from leapgen.engine.models.packed_linear import Linear, packing_supported

BLOCK_SIZE = 4
NUM_BLOCKS = 40


class PagedCache:
    """A hand-built paged KV cache with scattered block tables, standing in for the block manager."""

    def __init__(self, model, config, num_sequences: int, dtype=torch.float32) -> None:
        shape = (NUM_BLOCKS, BLOCK_SIZE, config.num_kv_heads, config.head_dim)
        self.k = torch.zeros(config.num_layers, *shape, dtype=dtype)
        self.v = torch.zeros_like(self.k)
        for i, layer in enumerate(model.attention_layers):
            layer.k_cache, layer.v_cache = self.k[i], self.v[i]
        order = torch.randperm(NUM_BLOCKS, generator=torch.Generator().manual_seed(1)).tolist()
        per_seq = NUM_BLOCKS // num_sequences
        self.tables = [order[i * per_seq:(i + 1) * per_seq] for i in range(num_sequences)]

    def step(self, sequences: list[list[int]], computed: list[int]) -> tuple[torch.Tensor, torch.Tensor,
                                                                           AttentionMetadata]:
        """input_ids, positions and metadata computing tokens `computed[i]:` of every sequence."""
        ids, positions, slots, q_lens, k_lens = [], [], [], [], []
        for seq, done, table in zip(sequences, computed, self.tables):
            for pos in range(done, len(seq)):
                ids.append(seq[pos])
                positions.append(pos)
                slots.append(table[pos // BLOCK_SIZE] * BLOCK_SIZE + pos % BLOCK_SIZE)
            q_lens.append(len(seq) - done)
            k_lens.append(len(seq))
        tables = torch.tensor(self.tables, dtype=torch.int32)
        if all(n == 1 for n in q_lens):
            metadata = AttentionMetadata(is_prefill=False, slot_mapping=torch.tensor(slots), block_tables=tables,
                                         context_lens=torch.tensor(k_lens, dtype=torch.int32),
                                         max_seqlen_k=max(k_lens))
        else:
            cumulative = lambda lens: torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
            metadata = AttentionMetadata(is_prefill=True, slot_mapping=torch.tensor(slots),
                                         cu_seqlens_q=cumulative(q_lens), cu_seqlens_k=cumulative(k_lens),
                                         max_seqlen_q=max(q_lens), max_seqlen_k=max(k_lens),
                                         block_tables=tables if any(computed) else None)
        return torch.tensor(ids), torch.tensor(positions), metadata


def reference_logits(hf, sequences: list[list[int]], computed: list[int]) -> torch.Tensor:
    """transformers' logits for the uncomputed tokens of each sequence, from a full forward of it."""
    with torch.no_grad():
        rows = [hf(torch.tensor([seq])).logits[0, done:] for seq, done in zip(sequences, computed)]
    return torch.cat(rows).float()


@pytest.mark.parametrize("packed", [False, True], ids=["sgemm", "packed"])
@pytest.mark.parametrize("name", list(CHECKPOINTS))
def test_logits_match_transformers_through_prefill_chunks_and_decode(tmp_path, name, packed):
    hf = build_checkpoint(tmp_path, name)
    loaded = load_model(tmp_path, dtype=torch.float32)
    model, config = loaded.model, loaded.config
    if packed:       # on Intel the prefill steps (19 and 7 rows) go through the packed weights, decode (3 rows)
                     # does not; on AMD CPUs every step does
        weights = [m.weight for m in model.modules() if isinstance(m, Linear)]
        weights += [model.model.embed_tokens.weight] if model.lm_head is None else []        # a tied head
        assert model.pack_weights() == 4 * sum(w.numel() for w in weights)
    assert config.model_type == hf.config.model_type and not loaded.is_fallback
    cache = PagedCache(model, config, num_sequences=3)
    gen = torch.Generator().manual_seed(2)
    sequences = [torch.randint(3, VOCAB, (n,), generator=gen).tolist() for n in (5, 11, 3)]
    computed = [0, 0, 0]

    def check_step() -> None:
        input_ids, positions, metadata = cache.step(sequences, computed)
        with torch.no_grad():
            ours = model.compute_logits(model(input_ids, positions, metadata))
        assert ours.dtype == torch.float32 and ours.shape == (len(input_ids), VOCAB)
        torch.testing.assert_close(ours, reference_logits(hf, sequences, computed), atol=1e-4, rtol=1e-4)
        computed[:] = [len(s) for s in sequences]

    check_step()                                   # packed prefill of fresh prompts
    for seq, extra in zip(sequences, (4, 2, 1)):   # continuing cached context through block tables
        seq.extend(torch.randint(3, VOCAB, (extra,), generator=gen).tolist())
    check_step()
    for _ in range(3):                             # decode: one token per sequence
        for seq in sequences:
            seq.append(int(torch.randint(3, VOCAB, (1,), generator=gen)))
        check_step()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("vendor", ["GenuineIntel", "AuthenticAMD", ""])
def test_packed_linear_serves_its_row_range(bias, dtype, vendor, monkeypatch):
    monkeypatch.setattr(packing, "cpu_vendor", lambda: vendor)
    layer = Linear(48, 80, bias=bias).to(dtype)
    if not packing_supported(layer.weight):
        pytest.skip(f"this CPU's oneDNN does not pack {dtype}")
    assert layer.pack() == 48 * 80 * dtype.itemsize and layer.packed is not None
    served = packing.packed_rows(dtype)
    assert served == (range(1, sys.maxsize) if vendor == "AuthenticAMD" else packing.PACKED_ROWS[dtype])
    tolerance = {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 0.05, "rtol": 0.02}
    for rows in [1, 2, 3, 4, 5, 9, 127, 128, 300]:
        x = torch.randn(rows, 48, dtype=dtype)
        expected = F.linear(x, layer.weight, layer.bias)
        if rows not in served:          # F.linear's result exactly, as transformers computes it
            assert torch.equal(layer(x), expected)
        else:
            torch.testing.assert_close(layer(x), expected, **tolerance)
    assert torch.equal(layer(x[:, None]), F.linear(x[:, None], layer.weight, layer.bias))     # not 2-D


def test_packing_covers_float32_and_bfloat16_and_can_be_turned_off(tmp_path):
    build_checkpoint(tmp_path, "llama")
    assert load_model(tmp_path, dtype="float16").model.pack_weights() == 0
    bf16 = load_model(tmp_path, dtype="bf16").model
    assert (bf16.pack_weights() > 0) == packing_supported(bf16.lm_head.weight)
    llm = leapgen.LLM(tmp_path, dtype="float32", kv_cache_memory="4MiB", pack_weights=False)
    assert all(m.packed is None for m in llm.engine.runner.model.modules() if isinstance(m, Linear))
    llm = leapgen.LLM(tmp_path, dtype="float32", kv_cache_memory="4MiB")
    assert all(m.packed is not None for m in llm.engine.runner.model.modules() if isinstance(m, Linear))


def test_bf16_load_keeps_dtype_and_tracks_fp32_logits(tmp_path):
    hf = build_checkpoint(tmp_path, "llama")
    loaded = load_model(tmp_path, dtype="bf16")
    model = loaded.model
    assert loaded.dtype == torch.bfloat16
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    cache = PagedCache(model, loaded.config, num_sequences=1, dtype=torch.bfloat16)
    sequences = [[5, 17, 33, 8, 61, 40, 12]]
    input_ids, positions, metadata = cache.step(sequences, [0])
    with torch.no_grad():
        ours = model.compute_logits(model(input_ids, positions, metadata))
    assert ours.dtype == torch.float32
    expected = reference_logits(hf, sequences, [0])
    scale = expected.abs().max()
    assert (ours - expected).abs().max() < 0.05 * scale
    assert (ours.argmax(-1) == expected.argmax(-1)).float().mean() >= 0.85


def test_runner_facing_sizes(tmp_path):
    build_checkpoint(tmp_path, "qwen3")
    (tmp_path / "generation_config.json").write_text('{"eos_token_id": [2, 7]}')
    loaded = load_model(tmp_path, dtype=torch.float32)
    config = loaded.config
    assert (config.num_layers, config.num_heads, config.num_kv_heads, config.head_dim) == (2, 4, 2, 16)
    assert loaded.vocab_size == VOCAB and loaded.max_model_len == 256
    assert loaded.eos_token_ids == (2, 7)
    assert len(loaded.model.attention_layers) == 2
    model, hf_config, tokenizer = loaded
    assert hf_config.model_type == "qwen3" and tokenizer.eos_token == "</s>"


def test_sliding_window_is_enforced_not_ignored(tmp_path):
    config = MistralConfig(**SMALL, sliding_window=6)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path)
    save_tiny_tokenizer(tmp_path)
    with pytest.warns(UserWarning, match="sliding window"):
        loaded = load_model(tmp_path, dtype=torch.float32)
    assert loaded.max_model_len == 6
    cache = PagedCache(loaded.model, loaded.config, num_sequences=1)
    with pytest.raises(ValueError, match="6-token sliding window"):
        loaded.model(*cache.step([list(range(3, 10))], [0]))
    # a request past the window is refused naming the window, not max_position_embeddings (which is 256 here)
    engine = LLMEngine(loaded, EngineConfig(kv_cache_memory="4MiB"))
    with pytest.raises(RequestError, match=r"context is 6 tokens \(sliding_window\)"):
        engine.check(list(range(3, 10)))
    with pytest.raises(RequestError, match=r"context of 6 tokens \(sliding_window\)"):
        engine.check([3, 4], SamplingParams(max_tokens=5))
