"""Constrained generation in the engine: every output inside the constraint, forced-token jumps save passes."""

from __future__ import annotations

import json
import re

import dataclasses

import jsonschema
import lark
import pytest

from checkpoints import ENGINE_DEVICE, build_checkpoint_for_tokenizer
from leapgen.constraints import Grammar, JsonSchema, Regex
from leapgen.decoding.sampling_params import SamplingParams
from leapgen.engine.llm_engine import EngineConfig, LLMEngine
from leapgen.engine.loader import load_model
from tokenizers_util import byte_level_bpe

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 3},
        "active": {"type": "boolean"},
    },
    "required": ["name", "age", "tags", "active"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    directory = tmp_path_factory.mktemp("constrained")
    build_checkpoint_for_tokenizer(directory, byte_level_bpe())
    return LLMEngine(load_model(directory, "float32", ENGINE_DEVICE), EngineConfig(kv_cache_memory="16MiB", block_size=8))


def run(engine, constraint, params, prompts=("the data:", "x", "a longer prompt about people")):
    before = (engine.num_steps, engine.num_forced_tokens)
    outputs = engine.generate(list(prompts), dataclasses.replace(params, constraint=constraint))
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    return outputs, engine.num_steps - before[0], engine.num_forced_tokens - before[1]


@pytest.mark.parametrize("whitespace,budget", [("dumps", 200), ("compact", 200), ("flexible", 1200)])
def test_json_outputs_validate_greedy_and_sampled(engine, whitespace, budget):
    """Whitespace is bounded: even a random model that prefers tabs ends within the bound's budget."""
    constraint = JsonSchema(SCHEMA, {"whitespace": whitespace})
    for params in (SamplingParams(max_tokens=budget),
                   SamplingParams(max_tokens=budget, temperature=1.0, seed=5, n=3)):
        outputs, _, _ = run(engine, constraint, params)
        for output in outputs:
            for completion in output.outputs:
                assert completion.finish_reason == "stop", completion.text
                jsonschema.validate(json.loads(completion.text), SCHEMA)


def test_any_property_order_outputs_validate_within_a_tight_budget(engine):
    """property_order="any": a random model picks its own key order, and a budget that only just fits still
    closes every object with the required keys it did not write yet."""
    constraint = JsonSchema(SCHEMA, {"whitespace": "compact", "property_order": "any"})
    params = SamplingParams(max_tokens=45, temperature=1.0, seed=3, n=4)
    outputs, _, _ = run(engine, constraint, params)
    reasons = set()
    for output in outputs:
        for completion in output.outputs:
            reasons.add(completion.finish_reason)
            jsonschema.validate(json.loads(completion.text), SCHEMA)
    assert "length" in reasons      # some outputs were closed by the budget (complete JSON all the same)


def test_forced_tokens_take_fewer_forward_passes(engine):
    outputs, steps, forced = run(engine, JsonSchema(SCHEMA, {"whitespace": "compact"}), SamplingParams(max_tokens=200))
    generated = sum(len(o.token_ids) for o in outputs)
    assert forced > 0
    # each forced run is computed in one multi-token step, so there are fewer passes than tokens
    assert steps < generated
    for output in outputs:
        assert output.text.startswith('{"name":"')


def test_a_forced_text_that_completes_the_output_forces_the_eos_after_it_in_the_same_step(engine):
    """One choice, then a forced text, then eos: one forward pass (the eos, then the only token allowed, took a
    pass of its own to be sampled)."""
    params = SamplingParams(max_tokens=20, logprobs=0, constraint=Regex(r"(x|y)hello world"))
    output = engine.generate(["x"], params)[0]
    completion = output.outputs[0]
    assert completion.text in ("xhello world", "yhello world") and completion.finish_reason == "stop"
    assert [entry.forced for entry in completion.logprobs] == [False] + [True] * (len(completion.token_ids) - 1)
    assert completion.token_ids[-1] in engine.vocabulary.eos_ids and output.metrics.forward_passes == 1


def test_regex_and_lark_constraints(engine):
    pattern = r"(19|20)\d\d-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])"
    outputs, _, _ = run(engine, Regex(pattern), SamplingParams(max_tokens=30, temperature=1.0, seed=1))
    assert all(re.fullmatch(pattern, o.text) for o in outputs)
    grammar = """
        start: expr
        expr: term (("+" | "-") term)*
        term: NUMBER | "(" expr ")"
        %import common.NUMBER
    """
    # A random model never prefers to end an unbounded NUMBER; a bias on eos (allowed only where the
    # expression is complete) lets it end, so every output must be a whole expression.
    eos_bias = {eos: 3.0 for eos in engine.loaded.eos_token_ids}
    outputs, _, _ = run(engine, Grammar(grammar), SamplingParams(max_tokens=400, temperature=1.0, seed=2, n=4,
                                                                 logit_bias=eos_bias))
    parser = lark.Lark(grammar)
    completions = [c for o in outputs for c in o.outputs]
    assert len({c.text for c in completions}) > 1            # sampled: not all the shortest expression
    for completion in completions:
        assert completion.finish_reason == "stop", completion.text
        parser.parse(completion.text)


def test_a_request_whose_processors_may_rule_tokens_out_takes_no_forced_jumps(engine):
    """A forced continuation is appended in its canonical spelling without sampling, which passed by the request's
    own processors: a token banned by `logit_bias` came out in a forced text, and a logits processor saw one row of
    six tokens.  Such a request samples every token (the same text, spelled with tokens its processors allow)."""
    text = " says hello world"
    forced = Regex("(cat|dog)" + text)
    canonical = engine.tokenizer.encode(text, add_special_tokens=False)
    banned = [t for t in canonical if len(engine.tokenizer.decode([t])) > 1]
    assert banned
    plain, _, jumped = run(engine, forced, SamplingParams(max_tokens=40), prompts=("x",))
    assert jumped > 0 and any(t in plain[0].outputs[0].token_ids for t in banned)
    bias = SamplingParams(max_tokens=40, logit_bias={t: float("-inf") for t in banned})
    outputs, steps, jumped = run(engine, forced, bias, prompts=("x",))
    ids = outputs[0].outputs[0].token_ids
    assert jumped == 0 and not set(ids) & set(banned)
    assert outputs[0].outputs[0].text == plain[0].outputs[0].text and steps == len(ids)
    rows = []

    def counting(token_ids, logits):
        rows.append(len(token_ids))
        return logits

    outputs, steps, jumped = run(engine, forced, SamplingParams(max_tokens=40, logits_processors=[counting]),
                                 prompts=("x",))
    assert jumped == 0 and len(rows) == len(outputs[0].outputs[0].token_ids) == steps
    outputs, _, jumped = run(engine, forced, SamplingParams(max_tokens=40, no_repeat_ngram_size=3), prompts=("x",))
    assert jumped == 0 and outputs[0].outputs[0].text == plain[0].outputs[0].text


def test_the_engine_keeps_only_the_most_recently_used_compiled_constraints(engine, monkeypatch):
    """A server meeting a new schema in every request keeps only the last `CONSTRAINTS_KEPT` grammars, each with its
    caches of masks: a constraint used again becomes the most recent, one dropped compiles again for a later
    request, and a queued request keeps its own grammar though the engine dropped it."""
    from leapgen.engine import llm_engine

    monkeypatch.setattr(llm_engine, "CONSTRAINTS_KEPT", 2)
    monkeypatch.setattr(engine, "_compiled", type(engine._compiled)())
    one, two, three = Regex("a"), Regex("aa"), Regex("aaa")
    first = engine.compile(one)
    engine.compile(two)
    assert engine.compile(one) is first                 # kept, and now the most recently used
    engine.compile(three)                               # drops `two`, the least recently used
    assert list(engine._compiled) == [one.key(), three.key()]
    params = SamplingParams(max_tokens=8)
    queued = engine.add_request("x", dataclasses.replace(params, constraint=two))   # compiled again
    engine.compile(Regex("b"))
    engine.compile(Regex("bb"))
    assert two.key() not in engine._compiled
    finished = {}
    while engine.has_unfinished:
        finished.update((out.request_id, out) for out in engine.step() if out.finished)
    assert finished[queued].outputs[0].text == "aa"
    outputs, _, _ = run(engine, three, params)
    assert [o.outputs[0].text for o in outputs] == ["aaa"] * 3
    assert len(engine._compiled) == 2


def test_schemas_listing_their_properties_in_two_orders_keep_their_own_orders(engine):
    """Properties come in the schema's order: the same properties listed the other way round are another grammar,
    not the one compiled for the first order."""
    first = {"type": "object", "properties": {"first": {"type": "integer"}, "second": {"type": "integer"}},
             "required": ["first", "second"], "additionalProperties": False}
    second = {**first, "properties": dict(reversed(first["properties"].items()))}
    params = SamplingParams(max_tokens=40)
    for schema in (first, second, first):
        outputs, _, _ = run(engine, JsonSchema(schema, {"whitespace": "compact"}), params)
        for out in outputs:
            assert list(json.loads(out.outputs[0].text)) == list(schema["properties"])


def test_constraint_errors_are_clear(engine):
    with pytest.raises(ValueError, match="ignore_eos"):
        engine.add_request("x", SamplingParams(ignore_eos=True, constraint=Regex("a+")))
    with pytest.raises(TypeError, match="leapgen.JsonSchema"):
        engine.add_request("x", SamplingParams(constraint={"type": "string"}))
    assert not engine.has_unfinished


def test_min_tokens_beside_a_constraint_is_refused_before_any_work(engine):
    """A complete instance may come before min_tokens, and eos is then all the constraint allows: the request
    failed mid-run."""
    with pytest.raises(ValueError, match="^min_tokens cannot be combined with a constraint"):
        engine.add_request("x", SamplingParams(max_tokens=30, min_tokens=10, constraint=Regex("[0-9]{3}")))
    assert not engine.has_unfinished


def test_beam_search_refuses_the_stops_it_would_ignore(engine):
    for options in ({"stop": ["a"]}, {"stop_token_ids": [3]}):
        with pytest.raises(ValueError, match="takes no stop strings or stop token ids"):
            engine.add_request("x", SamplingParams(max_tokens=5, num_beams=2, **options))
    assert not engine.has_unfinished


def test_a_stop_string_still_stops_a_constrained_text(engine):
    """As in OpenAI's API and vLLM: the stop is the caller's, and the text ends there, short of an instance."""
    outputs = run(engine, Regex("[0-9]{3}"), SamplingParams(max_tokens=30, stop=list("0123456789")))[0]
    assert all(o.outputs[0].text == "" and o.outputs[0].finish_reason == "stop" for o in outputs)


def test_more_samples_or_beams_than_run_at_once_are_refused(engine):
    """A request's n samples (or beams) fork at once: past max_num_seqs they are refused, not held in memory."""
    most = engine.limits.max_num_seqs
    for options, name in (({"n": most + 1}, "n"), ({"num_beams": most + 1}, "num_beams")):
        with pytest.raises(ValueError, match=rf"^{name} \({most + 1}\) exceeds the sequences the engine runs at once"):
            engine.add_request("x", SamplingParams(max_tokens=2, **options))
    assert not engine.has_unfinished
    engine.add_request("x", SamplingParams(max_tokens=2, n=most, temperature=1.0))
    while engine.has_unfinished:
        engine.step()
