"""Checking outputs against a schema reads it as the compiler does: numbers exactly, patterns as ECMA-262 regexes.

A plain jsonschema check over json.loads divides floats (0.07 / 0.01 is 7.000000000000001) and runs Python's `re`;
leapgen's own checks (`is_valid`, extraction's status, the compiler's enum filter) would then refuse outputs the
compiler admits, or drop valid enum values."""

from __future__ import annotations

import json
from decimal import Decimal

import jsonschema
import pytest

from leapgen.constraints import Grammar, JsonSchema, Regex, is_valid
from leapgen.extraction import output_line
from leapgen.grammars import (LarkGrammarError, RegexError, SchemaError, UnsupportedSchemaError,
                              compile_json_schema)
from leapgen.grammars.json_validation import ExactNumber, exact_json, exact_value, is_multiple, schema_validator
from test_extract import fake_output
from tokenizers_util import accepts, byte_level_bpe

TOKENIZER = byte_level_bpe()

CASES = [   # schema, text, valid (JSON Schema's reading); * where jsonschema over json.loads reads it otherwise
    ({"type": "number", "multipleOf": 0.01}, "0.07", True),                     # *
    ({"type": "number", "multipleOf": 0.01}, "2.22", True),                     # *
    ({"type": "number", "multipleOf": 0.01}, "0.071", False),
    ({"type": "number", "multipleOf": 0.1}, "10.1", True),                      # *
    ({"type": "integer", "multipleOf": 7}, "21.0", True),
    ({"type": "number", "not": {"multipleOf": 0.01}}, "0.07", False),           # *
    ({"type": "number", "not": {"multipleOf": 0.01}}, "0.075", True),
    ({"type": "number", "exclusiveMaximum": 1}, "0.99999999999999999", True),   # *
    ({"type": "number", "maximum": 1}, "1.00000000000000001", False),           # *
    ({"not": {"const": 1}}, "1.00000000000000001", True),                       # *
    ({"const": 1}, "1.0", True),
    ({"type": "integer"}, "1.0", True),
    ({"type": "string", "pattern": "^\\s$"}, '"\ufeff"', True),      # * (ECMA's \s holds the BOM)
    ({"type": "string", "pattern": "^\\d$"}, '"\u0663"', False),     # * (ECMA's \d is ASCII digits)
    ({"type": "string", "pattern": "^a$"}, json.dumps("a\n"), False),          # * ($ is the very end)
    # the older spellings the compiler reads in any document (they raised or read `true` as 1 in a 2020-12 check)
    ({"type": "array", "items": [{"type": "integer"}], "additionalItems": False}, "[1]", True),
    ({"type": "array", "items": [{"type": "integer"}], "additionalItems": False}, "[1, 2]", False),
    ({"type": "number", "minimum": 0, "exclusiveMinimum": True}, "0.5", True),
    ({"type": "number", "minimum": 0, "exclusiveMinimum": True}, "0", False),
    ({"type": "number", "maximum": 100, "exclusiveMaximum": True}, "100.0", False),
    ({"type": "number", "exclusiveMaximum": False}, "0.5", True),
    ({"type": "object", "dependencies": {"a": ["b"]}}, '{"a": 1}', False),
    ({"$schema": "http://json-schema.org/draft-04/schema#", "type": "number", "exclusiveMinimum": 3}, "3", False),
    ({"$schema": "http://json-schema.org/draft-04/schema#", "type": "number", "minimum": 5, "exclusiveMinimum": 3},
     "5", True),                                                 # (draft-04's minimum took the number 3 for `true`)
    ({"type": "array", "items": True, "additionalItems": False}, "[1]", True),   # (raised on len(True))
    ({"enum": [0, 1, 2], "minimum": 0, "exclusiveMinimum": True}, "0", False),
    # the dialect as the compiler tells it (jsonschema's lookup read an https draft-07 URI as 2020-12)
    ({"$schema": "https://json-schema.org/draft-07/schema#", "properties": {"a": {"$ref": "#/definitions/s",
      "maxLength": 2}}, "definitions": {"s": {"type": "string"}}}, '{"a": "abc"}', True),
    ({"$schema": "https://json-schema.org/draft-04/schema", "type": "integer"}, "1.0", False),
    # draft-05 changed no keyword: read as draft-04 by both (the compiler read its integers and ids as draft-06's)
    ({"$schema": "http://json-schema.org/draft-05/schema#", "type": "integer"}, "1.0", False),
    ({"$schema": "http://json-schema.org/draft-05/schema#", "properties": {"t": {"$ref": "t.json"}},
      "definitions": {"T": {"id": "t.json", "type": "integer"}}}, '{"t": "a"}', False),
    # a subschema's own `$schema` read in the root's dialect, ids included (its `$id` was draft-04's `id` to
    # jsonschema's resolver, and the `$ref` to it unresolvable); a property named `$schema` is no keyword
    ({"properties": {"t": {"$ref": "t.json"}}, "$defs": {"T": {"$schema": "http://json-schema.org/draft-04/schema#",
      "$id": "t.json", "type": "integer"}}}, '{"t": "a"}', False),
    ({"properties": {"$schema": {"type": "string"}}, "additionalProperties": False}, '{"$schema": "x"}', True),
    # 2019-09's `$anchor` and `$defs` in a draft-07 or draft-04 document, as the compiler reads them (the check's
    # resolver knew neither: NoSuchAnchor, or a `$ref` to an `$id` under `$defs` unresolvable, out of is_valid)
    ({"$schema": "http://json-schema.org/draft-07/schema#", "$defs": {"a": {"$anchor": "x", "type": "string"}},
      "properties": {"p": {"$ref": "#x"}}}, '{"p": 1}', False),
    ({"$schema": "http://json-schema.org/draft-07/schema#", "$defs": {"b": {"$id": "b.json", "type": "integer"}},
      "properties": {"q": {"$ref": "b.json"}}}, '{"q": "a"}', False),
    ({"$schema": "http://json-schema.org/draft-04/schema#", "definitions": {"a": {"$anchor": "x", "type": "string"}},
      "properties": {"p": {"$ref": "#x"}}}, '{"p": "s"}', True),
]


