"""End-to-end generation: leapgen's engine against transformers' generate() on the same weights."""

from __future__ import annotations

import pytest
import torch

from checkpoints import CHECKPOINTS, ENGINE_DEVICE, build_checkpoint
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


def engine_for(directory, eos_token_ids: tuple[int, ...] | None = None, **config) -> LLMEngine:
    """An engine on the checkpoint in `directory`; `eos_token_ids` replaces the checkpoint's own."""
    loaded = load_model(directory, "float32", ENGINE_DEVICE)
    if loaded.device.type == "cuda":
        # The default cache takes 85% of the GPU's free memory, which the GPU check's parallel workers cannot share.
        config.setdefault("kv_cache_memory", "256MiB")
    if eos_token_ids is not None:
        loaded.eos_token_ids = eos_token_ids
    return LLMEngine(loaded, EngineConfig(**config))


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
    cached = engine.block_manager.num_cached_blocks
    again = engine.generate(prompts, params)       # full blocks of every prompt are now cached
    assert [o.token_ids for o in first] == [o.token_ids for o in again] == expected
    assert_no_leaks(engine)
    assert cached > 0 and engine.block_manager.num_cached_blocks == cached   # the same blocks again
    assert engine.reset_prefix_cache() == cached and engine.block_manager.num_cached_blocks == 0
    assert [o.token_ids for o in engine.generate(prompts, params)] == expected


def test_eos_stops_and_max_tokens_caps(tmp_path):
    hf = build_checkpoint(tmp_path, "llama")
    prompt = random_prompts(hf.config.vocab_size, [6])[0]
    reference = hf_greedy(hf, prompt, 12)
    eos = reference[4]                              # make the 5th generated token the end of sequence
    engine = engine_for(tmp_path, eos_token_ids=(eos,))
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
    with pytest.raises(ValueError, match="token id 1000000 is outside the vocabulary"):
        engine.add_request([10**6])
    with pytest.raises(ValueError, match="empty"):
        engine.add_request([])
    with pytest.raises(TypeError, match="prompt must be a string or a list of token ids"):
        engine.add_request(3.5)
    with pytest.raises(ValueError, match="kv_cache_memory"):
        engine_for(tmp_path, kv_cache_memory="lots")
    assert not engine.has_unfinished


@pytest.mark.parametrize("num_beams,length_penalty,early_stopping", [(2, 1.0, False), (3, 0.5, True),
                                                                     (4, 2.0, "never")])
def test_beam_search_matches_transformers(tmp_path, num_beams, length_penalty, early_stopping):
    hf = build_checkpoint(tmp_path, "llama")
    prompts = random_prompts(hf.config.vocab_size, [5, 11, 2])
    eos = hf_greedy(hf, prompts[0], 6)[3]          # an eos the beams actually meet
    engine = engine_for(tmp_path, eos_token_ids=(eos,), kv_cache_memory="8MiB", block_size=4)
    params = SamplingParams(max_tokens=8, num_beams=num_beams, n=2, length_penalty=length_penalty,
                            early_stopping=early_stopping)
    outputs = engine.generate(prompts, params)
    for prompt, output in zip(prompts, outputs):
        expected = hf.generate(torch.tensor([prompt]), max_new_tokens=8, num_beams=num_beams, num_return_sequences=2,
                               length_penalty=length_penalty, early_stopping=early_stopping, do_sample=False,
                               eos_token_id=eos, pad_token_id=0)
        for completion, row in zip(output.outputs, expected):
            ids = row[len(prompt):].tolist()
            if eos in ids:
                ids = ids[: ids.index(eos) + 1]
            assert completion.token_ids == ids
    assert_no_leaks(engine)


@pytest.mark.parametrize("ours, theirs", [
    ({"repetition_penalty": 1.5}, {"repetition_penalty": 1.5}),
    ({"repetition_penalty": 0.7}, {"repetition_penalty": 0.7}),
    ({"no_repeat_ngram_size": 2}, {"no_repeat_ngram_size": 2}),
    ({"min_tokens": 4}, {"min_new_tokens": 4}),
])
def test_beam_search_with_processors_matches_transformers(tmp_path, ours, theirs):
    """Processors act on the log-probs, not renormalised after (they acted on the logits, renormalised: every beam
    request with a penalty, a ban or min_tokens parted from transformers' beams and scores)."""
    hf = build_checkpoint(tmp_path, "llama")
    prompts = random_prompts(hf.config.vocab_size, [5, 11, 2])
    eos = hf_greedy(hf, prompts[0], 6)[3]
    engine = engine_for(tmp_path, eos_token_ids=(eos,), kv_cache_memory="8MiB", block_size=4)
    outputs = engine.generate(prompts, SamplingParams(max_tokens=8, num_beams=3, n=2, **ours))
    for prompt, output in zip(prompts, outputs):
        expected = hf.generate(torch.tensor([prompt]), max_new_tokens=8, num_beams=3, num_return_sequences=2,
                               do_sample=False, eos_token_id=eos, pad_token_id=0, output_scores=True,
                               return_dict_in_generate=True, **theirs)
        for completion, row, score in zip(output.outputs, expected.sequences, expected.sequences_scores):
            ids = row[len(prompt):].tolist()
            if eos in ids:
                ids = ids[: ids.index(eos) + 1]
            assert completion.token_ids == ids
            assert completion.score == pytest.approx(float(score), abs=1e-4)
        assert 0 < output.metrics.time_to_first_token <= output.metrics.total_time
    assert_no_leaks(engine)


