"""A failing request fails alone, bad input is refused before any work, and the engine stays usable.

Each test reproduces a case a user met: an error inside the step loop used to leave the engine
hanging on the next call, one bad prompt failed a whole batch without saying which, beams under
a constraint crashed, streamed pieces did not join to the final text, and padded vocabularies
let constrained requests pick ids the tokenizer does not have.
"""

from __future__ import annotations

import json
import os
import re
import threading
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import lark
import numpy as np
import pytest
import torch

import leapgen
from checkpoints import build_checkpoint, build_checkpoint_for_tokenizer
from leapgen import JsonSchema, Regex, SamplingParams
from leapgen.engine.admission import RequestError
from leapgen.engine.block_manager import beam_search_blocks
from leapgen.engine.constraint_state import ConstraintState, MasksAhead
from tokenizers_util import byte_level_bpe

PADDING = 37
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer", "minimum": 0,
                                                                        "maximum": 99}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
ARITHMETIC = """
    start: expr
    expr: term (("+" | "-") term)*
    term: INT | "(" expr ")"
    %import common.INT
"""


@pytest.fixture(scope="module")
def plain_llm(tmp_path_factory):
    directory = tmp_path_factory.mktemp("plain")
    build_checkpoint(directory, "llama")
    return leapgen.LLM(directory, dtype="float32", kv_cache_memory="4MiB", block_size=8)


@pytest.fixture(scope="module")
def text_llm(tmp_path_factory):
    """A byte-level BPE model whose embedding has PADDING rows more than the tokenizer has tokens."""
    directory = tmp_path_factory.mktemp("padded")
    build_checkpoint_for_tokenizer(directory, byte_level_bpe(), padding=PADDING)
    return leapgen.LLM(directory, dtype="float32", kv_cache_memory="16MiB", block_size=8)


def assert_idle(llm) -> None:
    engine = llm.engine
    assert not engine.has_unfinished and not engine.requests
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


class RaisesOnce:
    """A user logits processor that fails the first time it is called."""

    def __init__(self):
        self.calls = 0

    def __call__(self, input_ids, scores):
        self.calls += 1
        if self.calls == 1:
            raise RuntimeError("processor broke")
        return scores


def test_a_raising_logits_processor_fails_its_request_alone(plain_llm):
    prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]
    plain = SamplingParams(max_tokens=6, ignore_eos=True)
    expected = plain_llm.generate(prompts, plain)
    broken = SamplingParams(max_tokens=6, ignore_eos=True, logits_processors=[RaisesOnce()])
    outputs = plain_llm.generate(prompts, [plain, broken, plain])
    assert outputs[1].finish_reason == "error" and "processor broke" in outputs[1].error
    assert [o.token_ids for o in (outputs[0], outputs[2])] == [expected[0].token_ids, expected[2].token_ids]
    assert outputs[0].error is None and outputs[0].finish_reason == "length"
    assert_idle(plain_llm)
    assert plain_llm.generate(prompts, plain)[1].token_ids == expected[1].token_ids     # the next call works


@pytest.mark.parametrize("poison", ["one NaN", "all NaN", "all -inf"])
def test_greedy_rows_with_no_token_to_take_fail_alone_as_sampled_ones_do(plain_llm, poison):
    # argmax took a NaN for the maximum (the same token every step) and the first token of a row of -inf
    def processor(input_ids, scores):
        if poison == "one NaN":
            scores[:, 5] = float("nan")
            return scores
        return torch.full_like(scores, float("nan") if poison == "all NaN" else float("-inf"))

    prompts = [[5, 6, 7], [8, 9]]
    plain = SamplingParams(max_tokens=6, ignore_eos=True)
    expected = plain_llm.generate(prompts, plain)
    for broken in (SamplingParams(max_tokens=6, logits_processors=[processor]),
                   SamplingParams(max_tokens=6, logits_processors=[processor], temperature=0.8, seed=1)):
        outputs = plain_llm.generate(prompts, [plain, broken], on_error="return")
        assert outputs[1].finish_reason == "error" and "no token can be" in outputs[1].error
        assert outputs[0].token_ids == expected[0].token_ids and outputs[0].error is None
    assert_idle(plain_llm)


