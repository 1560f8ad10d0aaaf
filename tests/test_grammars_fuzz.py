"""Fuzzing the JSON schema compiler (issue 14): random schemas, valid and invalid instances, mask walks.

Each test draws schemas from the keywords the compiler supports (tests/fuzz_schemas.py; the oracle in fuzz_oracle.py, the checks in fuzz_checks.py) and checks, under
cl100k and SmolLM2's tokenizer (when the default model is installed):

- every compile (with its first mask) stays under COMPILE_BOUND_S, and a refusal is a SchemaError
  (UnsupportedSchemaError for what cannot be enforced); one that claims "unsatisfiable" has no instance;
- hypothesis-jsonschema's instances that jsonschema confirms valid, laid out as the whitespace option
  expects, are accepted token by token (the bitmask and is_token_allowed agree), eos allowed at the end;
- mutated instances that jsonschema calls invalid are never accepted to completion;
- random walks over the masks under a token budget finish, and what they write validates.

The CI variants have fixed seeds and are small (about two minutes on two cores); the `slow` ones draw
LONG_FACTOR times as many schemas.  benchmarks/fuzz_constraints.py runs the long campaign.  The tests at the
end pin down each bug it found.
"""

from __future__ import annotations

import json
import random
import warnings

import jsonschema
import pytest
from hypothesis import HealthCheck, given, seed, settings, strategies as st
from hypothesis.errors import FlakyStrategyDefinition

from fuzz_checks import Fuzzer, random_walk, tokenizer_factories
from fuzz_schemas import WHITESPACES, schemas
from leapgen.grammars import SchemaError, compile_json_schema, compile_regex
from tokenizers_util import accepts, byte_level_bpe

# Schemas per test: 15-36 s of calls each on two cores, plus a few seconds loading the tokenizers.
CI_SCHEMAS = {"compile": 600, "valid": 700, "invalid": 700, "walks": 550, "any order": 300}
# the slow variants: about 4 min on two cores (at 4x they took 7.7 min, nearly half of CI's whole suite; the
# campaign script runs the long fuzzing)
LONG_FACTOR = 2


@pytest.fixture(scope="module")
def tokenizers() -> dict:
    """cl100k, and SmolLM2's tokenizer when the default model is installed (each loaded once per process)."""
    from leapgen.engine.default_model import DefaultModelNotFoundError

    out = {}
    for name, factory in tokenizer_factories().items():
        try:
            out[name] = factory()
        except DefaultModelNotFoundError as exc:
            warnings.warn(f"fuzzing without {name}: {exc}")
    return out


def budgets(test: str) -> list:
    ci = CI_SCHEMAS[test]
    return [pytest.param(ci, id="ci"), pytest.param(ci * LONG_FACTOR, id="long", marks=pytest.mark.slow)]


