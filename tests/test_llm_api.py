"""The public surface a user meets first: `leapgen.LLM`, `generate`, `stream`, `chat_prompt`, and operations
settings (threads, the KV cache's default size)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile

import pytest
import torch

import leapgen
from leapgen import Regex, SamplingParams
from leapgen.engine.llm_engine import CPU_KV_CACHE_CAP, parse_memory
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


def test_penalties_outside_float32s_reach_are_refused():
    # (a repetition penalty of 1e-300 was 0 in the kernels' float32, a division by zero mid-run; a length
    # penalty of 1e300 overflowed length ** penalty)
    for field, value, message in (("repetition_penalty", 1e-300, r"must be in \[1e-6, 1e6\]"),
                                  ("repetition_penalty", 0, r"must be in \[1e-6, 1e6\]"),
                                  ("length_penalty", 1e300, r"must be in \[-10, 10\]"),
                                  ("length_penalty", -11, r"must be in \[-10, 10\]")):
        with pytest.raises(ValueError, match=f"SamplingParams.{field} {message}"):
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


def test_a_token_budget_below_the_batch_is_refused_before_the_model_loads(monkeypatch):
    """max_num_batched_tokens under max_num_seqs (256 by default) failed only once the model had loaded, as the
    scheduler's, with no word of max_num_seqs."""
    from leapgen import llm as llm_module

    def no_load(*args, **kwargs):
        raise AssertionError("the model loaded")

    monkeypatch.setattr(llm_module, "load_model", no_load)
    with pytest.raises(ValueError, match=re.escape("max_num_batched_tokens (64) must be >= max_num_seqs (256), a "
                                                   "decode step's token each: lower max_num_seqs with it")):
        leapgen.LLM(None, max_num_batched_tokens=64)


def test_cpu_kv_cache_is_sized_from_the_model(byte_level_model_dir):
    small = leapgen.LLM(byte_level_model_dir, dtype="float32", max_num_seqs=2, block_size=8, device="cpu")
    engine = small.engine
    block_bytes = cache_block_bytes(engine.loaded, 8)
    full_context = 2 * engine.loaded.max_model_len * block_bytes // 8
    assert engine.block_manager.num_blocks == full_context // block_bytes      # two sequences at full context
    wide = leapgen.LLM(byte_level_model_dir, dtype="float32", max_num_seqs=2048, block_size=8, device="cpu").engine
    assert wide.block_manager.num_blocks * block_bytes <= CPU_KV_CACHE_CAP      # a modest cap, not every sequence


def test_a_kv_cache_the_machine_cannot_hold_names_kv_cache_memory(byte_level_model_dir):
    # (a pebibyte: past any machine's address space, so no allocator can promise it)
    with pytest.raises(ValueError, match=r"kv_cache_memory=1048576.00GiB \(\d+ KV blocks\) cannot be allocated on "
                                         r"cpu: ask for less"):
        leapgen.LLM(byte_level_model_dir, dtype="float32", kv_cache_memory="1024TiB", device="cpu")
    assert parse_memory("2TiB") == 2 * 2**40 and parse_memory("1tb") == 10**12


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


def test_generate_iter_takes_one_prompt_as_generate_does(llm):
    params = SamplingParams(max_tokens=3)
    assert [(i, o.token_ids) for i, o in llm.generate_iter("hello", params)] == \
        [(0, llm.generate("hello", params)[0].token_ids)]
    ids = llm.tokenizer.encode("hello")
    assert [i for i, _ in llm.generate_iter(ids, params)] == [0]
    assert llm.generate([torch.tensor(ids).numpy().tolist()], params)[0].prompt_token_ids == ids


def test_params_changed_after_they_were_made_are_checked_again(llm):
    params = SamplingParams(max_tokens=3)
    params.n = 0
    with pytest.raises(leapgen.RequestError, match=r"prompts\[0\]: SamplingParams.n must be an int >= 1"):
        llm.generate("x", params)
    output = llm.generate(["x"], params, on_error="return")[0]
    assert output.finish_reason == "error" and "SamplingParams.n" in output.error
    assert not llm.engine.has_unfinished


