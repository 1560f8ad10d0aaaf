"""property_order="any": object members in any order, each at most once, exactly what the schema allows.

The object rule keeps the members it wrote on its stack frame (grammars/object_members.py); these tests pin down
the guards (duplicates, required members, dependencies, counts), the closing plan under a token budget, and
that nesting, recursion and rollback keep each object's record to itself.
"""

from __future__ import annotations

import itertools
import json
import random

import jsonschema
import pytest

from fuzz_checks import random_walk
from leapgen.grammars import SchemaError, compile_json_schema
from tokenizers_util import accepts, byte_level_bpe

TOKENIZER = byte_level_bpe()

PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age"],
          "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "email": {"type": "string"}}}


def compiled(schema: dict, **options):
    return compile_json_schema(schema, TOKENIZER, whitespace="dumps", property_order="any", **options)


def dumps(pairs: list[tuple[str, object]]) -> str:
    return "{" + ", ".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in pairs) + "}"


def test_every_order_of_the_members_is_accepted():
    grammar = compiled(PERSON)
    members = [("name", "Ada"), ("age", 36), ("email", "ada@x.org")]
    for order in itertools.permutations(members):
        assert accepts(grammar, TOKENIZER, dumps(list(order))), order
    for order in itertools.permutations(members[:2]):
        assert accepts(grammar, TOKENIZER, dumps(list(order))), order


def test_the_schema_order_is_still_the_default():
    grammar = compile_json_schema(PERSON, TOKENIZER, whitespace="dumps")
    assert accepts(grammar, TOKENIZER, dumps([("name", "Ada"), ("age", 36)]))
    assert not accepts(grammar, TOKENIZER, dumps([("age", 36), ("name", "Ada")]))


@pytest.mark.parametrize("text", [
    dumps([("name", "Ada"), ("age", 36), ("name", "Bob")]),      # a member twice
    dumps([("age", 36), ("age", 37), ("name", "Ada")]),
    dumps([("age", 36)]),                                         # a required member missing
    dumps([("email", "e"), ("name", "Ada")]),
    dumps([("name", "Ada"), ("age", 36), ("other", 1)]),          # an extra key where none may be
    "{}",
], ids=["repeat", "repeat-first", "missing", "missing-2", "extra", "empty"])
def test_what_the_schema_forbids_is_refused(text):
    assert not accepts(compiled(PERSON), TOKENIZER, text)


def test_a_key_once_written_leaves_the_mask():
    grammar = compiled(PERSON)
    matcher = grammar.matcher()
    for token in TOKENIZER.encode('{"age": 1, "', add_special_tokens=False):
        matcher.advance(token)
    texts = {TOKENIZER.decode([int(t)]) for t in matcher.allowed_token_ids()}
    keys = ('name"', 'email"')
    assert all(any(k.startswith(t) or t.startswith(k) for k in keys) for t in texts), sorted(texts)
    assert {t[0] for t in texts} == {"n", "e"}


def test_dependencies_and_counts_hold_in_any_order():
    schema = {"type": "object", "dependentRequired": {"card": ["address"]}, "maxProperties": 3, "minProperties": 2,
              "properties": {"card": {"type": "integer"}, "address": {"type": "string"}, "note": {"type": "string"}}}
    grammar = compiled(schema)
    validator = jsonschema.Draft202012Validator(schema)
    values = {"card": 1, "address": "x", "note": "n", "other": 2}
    for size in range(0, 5):
        for keys in itertools.permutations(values, size):
            text = dumps([(k, values[k]) for k in keys])
            assert accepts(grammar, TOKENIZER, text) == validator.is_valid(json.loads(text)), text


@pytest.mark.parametrize("order", ["schema", "any"])
@pytest.mark.parametrize("schema", [
    {"properties": {k: {} for k in "abcde"}, "required": ["b", "d"], "additionalProperties": False},
    {"properties": {k: {} for k in "abcde"}, "required": ["c"], "minProperties": 3, "maxProperties": 4},
    {"properties": {k: {} for k in "abcde"}, "dependentRequired": {"a": ["e"], "c": ["b"]}, "maxProperties": 3},
    {"properties": {k: {} for k in "abcde"}, "required": ["a"], "dependentRequired": {"a": ["c"]},
     "minProperties": 4, "additionalProperties": False},
])
def test_claimable_members_are_the_open_ones_after_which_the_object_completes(schema, order):
    """Every tag's claimable members (asked of a hundred at once where a large object's member comes next) are
    exactly its open members after which some completion remains."""
    from leapgen.grammars.object_members import AFTER

    grammar = compile_json_schema({"type": "object", **schema}, TOKENIZER, property_order=order)
    members = grammar.automaton.frames[0].members
    for seen in range(1 << members.size):
        for extras in range(3):
            tag = (seen, extras, ())
            expected = 0
            for k in range(members.size):
                after = (seen | 1 << k, extras, ())
                if members._open(tag) >> k & 1 and members.feasible(after, AFTER):
                    expected |= 1 << k
            assert members.claimable(tag) == expected, (seen, extras)


