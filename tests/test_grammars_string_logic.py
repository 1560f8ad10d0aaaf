"""String schemas whose not/anyOf/oneOf/if nest compile to one terminal: checked against jsonschema on random
strings, token by token, and against the distributing compiler they replace."""

from __future__ import annotations

import json
import random

import jsonschema
import pytest

from leapgen.grammars import UnsupportedSchemaError, compile_json_schema
from leapgen.grammars.automaton import terminal_for
from leapgen.grammars.ir import Terminal
from leapgen.grammars.json_schema import json_schema_to_grammar
from leapgen.grammars import json_schema_string_logic
from leapgen.grammars.json_schema_string_logic import Strings
from leapgen.grammars.regex import dfa_fullmatch
from tokenizers_util import accepts, byte_level_bpe


def _none_of(*schemas):
    return {"not": {"anyOf": list(schemas)}}


# Handwritten's allany14 in small: two conjuncts, each a not over three nots over three patterns (27 alternatives
# each, 729 together, distributed); `\w` spelled out, as ECMA's is ASCII and Python's (jsonschema's) is not
NESTED_NOTS = {
    "type": "string", "minLength": 3, "maxLength": 12,
    "allOf": [{"$ref": "#/$defs/n1"}, {"$ref": "#/$defs/n2"}, {"pattern": "[aA][12]"}],
    "$defs": {
        "n1": _none_of({"$ref": "#/$defs/a"}, {"$ref": "#/$defs/b"}, {"$ref": "#/$defs/c"}),
        "n2": _none_of({"$ref": "#/$defs/d"}, {"$ref": "#/$defs/e"}, {"$ref": "#/$defs/f"}),
        "a": _none_of({"pattern": "^...$"}, {"pattern": "ab"}, {"pattern": "b1"}),
        "b": _none_of({"pattern": "^...$"}, {"pattern": "bc"}, {"pattern": "c1"}),
        "c": _none_of({"pattern": "^...$"}, {"pattern": "ca"}, {"pattern": "a2"}),
        "d": _none_of({"pattern": r"^[A-Za-z0-9_]*$"}, {"pattern": r"\d\d"}, {"pattern": "[a|b]"}),
        "e": _none_of({"pattern": r"^[A-Za-z0-9_]*$"}, {"pattern": r"\d\d"}, {"pattern": "[b|c]"}),
        "f": _none_of({"pattern": r"^[A-Za-z0-9_]*$"}, {"pattern": r"\d\d"}, {"pattern": "[c|a]"}),
    },
}
# every combinator the formula reads, enums, types, lengths and escapes among them
MIXED = {
    "type": "string",
    "oneOf": [{"pattern": "a"}, {"pattern": "b"}, {"maxLength": 3}, {"enum": ["xyz", "ab", 'q"\\', 7]},
              {"type": "integer"}],
    "not": {"anyOf": [{"if": {"pattern": "^c"}, "then": {"minLength": 5}, "else": {"pattern": "1$"}},
                      {"allOf": [{"pattern": "z"}, {"not": {"pattern": "zz"}}]}]},
    "anyOf": [{"pattern": "[xq]"}, {"minLength": 6}, {"enum": ["ab"]}],
}
# (two different negations: two equal ones are one conjunct, whose few alternatives distribute instead)
FORMAT_KEPT = {"type": "string", "anyOf": [{"format": "date"}, {"pattern": "^x"}],
               "allOf": [_none_of(_none_of({"pattern": "1"}, {"pattern": "2"}), _none_of({"pattern": "0"}),
                                  _none_of({"pattern": "x"}, {"pattern": "4"}, {"pattern": "-0"})),
                         _none_of(_none_of({"pattern": "1"}, {"pattern": "2"}), _none_of({"pattern": "0"}),
                                  _none_of({"pattern": "x"}, {"pattern": "3"}, {"pattern": "-0"}))]}
# single characters (no newline: Python's `$` matches before one, ECMA's does not), and the words the patterns
# above look for (random characters alone rarely spell them)
_PIECES = [*"aAbcxyzq12340-\"\\\té", "ab", "b1", "bc", "c1", "ca", "a2", "a1", "A2", "12", "zz", "2024-01-05"]


def _random_strings(rng: random.Random, count: int) -> list[str]:
    out = ["x1", "ab", "xyz", 'q"\\', "cde1x", "c1234", "xa1", "x10", "2024-01-05", "2020-02-30", "2031-10-04"]
    while len(out) < count:
        out.append("".join(rng.choice(_PIECES) for _ in range(rng.randrange(0, 8))))
    return out


def _formula_terminal(schema) -> Terminal:
    grammar = json_schema_to_grammar(schema)
    start = grammar.rules[grammar.start]
    assert isinstance(start, Terminal) and any(isinstance(a, Strings) for a in start.also), start
    return start


@pytest.mark.parametrize("schema", [NESTED_NOTS, MIXED, FORMAT_KEPT], ids=["nested-nots", "mixed", "format"])
def test_the_formula_admits_exactly_what_jsonschema_accepts(schema):
    dfa = terminal_for(_formula_terminal(schema))
    validator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    strings = _random_strings(random.Random(7), 4000)
    verdicts = [(s, dfa_fullmatch(dfa, json.dumps(s, ensure_ascii=False).encode()), validator.is_valid(s))
                for s in strings]
    wrong = [(s, ours) for s, ours, truth in verdicts if ours != truth]
    assert not wrong, wrong[:5]
    assert sum(truth for _, _, truth in verdicts) >= 20   # the sample reaches both sides