def test_bad_requests_are_refused_before_any_work_and_name_the_prompt(plain_llm):
    vocab = plain_llm.engine.loaded.vocab_size
    cases = [
        ([[5, 6], [1_000_000_000]], SamplingParams(max_tokens=4), r"prompts\[1\]: token id 1000000000 is outside "
                                                                  rf"the vocabulary \({vocab}\)"),
        ([[5, 6]], SamplingParams(logit_bias={10**6: 1.0}), r"prompts\[0\]: logit_bias: token id 1000000"),
        ([[5], [6], b"bytes"], SamplingParams(max_tokens=4), r"prompts\[2\]: .*got bytes"),
        (["ok", "bad \udcff"], SamplingParams(max_tokens=4), r"prompts\[1\]: the prompt is not valid UTF-8"),
        ([[5] * 250], SamplingParams(max_tokens=10), r"prompts\[0\]: the prompt \(250 tokens\) \+ max_tokens \(10\) "
                                                     r"exceeds the model's context of 256 tokens"),
    ]
    steps = plain_llm.engine.num_steps
    for prompts, params, message in cases:
        with pytest.raises(RequestError, match=message):
            plain_llm.generate(prompts, params)
        assert_idle(plain_llm)
    assert plain_llm.engine.num_steps == steps                          # nothing ran
    with pytest.raises(ValueError, match="logprobs"):
        SamplingParams(logprobs=vocab + 1)


def test_on_error_return_runs_the_rest(plain_llm):
    outputs = plain_llm.generate([[5, 6], [1_000_000_000], [7]], SamplingParams(max_tokens=3, ignore_eos=True),
                                 on_error="return")
    assert [o.finish_reason for o in outputs] == ["length", "error", "length"]
    assert outputs[1].error.startswith("prompts[1]: token id 1000000000")
    assert len(outputs[0].token_ids) == 3 and outputs[1].token_ids == []
    assert_idle(plain_llm)


class BuggySpec:
    """A constraint spec of a user's whose compile meets a bug (not one of the compiler's refusals)."""

    def key(self) -> tuple:
        return ("buggy",)

    def compile(self, vocabulary):
        raise AttributeError("'NoneType' object has no attribute 'pattern'")


def test_a_constraint_that_is_no_str_or_whose_compile_meets_a_bug_fails_its_request_alone(plain_llm):
    """Regex(123) raised an AttributeError from inside the compiler, which no request's check caught: the whole
    batch was lost, its good prompts too, under on_error="return"."""
    good = SamplingParams(max_tokens=3, ignore_eos=True)
    for spec, message in [(Regex(123), "prompts[0]: a regex must be a str, not int"),
                          (Regex(b"[0-9]+"), "prompts[0]: a regex must be a str, not bytes"),
                          (BuggySpec(), "prompts[0]: the request could not be checked: AttributeError(")]:
        bad = SamplingParams(max_tokens=3, constraint=spec)
        outputs = plain_llm.generate([[5, 6], [7]], [bad, good], on_error="return")
        assert [o.finish_reason for o in outputs] == ["error", "length"]
        assert outputs[0].error.startswith(message)
        with pytest.raises(RequestError) as caught:
            plain_llm.generate([[5, 6], [7]], [bad, good])
        assert str(caught.value).startswith(message)
        assert_idle(plain_llm)


