"""Caps against runaway values: JsonSchemaOptions max_string_length, max_items and max_number_digits."""

from __future__ import annotations

import json
import random
import re

import jsonschema
import pytest

import leapgen
from leapgen.grammars import compile_json_schema
from leapgen.grammars.json_schema import MAX_LENGTH_CAP, JsonSchemaOptions
from test_grammars_json_schema import nest
from tokenizers_util import accepts, byte_level_bpe, random_walk

CAPS = {"max_string_length": 6, "max_items": 3, "max_number_digits": 4}
ANY_OBJECT = {"type": "object"}  # member values are the shared any-value rule


def reachable(schema, text: str, options: dict = CAPS) -> bool:
    """Whether the JSON `text` is accepted token by token when `schema` is compiled with `options`."""
    tokenizer = byte_level_bpe()
    return accepts(compile_json_schema(schema, tokenizer, **options), tokenizer, text)


# (a) within a cap reachable, (b) one past it not -----------------------------------------------------

@pytest.mark.parametrize("schema, within, past", [
    ({"type": "string"}, '"abcdef"', '"abcdefg"'),
    ({"type": "string"}, r'"a\nb\"cd"', r'"a\nb\"cde"'),  # an escape is one character
    ({"type": "string", "format": "email"}, '"a@b.cd"', '"ab@c.de"'),
    ({"type": "string", "pattern": "^[a-z]+$"}, '"abcdef"', '"abcdefg"'),
    ({"type": "string", "pattern": "b"}, '"abcdef"', '"abcdefg"'),
    ({"additionalProperties": {"type": "integer"}}, '{"abcdef": 1}', '{"abcdefg": 1}'),
    ({"patternProperties": {"^x": {}}, "additionalProperties": False}, '{"xbcdef": 1}', '{"xbcdefg": 1}'),
    (ANY_OBJECT, '{"k": "abcdef"}', '{"k": "abcdefg"}'),
    ({"type": "array"}, "[1, 2, 3]", "[1, 2, 3, 4]"),
    ({"type": "array", "prefixItems": [{"type": "integer"}]}, '[1, "a", "b"]', '[1, "a", "b", "c"]'),
    ({"items": {"enum": ["a", "b", "c", "d"]}, "uniqueItems": True}, '["a", "b", "c"]', '["a", "b", "c", "d"]'),
    (ANY_OBJECT, '{"k": [[1, 2, 3]]}', '{"k": [[1, 2, 3, 4]]}'),
    ({"type": "integer"}, "-9999", "-10000"),
    ({"type": "integer"}, "9.0000", "9.00000"),
    ({"type": "number"}, "12.3456", "12.34567"),
    ({"type": "number"}, "1.5e-9999", "1.5e-10000"),
    ({"type": "number", "minimum": 0}, "9999.5", "10000.5"),
    ({"type": "number", "minimum": 0, "maximum": 1}, "0.1234", "0.12345"),  # fraction digits stay capped
    ({"type": "integer", "multipleOf": 5}, "9995", "10000"),
    (ANY_OBJECT, '{"k": 1234.5678}', '{"k": 12345}'),
])
def test_values_within_the_cap_are_reachable_and_one_past_it_is_not(schema, within, past):
    assert reachable(schema, within)
    assert not reachable(schema, past)
    assert reachable(schema, past, {})  # without caps


# (c) the schema's own bounds win ------------------------------------------------------------------

@pytest.mark.parametrize("schema, reached, not_reached", [
    ({"type": "string", "maxLength": 3}, '"abc"', '"abcd"'),
    ({"type": "string", "maxLength": 10}, '"abcdefghij"', '"abcdefghijk"'),
    ({"type": "string", "pattern": "^[0-9]{2,4}$"}, '"1234"', '"12345"'),  # bounded within the cap: as is
    ({"type": "array", "maxItems": 2}, "[1, 2]", "[1, 2, 3]"),
    ({"type": "array", "maxItems": 5}, "[1, 2, 3, 4, 5]", "[1, 2, 3, 4, 5, 6]"),
    ({"type": "integer", "minimum": -10**8, "maximum": 10**8}, "-100000000", "100000001"),
    ({"type": "number", "minimum": 0, "maximum": 10**8}, "99999999.5", "100000000.5"),
    ({"enum": ["abcdefghij", 1]}, '"abcdefghij"', '"abcdefghi"'),  # enum and const values are not capped
    ({"const": 123456789.0123}, "123456789.0123", "123456789.012"),
    ({"const": [1, 2, 3, 4, 5]}, "[1, 2, 3, 4, 5]", "[1, 2, 3, 4]"),
])
def test_the_schemas_own_bounds_win(schema, reached, not_reached):
    assert reachable(schema, reached)
    assert not reachable(schema, not_reached)


