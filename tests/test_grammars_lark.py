"""Lark grammars: differential tests against lark's own Earley parser."""

import random

import pytest
import tokenizers_util as tu
from lark import Lark
from lark.exceptions import LarkError

from leapgen.grammars import compile_lark
from leapgen.grammars.errors import LarkGrammarError
from leapgen.grammars.lark_grammar import MAX_NESTING
from leapgen.grammars.regex import MAX_GROUP_DEPTH

JSON = r"""
?start: value
?value: object | array | string | SIGNED_NUMBER -> number | "true" | "false" | "null"
array  : "[" [value ("," value)*] "]"
object : "{" [pair ("," pair)*] "}"
pair   : string ":" value
string : ESCAPED_STRING
%import common.ESCAPED_STRING
%import common.SIGNED_NUMBER
%import common.WS
%ignore WS
"""
ARITH = r"""
?start: sum
?sum: product | sum ("+"|"-") product
?product: atom | product ("*"|"/") atom
?atom: NUMBER | "(" sum ")" | NAME | "-" atom
NUMBER: /[0-9]+(\.[0-9]+)?/
NAME: /[a-z_]\w*/
%ignore " "
"""
REPEATS = r"""
start: "a"~2..3 ("b" | "c")* "d"? item+ _end
item: ITEM | "<" start ">"
ITEM: /x[0-9]/i
_end: "!"
"""
MUTATION_CHARS = {"json": '{}[],:" 1-e.tnx\\', "arith": "+-*/() 1.a_", "repeats": "abcdxX1<>!"}
GRAMMARS = {"json": JSON, "arith": ARITH, "repeats": REPEATS}


def _lark_accepts(parser, text):
    try:
        parser.parse(text)
        return True
    except LarkError:
        return False


def _accepts(g, text):
    state = g.step(g.initial, text.encode("utf-8"))
    return state is not None and g.closure(state)[1]


def _mutate(rng, text, chars):
    pos = rng.randint(0, len(text))
    op = rng.choice("dir")
    if op == "d" and text:
        pos = min(pos, len(text) - 1)
        return text[:pos] + text[pos + 1 :]
    c = rng.choice(chars)
    return text[:pos] + c + text[pos + (op == "r") :]


@pytest.mark.parametrize("name", sorted(GRAMMARS))
def test_generated_strings_parse_with_lark_and_mutants_agree(name):
    tok = tu.byte_level_bpe()
    g = compile_lark(GRAMMARS[name], tok)
    parser = Lark(GRAMMARS[name], parser="earley", lexer="dynamic_complete")
    rng = random.Random(name)
    texts = []
    for _ in range(25):
        data = tu.random_walk(g.matcher(), g.vocabulary, rng, max_tokens=25, stop_prob=0.4)
        if data is not None:
            texts.append(data.decode("utf-8"))
    assert len(texts) >= 10
    for text in texts:
        assert _lark_accepts(parser, text), text
        for _ in range(6):
            mutant = _mutate(rng, text, MUTATION_CHARS[name])
            ours, theirs = _accepts(g, mutant), _lark_accepts(parser, mutant)
            if name == "json" and theirs and not ours:
                # lark's ESCAPED_STRING (as a whole-string regex) also admits unescaped inner quotes
                assert mutant.count('"') > 2 * mutant.count(":") + 2 or '\\"' in mutant, mutant
                continue
            assert ours == theirs, mutant


def test_hand_written_cases():
    tok = tu.byte_level_bpe()
    g = compile_lark(ARITH, tok)
    for text, ok in [("1+2*3", True), ("(a - b) / -4.5", True), ("1+", False), ("((1)", False), (" 1 ", True)]:
        assert _accepts(g, text) == ok, text
    j = compile_lark(JSON, tok)
    for text, ok in [('{"a": [1, 2.5e3, true, null, {}]}', True), ('{"a" 1}', False), ('["\\"q"]', True)]:
        assert _accepts(j, text) == ok, text


def test_escaped_string_inlined_into_a_larger_terminal():
    """lark writes an imported terminal's regex into the terminal using it; its ESCAPED_STRING (a lookbehind) is
    read as the equivalent regex there too, where it was refused as a negative lookbehind the user never wrote."""
    tok = tu.byte_level_bpe()
    value = compile_lark("start: VALUE\nVALUE: INT | ESCAPED_STRING\n%import common.INT\n%import common.ESCAPED_STRING",
                         tok)
    pair = compile_lark('start: KV\nKV: "k=" ESCAPED_STRING\n%import common.ESCAPED_STRING', tok)
    for g, text, ok in [(value, "12", True), (value, '"a\\"b"', True), (value, '"a\nb"', False), (value, "k", False),
                        (pair, 'k="x y"', True), (pair, 'k="x', False), (pair, "k=12", False)]:
        assert _accepts(g, text) == ok, text


def test_matcher_on_cl100k_reaches_a_json_document():
    tok = tu.cl100k()
    g = compile_lark(JSON, tok)
    m = g.matcher()
    for tid in g.vocabulary.encode(b'{"key": [1, "two", {"three": false}]}'):
        m.advance(tid)
    assert tok.eos_token_id in m.allowed_token_ids()


