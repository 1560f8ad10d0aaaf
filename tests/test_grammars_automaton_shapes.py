"""Automata memoised by their grammar's shape: a grammar built like an earlier one takes its automaton, laid out
with its own terminals, and matches what its own compile would."""

import json
from pathlib import Path

import pytest
import tokenizers_util as tu

from leapgen.grammars import automaton, automaton_shapes, ir, regex
from leapgen.grammars.automaton import compile_automaton
from leapgen.grammars.automaton_shapes import grammar_shape, shaped_automaton
from leapgen.grammars.errors import GrammarError
from leapgen.grammars.json_schema import json_schema_to_grammar
from leapgen.grammars.matcher import CompiledGrammar
from leapgen.grammars.vocab import as_vocabulary
from test_grammars_matcher import _grammar_accepts

BFCL = Path(__file__).resolve().parents[2] / "shared" / "corpora" / "maskbench" / "BFCL_simple"


@pytest.fixture
def compiles(monkeypatch) -> list[ir.Grammar]:
    """The grammars compiled whole from here on (an empty memo of shapes, no outline seen)."""
    monkeypatch.setattr(automaton_shapes, "_SHAPES", {})
    monkeypatch.setattr(automaton_shapes, "_OUTLINES", {})
    whole = []

    def counted(grammar, walked=None):
        whole.append(grammar)
        return compile_automaton(grammar, walked)

    monkeypatch.setattr(automaton_shapes, "compile_automaton", counted)
    return whole


def _masks_along(compiled: automaton.Automaton, data: bytes) -> list[list[int]]:
    grammar = CompiledGrammar(compiled, as_vocabulary(tu.cl100k()))
    m, masks = grammar.matcher(), []
    for tid in [*grammar.vocabulary.encode(data), grammar.vocabulary.eos_ids[0]]:
        masks.append(m.allowed_token_ids().tolist())
        if tid not in masks[-1]:
            break
        m.advance(tid)
    return masks


def _kept(grammar: ir.Grammar) -> automaton.Automaton:
    """Compile `grammar` where its shape is kept: the first grammar of an outline is compiled without a look at its
    shape, the next is compiled and its shape kept."""
    shaped_automaton(grammar)
    return shaped_automaton(grammar)


def _eos() -> int:
    return as_vocabulary(tu.cl100k()).eos_ids[0]


def _call(name: str, arguments: dict) -> dict:
    return {"type": "object", "properties": {name: {"type": "object", "properties": arguments,
                                                    "required": list(arguments), "additionalProperties": False}},
            "required": [name], "additionalProperties": False}


def test_a_grammar_of_a_known_shape_takes_its_automaton_with_its_own_terminals(compiles):
    first = json_schema_to_grammar(_call("get_weather", {"city": {"type": "string"}, "days": {"type": "integer"}}))
    second = json_schema_to_grammar(_call("book", {"room": {"type": "string"}, "nights": {"type": "integer"}}))
    assert grammar_shape(first).key == grammar_shape(second).key
    _kept(first)
    taken = shaped_automaton(second)
    assert compiles == [first, first]
    own = compile_automaton(second)
    assert sorted(dfa.uid for _, dfa in taken.terminals) == sorted(dfa.uid for _, dfa in own.terminals)
    assert taken.num_states == own.num_states and len(taken.call_callee) == len(own.call_callee)
    for data in (b'{"book": {"room": "12b", "nights": 3}}', b'{"get_weather": {"city": "Oslo", "days": 3}}',
                 b'{"book": {"room": "12b"}}'):
        assert _masks_along(taken, data) == _masks_along(own, data), data
    assert _masks_along(taken, b'{"book": {"room": "12b", "nights": 3}}')[-1] == [_eos()]


def test_grammars_whose_terminals_coincide_otherwise_are_other_shapes(compiles):
    """Which members share a terminal is part of the shape: two integers are one DFA called twice, an integer and a
    string are two."""
    both = json_schema_to_grammar(_call("f", {"a": {"type": "integer"}, "b": {"type": "integer"}}))
    mixed = json_schema_to_grammar(_call("g", {"a": {"type": "integer"}, "b": {"type": "string"}}))
    assert grammar_shape(both).key != grammar_shape(mixed).key
    _kept(both)
    assert _masks_along(shaped_automaton(mixed), b'{"g": {"a": 1, "b": "x"}}')[-1] == [_eos()]
    assert len(compiles) == 3