def test_claimable_members_counted_at_once_are_those_some_completion_follows():
    """Where no optional trigger is left, `claimable` counts the members with bit operations (`_claimable_fixed`):
    over random objects (required members, dependencies on required ones, counts, capped extras, loose members,
    members that cannot be written, either order) it equals the members after which `feasible` finds a completion."""
    from leapgen.grammars import ir
    from leapgen.grammars.object_members import AFTER, MemberSet

    rng, part, checked = random.Random(5), ir.Lit("x"), 0
    for _ in range(3000):
        n = rng.randint(1, 10)
        required = frozenset(k for k in range(n) if rng.random() < 0.3)
        dependents = tuple((t, frozenset(k for k in range(n) if k != t and rng.random() < 0.2))
                           for t in sorted(required) if rng.random() < 0.3)
        spec = ir.Members(part, (part,) * n, part, part, extra=part if rng.random() < 0.5 else None,
                          required=required, dependents=dependents, min=rng.choice([0, 0, 1, 2, 3, 5]),
                          max=rng.choice([None, None, 2, 4, 6]), ordered=rng.random() < 0.5,
                          max_extras=rng.choice([None, 0, 1, 3]), loose=rng.choice([0, 0, 1, 2]) if n > 2 else 0)
        live = None if rng.random() < 0.7 else sum(1 << k for k in range(n) if rng.random() < 0.8)
        members = MemberSet(spec, live, extra_live=rng.random() < 0.8)
        for _ in range(6):
            tag = (sum(1 << k for k in range(n) if rng.random() < 0.3), rng.choice([0, 0, 1, 2, 4]), ())
            expected = 0
            for k in range(n):
                if members._open(tag) >> k & 1 and members.feasible((tag[0] | 1 << k, tag[1], ()), AFTER):
                    expected |= 1 << k
            assert members.claimable(tag) == expected, (spec, live, tag)
            checked += expected != 0
    assert checked > 3000   # (most tags leave some member to claim)


def test_extras_mix_with_declared_members():
    schema = {"type": "object", "required": ["id"], "properties": {"id": {"type": "integer"}},
              "patternProperties": {"^x-": {"type": "string"}}, "additionalProperties": False}
    grammar = compiled(schema)
    assert accepts(grammar, TOKENIZER, dumps([("x-a", "1"), ("id", 2), ("x-b", "3")]))
    assert not accepts(grammar, TOKENIZER, dumps([("x-a", 1), ("id", 2)]))
    assert not accepts(grammar, TOKENIZER, dumps([("x-a", "1"), ("y", "2"), ("id", 2)]))


