"""Token budgets: every constrained output is a complete instance, even when max_tokens cuts it short."""

from __future__ import annotations

import dataclasses
import json
import random
import re

import jsonschema
import lark
import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

from leapgen.constraints import Grammar, JsonSchema, Regex
from leapgen.decoding.sampling_params import SamplingParams
from leapgen.decoding.speculative import SpeculativeConfig
from leapgen.engine.admission import RequestError
from leapgen.engine.constraint_state import ConstraintState
from leapgen.engine.llm_engine import EngineConfig, LLMEngine
from leapgen.engine.loader import load_model
from leapgen.grammars import compile_json_schema, compile_lark, compile_regex
from tokenizers_util import byte_level_bpe

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "email": {"type": "string", "format": "email"},
        "age": {"type": "integer", "minimum": 0},
        "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1},
        "address": {"type": "object", "properties": {"city": {"type": "string"},
                                                      "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                    "required": ["city", "zip"]},
    },
    "required": ["name", "email", "age", "tags", "address"],
}
LARK = """
start: "(" item ("," item)* ")"
item: NUMBER | start
NUMBER: /[0-9]+/
"""


def checker():
    return jsonschema.Draft202012Validator(PERSON, format_checker=jsonschema.FormatChecker())


def text_of(grammar, ids):
    vocab = grammar.vocabulary
    return b"".join(vocab.token_bytes[i] for i in ids if i not in vocab.eos_ids).decode("utf-8")


def random_walk(grammar, budget, rng):
    """Pick uniformly among the mask's tokens (eos last resort), as a sampler that ignores budgets would;
    a pick the matcher refuses is replaced by the first token of a shortest completion, or by eos where the text
    is complete, as the engine does."""
    matcher, ids = grammar.matcher(budget), []
    eos = set(grammar.vocabulary.eos_ids)
    while len(ids) < budget and not matcher.is_finished():
        allowed = matcher.allowed_token_ids().tolist()
        token = rng.choice([t for t in allowed if t not in eos] or allowed)
        if not matcher.is_token_allowed(token):
            closing = matcher.completion_tokens()
            token = closing[0] if closing else next(t for t in allowed if t in eos)     # complete: end it
        matcher.advance(token)
        ids.append(token)
        if token in eos:
            break
    return ids


@pytest.fixture(scope="module")
def tokenizer():
    return byte_level_bpe()


def test_shortest_completion_from_the_start_and_midway(tokenizer):
    grammar = compile_json_schema(PERSON, tokenizer, whitespace="compact")
    matcher = grammar.matcher()
    shortest = text_of(grammar, matcher.completion_tokens())
    checker().validate(json.loads(shortest))
    for token in tokenizer.encode('{"name":"Ada Lovel', add_special_tokens=False):
        matcher.advance(token)
    rest = text_of(grammar, matcher.completion_tokens())
    instance = json.loads('{"name":"Ada Lovel' + rest)
    checker().validate(instance)
    assert instance["name"] == "Ada Lovel"


def test_closing_forces_the_shortest_completion(tokenizer):
    grammar = compile_json_schema(PERSON, tokenizer, whitespace="compact")
    need = len(grammar.matcher().completion_tokens())
    matcher = grammar.matcher(need + 3)
    for token in tokenizer.encode('{"name":"', add_special_tokens=False):
        matcher.advance(token)
    plan = matcher.completion_tokens()
    left = need + 3 - len(tokenizer.encode('{"name":"', add_special_tokens=False))
    assert len(plan) <= left
    if len(plan) == left:                      # closing began: the plan is the only way on
        assert matcher.allowed_token_ids().tolist() == plan[:1]
        assert matcher.forced_tokens() == plan


def test_a_token_that_would_overrun_the_budget_is_refused_and_rollback_reopens(tokenizer):
    grammar = compile_regex(r"[a-z]{0,30}(;[0-9]{20})?", tokenizer)
    matcher = grammar.matcher(6)
    semicolon = tokenizer.encode(";", add_special_tokens=False)[0]
    assert semicolon in matcher.allowed_token_ids()      # the grammar allows it, the budget cannot take it
    assert not matcher.is_token_allowed(semicolon)
    with pytest.raises(ValueError):
        matcher.advance(semicolon)
    free = grammar.matcher()
    assert free.is_token_allowed(semicolon)
    free.advance(semicolon)