def test_a_failed_forward_pass_fails_its_requests_and_the_engine_goes_on(plain_llm, monkeypatch):
    runner = plain_llm.engine.runner
    real = runner.execute
    calls = []

    def flaky(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("device lost")
        return real(*args, **kwargs)

    monkeypatch.setattr(runner, "execute", flaky)
    outputs = plain_llm.generate([[5, 6], [7, 8]], SamplingParams(max_tokens=5, ignore_eos=True))
    assert all(o.finish_reason == "error" and "device lost" in o.error for o in outputs)
    assert_idle(plain_llm)
    assert all(o.finish_reason == "length" for o in plain_llm.generate([[5, 6]], SamplingParams(max_tokens=3,
                                                                                                  ignore_eos=True)))


def test_an_interrupted_call_aborts_its_requests(plain_llm):
    def interrupt(done, total):
        raise KeyboardInterrupt

    params = [SamplingParams(max_tokens=1, ignore_eos=True), SamplingParams(max_tokens=30, ignore_eos=True)]
    with pytest.raises(KeyboardInterrupt):
        plain_llm.generate([[5, 6], [7, 8]], params, progress=interrupt)
    assert_idle(plain_llm)
    assert plain_llm.generate([[5, 6]], params[0])[0].finish_reason == "length"


class FailingMatcher:
    """Wraps a real matcher; its third advance raises, as a constraint backend bug would."""

    def __init__(self, matcher):
        self.inner, self.advances = matcher, 0

    def advance(self, token_id):
        self.advances += 1
        if self.advances == 3:
            raise RuntimeError("matcher state corrupted")
        self.inner.advance(token_id)

    def __getattr__(self, name):
        return getattr(self.inner, name)


class FailingMaskMatcher(FailingMatcher):
    """Wraps a real matcher; its masks fail after its second advance (on whichever thread computes them)."""

    def advance(self, token_id):
        self.advances += 1
        self.inner.advance(token_id)

    def fill_bitmask(self, buffer):
        if self.advances >= 2:
            raise RuntimeError("mask walk failed")
        self.inner.fill_bitmask(buffer)


class ThreadRecordingMatcher(FailingMatcher):
    """Wraps a real matcher and records the thread of every mask it computes."""

    threads: list[str] = []

    def advance(self, token_id):
        self.inner.advance(token_id)

    def fill_bitmask(self, buffer):
        self.threads.append(threading.current_thread().name)
        self.inner.fill_bitmask(buffer)


class FailingSpec:
    """A constraint spec (the ConstraintSpec protocol) whose matchers are wrapped in `wrapper` (by default
    they fail mid-output)."""

    def __init__(self, wrapper=FailingMatcher):
        self.wrapper = wrapper

    def key(self):
        return ("failing", self.wrapper.__name__)

    def compile(self, vocabulary):
        compiled = Regex("[a-z ]{1,40}").compile(vocabulary)
        wrapper = self.wrapper

        class Compiled:
            def matcher(self, max_tokens=None):
                return wrapper(compiled.matcher(max_tokens))

        return Compiled()


def test_a_matcher_error_fails_its_request_alone(text_llm):
    good = SamplingParams(max_tokens=12, constraint=Regex("[a-z ]{1,40}"))
    outputs = text_llm.generate(["one", "two", "three"],
                                [good, SamplingParams(max_tokens=12, constraint=FailingSpec()), good])
    assert outputs[1].finish_reason == "error" and "matcher state corrupted" in outputs[1].error
    assert all(re.fullmatch("[a-z ]{1,40}", o.text) for o in (outputs[0], outputs[2]))
    assert_idle(text_llm)


def test_a_mask_that_fails_during_the_forward_pass_fails_its_request_alone(text_llm):
    good = SamplingParams(max_tokens=12, constraint=Regex("[a-z ]{1,40}"))
    outputs = text_llm.generate(["one", "two", "three"],
                                [good, SamplingParams(max_tokens=12, constraint=FailingSpec(FailingMaskMatcher)), good])
    assert outputs[1].finish_reason == "error" and "mask walk failed" in outputs[1].error
    assert len(outputs[1].outputs[0].token_ids) == 2
    assert all(re.fullmatch("[a-z ]{1,40}", o.text) for o in (outputs[0], outputs[2]))
    assert_idle(text_llm)


def test_masks_are_computed_on_the_worker_while_the_model_runs(text_llm):
    ThreadRecordingMatcher.threads.clear()
    output = text_llm.generate(["one"], SamplingParams(max_tokens=8, constraint=FailingSpec(ThreadRecordingMatcher)))
    assert output[0].finish_reason in ("stop", "length")
    # One mask per sampled token, each computed during the forward pass that made its logits.
    assert 0 < len(ThreadRecordingMatcher.threads) <= len(output[0].outputs[0].token_ids) + 1
    assert all(name.startswith("leapgen-masks") for name in ThreadRecordingMatcher.threads)


def test_the_step_computes_its_masks_itself_when_the_worker_cannot_run(text_llm, monkeypatch):
    dead = ThreadPoolExecutor(max_workers=1)
    dead.shutdown()                              # as at interpreter exit: submit raises
    monkeypatch.setattr(text_llm.engine._masks_ahead, "_worker", dead)
    monkeypatch.setattr(text_llm.engine._masks_ahead, "_pid", os.getpid())
    outputs = text_llm.generate(["one", "two"], SamplingParams(max_tokens=12, constraint=Regex("[a-z ]{1,40}")))
    assert all(o.finish_reason in ("stop", "length") and re.fullmatch("[a-z ]{1,40}", o.text) for o in outputs)
    assert_idle(text_llm)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_computes_masks_ahead_on_a_worker_of_its_own(text_llm):
    engine = text_llm.engine
    state = ConstraintState(engine.compile(Regex("[a-z]{1,9}")))
    ahead, words = MasksAhead(), engine.vocabulary.mask_words
    expected = ahead.start({0: state}, words).result(timeout=30)[0]
    pid = os.fork()
    if pid == 0:                 # the parent's worker thread does not exist here: work handed to it would never run
        try:
            same = np.array_equal(ahead.start({0: state}, words).result(timeout=30)[0], expected)
        except BaseException:
            same = False
        os._exit(0 if same else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_padding_ids_are_never_allowed_under_a_constraint(text_llm):
    tokenizer_size = len(text_llm.tokenizer)
    assert text_llm.engine.loaded.vocab_size == tokenizer_size + PADDING
    # a huge bias on every padding id: only the constraint keeps them out
    bias = {tokenizer_size + i: 100.0 for i in range(PADDING)}
    for params in (SamplingParams(max_tokens=60, logit_bias=bias),
                   SamplingParams(max_tokens=60, logit_bias=bias, temperature=1.0, seed=3, n=2)):
        for output in text_llm.generate(["a", "bb"], params, constraint=JsonSchema(SCHEMA, {"whitespace": "compact"})):
            for completion in output.outputs:
                assert max(completion.token_ids) < tokenizer_size
                jsonschema.validate(json.loads(completion.text), SCHEMA)
    assert_idle(text_llm)


def test_one_batch_mixes_schemas_regexes_and_free_text(text_llm):
    pydantic = pytest.importorskip("pydantic")

    class Person(pydantic.BaseModel):       # bounded, so a random model's output ends within max_tokens
        name: str = pydantic.Field(max_length=8)
        age: int = pydantic.Field(ge=0, le=99)

    params = [SamplingParams(max_tokens=80, constraint=JsonSchema(SCHEMA, {"whitespace": "compact"})),
              SamplingParams(max_tokens=12, constraint=Regex(r"\d{3}-\d{4}")),
              SamplingParams(max_tokens=5, ignore_eos=True),
              SamplingParams(max_tokens=80, constraint=Person)]
    schema_out, regex_out, free_out, person_out = text_llm.generate(["p", "q", "r", "s"], params)
    jsonschema.validate(json.loads(schema_out.text), SCHEMA)
    assert re.fullmatch(r"\d{3}-\d{4}", regex_out.text)
    assert len(free_out.token_ids) == 5
    Person.model_validate_json(person_out.text)
    assert_idle(text_llm)


@pytest.mark.parametrize("num_beams", [2, 3])
def test_beam_search_under_a_constraint_returns_valid_instances(text_llm, num_beams):
    # eos is allowed only where an instance is complete; the bias lets the random model take it there
    eos_bias = {eos: 3.0 for eos in text_llm.engine.loaded.eos_token_ids}
    params = SamplingParams(max_tokens=80, num_beams=num_beams, n=num_beams, logit_bias=eos_bias)
    for constraint, valid in ((JsonSchema(SCHEMA, {"whitespace": "compact"}),
                               lambda t: jsonschema.validate(json.loads(t), SCHEMA) is None),
                              (leapgen.Grammar(ARITHMETIC), lambda t: lark.Lark(ARITHMETIC).parse(t) is not None)):
        for output in text_llm.generate(["x", "a longer prompt"], params, constraint=constraint):
            assert len(output.outputs) == num_beams
            for completion in output.outputs:
                assert completion.finish_reason == "stop", completion.text
                assert valid(completion.text), completion.text
    assert_idle(text_llm)


def test_beams_under_a_constraint_of_fewer_instances_than_n_return_each_once(text_llm):
    """What the README says: four beams asked for four outputs under a constraint with two instances give two."""
    output = text_llm.generate(["x"], SamplingParams(max_tokens=4, num_beams=4, n=4), constraint=Regex("a|b"))[0]
    assert sorted(c.text for c in output.outputs) == ["a", "b"]
    assert {c.finish_reason for c in output.outputs} == {"stop"}
    assert_idle(text_llm)


def _drive(engine, prompts, params, max_steps: int) -> list:
    """Run `prompts` through `engine` step by step, at most `max_steps` steps (a stalled scheduler fails the test
    instead of hanging it); the outputs in prompt order."""
    ids = [engine.add_request(p, sp) for p, sp in zip(prompts, params)]
    done = {}
    for _ in range(max_steps):
        if not engine.has_unfinished:
            break
        done.update((o.request_id, o) for o in engine.step() if o.finished)
    assert not engine.has_unfinished, f"still unfinished after {max_steps} steps"
    return [done[i] for i in ids]


def test_beam_requests_beyond_the_cache_take_turns_and_match_a_roomy_cache(tmp_path):
    # two requests' beams, each part running and part waiting for the blocks the other's held, stalled the engine
    build_checkpoint_for_tokenizer(tmp_path, byte_level_bpe())
    roomy = leapgen.LLM(tmp_path, dtype="float32", kv_cache_memory="16MiB", block_size=16)
    prompts = [" ".join(str(i * j) for j in range(20)) for i in range(4)]
    beams = SamplingParams(max_tokens=40, num_beams=3, n=2)
    params = [beams, beams, SamplingParams(max_tokens=40, num_beams=2, constraint=JsonSchema(SCHEMA)),
              SamplingParams(max_tokens=40)]
    expected = _drive(roomy.engine, prompts, params, 500)
    widest = max(beam_search_blocks(len(o.prompt_token_ids), p.max_tokens, p.num_beams, 16)
                 for o, p in zip(expected, params))
    per_block = roomy.engine.runner.kv_cache[:, :, 0].numel() * roomy.engine.runner.kv_cache.element_size()
    tight = leapgen.LLM(tmp_path, dtype="float32", kv_cache_memory=(widest + 2) * per_block, block_size=16)
    assert tight.engine.block_manager.num_blocks == widest + 2     # room for one request's beams at a time
    got = _drive(tight.engine, prompts, params, 2000)
    assert [[c.token_ids for c in o.outputs] for o in got] == [[c.token_ids for c in o.outputs] for o in expected]
    assert all(o.error is None for o in got) and tight.engine.scheduler.num_preemptions > 0
    assert_idle(tight)


def test_preempted_beams_come_back_one_by_one_sharing_their_prompt(tmp_path):
    # admitted all at once, three beams of a 24-token prompt counted its blocks three times over (21 of 14 blocks):
    # refused as unfit, where coming back one a step the later ones share what the first computed
    build_checkpoint_for_tokenizer(tmp_path, byte_level_bpe())
    roomy = leapgen.LLM(tmp_path, dtype="float32", kv_cache_memory="16MiB", block_size=4)
    per_block = roomy.engine.runner.kv_cache[:, :, 0].numel() * roomy.engine.runner.kv_cache.element_size()
    tight = leapgen.LLM(tmp_path, dtype="float32", kv_cache_memory=14 * per_block, block_size=4, max_num_seqs=3)
    prompts = [list(range(20, 34)), list(range(50, 74))]
    params = [SamplingParams(max_tokens=12, n=2, temperature=1.0, seed=3, ignore_eos=True),
              SamplingParams(max_tokens=7, num_beams=3, ignore_eos=True)]
    assert beam_search_blocks(24, 7, 3, 4) <= 14
    expected = _drive(roomy.engine, prompts, params, 500)
    got = _drive(tight.engine, prompts, params, 500)
    assert [o.error for o in got] == [None, None] and tight.engine.scheduler.num_preemptions > 0
    assert [[c.token_ids for c in o.outputs] for o in got] == [[c.token_ids for c in o.outputs] for o in expected]
    assert_idle(tight)


def test_beams_that_cannot_come_back_together_fail_alone(tmp_path):
    # without prefix caching a preempted beam comes back with a copy of every block: three of 25 tokens need 21 of
    # the 19 blocks, and the request spun waiting for its last beam; it fails, the others finish as with room
    build_checkpoint_for_tokenizer(tmp_path, byte_level_bpe())
    roomy = leapgen.LLM(tmp_path, dtype="float32", kv_cache_memory="16MiB", block_size=4)
    per_block = roomy.engine.runner.kv_cache[:, :, 0].numel() * roomy.engine.runner.kv_cache.element_size()
    tight = leapgen.LLM(tmp_path, dtype="float32", kv_cache_memory=19 * per_block, block_size=4, max_num_seqs=3,
                        max_num_batched_tokens=16, enable_prefix_caching=False)
    prompts = [list(range(40, 70)), list(range(100, 117)), list(range(140, 170))]
    params = [SamplingParams(max_tokens=16, ignore_eos=True),
              SamplingParams(max_tokens=16, num_beams=3, n=2, ignore_eos=True),
              SamplingParams(max_tokens=28, ignore_eos=True)]
    expected = _drive(roomy.engine, prompts, params, 500)
    got = _drive(tight.engine, prompts, params, 3000)
    assert got[1].finish_reason == "error" and got[1].error.startswith("the KV cache (19 blocks of 4 tokens) cannot "
                                                                       "hold the request's 3 beams")
    assert "without prefix caching" in got[1].error
    assert [o.token_ids for o in (got[0], got[2])] == [o.token_ids for o in (expected[0], expected[2])]
    assert_idle(tight)
    assert _drive(tight.engine, prompts[1:2], [SamplingParams(max_tokens=4, num_beams=3)], 500)[0].error is None


def test_beams_that_cannot_fit_the_cache_even_alone_are_refused_up_front(tmp_path):
    # each beam alone fits, all of them never do: the search waited for its last beams forever
    build_checkpoint_for_tokenizer(tmp_path, byte_level_bpe())
    llm = leapgen.LLM(tmp_path, dtype="float32", kv_cache_memory="16MiB", block_size=8)
    per_block = llm.engine.runner.kv_cache[:, :, 0].numel() * llm.engine.runner.kv_cache.element_size()
    small = leapgen.LLM(tmp_path, dtype="float32", kv_cache_memory=12 * per_block, block_size=8)    # 96 tokens
    params = SamplingParams(max_tokens=20, num_beams=3)
    prompts = ["a", "a much longer prompt with quite a few more tokens in it"]     # alone: fits
    with pytest.raises(RequestError, match=r"prompts\[1\]: 3 beams of the prompt \(\d+ tokens\) \+ max_tokens \(20\) "
                                           r"need up to \d+ tokens of the KV cache, which holds 96"):
        small.generate(prompts, params)
    assert small.generate(prompts[1], SamplingParams(max_tokens=20))[0].error is None
    out = small.generate(prompts, params, on_error="return")
    assert out[0].error is None and out[1].finish_reason == "error"
    assert_idle(small)


def test_one_beam_under_a_constraint_is_constrained_greedy(tmp_path):
    build_checkpoint_for_tokenizer(tmp_path, byte_level_bpe())
    llm = leapgen.LLM(tmp_path, dtype="float32", kv_cache_memory="16MiB", block_size=8, enable_forced_tokens=False)
    constraint = JsonSchema(SCHEMA)
    greedy = llm.generate(["x", "y z"], SamplingParams(max_tokens=60), constraint=constraint)
    beams = llm.generate(["x", "y z"], SamplingParams(max_tokens=60, num_beams=1), constraint=constraint)
    assert [o.token_ids for o in beams] == [o.token_ids for o in greedy]


def test_stream_pieces_join_to_the_final_text(text_llm):
    for params in (SamplingParams(max_tokens=40, stop=["e", "an"], temperature=1.0, seed=4),
                   SamplingParams(max_tokens=40, temperature=1.0, seed=5),
                   SamplingParams(max_tokens=60, constraint=JsonSchema(SCHEMA))):
        final = text_llm.generate(["the story"], params)[0]
        pieces = list(text_llm.stream("the story", params))
        assert "".join(pieces) == final.text
        assert all(pieces)
    assert_idle(text_llm)


@pytest.mark.parametrize("fill", [-float("inf"), float("nan")])
def test_a_beam_row_with_nothing_to_take_fails_its_request(text_llm, fill):
    """As a sampled row's does: beam search ranked the NaN log-probs as tokens, and a request whose beams all met
    -inf came back finished, without an error or a completion."""
    prompt = "abc abc abc"
    start = len(text_llm.tokenizer.encode(prompt))

    def nothing_at_the_third(input_ids, scores):
        return torch.full_like(scores, fill) if input_ids.shape[1] - start == 2 else scores

    params = SamplingParams(max_tokens=6, num_beams=3, n=2, logits_processors=[nothing_at_the_third])
    outputs = text_llm.generate([prompt, "x y"], [params, SamplingParams(max_tokens=6, num_beams=3)],
                                on_error="return")
    assert outputs[0].finish_reason == "error" and "no token can be taken" in outputs[0].error
    assert outputs[1].error is None and len(outputs[1].token_ids) > 0
    assert_idle(text_llm)


def test_prompt_logprobs_of_a_preempted_request_come_once(tmp_path):
    """Recomputed after a preemption, the prompt gave its logprobs again (119 entries for 60 tokens)."""
    build_checkpoint_for_tokenizer(tmp_path, byte_level_bpe())
    prompts = ["abc abc abc abc abc " * 3, "the cat sat on the mat, the cat sat on the", "one two three four " * 2]
    params = [SamplingParams(max_tokens=60, prompt_logprobs=1, ignore_eos=True, n=2, seed=1, temperature=0.5),
              SamplingParams(max_tokens=60, ignore_eos=True), SamplingParams(max_tokens=60, ignore_eos=True)]
    roomy = leapgen.LLM(tmp_path, dtype="float32", kv_cache_memory="16MiB", block_size=8)
    tight = leapgen.LLM(tmp_path, dtype="float32", kv_cache_memory="160KiB", block_size=8)
    expected, got = roomy.generate(prompts, params)[0], tight.generate(prompts, params)[0]
    assert tight.engine.scheduler.num_preemptions > 0
    assert len(got.prompt_logprobs) == len(got.prompt_token_ids)
    assert [e and (e.token_id, round(e.logprob, 4)) for e in got.prompt_logprobs] == \
        [e and (e.token_id, round(e.logprob, 4)) for e in expected.prompt_logprobs]
    assert_idle(tight)


def test_two_open_streams_and_a_generate_between_them_each_get_all_their_text(text_llm):
    """Callers sharing the engine: each step advances every request, so a stream reads its text from its output,
    not from the steps it took itself (two streams read in turn each lost half their pieces, and a stream paused
    while generate() ran lost the rest of its text)."""
    greedy = SamplingParams(max_tokens=30, ignore_eos=True)
    sampled = SamplingParams(max_tokens=30, ignore_eos=True, temperature=1.0, seed=6)
    alone = [o.text for o in text_llm.generate(["the story", "once upon"], [greedy, sampled])]
    first, second = text_llm.stream("the story", greedy), text_llm.stream("once upon", sampled)
    texts = ["", ""]
    for _ in range(6):
        texts[0] += next(first)
        texts[1] += next(second)
    middle = text_llm.generate(["a third"], greedy)[0]
    texts[0] += "".join(first)
    texts[1] += "".join(second)
    assert texts == alone
    assert middle.text == text_llm.generate(["a third"], greedy)[0].text
    assert_idle(text_llm)


class HeldCompile:
    """A constraint spec whose compile starts, then waits until the test lets it go on (at most `hold` seconds)."""

    def __init__(self, inner, hold: float):
        self.inner, self.hold = inner, hold
        self.started, self.released = threading.Event(), threading.Event()
        self.let_go = False     # whether the test let it go on before `hold` ran out

    def key(self) -> tuple:
        return ("held", id(self), *self.inner.key())

    def compile(self, vocabulary):
        self.started.set()
        self.let_go = self.released.wait(self.hold)
        return self.inner.compile(vocabulary)


def test_a_constraint_compiling_on_one_thread_holds_no_other_callers_steps(text_llm):
    """A request is checked (its constraint compiled) before the engine's lock is taken: a thread adding a request
    whose schema compiles for a long time no longer held a stream on another thread meanwhile.  The compile here
    waits until the stream has ended; were the lock held through it, the stream would wait out its hold (an order of
    events, not a race of timings: the test held on a loaded machine)."""
    held = HeldCompile(Regex(r"[0-9]{3}"), hold=20.0)
    with ThreadPoolExecutor(1) as pool:
        constrained = pool.submit(lambda: "".join(text_llm.stream("x", SamplingParams(max_tokens=5,
                                                                                        constraint=held))))
        assert held.started.wait(20.0)
        text = "".join(text_llm.stream("the story", SamplingParams(max_tokens=20, ignore_eos=True)))
        held.released.set()
        digits = constrained.result()
    assert text and held.let_go
    assert len(digits) == 3 and digits.isdigit()
    assert_idle(text_llm)


class Watched:
    """A compiled constraint that tells whether two threads were ever inside it at once: a search for its shortest
    output waits (at most `hold` seconds) for a second one to come in."""

    def __init__(self, inner, hold: float, searching: threading.Event):
        self.inner, self.hold, self.searching = inner, hold, searching
        self.together = threading.Barrier(2)
        self.shared = False

    def matcher(self, max_tokens=None):
        return WatchedMatcher(self, self.inner.matcher(max_tokens))


class WatchedMatcher:
    def __init__(self, owner: Watched, inner):
        self.owner, self.inner = owner, inner

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def completion_tokens(self):
        self.owner.searching.set()
        try:
            self.owner.together.wait(self.owner.hold)
            self.owner.shared = True
        except threading.BrokenBarrierError:
            pass
        return self.inner.completion_tokens()


class WatchedSpec:
    def __init__(self, inner, hold: float):
        self.inner, self.hold = inner, hold
        self.compiled: list[Watched] = []
        self.searching = threading.Event()      # set once a search for a shortest output began

    def key(self) -> tuple:
        return ("watched", id(self), *self.inner.key())

    def compile(self, vocabulary):
        self.compiled.append(Watched(self.inner.compile(vocabulary), self.hold, self.searching))
        return self.compiled[-1]


def test_two_requests_with_one_new_constraint_never_search_one_grammar_at_once(text_llm):
    """A compiled grammar's parser takes no lock of its own: the engine searches a new constraint's shortest output
    before keeping it, so a second request with the same constraint, checked meanwhile on another thread, works on a
    grammar of its own (it searched the kept one, with the first request inside it).  An order of events: the second
    check starts once the first is inside its search, which waits there for a second thread."""
    spec = WatchedSpec(Regex(r"[0-9]{3}"), hold=1.0)
    params = SamplingParams(max_tokens=5, constraint=spec)
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(text_llm.engine.check, "x", params)
        assert spec.searching.wait(20.0)
        second = pool.submit(text_llm.engine.check, "y", params)
        checked = [first.result(), second.result()]
    assert not any(grammar.shared for grammar in spec.compiled)
    assert all(c.constraint in spec.compiled for c in checked)


def test_threads_sharing_one_llm_get_what_each_would_alone(text_llm):
    """Two threads calling generate() on one LLM: their steps take turns under the engine's lock and serve both
    batches (they failed with KeyErrors or ended requests after one token)."""
    params = [SamplingParams(max_tokens=25, ignore_eos=True),
              SamplingParams(max_tokens=25, ignore_eos=True, temperature=1.0, seed=2, n=2)]
    prompts = [["the story", "x y"], ["once upon", "a time there"]]
    alone = [[[c.token_ids for c in o.outputs] for o in text_llm.generate(p, q)] for p, q in zip(prompts, params)]
    got: list = [None, None]

    def run(k: int) -> None:
        got[k] = [[c.token_ids for c in o.outputs] for o in text_llm.generate(prompts[k], params[k])]

    for _ in range(3):
        threads = [threading.Thread(target=run, args=(k,)) for k in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert got == alone
    assert_idle(text_llm)


def test_stream_refuses_several_samples_instead_of_dropping_all_but_one(text_llm):
    with pytest.raises(ValueError, match=r"stream\(\) yields the text of one completion: SamplingParams.n must be 1"):
        next(text_llm.stream("the story", SamplingParams(max_tokens=8, n=2, temperature=1.0)))
    assert_idle(text_llm)


def test_outputs_carry_deltas_that_join_to_the_text(text_llm):
    engine = text_llm.engine
    params = SamplingParams(max_tokens=30, n=2, temperature=1.0, seed=8, stop=["th"])
    request_id = engine.add_request("once upon", params)
    joined: dict[int, str] = {0: "", 1: ""}
    while engine.has_unfinished:
        for output in engine.step():
            for completion in output.outputs:
                joined[completion.index] += completion.delta
    assert joined == {c.index: c.text for c in output.outputs}
    assert output.request_id == request_id and output.finished


def test_a_failed_stream_raises_and_frees_its_blocks(text_llm):
    with pytest.raises(RuntimeError, match="matcher state corrupted"):
        list(text_llm.stream("x", SamplingParams(max_tokens=12, constraint=FailingSpec())))
    assert_idle(text_llm)
    stream = text_llm.stream("x", SamplingParams(max_tokens=30, ignore_eos=True))
    next(stream)
    stream.close()                                       # a consumer that stops early
    assert_idle(text_llm)


def test_forced_text_that_only_starts_tokens_is_left_to_the_mask(plain_llm):
    # the word-level test vocabulary has w10..w19 but no "w" or "w1": the forced "w1" cannot be jumped
    output = plain_llm.generate(["w3"], SamplingParams(max_tokens=8), constraint=Regex("(w1[0-9]){2}"))[0]
    assert output.finish_reason == "stop" and re.fullmatch("(w1[0-9]){2}", output.text), output.error
    assert_idle(plain_llm)


def test_a_constraint_the_vocabulary_cannot_spell_is_refused_up_front(plain_llm):
    with pytest.raises(RequestError, match=r"prompts\[0\]: constraint: no token of this model's vocabulary"):
        plain_llm.generate(["w3"], SamplingParams(max_tokens=8), constraint=Regex("xyz"))
    assert_idle(plain_llm)