def test_list_fields_take_any_iterable_once_and_refuse_a_single_value():
    """A generator of stop strings was used up by the check and the request then read none of them."""
    params = SamplingParams(stop=(s for s in [" 6"]), stop_token_ids=iter([38]), logits_processors=None)
    assert params.stop == [" 6"] and params.stop_token_ids == [38] and params.logits_processors == []
    for field_name, value, what in (("stop", 5, "a string or a list of strings"),
                                    ("stop_token_ids", 38, "a list of token ids"),
                                    ("logits_processors", print, "a list of callables")):
        with pytest.raises(ValueError, match=f"SamplingParams.{field_name} must be {what}"):
            SamplingParams(**{field_name: value})
    with pytest.raises(TypeError, match="JsonSchema options must be a dict"):
        leapgen.JsonSchema({"type": "integer"}, "dumps")


def test_a_boolean_json_schema_is_a_schema(llm):
    """`true` (any JSON value) and `false` (none) are schemas, as a value or a JSON string; they were refused."""
    assert leapgen.JsonSchema(True).as_dict() == leapgen.JsonSchema("true").as_dict() == {}
    out = llm.generate("a", SamplingParams(max_tokens=8), constraint=leapgen.JsonSchema(True))[0]
    if out.finish_reason == "stop":
        json.loads(out.text)    # any JSON value
    with pytest.raises(leapgen.RequestError, match="unsatisfiable"):
        llm.generate("a", SamplingParams(max_tokens=8), constraint=leapgen.JsonSchema(False))
    with pytest.raises(TypeError, match="got a JSON string holding str"):
        leapgen.JsonSchema('"person"').as_dict()


def test_numpy_numbers_are_taken_in_every_numeric_field():
    """A grid of settings from numpy (`np.arange`, `np.linspace`): np.int64 seeds and biases were taken, but a
    np.int64 max_tokens, n, top_k or logprobs and a np.float32 temperature were refused as not ints or floats."""
    import numpy as np
    params = SamplingParams(max_tokens=np.int64(8), n=np.int32(2), top_k=np.int64(3), logprobs=np.int64(2),
                            temperature=np.float32(0.5), top_p=np.float64(0.9), repetition_penalty=np.float32(1.25),
                            stop_token_ids=[np.int64(7)])
    read = (params.max_tokens, params.n, params.top_k, params.logprobs, params.temperature, params.top_p,
            params.repetition_penalty, params.stop_token_ids)
    assert read == (8, 2, 3, 2, 0.5, 0.9, 1.25, [7])
    assert [type(v) for v in read[:7]] == [int] * 4 + [float] * 3 and type(read[7][0]) is int
    with pytest.raises(ValueError, match="max_tokens must be an int >= 1, got 0"):
        SamplingParams(max_tokens=np.int64(0))
    with pytest.raises(ValueError, match="temperature must be a finite number, got nan"):
        SamplingParams(temperature=np.float32("nan"))
    with pytest.raises(ValueError, match="n must be an int >= 1, got 1.0"):
        SamplingParams(n=np.float64(1.0))


def test_token_ids_as_json_or_numpy_gives_them(llm):
    import numpy as np
    assert SamplingParams(logit_bias={"5": 1.5, np.int64(6): -2}).logit_bias == {5: 1.5, 6: -2}
    assert SamplingParams(seed=np.int64(3)).seed == 3
    with pytest.raises(ValueError, match="logit_bias keys must be token ids, got 'a'"):
        SamplingParams(logit_bias={"a": 1.0})
    with pytest.raises(ValueError, match="stop_token_ids"):
        SamplingParams(stop_token_ids=[True])
    for bad, message in (({"²": 1.0}, "keys must be token ids, got '²'"), ({"5": 1.0, 5: 2.0}, "token 5 twice")):
        with pytest.raises(ValueError, match=message):
            SamplingParams(logit_bias=bad)
    later = SamplingParams(max_tokens=2)
    later.stop, later.seed, later.logit_bias = "9x", np.int64(3), {"5": 1.0}     # read as the constructor reads them
    later.validate()
    assert (later.stop, later.seed, later.logit_bias) == (["9x"], 3, {5: 1.0})
    ids = llm.tokenizer.encode("hello")
    assert llm.generate([list(np.array(ids))], SamplingParams(max_tokens=2))[0].prompt_token_ids == ids