def test_n_samples_share_prompt_blocks(tmp_path):
    hf = build_checkpoint(tmp_path, "llama")
    prompt = random_prompts(hf.config.vocab_size, [22])[0]
    engine = engine_for(tmp_path, kv_cache_memory="8MiB", block_size=4)
    engine.add_request(prompt, SamplingParams(max_tokens=6, n=4, temperature=1.0, seed=7, ignore_eos=True))
    engine.step()                                   # prefill, then the samples fork
    seqs = engine.scheduler.running
    assert len(seqs) == 4
    shared = set.intersection(*(set(s.block_table[:5]) for s in seqs))
    assert len(shared) == 5                         # the prompt's 5 full blocks are held once, by all 4
    assert all(engine.block_manager.blocks[b].ref_count == 4 for b in shared)
    outputs = []
    while engine.has_unfinished:
        outputs += [o for o in engine.step() if o.finished]
    samples = outputs[0].outputs
    assert len(samples) == 4 and all(len(s.token_ids) == 6 for s in samples)
    assert len({tuple(s.token_ids) for s in samples}) > 1          # different seeds per sample index
    again = engine.generate([prompt], SamplingParams(max_tokens=6, n=4, temperature=1.0, seed=7, ignore_eos=True))
    assert [s.token_ids for s in again[0].outputs] == [s.token_ids for s in samples]
    assert_no_leaks(engine)


def test_logprobs_and_prompt_logprobs_match_transformers(tmp_path):
    hf = build_checkpoint(tmp_path, "qwen3")
    prompt = random_prompts(hf.config.vocab_size, [13])[0]
    engine = engine_for(tmp_path, kv_cache_memory="8MiB", block_size=4, max_num_batched_tokens=8, max_num_seqs=4)
    out = engine.generate([prompt], SamplingParams(max_tokens=3, logprobs=2, prompt_logprobs=1, ignore_eos=True))[0]
    full = torch.tensor([prompt + out.token_ids])
    with torch.no_grad():
        logp = hf(full).logits[0].float().log_softmax(-1)
    assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == len(prompt)
    for i, entry in enumerate(out.prompt_logprobs[1:], start=1):
        assert entry.token_id == prompt[i]
        assert entry.logprob == pytest.approx(logp[i - 1, prompt[i]].item(), abs=1e-4)
    for j, entry in enumerate(out.outputs[0].logprobs):
        position = len(prompt) - 1 + j
        assert entry.logprob == pytest.approx(logp[position, entry.token_id].item(), abs=1e-4)
        assert list(entry.top) == logp[position].topk(2).indices.tolist()


def test_transformers_logits_processor_runs_inside_the_engine(tmp_path):
    from transformers import NoBadWordsLogitsProcessor

    hf = build_checkpoint(tmp_path, "llama")
    prompt = random_prompts(hf.config.vocab_size, [9])[0]
    engine = engine_for(tmp_path)
    free = engine.generate([prompt], SamplingParams(max_tokens=8, ignore_eos=True))[0].token_ids
    banned = free[2]
    params = SamplingParams(max_tokens=8, ignore_eos=True,
                            logits_processors=[NoBadWordsLogitsProcessor([[banned]], eos_token_id=2)])
    assert banned not in engine.generate([prompt], params)[0].token_ids


def test_fallback_architecture_generates_like_transformers(tmp_path):
    """GPT-2 is not in leapgen's model code: it runs through the labelled transformers fallback."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from checkpoints import save_tiny_tokenizer

    torch.manual_seed(0)
    hf = GPT2LMHeadModel(GPT2Config(vocab_size=96, n_embd=32, n_layer=2, n_head=2, n_positions=128,
                                    bos_token_id=1, eos_token_id=2)).eval()
    hf.save_pretrained(tmp_path)
    save_tiny_tokenizer(tmp_path)
    with pytest.warns(UserWarning, match="slower"):
        engine = engine_for(tmp_path, block_size=4, max_num_batched_tokens=16, max_num_seqs=8)
    assert engine.loaded.is_fallback
    prompts = random_prompts(96, [3, 20, 9])
    outputs = engine.generate(prompts, SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True))
    assert [o.token_ids for o in outputs] == [hf_greedy(hf, p) for p in prompts]
    assert_no_leaks(engine)