# (d) what the schema requires stays reachable above the cap -------------------------------------

@pytest.mark.parametrize("schema, needed, past, caps", [
    ({"type": "string", "minLength": 9}, '"abcdefghi"', '"abcdefghij"', {}),
    ({"type": "string", "pattern": "^[0-9]{8,}$"}, '"12345678"', '"123456789"', {}),  # its shortest match
    ({"type": "string", "format": "uuid"}, '"123e4567-e89b-12d3-a456-426614174000"', '"abc"', {}),
    ({"propertyNames": {"minLength": 8}}, '{"abcdefgh": 1}', '{"abcdefghi": 1}', {}),
    ({"type": "array", "minItems": 5}, "[1, 2, 3, 4, 5]", "[1, 2, 3, 4, 5, 6]", {}),
    ({"type": "array", "prefixItems": [{}, {}, {}, {}, {}]}, "[1, 2, 3, 4, 5]", "[1, 2, 3, 4, 5, 6]", {}),
    ({"type": "integer", "minimum": 10**20}, str(10**20), str(10**21), {}),
    ({"type": "integer", "maximum": -10**20}, str(-10**20), str(-10**21), {}),
    ({"type": "integer", "exclusiveMinimum": 9999}, "10000", "100000", {}),
    ({"type": "integer", "minimum": 9999001, "multipleOf": 1000}, "10000000", "100000000", {}),
    ({"type": "number", "minimum": 0.000001}, "0.000001", "0.00000155", {}),
    ({"type": "number", "exclusiveMinimum": 0.1, "exclusiveMaximum": 0.2}, "0.15", "0.155", {"max_number_digits": 1}),
])
def test_what_the_schema_requires_stays_reachable_above_the_cap(schema, needed, past, caps):
    assert reachable(schema, needed, CAPS | caps)
    assert not reachable(schema, past, CAPS | caps)


# (e) random walks end, valid and within the caps -------------------------------------------------

# Every value here is bounded only by the caps (extra keys by maxProperties), so every walk must end.
WALKED = {
    "type": "object",
    "properties": {
        "name": {"type": "string"}, "email": {"type": "string", "format": "email"},
        "code": {"type": "string", "pattern": "^[A-Z]"}, "n": {"type": "integer", "minimum": 0},
        "x": {"type": "number"}, "tags": {"type": "array", "items": {"type": "string"}},
        "grid": {"type": "array", "items": {"type": "array", "items": {"type": "number"}}},
        "meta": {"type": "object", "additionalProperties": {"type": ["string", "integer"]}, "maxProperties": 2},
    },
    "required": ["name", "email", "n", "tags"],
    "additionalProperties": False,
}


def _number_literals(text: str) -> list[str]:
    """The number literals of a JSON text, as written."""
    found: list[str] = []
    json.loads(text, parse_int=lambda s: found.append(s) or int(s), parse_float=lambda s: found.append(s) or 0.0)
    return found


def _within_caps(value, caps: dict) -> bool:
    if isinstance(value, str):
        return len(value) <= caps["max_string_length"]
    if isinstance(value, list):
        return len(value) <= caps["max_items"] and all(_within_caps(v, caps) for v in value)
    if isinstance(value, dict):
        return all(_within_caps(k, caps) and _within_caps(v, caps) for k, v in value.items())
    return True