def test_the_plan_is_kept_until_rolled_back(tokenizer):
    grammar = compile_regex(r"\[[a-z]+(,[a-z]+)*\]", tokenizer)
    matcher = grammar.matcher(4)
    opening = tokenizer.encode("[", add_special_tokens=False)
    for token in opening:
        matcher.advance(token)
    plan = matcher.completion_tokens()
    assert text_of(grammar, opening + plan) == "[a]"
    matcher.advance(plan[0])
    assert matcher.completion_tokens() == plan[1:]
    matcher.rollback(1 + len(opening))
    assert matcher.allowed_token_ids().tolist() == grammar.matcher().allowed_token_ids().tolist()


@pytest.mark.parametrize("seed", range(3))
def test_random_walks_under_every_budget_complete(tokenizer, seed):
    rng = random.Random(seed)
    grammars = [(compile_json_schema(PERSON, tokenizer, whitespace=ws), lambda t: checker().validate(json.loads(t)))
                for ws in ("compact", "flexible")]
    grammars.append((compile_lark(LARK, tokenizer), lark.Lark(LARK).parse))
    grammars.append((compile_regex(r"[A-Z][a-z]{2,}( [A-Z][a-z]+)* <[a-z]+@[a-z]+\.[a-z]{2,3}>", tokenizer),
                     lambda t: re.fullmatch(r"[A-Z][a-z]{2,}( [A-Z][a-z]+)* <[a-z]+@[a-z]+\.[a-z]{2,3}>", t).group()))
    for grammar, validate in grammars:
        need = len(grammar.matcher().completion_tokens())
        for budget in (need, need + 1, need + 2, need + 7, need + 25):
            validate(text_of(grammar, random_walk(grammar, budget, rng)))


# --- random schemas x random budgets -------------------------------------------------------------

def leaf_schemas():
    return st.one_of(
        st.builds(lambda lo, extra: {"type": "string", "minLength": lo, **({"maxLength": lo + extra} if extra else {})},
                  st.integers(0, 4), st.integers(0, 6)),
        st.just({"type": "string", "format": "email"}),
        st.just({"type": "string", "format": "date"}),
        st.just({"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3,}$"}),
        st.builds(lambda lo, span: {"type": "integer", "minimum": lo, "maximum": lo + span},
                  st.integers(-1000, 1000), st.integers(0, 10 ** 6)),
        st.just({"type": "number", "minimum": 0}),
        st.just({"type": "boolean"}),
        st.lists(st.text("abcxyz -", min_size=1, max_size=8), min_size=1, max_size=4, unique=True)
        .map(lambda values: {"enum": values}),
    )


def schemas():
    return st.recursive(
        leaf_schemas(),
        lambda inner: st.one_of(
            st.builds(lambda items, lo: {"type": "array", "items": items, "minItems": lo}, inner, st.integers(0, 3)),
            st.dictionaries(st.sampled_from(["a", "b", "name", "id", "when"]), inner, min_size=1, max_size=4)
            .flatmap(lambda props: st.builds(
                lambda required, closed: {"type": "object", "properties": props, "required": required,
                                          "additionalProperties": not closed},
                st.lists(st.sampled_from(sorted(props)), unique=True), st.booleans())),
            st.lists(inner, min_size=2, max_size=3).map(lambda options: {"anyOf": options}),
        ),
        max_leaves=6,
    )


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(schema=schemas(), slack=st.integers(0, 40), seed=st.integers(0, 2 ** 16),
       whitespace=st.sampled_from(["compact", "flexible"]))
@example(schema={"type": "number", "minimum": 0}, slack=10, seed=1272, whitespace="compact")
def test_random_schemas_under_random_budgets_always_validate(tokenizer, schema, slack, seed, whitespace):
    grammar = compile_json_schema(schema, tokenizer, whitespace=whitespace)
    need = len(grammar.matcher().completion_tokens())
    text = text_of(grammar, random_walk(grammar, need + slack, random.Random(seed)))
    jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker()).validate(json.loads(text))


# --- in the engine --------------------------------------------------------------------------------