def test_a_terminal_matching_the_empty_text_or_nothing_makes_another_shape(compiles):
    """What the compile asks of a terminal's language is part of the shape: a terminal that can be empty makes the
    same rule left-recursive, one that matches nothing has its calls trimmed away.  (The terminals sit in rules of
    their own, inlined, so that no rule is kept across grammars: `test_a_shape_whose_shared_rules...`.)"""

    def loop(terminal: str) -> ir.Grammar:
        rule = ir.Choice((ir.Seq((ir.Ref("t"), ir.Ref("r"))), ir.Lit(";")))
        return ir.Grammar({"t": ir.Terminal(terminal), "r": rule, "start": ir.Seq((ir.Lit("<"), ir.Ref("r")))},
                          "start")

    _kept(loop("a+"))
    with pytest.raises(GrammarError, match="left-recursive"):
        shaped_automaton(loop("b*"))

    def either(terminal: ir.Terminal) -> ir.Grammar:
        return ir.Grammar({"t": terminal, "start": ir.Choice((ir.Seq((ir.Ref("t"), ir.Lit("!"))), ir.Lit("?")))},
                          "start")

    _kept(either(ir.Terminal("x")))
    empty = either(ir.Terminal("y", excluding=("y",)))
    assert regex.terminal_dfa("y", (), ("y",)).matches_nothing
    taken, own = shaped_automaton(empty), compile_automaton(empty)
    assert len(compiles) == 6
    assert len(taken.call_callee) == len(own.call_callee) < len(compile_automaton(either(ir.Terminal("x"))).call_callee)


def test_terminals_past_the_budget_are_refused_as_their_compile_refuses_them(compiles, monkeypatch):
    monkeypatch.setattr(automaton, "MAX_TERMINAL_STATES", 30)
    monkeypatch.setattr(automaton_shapes, "MAX_TERMINAL_STATES", 30)
    _kept(ir.Grammar({"start": ir.Seq((ir.Lit("ab"), ir.Terminal("[0-9]+")))}, "start"))
    with pytest.raises(GrammarError, match="more than 30 automaton states"):
        shaped_automaton(ir.Grammar({"start": ir.Seq((ir.Lit("x" * 40), ir.Terminal("[0-9]+")))}, "start"))
    assert len(compiles) == 3


def test_a_shape_whose_shared_rules_call_dfas_made_again_is_compiled_again(compiles):
    """An object taking extra keys calls any JSON value's rule, which reads the same in every grammar holding it
    (`Automaton.portable`): once the terminal memo has made its terminals again, the next grammar of the shape is
    compiled over the new DFAs (its shared rules' keys name the DFAs they call) and kept in place of the first."""
    schema = {"type": "object", "properties": {"name": {"type": "string"}}}
    first = _kept(json_schema_to_grammar(schema))
    assert first.portable
    for memo in (regex.regex_dfa, regex.terminal_dfa, regex.literal_dfa, regex.literals_dfa):
        memo.cache_clear()
    again = shaped_automaton(json_schema_to_grammar(schema))
    assert len(compiles) == 3 and again.portable
    assert shaped_automaton(json_schema_to_grammar(schema)).portable == again.portable
    assert len(compiles) == 3
    now = {dfa.uid for dfa in grammar_shape(json_schema_to_grammar(schema)).slots}    # what the memo holds now
    assert {dfa.uid for _, dfa in again.terminals} <= now
    assert not {dfa.uid for _, dfa in first.terminals} <= now


def test_grammars_with_captured_terminals_or_many_rules_are_compiled_whole(compiles):
    unique = json_schema_to_grammar({"type": "array", "items": {"type": "string"}, "uniqueItems": True})
    large = ir.Grammar({f"r{k}": ir.Seq((ir.Lit(f"{k}"), ir.Ref(f"r{k + 1}"))) for k in range(30)}
                       | {"r30": ir.Lit("."), "start": ir.Ref("r0")}, "start")
    for grammar in (unique, large):
        for _ in range(3):
            shaped_automaton(grammar)
    assert len(compiles) == 6 and not automaton_shapes._SHAPES


@pytest.mark.skipif(not BFCL.is_dir(), reason=f"maskbench corpus not found at {BFCL}")
def test_function_call_schemas_taken_by_shape_mask_as_their_own_compile(compiles):
    """The BFCL function schemas (many share a shape): along every test instance, each mask of the automaton taken
    by shape is that of the grammar's own compile, to the end."""
    taken = 0
    for path in sorted(BFCL.glob("*.json"))[:100]:
        doc = json.loads(path.read_text())
        grammar = json_schema_to_grammar(doc["schema"])
        before = len(compiles)
        shaped = shaped_automaton(grammar)
        taken += len(compiles) == before
        own = compile_automaton(json_schema_to_grammar(doc["schema"]))
        assert shaped.num_states == own.num_states
        for case in doc["tests"]:
            data = json.dumps(case["data"], ensure_ascii=False).encode()
            assert _masks_along(shaped, data) == _masks_along(own, data), (path.name, data)
    assert taken >= 30, taken