def test_wrong_argument_types_name_the_argument(llm, byte_level_model_dir):
    with pytest.raises(TypeError, match="prompts must be a string, a list of token ids or a list of those, got "
                                        "NoneType"):
        llm.generate(None)
    with pytest.raises(TypeError, match="params must be leapgen.SamplingParams .*got dict"):
        llm.generate("x", {"max_tokens": 2})
    with pytest.raises(leapgen.RequestError, match=r"prompts\[0\]: .*got a list holding str at \[0\]"):
        llm.generate([["a", "b"]])
    with pytest.raises(TypeError, match="seed must be an int or None, got str"):
        leapgen.LLM(byte_level_model_dir, seed="x")
    with pytest.raises(TypeError, match="model must be a path"):
        leapgen.LLM(123)
    with pytest.raises(ValueError, match="model is an empty path"):
        leapgen.LLM(" ")
    with pytest.raises(ValueError, match="num_speculative_tokens missing"):
        leapgen.LLM(byte_level_model_dir, speculative={"method": "ngram"})


def test_a_request_failing_while_it_runs_names_its_prompt_in_either_mode(llm):
    def boom(input_ids, scores):
        raise RuntimeError("boom")

    params = [SamplingParams(max_tokens=3), SamplingParams(max_tokens=3, logits_processors=[boom])]
    for on_error in ("raise", "return"):
        ok, failed = llm.generate(["a", "b"], params, on_error=on_error)
        assert ok.finish_reason == "length" and failed.finish_reason == "error"
        assert failed.error.startswith("prompts[1]: ") and "boom" in failed.error
    assert llm.generate("a", params[0])[0].token_ids == ok.token_ids


def test_logprobs_under_a_constraint_describe_every_output_token(llm):
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 4}}, "required": ["name"]}
    for params in (SamplingParams(max_tokens=30, logprobs=1), SamplingParams(max_tokens=30, logprobs=0, n=2,
                                                                              temperature=1.0, seed=3)):
        for completion in llm.generate("x", params, constraint=leapgen.JsonSchema(schema))[0].outputs:
            assert [entry.token_id for entry in completion.logprobs] == completion.token_ids
    plain = llm.generate("x", SamplingParams(max_tokens=30), constraint=leapgen.JsonSchema(schema))[0]
    asked = llm.generate("x", SamplingParams(max_tokens=30, logprobs=1), constraint=leapgen.JsonSchema(schema))[0]
    assert asked.token_ids == plain.token_ids and llm.engine.num_forced_tokens    # logprobs change no token
    forced = [entry for entry in asked.outputs[0].logprobs if entry.forced]
    assert forced and all(entry.logprob == 0.0 and entry.top == {entry.token_id: 0.0} for entry in forced)
    assert asked.outputs[0].cumulative_logprob == sum(entry.logprob for entry in asked.outputs[0].logprobs)


@pytest.mark.parametrize("env,expected", [({}, "50000"), ({"GOMP_SPINCOUNT": "7"}, "7"),
                                          ({"OMP_WAIT_POLICY": "ACTIVE"}, "None")])
def test_importing_leapgen_first_shortens_the_openmp_spin_unless_the_user_chose(env, expected):
    clean = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    code = "import leapgen, os; print(os.environ.get('GOMP_SPINCOUNT'))"
    out = subprocess.run([sys.executable, "-c", code], env={**clean, **env}, capture_output=True, text=True,
                         check=True, cwd=tempfile.gettempdir())
    assert out.stdout.strip() == expected