def _digits_within_cap(literal: str, cap: int) -> bool:
    """Whether each digit run of a number literal (integer part, fraction, exponent) has at most `cap` digits."""
    runs = re.fullmatch(r"-?([0-9]+)(?:\.([0-9]+))?(?:[eE][+-]?([0-9]+))?", literal).groups(default="")
    return all(len(run) <= cap for run in runs)


def test_random_walks_end_in_valid_instances_within_the_caps():
    tokenizer = byte_level_bpe()
    grammar = compile_json_schema(WALKED, tokenizer, **CAPS)
    rng = random.Random(12)
    for _ in range(12):
        text = random_walk(grammar.matcher(), grammar.vocabulary, rng, max_tokens=200, stop_prob=0.02)
        assert text is not None, "the caps bound the document, so every walk ends"
        value = json.loads(text)
        jsonschema.validate(value, WALKED, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
        assert _within_caps(value, CAPS), text
        assert all(_digits_within_cap(n, CAPS["max_number_digits"]) for n in _number_literals(text)), text


# limits and options -------------------------------------------------------------------------------

def nested_arrays(levels: int) -> dict:
    return nest(levels, lambda s: {"type": "array", "items": s})


def test_caps_hold_at_every_level_of_nested_arrays_and_are_left_off_past_the_budget():
    tokenizer = byte_level_bpe()
    # counted in base 8 (json_schema_arrays._tail_items), a cap of 64 takes a few dozen automaton nodes, not 64
    # copies of the item: 64**3 copies three levels down
    grammar = compile_json_schema(nested_arrays(3), tokenizer, max_items=64)
    assert accepts(grammar, tokenizer, json.dumps([[["a"]]] * 64))
    assert accepts(grammar, tokenizer, json.dumps([[["a"] * 64] * 64]))
    for over in ([[["a"]]] * 65, [[["a"]] * 65], [[["a"] * 65]]):
        assert not accepts(grammar, tokenizer, json.dumps(over))
    uncapped = compile_json_schema(nested_arrays(3), tokenizer).automaton.num_states
    assert grammar.automaton.num_states < uncapped + 3 * 100    # each capped level adds ~50 states
    many = {"type": "object", "properties": {f"p{i}": {"type": "array", "items": {"type": "integer", "minimum": -i}}
                                             for i in range(600)}}
    grammar = compile_json_schema(many, tokenizer, max_items=64)  # together past the budget: no item cap
    assert accepts(grammar, tokenizer, json.dumps({"p0": list(range(65))}))
    grammar = compile_json_schema({"type": "string", "format": "hostname"}, tokenizer, max_string_length=200)
    assert accepts(grammar, tokenizer, json.dumps("a" * 62 + ".b"))  # intersecting would cost too much


@pytest.mark.parametrize("name", ["max_string_length", "max_items", "max_number_digits"])
@pytest.mark.parametrize("value", [0, -1, True, 2.0, "8"])
def test_bad_cap_values_raise_naming_the_option(name, value):
    with pytest.raises(ValueError, match=name):
        compile_json_schema({"type": "string"}, byte_level_bpe(), **{name: value})


@pytest.mark.parametrize("name", ["max_string_length", "max_number_digits"])
def test_length_caps_have_a_ceiling(name):
    assert JsonSchemaOptions(**{name: MAX_LENGTH_CAP})
    with pytest.raises(ValueError, match=f"{name} must be at most {MAX_LENGTH_CAP}"):
        JsonSchemaOptions(**{name: MAX_LENGTH_CAP + 1})


def test_caps_reach_the_compiler_through_leapgen_json_schema():
    constraint = leapgen.JsonSchema({"type": "string"}, options={"max_string_length": 4})
    assert constraint.key() != leapgen.JsonSchema({"type": "string"}).key()
    grammar = constraint.compile(byte_level_bpe())
    assert accepts(grammar, byte_level_bpe(), '"abcd"') and not accepts(grammar, byte_level_bpe(), '"abcde"')


def test_no_caps_by_default():
    text = json.dumps({"a": ["x" * 300] * 20, "b": 10**40})
    assert reachable({"type": "object", "properties": {"a": {"type": "array"}}}, text, {})