def test_a_grammar_of_a_new_outline_is_compiled_without_a_look_at_its_shape(compiles, monkeypatch):
    """A grammar whose outline (rules' kinds, start) no grammar had lately is compiled whole, its shape not walked
    (most new shapes never come again); the next grammar of the outline is walked and its shape kept, so the one
    after takes it."""
    walked = []
    monkeypatch.setattr(automaton_shapes, "grammar_shape",
                        lambda grammar: walked.append(grammar) or grammar_shape(grammar))
    grammars = [json_schema_to_grammar(_call(name, {"x": {"type": "integer"}})) for name in ("f", "g", "h")]
    for grammar in grammars:
        shaped_automaton(grammar)
    assert walked == grammars[1:] and compiles == grammars[:2]
    other = json_schema_to_grammar({"type": "array", "items": {"type": "integer"}})
    assert automaton_shapes.outline(other) != automaton_shapes.outline(grammars[0])
    shaped_automaton(other)
    assert walked == grammars[1:] and compiles == [*grammars[:2], other]


def _accepts(compiled: automaton.Automaton, text: str) -> bool:
    return _grammar_accepts(CompiledGrammar(compiled, as_vocabulary(tu.byte_level_bpe())), text)


def test_an_empty_text_between_an_objects_members_is_not_a_slot_of_another_terminal(compiles):
    """An empty literal as an object's separator is a terminal the compile lays out, while in a sequence it calls
    nothing: its DFA is also a choice's of empty texts, which has a slot, so a second grammar would have laid its own
    terminal of that slot out as the separator.  Such grammars are compiled whole."""

    def grammar(texts: tuple[str, ...]) -> ir.Grammar:
        return ir.Grammar({"start": ir.Seq((ir.Lit("s"), ir.Ref("obj"), ir.Choice(tuple(map(ir.Lit, texts))))),
                           "obj": ir.Members(ir.Lit("{"), (ir.Lit("a"), ir.Lit("b")), ir.Lit(""), ir.Lit("}"))},
                          "start")

    _kept(grammar(("", "")))
    second = grammar(("", "q"))
    assert grammar_shape(second) is None
    taken = shaped_automaton(second)
    assert not _accepts(taken, "s{aqb}") and _accepts(taken, "s{ab}q")


def test_equal_terminals_are_one_slot_though_the_memo_made_their_dfa_again_between_them(compiles):
    """Two equal literals with 600 other terminals between them: the terminal memo (512 kept) makes the first one's
    DFA again by the time the walk meets the second, while the compile takes one DFA for equal terminals.  The walk
    takes them as the compile does, so a grammar with two different literals there is another shape."""

    def grammar(first: str, last: str, tag: str) -> ir.Grammar:
        many = ir.Choice(tuple(ir.Lit(f"{tag}{i}_") for i in range(600)) + (ir.Terminal("[0-9]"),))
        return ir.Grammar({"e": ir.Lit("e"), "start": ir.Seq((ir.Lit(first), many, ir.Ref("e"), ir.Lit(last)))},
                          "start")

    shape = grammar_shape(grammar("k", "k", "x"))
    assert len(shape.slots) == 603      # "k" once, the 600 literals, the digit, "e"
    _kept(grammar("k", "k", "y"))
    other = grammar("a", "b", "z")
    assert grammar_shape(other).key != shape.key
    taken = shaped_automaton(other)
    assert _accepts(taken, "a3eb") and not _accepts(taken, "b3eb")


def test_what_the_compile_refuses_the_walk_leaves_to_it(compiles):
    """Bad bounds on a terminal's repetition are refused as the compile refuses them, not taken by shape; a terminal
    past the automaton budget in a rule nothing calls is the compile's to judge (it never builds it)."""

    def grammar(inner: ir.Expr) -> ir.Grammar:
        return ir.Grammar({"start": ir.Seq((ir.Lit("x"), ir.Seq((inner,))))}, "start")

    _kept(grammar(ir.Lit("b")))
    with pytest.raises(GrammarError, match="bad repetition bounds 2..1"):
        shaped_automaton(grammar(ir.Repeat(ir.Lit("a"), 2, 1)))
    big = ir.Repeat(ir.Terminal("a{0,13000}"), 16, 16)
    unused = ir.Grammar({"unused": ir.Seq((ir.Lit("u"), big)), "start": ir.Lit("x")}, "start")
    for _ in range(2):
        assert _accepts(shaped_automaton(unused), "x")
    with pytest.raises(GrammarError, match="grammar too large to compile"):
        _kept(ir.Grammar({"start": ir.Seq((ir.Lit("u"), big))}, "start"))