@pytest.mark.parametrize("schema, text, valid", CASES)
def test_the_check_and_the_compiler_agree(schema, text, valid):
    assert is_valid(JsonSchema(schema), text) is valid
    assert accepts(compile_json_schema(schema, TOKENIZER), TOKENIZER, text) is valid


def test_plain_jsonschema_reads_the_starred_cases_otherwise():
    # what the cases marked * guard against: the check they would get without the exact reading
    def plain(schema, text):
        return jsonschema.Draft202012Validator(schema).is_valid(json.loads(text))
    assert not plain(*CASES[0][:2]) and not plain(*CASES[3][:2]) and plain(*CASES[5][:2])
    assert not plain(*CASES[7][:2]) and plain(*CASES[8][:2]) and not plain(*CASES[9][:2])


def test_enum_values_are_filtered_exactly():
    # the compiler filters enum values through its own check: 0.07 was dropped as no multiple of 0.01
    grammar = compile_json_schema({"enum": [0.07, 0.5, 0.075], "multipleOf": 0.01}, TOKENIZER)
    assert [accepts(grammar, TOKENIZER, text) for text in ("0.07", "0.5", "0.075")] == [True, True, False]


def test_an_extracted_price_is_ok():
    schema = {"type": "object", "properties": {"price": {"type": "number", "multipleOf": 0.01}},
              "required": ["price"]}
    ok = output_line("a", fake_output('{"price": 0.07}'), schema_validator(schema), speculating=False)
    assert ok["status"] == "ok" and ok["data"] == {"price": 0.07} and isinstance(ok["data"]["price"], float)
    bad = output_line("a", fake_output('{"price": 0.071}'), schema_validator(schema), speculating=False)
    assert bad["status"] == "error" and bad["error"] == \
        "does not match the schema at /price: 0.071 is not a multiple of 0.01"      # (no "Decimal('0.071')")


DRAFT_04, DRAFT_03 = "http://json-schema.org/draft-04/schema#", "http://json-schema.org/draft-03/schema#"
S2020 = "https://json-schema.org/draft/2020-12/schema"


