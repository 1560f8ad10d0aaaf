"""End-to-end generation: leapgen's engine against transformers' generate() on the same weights."""

from __future__ import annotations

import pytest
import torch

from checkpoints import CHECKPOINTS, build_checkpoint
from leapgen.decoding.sampling_params import SamplingParams
from leapgen.engine.llm_engine import EngineConfig, LLMEngine
from leapgen.engine.loader import load_model

PROMPT_LENGTHS = [1, 3, 7, 17, 40, 5, 12, 29, 64]
MAX_TOKENS = 10


def random_prompts(vocab: int, lengths=PROMPT_LENGTHS, seed: int = 1) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=generator).tolist() for n in lengths]


def hf_greedy(hf, prompt: list[int], max_tokens: int = MAX_TOKENS) -> list[int]:
    """transformers' greedy continuation with eos disabled (the engine runs with ignore_eos)."""
    out = hf.generate(torch.tensor([prompt]), max_new_tokens=max_tokens, do_sample=False, eos_token_id=None,
                      pad_token_id=0)
    return out[0, len(prompt):].tolist()


@pytest.fixture(scope="module", params=list(CHECKPOINTS))
def checkpoint(request, tmp_path_factory):
    directory = tmp_path_factory.mktemp(request.param)
    hf = build_checkpoint(directory, request.param)
    prompts = random_prompts(hf.config.vocab_size)
    return directory, [hf_greedy(hf, p) for p in prompts], prompts


def engine_for(directory, **config) -> LLMEngine:
    return LLMEngine(load_model(directory, "float32"), EngineConfig(**config))


def assert_no_leaks(engine: LLMEngine) -> None:
    bm = engine.block_manager
    assert not engine.has_unfinished
    assert bm.num_free_blocks == bm.num_blocks


def test_batched_greedy_matches_transformers(checkpoint):
    """All prompts submitted together (packed prefill, chunked by a small token budget, batched decode)."""
    directory, expected, prompts = checkpoint
    engine = engine_for(directory, kv_cache_memory="8MiB", block_size=4, max_num_batched_tokens=24, max_num_seqs=8)
    outputs = engine.generate(prompts, SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True))
    assert [o.token_ids for o in outputs] == expected
    assert all(o.finish_reason == "length" for o in outputs)
    assert_no_leaks(engine)


def test_memory_pressure_preempts_and_recomputes(checkpoint):
    """A cache that holds about two sequences: every request still finishes, outputs unchanged."""
    directory, expected, prompts = checkpoint
    longest = max(len(p) for p in prompts) + MAX_TOKENS
    engine = engine_for(directory, block_size=4, max_num_batched_tokens=32, max_num_seqs=8)
    per_block = engine.block_manager.capacity_tokens // engine.block_manager.num_blocks
    blocks = 2 * ((longest + per_block - 1) // per_block)
    small = engine_for(directory, block_size=4, max_num_batched_tokens=32, max_num_seqs=8,
                       kv_cache_memory=blocks * engine.runner.kv_cache[:, :, 0].numel() * 4)
    assert small.block_manager.num_blocks == blocks
    many = prompts + prompts[::-1]                 # 18 requests
    outputs = small.generate(many, SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True))
    assert [o.token_ids for o in outputs] == expected + expected[::-1]
    assert small.scheduler.num_preemptions > 0
    assert_no_leaks(small)


def test_prefix_cache_hits_do_not_change_outputs(checkpoint):
    directory, expected, prompts = checkpoint
    engine = engine_for(directory, kv_cache_memory="8MiB", block_size=4)
    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)
    first = engine.generate(prompts, params)
    again = engine.generate(prompts, params)       # full blocks of every prompt are now cached
    assert [o.token_ids for o in first] == [o.token_ids for o in again] == expected
    assert_no_leaks(engine)


def test_eos_stops_and_max_tokens_caps(tmp_path):
    hf = build_checkpoint(tmp_path, "llama")
    prompt = random_prompts(hf.config.vocab_size, [6])[0]
    reference = hf_greedy(hf, prompt, 12)
    engine = engine_for(tmp_path)
    eos = reference[4]                              # make the 5th generated token the end of sequence
    engine.loaded.eos_token_ids = (eos,)
    out = engine.generate([prompt], SamplingParams(max_tokens=12))[0]
    assert out.token_ids == reference[: reference.index(eos) + 1]
    assert out.finish_reason == "stop"
    ignored = engine.generate([prompt], SamplingParams(max_tokens=12, ignore_eos=True))[0]
    assert ignored.token_ids == reference and ignored.finish_reason == "length"


def test_seeded_sampling_is_reproducible_and_batch_independent(tmp_path):
    hf = build_checkpoint(tmp_path, "qwen2-sharded")
    prompts = random_prompts(hf.config.vocab_size, [4, 9, 2, 15])
    engine = engine_for(tmp_path)
    seeded = SamplingParams(max_tokens=8, temperature=1.0, seed=123, ignore_eos=True)
    alone = engine.generate([prompts[0]], seeded)[0].token_ids
    others = [SamplingParams(max_tokens=8, temperature=0.8, ignore_eos=True)] * 3
    mixed = engine.generate(prompts, [seeded] + others)[0].token_ids
    assert alone == mixed


def test_bad_requests_are_clear_errors(tmp_path):
    build_checkpoint(tmp_path, "llama")
    engine = engine_for(tmp_path)
    limit = engine.loaded.max_model_len
    with pytest.raises(ValueError, match=f"context is {limit} tokens"):
        engine.add_request([5] * limit)
    with pytest.raises(ValueError, match="outside the model's vocabulary"):
        engine.add_request([10**6])
    with pytest.raises(ValueError, match="empty"):
        engine.add_request([])
    with pytest.raises(TypeError, match="prompt must be a string or a list of token ids"):
        engine.add_request(3.5)
    with pytest.raises(ValueError, match="kv_cache_memory"):
        engine_for(tmp_path, kv_cache_memory="lots")
    assert not engine.has_unfinished