def fuzz(tokenizers: dict, examples: int, random_seed: int, property_order: str = "schema", batch: int = 50,
         **checks: int) -> Fuzzer:
    """Run the fuzzer's `checks` on `examples` schemas, the same ones on every run (a seed per batch of
    `batch`, no example database), failing on the first unsound answer with its reproducer.  A batch that
    hypothesis cuts short for drawing inconsistently (hypothesis-jsonschema's caches make a schema's instances
    depend on what came before) loses its remaining examples only, as in benchmarks/fuzz_constraints.py."""
    fuzzer = Fuzzer(tokenizers, property_order=property_order)
    found: list = []    # kept here too: a failing example that hypothesis cannot replay still fails the test
    for number in range(-(-examples // batch)):

        @seed(random_seed * 1_000_003 + number)
        @settings(max_examples=min(batch, examples - number * batch), deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(schema=schemas(max_leaves=6), whitespace=st.sampled_from(WHITESPACES), data=st.data())
        def run(schema, whitespace, data):
            fuzzer.failures.clear()      # each example is judged alone (hypothesis replays a failing one)
            fuzzer.run(schema, whitespace, data, **checks)
            found.extend(fuzzer.failures)
            assert not fuzzer.failures, "\n\n".join(f.reproducer() for f in fuzzer.failures)

        try:
            run()
        except FlakyStrategyDefinition:
            fuzzer.counts["batches cut short by hypothesis"] += 1
        assert not found, "\n\n".join(f.reproducer() for f in found)
    return fuzzer


@pytest.mark.parametrize("examples", budgets("compile"))
def test_compiles_are_bounded_and_refusals_are_schema_errors(tokenizers, examples):
    fuzzer = fuzz(tokenizers, examples, 1, valid=0, invalid=0, walks=0)
    assert fuzzer.counts["compiled"] > examples / 2, fuzzer.refused      # the grammar mostly draws what compiles


@pytest.mark.parametrize("examples", budgets("valid"))
def test_valid_instances_are_reachable_token_by_token(tokenizers, examples):
    fuzzer = fuzz(tokenizers, examples, 2, valid=3, invalid=0, walks=0)
    assert fuzzer.counts["valid accepted"] > examples


@pytest.mark.parametrize("examples", budgets("invalid"))
def test_invalid_instances_are_never_accepted(tokenizers, examples):
    fuzzer = fuzz(tokenizers, examples, 3, valid=1, invalid=3, walks=0)
    assert fuzzer.counts["invalid refused"] > examples


@pytest.mark.parametrize("examples", budgets("walks"))
def test_mask_walks_under_a_budget_finish_valid(tokenizers, examples):
    fuzzer = fuzz(tokenizers, examples, 4, valid=0, invalid=0, walks=2)
    assert fuzzer.counts["walks validated"] > examples


@pytest.mark.parametrize("examples", budgets("any order"))
def test_in_any_property_order_valid_instances_are_reachable_and_invalid_ones_are_not(tokenizers, examples):
    """property_order="any": instances with their keys shuffled, and walks whose budgets close objects that
    still lack required members."""
    fuzzer = fuzz(tokenizers, examples, 5, property_order="any", valid=2, invalid=2, walks=1)
    assert fuzzer.counts["valid accepted"] > examples / 2
    assert fuzzer.counts["invalid refused"] > examples / 2
    assert fuzzer.counts["walks validated"] > examples / 2


# ---- the compiler bugs this fuzzer found ---------------------------------------------------------------
# Each stays as a regression test (repeated extra keys: tests/test_grammars_distinct.py).

@pytest.mark.parametrize("schema", [
    {"type": "integer", "minimum": 1, "maximum": 1, "multipleOf": 2},
    {"type": "string", "pattern": "^a$", "maxLength": 0},
    {"$defs": {"n": {"type": "array", "minItems": 1, "items": {"$ref": "#/$defs/n"}}}, "$ref": "#/$defs/n"},
], ids=["multipleOf", "pattern", "recursion"])
def test_unsatisfiable_schemas_are_refused_with_a_schema_error(schema):
    """Found by this fuzzer: emptiness only the automata see was a GrammarError without a pointer."""
    with pytest.raises(SchemaError, match="unsatisfiable"):
        compile_json_schema(schema, byte_level_bpe())


# Found by the long campaign (seed 0, SmolLM2, whitespace "dumps"): an anyOf of two objects.
PROMISED_ROUTE_SCHEMA = {
    "anyOf": [{"$ref": "#/$defs/d1"},
              {"type": "object", "additionalProperties": False, "minProperties": 1,
               "properties": {"name": {"type": ["string", "null"], "maxLength": 3},
                              "id": {"type": "string", "minLength": 3, "maxLength": 7},
                              "x y": {"type": "string", "minLength": 3, "maxLength": 9},
                              "tab\t": {"type": "number", "minimum": 0}}}],
    "$defs": {"d1": {"type": "object", "required": ["id", "x y", "r", "tab\t"], "additionalProperties": True,
                     "properties": {"x y": {"type": "number", "minimum": 0}, "tab\t": {"const": -7},
                                    "id": {"type": "integer", "minimum": 193, "maximum": 2858}}}}}


def test_a_budget_keeps_to_the_completion_it_promised(tokenizers):
    """Found by this fuzzer (a budgeted walk): after a token of the shortest completion, the shortest completion
    in bytes from the new state took more tokens than the rest of the promised one, so the budget refused the
    promised completion's next token.  Each position now keeps the shorter of the two."""
    if "smollm2" not in tokenizers:
        pytest.skip("SmolLM2's tokenizer is not installed")
    grammar = compile_json_schema(PROMISED_ROUTE_SCHEMA, tokenizers["smollm2"], whitespace="dumps")
    validator = jsonschema.Draft202012Validator(PROMISED_ROUTE_SCHEMA)
    for walk_seed in range(12):
        walk = random_walk(grammar, random.Random(walk_seed), slack=2)
        assert walk.finished and not walk.problem, (walk_seed, walk)
        assert validator.is_valid(json.loads(walk.text)), (walk_seed, walk.text)


def test_a_starred_alternative_keeps_its_loop_to_itself():
    """Found by this fuzzer (a mask walk): the regex NFA looped a leading star back into the other branches."""
    assert not accepts(compile_regex("a*b|c", byte_level_bpe()), byte_level_bpe(), "ac")
    grammar = compile_json_schema({"type": "string", "pattern": "q|^w"}, byte_level_bpe())
    assert not accepts(grammar, byte_level_bpe(), '"aw"')


def test_equal_conjuncts_met_again_are_not_a_ref_cycle():
    """Found by a campaign (seed 2513, --property-order any): the first item's `not: {oneOf}` of two `$ref`s, both
    of whose negations became `not: {type: object}` beside an item failing `contains`; rewriting one away left a
    conjunction equal to the one being compiled (A and A is A), which was refused as a `$ref` cycle that consumes
    no input (MaskBench's Github_hard o44959 too, a schema without such a cycle)."""
    schema = {"prefixItems": [{"not": {"oneOf": [{"$ref": "#/$defs/a"}, {"$ref": "#/$defs/b"}]}}],
              "contains": {"oneOf": [{"type": "array", "maxItems": 3}]}, "maxContains": 4,
              "$defs": {"a": {"type": "object", "required": ["x"]}, "b": {"type": "object", "maxProperties": 3}}}
    tokenizer = byte_level_bpe()
    grammar = compile_json_schema(schema, tokenizer)
    validator = jsonschema.Draft202012Validator(schema)
    instances = [[1, []], [[], 1], [{"x": 1}], [{"x": 1, "y": 2, "z": 3, "w": 4}], [{}], [[]], ["a", [], [1]],
                 [[], [], [], [], []], [[1, 2, 3, 4]], [[1, 2, 3, 4], []]]
    for instance in instances:
        text = json.dumps(instance)
        assert accepts(grammar, tokenizer, text) == validator.is_valid(instance), text
    assert {validator.is_valid(i) for i in instances} == {True, False}