def test_a_formula_is_walked_token_by_token():
    tokenizer = byte_level_bpe()
    compiled = compile_json_schema(NESTED_NOTS, tokenizer)
    validator = jsonschema.Draft202012Validator(NESTED_NOTS)
    strings = _random_strings(random.Random(3), 600)
    for s in strings:
        assert accepts(compiled, tokenizer, json.dumps(s, ensure_ascii=False)) == validator.is_valid(s), s


@pytest.mark.parametrize("schema", [
    {"type": "string", "anyOf": [{"pattern": "^a"}, {"not": {"pattern": "b"}}]},
    {"type": "string", "oneOf": [{"const": f"v{i}"} for i in range(40)]},                 # a choice of literals
    {"type": "string", "not": {"anyOf": [{"pattern": f"{i}"} for i in range(40)]}},       # one exclusion
    {"type": "string", "allOf": [{"anyOf": [{"pattern": "a"}, {"pattern": "b"}]}] * 5},   # 32, none negated
    {"type": ["string", "null"], "allOf": [NESTED_NOTS["allOf"][0]], "$defs": NESTED_NOTS["$defs"]},  # a null too
], ids=["few", "oneof-literals", "negated-choice", "no-negation", "not-only-strings"])
def test_what_distributes_well_stays_distributed(schema):
    grammar = json_schema_to_grammar(schema)
    assert not any(isinstance(rule, Terminal) and any(isinstance(a, Strings) for a in rule.also)
                   for rule in grammar.rules.values())


def test_a_negated_format_leaves_the_formula_to_the_distributing_compiler():
    schema = {"type": "string", "allOf": [_none_of(_none_of({"pattern": "1"}, {"pattern": "2"}),
                                                   _none_of({"format": "date"}, {"pattern": "3"}))] * 5}
    # (a format's regex admits a subset of the format: its complement would admit some dates)
    grammar = json_schema_to_grammar(schema)
    assert not any(isinstance(rule, Terminal) and any(isinstance(a, Strings) for a in rule.also)
                   for rule in grammar.rules.values())
    # distributed: 4^5 conjunctions, of a few distinct ones (the five conjuncts are one schema at five places)
    tokenizer = byte_level_bpe()
    compiled = compile_json_schema(schema, tokenizer)
    validator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    strings = _random_strings(random.Random(5), 300) + ["2024-02-29", "2023-02-29", "12024-01-01", "1", "2", "3", "13"]
    for s in strings:
        assert accepts(compiled, tokenizer, json.dumps(s, ensure_ascii=False)) == validator.is_valid(s), s


def test_a_ref_cycle_through_not_ends_at_the_nesting_bound():
    schema = {"type": "string", "$defs": {"x": {"not": {"anyOf": [{"$ref": "#/$defs/x"}, {"pattern": "a"}]}}},
              "anyOf": [{"$ref": "#/$defs/x"}] + [{"pattern": c} for c in "bcdefghijklmnopq"]}
    with pytest.raises(Exception) as caught:    # whatever the distributing compiler says of it, it says it soon
        json_schema_to_grammar(schema)
    assert isinstance(caught.value, (UnsupportedSchemaError, RecursionError)) or "cycle" in str(caught.value)


def _shared_nesting(depth: int) -> dict:
    """Each level refers to the one below twice, once negated: a tree of 2**depth paths over depth + 1 schemas."""
    defs = {"d0": {"pattern": "a"}}
    for i in range(1, depth + 1):
        defs[f"d{i}"] = {"anyOf": [{"allOf": [{"$ref": f"#/$defs/d{i - 1}"}, {"pattern": f"{i % 10}"}]},
                                   {"not": {"$ref": f"#/$defs/d{i - 1}"}, "minLength": i % 4}]}
    return {"type": "string", "$defs": defs,
            "allOf": [{"$ref": f"#/$defs/d{depth}"}, {"not": {"anyOf": [{"pattern": "x"}, {"pattern": "y"}]}}]}


def test_a_formula_sharing_its_subschemas_is_read_and_built_once_per_node():
    # walked as a tree this takes 2**40 steps; read as the graph it is, a node per subschema
    start = _formula_terminal(_shared_nesting(40))
    formula = next(a for a in start.also if isinstance(a, Strings))
    nodes, todo = set(), [formula]
    while todo:
        item = todo.pop()
        if isinstance(item, Strings) and id(item) not in nodes:
            nodes.add(id(item))
            todo += item.items
    assert len(nodes) <= 4 * 40
    assert terminal_for(start).num_states > 1


def test_a_formula_past_its_work_budget_is_refused_with_its_pointer(monkeypatch):
    monkeypatch.setattr(json_schema_string_logic, "_MAX_FORMULA_WORK", 50)
    json_schema_string_logic._formula_dfa.cache_clear()
    schema = {**NESTED_NOTS, "maxLength": 11}
    with pytest.raises(UnsupportedSchemaError, match=r"string keywords under not/anyOf/oneOf/if together cannot be "
                                                     r"enforced exactly within 50 automaton states built \(at /\)"):
        compile_json_schema(schema, byte_level_bpe())