def test_a_document_is_read_in_its_roots_dialect_throughout():
    # a subschema naming a dialect of its own got jsonschema's stock class: floats again, Python's `re`, and a
    # Decimal remainder past its precision that raised out of the extraction run
    nested = {"type": "object", "properties": {"p": {"$schema": S2020, "type": "number", "multipleOf": 0.01},
                                               "d": {"$schema": S2020, "type": "string", "pattern": "^\\d$"}}}
    validator = schema_validator(nested)
    assert validator.is_valid(exact_json('{"p": 12345678901234567890123456789.07}'))
    assert not validator.is_valid(exact_json('{"d": "\u0663"}'))
    grammar = compile_json_schema({"enum": [0.07, 0.5], "allOf": [{"$schema": S2020, "multipleOf": 0.01}]}, TOKENIZER)
    assert accepts(grammar, TOKENIZER, "0.07")
    divisible = {"$schema": DRAFT_03, "properties": {"p": {"type": "number", "divisibleBy": 0.01}}}
    line = output_line("a", fake_output('{"p": 12345678901234567890123456789.01}'), schema_validator(divisible),
                       speculating=False)
    assert line["status"] == "ok"
    pair = {"type": "object", "properties": {"at": {"type": "array", "items": [{"type": "number"}] * 2,
                                                     "additionalItems": False}}}
    line = output_line("a", fake_output('{"at": [48.85, 2.35]}'), schema_validator(pair), speculating=False)
    assert line["status"] == "ok"               # (draft-07's `items` array in a 2020-12 check raised out of the run)


def test_draft_04_integers_are_written_as_integers():
    schema = {"$schema": DRAFT_04, "type": "integer"}
    grammar = compile_json_schema(schema, TOKENIZER)
    for text, valid in (("3", True), ("3.0", False), ("3e0", False)):
        assert is_valid(JsonSchema(schema), text) is valid and accepts(grammar, TOKENIZER, text) is valid, text
    assert is_valid(JsonSchema({"type": "integer"}), "3e0") and is_valid(JsonSchema({"type": "integer"}), "3.00")


def test_formats_are_checked_by_is_valid_only():
    # JSON Schema leaves formats annotations; the compiler writes the ones it knows, and reads the others (an
    # idn-email) as any string: extraction's status does not hold them to jsonschema's checks
    schema = {"type": "string", "format": "idn-email"}
    assert output_line("a", fake_output('"n/a"'), schema_validator(schema), speculating=False)["status"] == "ok"
    assert not is_valid(JsonSchema(schema), '"n/a"')


def test_what_cannot_be_read_fails_its_record_alone():
    deep = "[" * 5000 + "]" * 5000
    line = output_line("a", fake_output(deep), schema_validator({}), speculating=False)
    assert line["status"] == "error" and "nested too deeply" in line["error"]
    with pytest.raises(ValueError, match="the text nests 5000 arrays and objects"):
        is_valid(JsonSchema({}), deep)
    nan = output_line("a", fake_output('{"x": NaN}'), schema_validator({}), speculating=False)
    assert nan["status"] == "error" and nan["error"] == "not valid JSON: NaN is not JSON"
    # a pattern only Python's `re` reads (the compiler refuses it): read by `re`, not an exception
    assert is_valid(JsonSchema({"pattern": "(?i)^a$"}), '"A"')


def test_a_malformed_schema_is_refused_by_is_valid_with_what_and_where():
    # jsonschema raised its own multi-line UnknownType, and read `properties: 3` and `minimum: "a"` as no constraint
    for schema, message in (({"type": "strin"}, r"unknown type 'strin' \(at /type\)"),
                            ({"properties": 3}, r"properties must be an object \(at /properties\)"),
                            ({"items": {"minimum": "a"}}, r"expected a number \(at /items/minimum\)")):
        with pytest.raises(SchemaError, match=message):
            is_valid(JsonSchema(schema), "1")
    # what the compiler cannot enforce, or what no value satisfies, is well-formed: the check answers
    unique_objects = {"type": "array", "items": {"type": "object"}, "uniqueItems": True}
    assert is_valid(JsonSchema(unique_objects), "[{}, {}]") is False
    # ...so is a value an enum filter cannot check against a $ref to another document
    remote = {"enum": [{"x": 1}], "properties": {"x": {"$ref": "https://example.com/x.json"}}}
    assert is_valid(JsonSchema(remote), '"a"') is False
    # a draft-03 document is the check's alone (the compiler does not read `type: "any"` or `required: true`)
    draft_03 = "http://json-schema.org/draft-03/schema#"
    assert is_valid(JsonSchema({"$schema": draft_03, "type": "any"}), "1")
    assert not is_valid(JsonSchema({"$schema": draft_03, "properties": {"a": {"required": True}}}), "{}")
    # the compiler's options count: `check_schema` holds the schema to its metaschema, as compiling it does
    with pytest.raises(SchemaError, match=r"metaschema: 3 is not of type 'string' \(at /title\)"):
        is_valid(JsonSchema({"type": "string", "title": 3}, options={"check_schema": True}), '"a"')
    assert is_valid(JsonSchema({"type": "string", "minLength": 3, "maxLength": 2}), '"ab"') is False


