"""Shared terminal automata: reuse across grammars, and structure that must not blow up token walks."""

import json

import jsonschema
import numpy as np
import tokenizers_util as tu
from tokenizers_util import accepts

from leapgen.grammars import compile_json_schema, compile_lark, ir
from leapgen.grammars.automaton import compile_automaton
from leapgen.grammars.regex import regex_dfa


def test_equal_terminals_are_one_dfa_in_every_grammar():
    # token walks are cached per terminal DFA object, so equal terminals must be the same object
    a = compile_automaton(ir.Grammar({"start": ir.Seq((ir.Lit("x="), ir.Terminal("[0-9]+")))}))
    b = compile_automaton(ir.Grammar({"start": ir.Choice((ir.Terminal("[0-9]+"), ir.Lit("none")))}))
    digits_a = [dfa for _, dfa in a.terminals if dfa.num_states == 2]
    digits_b = [dfa for _, dfa in b.terminals if dfa.num_states == 2]
    assert digits_a and digits_a[0] is digits_b[0]


def test_terminal_states_with_equal_futures_have_equal_signatures():
    a = compile_automaton(ir.Grammar({"start": ir.Terminal(r'x"[^"]*"')}))
    b = compile_automaton(ir.Grammar({"start": ir.Terminal(r'"[^"]*"')}))
    (_, dfa_a), (_, dfa_b) = a.terminals[0], b.terminals[0]

    def after(dfa, text: bytes) -> int:
        s = 0
        for byte in text:
            s = int(dfa.trans[s, byte])
        return s

    assert dfa_a.signature(after(dfa_a, b'x"yz')) == dfa_b.signature(after(dfa_b, b'"y'))
    assert dfa_a.signature(after(dfa_a, b"x")) != dfa_b.signature(after(dfa_b, b'"'))


def test_signatures_follow_byte_ranges_targets_and_acceptance():
    # a signature lists each reachable state's byte ranges: equal for equal minimal automata however they were
    # written, apart where a range's bounds, where it leads or whether a state accepts differ
    def signature(pattern: str) -> bytes:
        return regex_dfa(pattern).signature(0)

    assert signature("a[bc]") == signature("ab|ac")
    assert signature('"[a-y]*"') != signature('"[a-z]*"')
    assert signature("a[bc]d") != signature("a[bc]e")
    assert signature("a[bc]") != signature("a[bc]?")
    # a few bytes per range, not a row of 256 targets per state (whole rows: 11 KB for a JSON string's automaton)
    string = regex_dfa(r'"(?:[^"\\\x00-\x1f]|\\["\\/bfnrt])*"')
    assert len(string.signature(0)) * 10 < string.num_states * 256 * 4


def test_masks_inside_strings_do_not_leak_between_grammars():
    # the second grammar reuses the first one's walks inside its string; the key exclusions differ
    tok = tu.cl100k()
    closed = {"type": "object", "properties": {"name": {"type": "string"}},
              "additionalProperties": {"type": "integer"}}
    other = {"type": "object", "properties": {"title": {"type": "string"}},
             "additionalProperties": {"type": "integer"}}
    g1, g2 = compile_json_schema(closed, tok), compile_json_schema(other, tok)
    for schema, grammar in ((closed, g1), (other, g2)):
        for instance in ({"name": "a b"}, {"title": "c"}, {"name": 1}, {"title": 2}, {"x": 3}, {"x": "y"}):
            valid = jsonschema.Draft202012Validator(schema).is_valid(instance)
            assert accepts(grammar, tok, json.dumps(instance)) == valid, (schema, instance)


def test_ignored_whitespace_loops_stay_cheap_on_long_space_tokens():
    # `%ignore WS` repeats a terminal that may end after any space: as a call loop every split of a
    # run of spaces would be a separate walk; as one terminal it is a single walk
    grammar = compile_lark('start: "[" NUMBER ("," NUMBER)* "]"\n%import common.NUMBER\n'
                           "%import common.WS\n%ignore WS\n", tu.cl100k())
    tok = tu.cl100k()
    text = "[1," + " " * 40 + "2 ,\n" + " " * 17 + "3]"
    assert accepts(grammar, tok, text)
    assert not accepts(grammar, tok, "[1," + " " * 40 + "]")
    ids = grammar.matcher().allowed_token_ids()
    assert len(ids) and np.all(np.diff(ids) > 0)


def test_terminal_states_follow_every_structural_state():
    """Masks tell a terminal state by `state >= first_terminal`: every state from there on is a terminal's, none
    before it, in grammars from a schema (objects, captures), a lark grammar and an IR with a lone terminal."""
    grammars = [
        compile_json_schema({"type": "object", "properties": {"a": {"type": "array", "items": {"type": "string"},
                                                                   "uniqueItems": True}},
                             "minProperties": 2, "additionalProperties": {"type": "integer"}}, tu.byte_level_bpe()),
        compile_lark('start: "(" item ("," item)* ")"\nitem: /[a-z]+/ | start', tu.byte_level_bpe()),
    ]
    automata = [g.automaton for g in grammars] + [compile_automaton(ir.Grammar({"start": ir.Terminal("[0-9]+")}))]
    for a in automata:
        assert 0 < a.first_terminal < a.num_states
        assert [a.terminal_of(s) is not None for s in range(a.num_states)] == [
            s >= a.first_terminal for s in range(a.num_states)]