def test_nested_and_recursive_objects_keep_their_own_records():
    tree = {"$defs": {"node": {"type": "object", "required": ["v"], "additionalProperties": False,
                               "properties": {"v": {"type": "integer"},
                                              "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}},
            "$ref": "#/$defs/node"}
    grammar = compiled(tree)
    assert accepts(grammar, TOKENIZER, '{"kids": [{"v": 2}, {"kids": [], "v": 3}], "v": 1}')
    assert not accepts(grammar, TOKENIZER, '{"kids": [{"v": 2, "v": 3}], "v": 1}')
    assert not accepts(grammar, TOKENIZER, '{"kids": [{"kids": []}], "v": 1}')
    assert not accepts(grammar, TOKENIZER, '{"v": 1, "kids": [{"v": 2}], "v": 1}')


def test_a_budget_closes_with_the_required_members_still_missing():
    grammar = compiled(PERSON)
    validator = jsonschema.Draft202012Validator(PERSON)
    prefix = TOKENIZER.encode('{"email": "a", ', add_special_tokens=False)
    free = grammar.matcher()
    for token in prefix:
        free.advance(token)
    rest = free.completion_tokens()
    text = TOKENIZER.decode(prefix + rest)
    assert validator.is_valid(json.loads(text)), text
    assert json.loads(text).keys() == {"email", "name", "age"}
    tight = grammar.matcher(max_tokens=len(prefix) + len(rest))   # just room for that completion
    for token in prefix:
        tight.advance(token)
    for token in rest:
        assert list(tight.allowed_token_ids()) == [token]
        tight.advance(token)
    assert tight.is_finished() or list(tight.allowed_token_ids()) == [TOKENIZER.eos_token_id]


def test_mask_walks_under_budgets_end_valid():
    schema = {"type": "object", "required": ["a", "b"], "minProperties": 3, "dependentRequired": {"c": ["d"]},
              "properties": {k: {"type": "integer", "maximum": 9, "minimum": 0} for k in "abcd"}}
    grammar = compiled(schema)
    validator = jsonschema.Draft202012Validator(schema)
    for seed in range(30):
        walk = random_walk(grammar, random.Random(seed), slack=seed % 7)
        assert walk.finished and not walk.problem, (seed, walk)
        assert validator.is_valid(json.loads(walk.text)), walk.text


def test_rollback_restores_the_record():
    grammar = compiled(PERSON)
    matcher = grammar.matcher()
    first = TOKENIZER.encode('{"name": "A", ', add_special_tokens=False)
    for token in first:
        matcher.advance(token)
    again = TOKENIZER.encode('"age": 1, ', add_special_tokens=False)
    for token in again:
        matcher.advance(token)
    matcher.rollback(len(again))
    for token in TOKENIZER.encode('"age": 2}', add_special_tokens=False):
        matcher.advance(token)
    assert matcher.is_finished() or TOKENIZER.eos_token_id in matcher.allowed_token_ids()


def test_unsatisfiable_objects_are_still_refused_with_their_pointer():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": False,
              "minProperties": 2}
    with pytest.raises(SchemaError, match="unsatisfiable"):
        compiled(schema)


def test_an_unknown_order_is_refused():
    with pytest.raises(ValueError, match="property_order"):
        compile_json_schema(PERSON, TOKENIZER, property_order="sorted")


@pytest.mark.parametrize("schema", [
    {"const": {"a": 1, "b": [{"x": True, "y": None}]}},
    {"enum": [{"a": 1, "b": [{"x": True, "y": None}]}, 3]},
    {"type": "object", "properties": {"v": {"const": {"a": 1, "b": [{"x": True, "y": None}]}}}, "required": ["v"]},
])
def test_objects_an_enum_or_const_lists_take_their_members_in_any_order(schema):
    grammar = compiled(schema)
    inner = ['{"x": true, "y": null}', '{"y": null, "x": true}']
    values = [f'{{"a": 1, "b": [{i}]}}' for i in inner] + [f'{{"b": [{i}], "a": 1}}' for i in inner]
    wrap = (lambda v: f'{{"v": {v}}}') if "properties" in schema else (lambda v: v)
    assert all(accepts(grammar, TOKENIZER, wrap(v)) for v in values)
    for bad in ['{"a": 1}', '{"a": 1, "a": 1, "b": [{"x": true, "y": null}]}', '{"a": 2, "b": [{"x": true, "y": null}]}',
                '{"a": 1, "b": [{"x": true, "y": null}], "c": 1}', '{"a": 1, "b": [{"x": true}]}']:
        assert not accepts(grammar, TOKENIZER, wrap(bad)), bad


def test_unique_items_from_an_enum_of_objects_count_each_value_once_in_any_order():
    grammar = compiled({"type": "array", "items": {"enum": [{"a": 1, "b": 2}, {"c": 3}]}, "uniqueItems": True})
    assert accepts(grammar, TOKENIZER, '[{"b": 2, "a": 1}, {"c": 3}]')
    assert not accepts(grammar, TOKENIZER, '[{"a": 1, "b": 2}, {"b": 2, "a": 1}]')


def test_listed_objects_keep_draft_04s_integers_in_any_order():
    schema = {"$schema": "http://json-schema.org/draft-04/schema#", "properties": {"v": {"type": "integer"}},
              "enum": [{"v": 1, "w": 2}]}
    grammar = compiled(schema)
    assert accepts(grammar, TOKENIZER, '{"w": 2, "v": 1}') and not accepts(grammar, TOKENIZER, '{"v": 1.0, "w": 2}')