def test_is_valid_says_in_one_line_what_it_cannot_read():
    # each raised its own library's error (re.error, JSONDecodeError, lark's, AttributeError) or answered wrongly
    for spec, error, message in (
            (JsonSchema({"pattern": "^\\p{L}+$"}), UnsupportedSchemaError, r"pattern '\^.*' cannot be checked"),
            (JsonSchema('{"type": "integer"} and more'), SchemaError, "schema is not valid JSON: Extra data"),
            (Regex("(("), RegexError, "invalid regex: missing \\)"),
            (Grammar("start: foo"), LarkGrammarError, "invalid lark grammar: Rule 'foo' used but not defined"),
            (Grammar("start: /(/"), LarkGrammarError, "invalid lark grammar"),   # (its regex module's own error)
            (Grammar("start: X\n%import mine.X"), LarkGrammarError, "only lark's own grammars"),
            (JsonSchema({"$schema": "http://json-schema.org/draft-03/schema#", "properties": 3}), SchemaError,
             r"metaschema: 3 is not of type 'object' \(at /properties\)")):
        with pytest.raises(error, match=message):
            is_valid(spec, '"a"')
    assert is_valid(JsonSchema({"$id": 3, "type": "string"}), '"a"')    # an id that is no string names nothing
    deep: dict = {}
    for _ in range(3000):      # past json's encoder's recursion: the compiler's depth check names where
        deep = {"items": deep}
    with pytest.raises(UnsupportedSchemaError, match=r"nested deeper than 129 objects and arrays \(at /items/items"):
        is_valid(JsonSchema(deep), "1")


def test_a_text_too_deep_to_check_is_no_invalid_one():
    # jsonschema recurses per level: past Python's recursion limit (250 levels at its default) that read as "invalid"
    schema = JsonSchema({"type": "array", "items": {"$ref": "#"}})
    assert is_valid(schema, "[" * 100 + "]" * 100) and not is_valid(schema, "[" * 100 + "1" + "]" * 100)
    with pytest.raises(ValueError, match="too deep for jsonschema to check .*: the text nests 5000 arrays and objects"):
        is_valid(schema, "[" * 5000 + "]" * 5000)


def test_numbers_are_read_exactly():
    assert exact_json('[1, 1.0, 0.07, 1e2, 1.5e-3, -0]') == [1, 1, Decimal("0.07"), 100, Decimal("0.0015"), 0]
    assert [type(v) for v in exact_json("[1, 1.0]")] == [int, ExactNumber] and repr(exact_json("2.50")) == "2.50"
    assert exact_value({"a": [0.1, 2.0, True, "x"]}) == {"a": [Decimal("0.1"), 2, True, "x"]}
    assert exact_value(True) is True and exact_json("1e999999999999999999999") == float("inf")
    validator = schema_validator({"type": "number", "multipleOf": 0.5})
    assert not validator.is_valid(float("inf")) and validator.is_valid(exact_json("1e300000"))
    assert not validator.is_valid(exact_json("1e-300000")) and validator.is_valid(exact_json("25e-1"))
    assert is_multiple(Decimal("1e300000"), Decimal("0.05")) and not is_multiple(Decimal("1e300000"), Decimal("0.07"))
    assert is_multiple(Decimal("21e-300000"), Decimal("7e-300000")) and not is_multiple(Decimal("3e-300000"), 7)
