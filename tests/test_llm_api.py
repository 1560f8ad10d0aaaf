"""The public surface a user meets first: `leapgen.LLM`, `generate`, `stream`, `chat_prompt`, and operations
settings (threads, the KV cache's default size)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import pytest
import torch

import leapgen
from leapgen import Regex, SamplingParams
from leapgen.engine.llm_engine import CPU_KV_CACHE_CAP
from leapgen.engine.model_runner import cache_block_bytes

CHAT_TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<assistant>{% endif %}")


@pytest.fixture(scope="module")
def llm(byte_level_model_dir):
    return leapgen.LLM(byte_level_model_dir, dtype="float32", kv_cache_memory="8MiB", block_size=8)


def test_generate_one_call_equals_llm_generate(llm):
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    batch = llm.generate(["hello there", "x"], params)
    one = leapgen.generate(llm, "hello there", max_tokens=6, ignore_eos=True)
    assert one.token_ids == batch[0].token_ids and one.text == batch[0].text
    assert llm.generate("hello there", params)[0].token_ids == batch[0].token_ids     # a single string is a batch of 1
    with pytest.raises(ValueError, match="either params or SamplingParams keywords"):
        leapgen.generate(llm, "x", params, max_tokens=3)


def test_stream_of_one_prompt_and_its_constraint(llm):
    params = SamplingParams(max_tokens=12, temperature=1.0, seed=11)
    assert "".join(llm.stream("abc", params)) == llm.generate(["abc"], params)[0].text
    digits = "".join(llm.stream("abc", SamplingParams(max_tokens=12), constraint=Regex(r"[0-9]{3}")))
    assert len(digits) == 3 and digits.isdigit()


def test_chat_prompt_uses_the_template_and_refuses_without_one(llm):
    with pytest.raises(ValueError, match="no chat template"):
        llm.chat_prompt("hi")
    llm.tokenizer.chat_template = CHAT_TEMPLATE
    try:
        assert llm.chat_prompt("hi", system="be brief") == "<system>be brief\n<user>hi\n<assistant>"
        assert llm.chat_prompt("hi") == "<user>hi\n<assistant>"
    finally:
        llm.tokenizer.chat_template = None


def test_the_empty_regex_means_empty_output(llm):
    output = llm.generate(["anything"], SamplingParams(max_tokens=5), constraint=Regex(""))[0]
    assert output.text == "" and output.finish_reason == "stop"


@pytest.mark.parametrize("field", ["temperature", "top_p", "repetition_penalty", "length_penalty"])
def test_non_finite_floats_are_refused(field):
    for value in (float("inf"), float("nan")):
        with pytest.raises(ValueError, match=f"SamplingParams.{field} must be a finite number"):
            SamplingParams(**{field: value})


def test_threads_set_torchs_thread_count(byte_level_model_dir):
    before = torch.get_num_threads()
    try:
        leapgen.LLM(byte_level_model_dir, dtype="float32", kv_cache_memory="1MiB", threads=1)
        assert torch.get_num_threads() == 1
        with pytest.raises(ValueError, match="threads must be an int >= 1"):
            leapgen.LLM(byte_level_model_dir, threads=0)
    finally:
        torch.set_num_threads(before)


def test_cpu_kv_cache_is_sized_from_the_model(byte_level_model_dir):
    small = leapgen.LLM(byte_level_model_dir, dtype="float32", max_num_seqs=2, block_size=8, device="cpu")
    engine = small.engine
    block_bytes = cache_block_bytes(engine.loaded, 8)
    full_context = 2 * engine.loaded.max_model_len * block_bytes // 8
    assert engine.block_manager.num_blocks == full_context // block_bytes      # two sequences at full context
    wide = leapgen.LLM(byte_level_model_dir, dtype="float32", max_num_seqs=2048, block_size=8, device="cpu").engine
    assert wide.block_manager.num_blocks * block_bytes <= CPU_KV_CACHE_CAP      # a modest cap, not every sequence


def test_generate_iter_yields_as_requests_finish_and_bounds_what_is_queued(llm):
    prompts = [f"prompt number {i}" for i in range(7)] + [[10 ** 9]]          # the last one is refused
    params = [SamplingParams(max_tokens=3 + i) for i in range(8)]
    expected = llm.generate(prompts, params, on_error="return")
    seen, most_queued = {}, 0
    for index, output in llm.generate_iter(prompts, params, on_error="return", max_pending=3):
        most_queued = max(most_queued, len(llm.engine.requests))
        seen[index] = output
    assert most_queued <= 3 and sorted(seen) == list(range(8))
    assert [seen[i].token_ids for i in range(7)] == [o.token_ids for o in expected[:7]]
    assert seen[7].finish_reason == "error" and "prompts[7]" in seen[7].error
    assert not llm.engine.has_unfinished


@pytest.mark.parametrize("env,expected", [({}, "50000"), ({"GOMP_SPINCOUNT": "7"}, "7"),
                                          ({"OMP_WAIT_POLICY": "ACTIVE"}, "None")])
def test_importing_leapgen_first_shortens_the_openmp_spin_unless_the_user_chose(env, expected):
    clean = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    code = "import leapgen, os; print(os.environ.get('GOMP_SPINCOUNT'))"
    out = subprocess.run([sys.executable, "-c", code], env={**clean, **env}, capture_output=True, text=True,
                         check=True, cwd=tempfile.gettempdir())
    assert out.stdout.strip() == expected