def test_a_sample_past_the_budget_after_a_complete_text_becomes_eos(tokenizer):
    """Found by the random-budget test: "5" is a complete number, "5e" is not and no room is left to finish it;
    the shortest completion is empty, so the engine must end the text rather than append the refused sample."""
    grammar = compile_json_schema({"type": "number"}, tokenizer, whitespace="compact")
    ids = tokenizer.encode("5", add_special_tokens=False)
    state = ConstraintState(grammar, ids, max_tokens=len(ids) + 1)
    exponent = tokenizer.encode("e", add_special_tokens=False)[0]
    assert not state.matcher.is_token_allowed(exponent) and state.matcher.completion_tokens() == []
    assert state.admissible(exponent, [tokenizer.eos_token_id]) == tokenizer.eos_token_id


@pytest.fixture(scope="module")
def engine(byte_level_model_dir):
    return LLMEngine(load_model(byte_level_model_dir, "float32"), EngineConfig(kv_cache_memory="16MiB", block_size=8))


def generate(engine, params, constraint=JsonSchema(PERSON), prompts=("the data:", "x", "a longer prompt")):
    outputs = engine.generate(list(prompts), dataclasses.replace(params, constraint=constraint))
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    return [c for output in outputs for c in output.outputs]


def shortest(engine, schema=PERSON):
    return len(compile_json_schema(schema, engine.vocabulary).matcher().completion_tokens())


@pytest.mark.parametrize("params,slack", [
    (SamplingParams(), 10),
    (SamplingParams(temperature=1.0, seed=3, n=3), 15),
    (SamplingParams(num_beams=3), 5),
    (SamplingParams(temperature=1.2, top_k=50, seed=9), 30),
], ids=["greedy", "sampled-n3", "beams", "top-k"])
@pytest.mark.parametrize("forced", [True, False], ids=["forced", "unforced"])
def test_engine_outputs_cut_by_max_tokens_still_validate(engine, params, slack, forced):
    """A random-weight model never closes by itself: max_tokens ends every output, and each is complete."""
    params = dataclasses.replace(params, max_tokens=shortest(engine) + slack)
    engine.config.enable_forced_tokens = forced
    try:
        completions = generate(engine, params)
    finally:
        engine.config.enable_forced_tokens = True
    for completion in completions:
        checker().validate(json.loads(completion.text))
        assert len(completion.token_ids) <= params.max_tokens
        if params.num_beams == 1:
            assert completion.finish_reason in ("length", "stop")


def test_engine_budget_with_regex_and_lark(engine):
    for constraint, validate in ((Grammar(LARK), lark.Lark(LARK).parse),
                                 (Regex(r"[a-z]{3,}(,[a-z]{3,})*;"), lambda t: re.fullmatch(r"[a-z]{3,}(,[a-z]{3,})*;", t).group())):
        for completion in generate(engine, SamplingParams(max_tokens=12, temperature=1.0, seed=1), constraint):
            validate(completion.text)


@pytest.mark.parametrize("method", ["ngram", "draft"])
def test_speculative_engine_respects_the_budget(byte_level_model_dir, method):
    directory = byte_level_model_dir
    speculative = {"method": "ngram", "num_speculative_tokens": 6, "prompt_lookup_min": 1} if method == "ngram" \
        else {"method": "draft", "model": str(directory), "num_speculative_tokens": 4}
    spec = LLMEngine(load_model(directory, "float32"),
                     EngineConfig(kv_cache_memory="16MiB", block_size=8,
                                  speculative=SpeculativeConfig.parse(speculative)))
    prompts = ('{"name": "Ada", "email": "ada@example.org", "age": 36, "tags": ["x"], '
               '"address": {"city": "London", "zip": "12345"}} again:',)
    for slack in (0, 3, 8):
        for completion in generate(spec, SamplingParams(max_tokens=shortest(spec) + slack), prompts=prompts):
            checker().validate(json.loads(completion.text))
    if method == "draft":
        assert spec.requests == {} and not spec.has_unfinished


def test_a_budget_below_the_shortest_instance_is_refused_before_any_work(engine):
    need = shortest(engine)
    with pytest.raises(RequestError, match=rf"prompts\[1\]: max_tokens={need - 1} is too small for the constraint: "
                                           rf"its shortest output takes {need} tokens"):
        engine.generate(["a", "b"], [SamplingParams(max_tokens=need, constraint=JsonSchema(PERSON)),
                                     SamplingParams(max_tokens=need - 1, constraint=JsonSchema(PERSON))])
    assert not engine.has_unfinished
    [completion] = generate(engine, SamplingParams(max_tokens=need), prompts=("a",))
    checker().validate(json.loads(completion.text))