@pytest.mark.parametrize(
    "text, message, line",
    [
        ("", "empty", None),
        ("// only a comment\n", "empty", None),
        ("start: a\na: b\n", "undefined rule", 2),
        ('start: "x" FOO\n', "FOO", 1),
        ('start: "a"\n  | :\n', "invalid lark grammar", 2),
        ("start: A\nA: /a(?=b)/\n", "lookahead", 2),
        ("start: a\na: b \"x\"\nb: a | \"y\"\n", "left-recursive", None),
        ('start: "x"\n  | ' + "(" * 200 + '"a"' + ")" * 200, f"brackets nested deeper than {MAX_NESTING}", 2),
        ("start: A\nA: /" + "(" * 200 + "a" + ")" * 200 + "/\n", f"groups nested deeper than {MAX_GROUP_DEPTH}", 2),
        ("start: X\n%import .other.X\n", r"%import .other.X: only lark's own grammars", 2),   # would read a file
        ("start: X\n\n%import os.X\n", r"%import os.X: only lark's own grammars", 3),
        ("start: X\r\n%import .other.X\r\n", r"%import .other.X", 2),   # as lark's lexer reads lines too
        ("start: X\n\x0c%import\\\n .other.X\n", r"%import .other.X", 2),
        ("start: X\n%import.other.X\n", r"%import .other.X", 2),
        ("start: X\n%import common.other.X\n", r"%import common.other.X", 2),    # a file common/other.lark
        ("start: X\n%import common . other . X\n", r"%import common.other.X", 2),
        # lark compiles every /regexp/ with the regex module, whose errors are no LarkError
        ("start: /a/l\n", r"invalid regular expression /a/l: unknown flag 'l'", 1),
        ("start: A\n// a comment\nA: /(a/\n", r"invalid regular expression /\(a/: missing \)", 3),
        ("start: A\nA: /[z-a]/i\n", r"invalid regular expression /\[z-a\]/i: bad character range", 2),
        ('start: "x" /a{2,1}/\n', r"/a\{2,1\}/: min repeat greater than max repeat", 1),
    ],
)
def test_bad_grammars(text, message, line):
    with pytest.raises(LarkGrammarError, match=message) as info:
        compile_lark(text, tu.byte_level_bpe())
    if line is not None:
        assert info.value.line == line


def test_nesting_at_the_limit_compiles():
    depth = MAX_NESTING - 1  # and the [...] inside
    grammar = compile_lark("start: " + "(" * depth + '"a" "/(" ["]"]' + ")" * depth, tu.byte_level_bpe())
    assert _accepts(grammar, "a/(]") and _accepts(grammar, "a/(")


def test_a_comment_may_mention_an_import():
    grammar = compile_lark("// this grammar needs no %import of its own rules\nstart: WORD\n%import common.WORD\n",
                           tu.byte_level_bpe())
    assert _accepts(grammar, "abc") and not _accepts(grammar, "a1")



def test_a_lazy_regexp_ends_at_its_first_possible_end_as_larks_lexer_ends_it():
    """`/".*?"/` is one quoted text without a quote inside (its full-match language also holds `"a","b"`, which
    lark never lexes as one terminal: outputs failed to parse)."""
    text = 'start: pair ("," pair)*\npair: STRING ":" STRING\nSTRING: /".*?"/\n'
    g, parser = compile_lark(text, tu.byte_level_bpe()), Lark(text, parser="earley", lexer="dynamic_complete")
    for case in ('"a":"b"', '"a":"b","c":""', '"a","b":"c"', '"a"b":"c"', '"a":"b":"c"'):
        assert _accepts(g, case) == _lark_accepts(parser, case), case
    comment = "start: C_COMMENT\n%import common.C_COMMENT\n"
    g, parser = compile_lark(comment, tu.byte_level_bpe()), Lark(comment, parser="earley", lexer="dynamic_complete")
    for case in ("/* a */", "/* a * / b */", "/* a */ b */", "/**/", "/* a */*/"):
        assert _accepts(g, case) == _lark_accepts(parser, case), case


@pytest.mark.parametrize("terminal", [r'/\d+?\.\d+/', r'/".*?"x*/', r'/(?:ab|a)c*?/', r'/<!--.*?-->\n*/'])
def test_a_lazy_quantifier_beside_greedy_choices_is_refused_naming_the_terminal(terminal):
    """Lark's lexer ends such a text where Python's regex engine prefers, which neither the regex's language nor
    its first ends follow (the first ends refused `1.55` for the first, the language admitted `"a"b"x` for the
    second)."""
    with pytest.raises(LarkGrammarError, match=r"terminal T: a lazy quantifier beside greedy choices") as info:
        compile_lark(f"start: T\nT: {terminal}\n", tu.byte_level_bpe())
    assert info.value.line == 2


@pytest.mark.parametrize("terminal, texts", [
    (r'/"(\\.|[^"\\])*?"/', ['"a"', '"a\\"b"', '"a"b"', '"\\\\"', '""']),  # no text begins another: its language
    (r'/.*?(END|STOP)/', ["xEND", "xENDyEND", "STOP", "aSTOPEND"]),         # alternatives apart: first ends
])
def test_lazy_regexps_whose_ends_are_known_compile_as_lark_lexes_them(terminal, texts):
    text = f"start: T\nT: {terminal}\n"
    g, parser = compile_lark(text, tu.byte_level_bpe()), Lark(text, parser="earley", lexer="dynamic_complete")
    for case in texts:
        assert _accepts(g, case) == _lark_accepts(parser, case), case


def test_a_regexp_may_end_before_the_literal_that_follows_and_the_checker_agrees():
    """The language is lark's `dynamic_complete` one, which `is_valid` (and `leapgen sweep`) checks against: with
    lark's default lexer `FIELD` took `user_id` whole and every output read as invalid."""
    from leapgen import Grammar
    from leapgen.constraints import is_valid

    text = 'start: FIELD "_id"\nFIELD: /\\w+/\n'
    g = compile_lark(text, tu.byte_level_bpe())
    assert _accepts(g, "user_id") and is_valid(Grammar(text), "user_id")
    assert not _accepts(g, "user") and not is_valid(Grammar(text), "user")
