"""JSON schema front end: IR shape, strings/numbers regexes against Python peers, errors with pointers."""

from __future__ import annotations

import itertools
import json
import random
import re
from decimal import Decimal

import jsonschema
import pytest

from leapgen.grammars import SchemaError, UnsatisfiableSchemaError, UnsupportedSchemaError, compile_json_schema
from leapgen.grammars import (automaton, json_schema_combinators, json_schema_compiler, json_schema_objects,
                               json_schema_scalars, regex)
from leapgen.grammars.automaton import _Compiler, compile_automaton
from leapgen.grammars.fsm import MEMO_SIZE, NFA, BudgetExceeded, determinize_calls, product
from leapgen.grammars.ir import Capture, Choice, Grammar, Lit, Members, Ref, Repeat, Seq, Terminal
from leapgen.grammars.json_numbers import Multiples, at_least, at_most, common_multiple, natural_range
from leapgen.grammars.json_schema import (MAX_DOCUMENT_DEPTH, MAX_SUBSCHEMA_DEPTH, MAX_SUBSCHEMAS,
                                          json_schema_to_grammar)
from leapgen.grammars.json_schema_compiler import SchemaCompiler
from leapgen.grammars.json_schema_context import JsonSchemaOptions
from leapgen.grammars.json_schema_ir import grammar_size
from leapgen.grammars.json_strings import (ANY_CHARS, ANY_STRING_END, FORMATS, Chars, Length, StringEnd, chars_regex,
                                          format_regex, length_dfa, pattern_regex, pattern_regexes, string_regex)
from leapgen.grammars.regex import dfa_fullmatch, regex_dfa
from tokenizers_util import accepts, byte_level_bpe


def ir_accepts(grammar, text: str) -> bool:
    """Test oracle: does the IR derive `text`?  (Python `re` per terminal, memoised end positions.)"""
    memo: dict = {}
    made: list = []   # expressions made here: kept alive, as the memo knows them by id

    def whole(rx, i, j):
        if not isinstance(rx, str):  # a Language: its own automaton
            return dfa_fullmatch(rx.dfa(), text[i:j].encode())
        return re.compile(rx).fullmatch(text, i, j) is not None

    def ends(e, i):
        key = (id(e), i)
        if key not in memo:
            memo[key] = set()
            if isinstance(e, Lit):
                r = {i + len(e.text)} if text.startswith(e.text, i) else set()
            elif isinstance(e, Terminal):
                r = {j for j in range(i, len(text) + 1) if whole(e.pattern, i, j)
                     and all(whole(a, i, j) for a in e.also) and not any(whole(x, i, j) for x in e.excluding)}
            elif isinstance(e, Ref):
                r = ends(grammar.rules[e.name], i)
            elif isinstance(e, Seq):
                r = {i}
                for item in e.items:
                    r = {k for j in r for k in ends(item, j)}
            elif isinstance(e, Choice):
                r = set().union(*(ends(item, i) for item in e.items))
            elif isinstance(e, Members):
                r = members_ends(e, i)
            elif isinstance(e, Capture):
                r = ends(e.item, i)
            else:
                assert isinstance(e, Repeat)
                r, cur, n, seen = ({i} if e.min == 0 else set()), {i}, 0, {i}
                while cur and (e.max is None or n < e.max):
                    cur = {k for j in cur for k in ends(e.item, j)} - (seen if e.max is None else set())
                    seen |= cur
                    n += 1
                    if n >= e.min:
                        r |= cur
            memo[key] = r
        return memo[key]

    def captured(e):
        """(the Capture an extra begins with, the rest of the extra), None for an extra without one."""
        while isinstance(e, (Ref, Choice)) and (isinstance(e, Ref) or len(e.items) == 1):
            e = grammar.rules[e.name] if isinstance(e, Ref) else e.items[0]
        if isinstance(e, Capture):
            made.append(Seq(()))
            return e, made[-1]
        if isinstance(e, Seq) and e.items and captured(e.items[0]) is not None:
            lead, rest = captured(e.items[0])
            made.append(Seq((rest, *e.items[1:])))
            return lead, made[-1]
        return None

    def extra_ends(e, start, texts):
        """(end, texts written) after one extra from `start`: a captured text must not be one of `texts`."""
        split = captured(e.extra)
        if split is None:
            return [(q, texts) for q in ends(e.extra, start)]
        lead, rest = split
        return [(q, texts | {text[start:j]}) for j in ends(lead, start) if text[start:j] not in texts
                for q in ends(rest, j)]

    def members_ends(e, i):
        """An object: every (position, members written, extras written, first item still to come, captured texts)
        reachable."""
        cap = max(e.max if e.max is not None else e.min, e.max_extras or 0) + 1
        out, seen_states = set(), set()
        todo = [(j, frozenset(), 0, True, frozenset()) for j in ends(e.open, i)]
        while todo:
            state = todo.pop()
            if state in seen_states:
                continue
            seen_states.add(state)
            pos, written, extras, first, texts = state
            count = len(written) + extras
            if (not first and e.required <= written and e.min <= count and (e.max is None or count <= e.max)
                    and all(deps <= written for t, deps in e.dependents if t in written)):
                out |= ends(e.close, pos)
            for start in [pos] if first else ends(e.separator, pos):
                for k, member in enumerate(e.members):
                    loose = k >= len(e.members) - e.loose    # a key no `properties` declares: among the extras
                    if k in written or (e.ordered and not loose and (extras or any(w > k for w in written))):
                        continue
                    todo += [(q, written | {k}, extras, False, texts) for q in ends(member, start)]
                if e.extra is not None and (e.max_extras is None or extras < e.max_extras):
                    todo += [(q, written, min(extras + 1, cap), False, more) for q, more in extra_ends(e, start, texts)]
        return out

    return len(text) in ends(grammar.rules[grammar.start], 0)


def check(schema, valid=(), invalid=(), **options):
    grammar = json_schema_to_grammar(schema, **options)
    for value in valid:
        assert ir_accepts(grammar, json.dumps(value, ensure_ascii=False)), value
    for value in invalid:
        assert not ir_accepts(grammar, json.dumps(value, ensure_ascii=False)), value


# ---- strings --------------------------------------------------------------------------------------

@pytest.mark.parametrize("pattern", [r"^[a-z]+$", "abc", r"^\d{3}-\d{4}$", r'a"b\\c', r"^(foo|bar)$", r"(^a$|^b)",
                                     r"[^a-z]", "^$", r"^[é-ÿ]+$", "x|^y$", r'^[^"]*$',
                                     # ends any text may follow or precede: optional parts and extra repetitions
                                     # there are dropped
                                     r"[a-z]+:(//x*)?(\?y*)?", r"(ab)?c+d", r"x(yz|w?)", r"(a|bc?)+", "c{2,4}",
                                     r"^(ab)?c+d", r"(ab)?c+d$", r"(a?|b)x(1|2?)", r"((a|b)c?){2,3}",
                                     # `$` inside: what passes it may only be followed by empty matches
                                     r"^(\/?((\.{2})|([a-z0-9\-]*))($|\/))*$", r"^([^,]+(,|$)){3,}$",
                                     r"^$[a-z_]*$", r"a($|b)", r"(a|$)b", r"(ab|$)+", r"(a$)?b", r"x(y$|z)*1?"])
def test_pattern_is_search_over_decoded_text(pattern):
    rng = random.Random(0)
    alphabet = list("abcxyz15-\"\\\n\t\x01 éüfor")
    encoded = re.compile(pattern_regex(pattern))
    python = re.compile(pattern.replace("$", r"\Z"))  # ECMA `$` never matches before a final newline
    for _ in range(2000):
        s = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 6)))
        assert bool(encoded.fullmatch(json.dumps(s, ensure_ascii=False))) == bool(python.search(s)), s


@pytest.mark.parametrize("pattern", [r"^(?!foo)[a-z]+$", r"^(?=[^=]+$)(?!\s+$)(.|\n)+$", r"^(?!.*/)^(.*[^.]+.*)$",
                                     r"^(?![ \t\n]*\(default(.*)\))[\s\S]*", r"^(?!a|b$)", r"^(?=a)(?=.*b)(?!.*c$)",
                                     r"((?:[^/]*/)*)(?=\.(fo|b))", r"^(?!f)o*(?=a|b)",
                                     r"^(?!^[-+.]*$)[+-]?0*\d*\.?\d*$", r"^(?=^a|^1)(?=^^.*b)"])
def test_leading_lookaheads_become_intersections_and_exclusions(pattern):
    """Patterns from JsonSchemaStore and pydantic's decimals (and harder ones) against Python's search, through the
    compiled schema; a lookahead that ends a pattern is consumed, since search never looks past a match, and a `^`
    opening a leading lookahead's body says what it says already."""
    grammar = json_schema_to_grammar({"type": "string", "pattern": pattern})
    python = re.compile(pattern.replace("$", r"\Z"))
    rng = random.Random(1)
    alphabet = list("abcfo=/. \n(deult)01+-")
    for _ in range(400):
        text = rng.choice(["", "", "foo", "a", " (default"]) + "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 6)))
        assert ir_accepts(grammar, json.dumps(text, ensure_ascii=False)) == bool(python.search(text)), text


def test_pattern_properties_with_leading_lookaheads_key_their_class():
    """JsonSchemaStore's locale files: any key but those starting "@@" (a declared one among them keeps its own
    schema).  Beside another pattern its keys would have to exclude, the complement is a union: refused."""
    check({"type": "object", "properties": {"@@x": {"type": "integer"}},
           "patternProperties": {"^(?!@@)[@a-z_]+$": {"type": "string"}}, "additionalProperties": False},
          valid=[{}, {"@@x": 1, "a": "x", "@b": "y", "a@@": "z"}], invalid=[{"@@a": "x"}, {"a": 1}, {"@@x": "c"}])
    with pytest.raises(UnsupportedSchemaError, match="a union") as info:
        json_schema_to_grammar({"type": "object", "patternProperties": {"^[@a-z]+$": {"type": "string"},
                                                                        "^(?!.*z)[a-z]+$": {"maxLength": 1}}})
    assert info.value.pointer == "/patternProperties/^(?!.*z)[a-z]+$"



def test_declared_keys_are_matched_against_patterns_by_their_automata():
    """A declared key takes the values of the patternProperties it matches, judged as the key terminal judges
    it; a pattern too large for an automaton is refused where it stands."""
    check({"type": "object", "properties": {"ab": {}, "é1": {}},
           "patternProperties": {"^[a-z]+$": {"type": "integer"}, r"\d$": {"type": "string"}}},
          valid=[{"ab": 1, "é1": "x", "cd": 2, "z9": "y"}], invalid=[{"ab": "x"}, {"é1": 1}, {"cd": "x"}])
    with pytest.raises(UnsupportedSchemaError, match="cannot be enforced exactly") as info:
        json_schema_to_grammar({"type": "object", "properties": {"ab": {}},
                                "patternProperties": {"^(a|b)*a(a|b){16}$": {"type": "integer"}}})
    assert info.value.pointer == "/patternProperties/^(a|b)*a(a|b){16}$"

@pytest.mark.parametrize("schema,where", [
    ({"type": "string", "pattern": "a(?=b)c"}, "/pattern"),                      # inside the pattern
    ({"type": "string", "pattern": "a(?!b)"}, "/pattern"),                       # a negative one at the end
    ({"type": "string", "pattern": "^(?<=a)b"}, "/pattern"),                     # a lookbehind
    ({"type": "string", "not": {"pattern": "^(?!a)"}}, "/not/pattern"),          # its complement is a union
    ({"type": "object", "patternProperties": {"^(?!x)": {}}}, "/patternProperties/^(?!x)"),
    ({"type": "string", "pattern": "a(^b|c)"}, "/pattern"),                      # `^` inside
    ({"type": "string", "pattern": r"\bword"}, "/pattern"),                     # a word boundary
])
def test_other_lookarounds_are_refused_with_their_pointer(schema, where):
    with pytest.raises(UnsupportedSchemaError) as info:
        json_schema_to_grammar(schema)
    assert info.value.pointer == where, info.value


def test_string_length_counts_decoded_characters_with_canonical_escapes():
    rx = re.compile(string_regex(2, 3))
    for s in ["ab", "a\n", '"\\', "é\x01x", "\u2028\t"]:
        assert rx.fullmatch(json.dumps(s, ensure_ascii=False)), s
    for text in ['"a"', '"abcd"', r'"\u0041b"', r'"a\/"', r'"\u000a"']:  # too short/long or not canonical
        assert not rx.fullmatch(text), text


@pytest.mark.parametrize("lo, hi", [(0, 0), (0, 1), (2, 5), (5, 40), (0, None), (3, None)])
def test_length_automaton_laid_out_directly_is_the_regex_s(lo, hi):
    """json_strings.Length builds the automaton of string_regex(lo, hi) without the regex compiler: the same
    language (neither minus the other accepts anything), and where bounded the same minimal automaton."""
    direct, compiled = length_dfa(lo, hi), regex_dfa(string_regex(lo, hi))
    assert not product(direct, compiled, False, 10**5).accept.any()
    assert not product(compiled, direct, False, 10**5).accept.any()
    if hi is not None:
        assert direct.num_states == compiled.num_states


@pytest.mark.parametrize("lo, hi", [(0, 1), (1, 1), (0, 31), (5, 31), (0, None), (3, None)])
def test_string_end_automaton_laid_out_directly_is_the_regex_s(lo, hi):
    """json_strings.StringEnd (a chunked string's remainder: characters, then the closing quote) is the language
    of chars_regex(lo, hi) + '"' and its minimal automaton, laid out without the regex compiler."""
    direct = StringEnd(lo, hi).intersect(regex_dfa(ANY_STRING_END), 10**5)
    compiled = regex_dfa(chars_regex(lo, hi) + '"')
    assert not product(direct, compiled, False, 10**5).accept.any()
    assert not product(compiled, direct, False, 10**5).accept.any()
    assert direct.num_states == compiled.num_states
    with pytest.raises(BudgetExceeded):
        StringEnd(lo, hi).intersect(regex_dfa(ANY_STRING_END), direct.num_states - 1)


@pytest.mark.parametrize("count", [1, 2, 32])
def test_chunk_automaton_laid_out_directly_is_the_regex_s(count):
    """json_strings.Chars (a chunk of a long string: so many characters, no quote) is the language of
    chars_regex(count, count) and its minimal automaton, laid out without the regex compiler."""
    direct = Chars(count).intersect(regex_dfa(ANY_CHARS), 10**5)
    compiled = regex_dfa(chars_regex(count, count))
    assert not product(direct, compiled, False, 10**5).accept.any()
    assert not product(compiled, direct, False, 10**5).accept.any()
    assert direct.num_states == compiled.num_states
    with pytest.raises(BudgetExceeded):
        Chars(count).intersect(regex_dfa(ANY_CHARS), direct.num_states - 1)
    # beside another pattern, the product
    letters = Chars(count).intersect(regex_dfa("[a-z]*"), 10**5)
    expected = regex_dfa(f"[a-z]{{{count}}}")
    assert not product(letters, expected, False, 10**5).accept.any()
    assert not product(expected, letters, False, 10**5).accept.any()


@pytest.mark.parametrize("pattern", [r"^\S+@\S+$", r"^[a-z][-a-z0-9.+]*$", "ab", "^(a|é)+$", "x$", "[\u00e9\n]",
                                     r"^[a-z]*$", "^(|abc)$",     # the empty string among them
                                     # bounded: past some characters, the rest can no longer pass maxLength
                                     r"^[a-zé]{1,4}(\.[a-z]{1,4}){1,3}$", r"^(\d{3}-)?\d{4}$"])
def test_lengths_counted_along_a_pattern_are_the_product_with_the_length_automaton(pattern):
    """Length.intersect unrolls the pattern's automaton over the count; the product with length_dfa is the
    reference: the same language and the same minimal automaton."""
    regex = regex_dfa(pattern_regexes(pattern, "").regex)
    for lo, hi in [(0, 0), (0, 3), (2, 5), (1, None), (3, None), (0, None), (5, 40), (0, 8), (4, 12), (8, 8), (0, 19)]:
        counted, reference = Length(lo, hi).intersect(regex, 10**5), product(regex, length_dfa(lo, hi), True, 10**5)
        assert not product(counted, reference, False, 10**5).accept.any(), (lo, hi)
        assert not product(reference, counted, False, 10**5).accept.any(), (lo, hi)
        assert counted.num_states == reference.num_states, (lo, hi)


def test_formats_only_admit_what_jsonschema_accepts():
    checker = jsonschema.Draft202012Validator.FORMAT_CHECKER
    good = {"date": "2024-02-29", "time": "23:59:59.5+01:00", "date-time": "2020-01-01T00:00:00Z",
            "duration": "P1Y2M3DT4H", "email": "a.b@example.com", "hostname": "a-b.example.org",
            "ipv4": "192.168.0.1", "ipv6": "::ffff:10.0.0.1", "uuid": "123e4567-e89b-12d3-a456-426614174000",
            "uri": "https://example.com/a?b=c#d", "uri-template": "https://example.com/{id}{?q,lang*}{#f:3}",
            "uri-reference": "../a/b?c#d", "iri": "https://例え.jp/パス?q=値", "iri-reference": "//例え.jp/x",
            "json-pointer": "/a~1b/0/~0c", "relative-json-pointer": "1/a/b"}
    bad = {"uri-template": "https://example.com/resource/{", "iri": "not-an-iri", "uri-reference": "a b",
           "json-pointer": "a/b", "relative-json-pointer": "-1/a","date": "2023-02-29", "ipv4": "256.1.1.1", "ipv6": "1:2:3", "uuid": "123e4567e89b12d3a456426614174000",
           "time": "24:00:00Z", "duration": "P", "email": "no-at-sign"}
    assert set(good) == set(FORMATS)
    for name, value in good.items():
        assert re.fullmatch(format_regex(name), json.dumps(value, ensure_ascii=False)), name
        assert checker.conforms(value, name), name
    for name, value in bad.items():
        assert not re.fullmatch(format_regex(name), json.dumps(value, ensure_ascii=False)), name


# ---- numbers --------------------------------------------------------------------------------------

def _numbers(rng):
    for _ in range(1500):
        s = ("-" if rng.random() < 0.4 else "") + str(rng.choice([0, 1, 2, 5, 9, 10, 99, 100, 101, rng.randint(0, 10**5)]))
        if rng.random() < 0.5:
            s += "." + "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 3)))
        if not (s.startswith("-") and Decimal(s) == 0):  # negative zero is refused under bounds, by design
            yield s


@pytest.mark.parametrize("bound", ["0", "0.5", "1", "-1", "-0.25", "99.99", "-1000", "0.001"])
@pytest.mark.parametrize("strict", [False, True])
def test_bounds_compare_decimals_exactly(bound, strict):
    b = Decimal(bound)
    ge, le = re.compile(at_least(b, strict)), re.compile(at_most(b, strict))
    for s in _numbers(random.Random(bound)):
        v = Decimal(s)
        assert bool(ge.fullmatch(s)) == (v > b if strict else v >= b), s
        assert bool(le.fullmatch(s)) == (v < b if strict else v <= b), s


def test_natural_ranges():
    for lo, hi in [(0, 0), (3, 17), (5, 1234), (7, None), (999, 1001)]:
        rx = re.compile(natural_range(lo, hi))
        assert all(bool(rx.fullmatch(str(i))) == (lo <= i and (hi is None or i <= hi)) for i in range(2000))
    # bounds of many digits: the lengths below the upper bound's are one counted repeat (a float's maximum has 309)
    rng = random.Random(3)
    for lo, hi in [(0, 10**308 * 17976931 // 10**7), (10**5, 10**40 - 1), (12, 10**25 + 3), (0, 10**6 - 1)]:
        pattern = natural_range(lo, hi)
        assert pattern.count("[0-9]{") < 40, pattern     # not a counted repeat per length
        rx = re.compile(pattern)
        near = [lo - 1, lo, lo + 1, hi - 1, hi, hi + 1, 10 ** (len(str(hi)) - 1), 10 ** (len(str(hi)) - 1) - 1]
        for i in near + [rng.randrange(10 ** rng.randint(1, len(str(hi)) + 1)) for _ in range(400)]:
            assert bool(rx.fullmatch(str(i))) == (lo <= i <= hi), (lo, hi, i)
        assert not rx.fullmatch("0" + str(hi)[1:])


@pytest.mark.parametrize("k", ["2", "3", "7", "20", "25", "37", "1000", "0.01", "0.25", "0.3", "1.5", "2.125", "6.75"])
def test_multiples_are_residue_automata_exact_on_decimals(k):
    rng = random.Random(k)
    decimal = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?")
    dfa = Multiples(Decimal(k)).dfa()
    texts = list(_numbers(rng)) + ["0", "-0", "0.000", "00", "01", "1.", ".5", "3e0", "--3", "4.50", "-6.7500"]
    texts += [str(rng.randrange(10**6) * Decimal(k)) + "0" * rng.randrange(3) for _ in range(300)]  # multiples
    for text in texts:
        expected = bool(decimal.fullmatch(text)) and Decimal(text) % Decimal(k) == 0
        assert dfa_fullmatch(dfa, text.encode()) == expected, (k, text)


def test_common_multiple_of_steps():
    assert common_multiple([Decimal(k) for k in ["5", "3", "2", "7", "4"]]) == 420
    assert common_multiple([Decimal(k) for k in ["6.75", "19", "9.5", "2.125"]]) == 8721
    assert common_multiple([Decimal("0.25"), Decimal("0.1")]) == Decimal("0.5")


# ---- schemas through the IR -----------------------------------------------------------------------

def test_objects_follow_schema_order_with_optional_and_extra_keys():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
              "required": ["b"]}
    check(schema, valid=[{"b": "x"}, {"a": 1, "b": "x"}, {"a": 1, "b": "x", "zz": [1, {"q": None}]}],
          invalid=[{"a": 1}, {"b": 2}, {}, {"b": "x", "a": 1}, {"b": "x", "b2": 1, "a": 2}])
    check(schema, valid=[{"a": 1, "b": "x"}], invalid=[{"b": "x", "zz": 1}], additional_properties=False)


def test_keys_no_properties_declare_come_among_the_extras_in_any_order():
    """In schema order a required, dependent or listed key that no `properties` declares is written as extra keys
    are: after the declared members, in any order among the extras (the JSON-Schema-Test-Suite's dependencies with
    escaped characters)."""
    cases = [({"dependencies": {"x": ["y"]}},
              [{"x": 1, "y": 1}, {"y": 1, "x": 1}, {"y": 1}, {"z": 0, "y": 1, "x": 1}], [{"x": 1}, {"x": 1, "z": 0}]),
             ({"required": ["b", "a"], "properties": {"c": {}}, "additionalProperties": {"type": "integer"}},
              [{"a": 1, "b": 2}, {"c": 0, "b": 1, "z": 3, "a": 2}], [{"a": 1, "c": 0, "b": 2}, {"a": 1}]),
             ({"propertyNames": {"enum": ["p", "q"]}}, [{"q": 1, "p": 2}, {"p": 1, "q": 2}], [{"p": 1, "r": 2}]),
             # declared members keep their order
             ({"properties": {"a": {}, "b": {}}, "dependentRequired": {"a": ["w"]}},
              [{"a": 1, "b": 2, "w": 3}, {"a": 1, "w": 3}], [{"b": 2, "a": 1, "w": 3}, {"w": 3, "a": 1}])]
    tokenizer = byte_level_bpe()
    for schema, valid, invalid in cases:
        check(schema, valid=valid, invalid=invalid)
        grammar = compile_json_schema(schema, tokenizer)
        for texts, expected in (([json.dumps(v) for v in valid], True), ([json.dumps(v) for v in invalid], False)):
            for text in texts:      # (as texts: dicts equal whatever their order)
                assert accepts(grammar, tokenizer, text) == expected, (schema, text)


def test_pattern_properties_property_names_and_counts():
    check({"patternProperties": {"^x": {"type": "integer"}}, "additionalProperties": False},
          valid=[{}, {"x1": 1, "xy": 2}], invalid=[{"y": 1}, {"x": "s"}])
    check({"propertyNames": {"maxLength": 2}, "minProperties": 1, "maxProperties": 2},
          valid=[{"ab": 1}, {"a": 1, "b": 2}], invalid=[{}, {"abc": 1}, {"a": 1, "b": 2, "c": 3}])
    check({"dependentRequired": {"a": ["b"]}, "properties": {"b": {}, "a": {}}},
          valid=[{}, {"b": 1}, {"b": 1, "a": 2}], invalid=[{"a": 1}])


def test_many_pattern_properties_split_keys_only_where_they_overlap():
    """19 patterns with distinct literal prefixes (a MaskBench schema) exclude each other pairwise: 20 key classes,
    not 2^19; two overlapping patterns make one more class whose value must satisfy both."""
    patterns = {f"^k{i}:(en|nl)$": {"type": "integer"} for i in range(19)}
    check({"patternProperties": patterns, "additionalProperties": False},
          valid=[{"k3:en": 1, "k18:nl": 2}], invalid=[{"k3:de": 1}, {"k3:en": "s"}, {"k19:en": 1}])
    check({"patternProperties": {"^a": {"type": "integer"}, "b$": {"minimum": 5}}, "additionalProperties": False},
          valid=[{"ab": 5, "a": 1, "b": 7}], invalid=[{"ab": 4}, {"ab": 5.5}, {"b": 3}])


def test_property_names_from_an_enum_are_the_only_keys():
    schema = {"propertyNames": {"$ref": "#/$defs/names"}, "additionalProperties": {"type": "integer"},
              "properties": {"b": {"type": "string"}}, "$defs": {"names": {"enum": ["a", "b", "c", 1]}}}
    # in schema order: the declared properties, then the listed names in the enum's order
    check(schema, valid=[{}, {"a": 1}, {"b": "x", "a": 1, "c": 2}], invalid=[{"d": 1}, {"a": "x"}, {"b": 1}])
    check(schema, valid=[{"c": 2, "a": 1}], property_order="any")
    assert not ir_accepts(json_schema_to_grammar(schema, property_order="any"), '{"a": 1, "a": 2}')
    check({"propertyNames": {"const": "k"}, "minProperties": 2}, invalid=[{"k": 1}])


def test_unanchored_alternatives_share_their_padding():
    """Nine words to search for: one automaton of about their total length, not one per set of words seen."""
    words = [f"{row}-{col}" for row in ("top", "middle", "bottom") for col in ("left", "center", "right")]
    check({"type": "string", "pattern": "|".join(words)}, valid=["at middle-center", "bottom-right!", "top-left"],
          invalid=["middle", "top-centre", ""])
    check({"type": "string", "pattern": "^ab|cd$|ef"}, valid=["abx", "xcd", "xefx"], invalid=["xab", "cdx"])


def test_an_unanchored_search_drops_the_optional_tail_it_would_determinize_against_every_start():
    """`.*X.*` where X ends in optional parts is `.*X'.*`: a URI pattern searched for without anchors is an
    automaton of its scheme, not of every place a URI may start times every part it may have."""
    pattern = FORMATS["uri"]  # unanchored: contains a URI anywhere
    check({"type": "string", "pattern": pattern}, valid=["see http://x.org/a?b#c", "a:"], invalid=["no scheme", ":"])
    assert compile_automaton(json_schema_to_grammar({"type": "string", "pattern": pattern})).num_states < 100


def test_excluded_patterns_are_searched_for_together():
    """Strings containing none of several words: one automaton of about the words' length (excluded one by one,
    or as a union of separate searches, the automata multiply)."""
    words = ["NEW", "ON_APPROVAL", "ON_SIGNING", "EXECUTED", "DEPRECATED", "REJECTED"]
    schema = {"type": "string", "allOf": [{"not": {"pattern": word}} for word in words]}
    check(schema, valid=["", "NE", "ON_SIGN", "signed"], invalid=[f"x{word}y" for word in words])
    assert compile_automaton(json_schema_to_grammar(schema)).num_states < 200


def test_excluded_patterns_anchored_at_the_start_stay_alone_and_searched_ones_join(monkeypatch):
    """The branches of a oneOf of patterns each exclude the others: anchored ones are each parsed once, not
    again inside every branch's join (Github_hard's o46658)."""
    anchored = ["^u?int(8|16|24|32)?$", "^address$", "^bytes(1|2|3)", "^$|^[a-z]+$"]
    searched = ["x[0-9]", "^a|b$"]
    schema = {"type": "string", "oneOf": [{"pattern": p} for p in anchored + searched]}
    parsed = []
    real = json_schema_scalars.pattern_regexes
    monkeypatch.setattr(json_schema_scalars, "pattern_regexes", lambda p, at="": parsed.append(p) or real(p, at))
    grammar = json_schema_to_grammar(schema)
    joined = [p for p in parsed if p not in anchored + searched]
    # each branch joins the searched patterns it excludes (one branch excludes one of them alone), nothing more
    assert set(joined) == {"(?:x[0-9])|(?:^a|b$)"}, joined
    texts = ["uint8", "int", "address", "bytes2z", "", "abc", "x1", "a", "zb", "uint9x1", "bytes1x5", "A-b", "int64"]
    valid = {s for s in texts if sum(bool(re.search(p, s)) for p in anchored + searched) == 1}
    check(schema, valid=sorted(valid), invalid=sorted(set(texts) - valid))
    assert len(valid) >= 4 and len(set(texts) - valid) >= 4


def test_excluded_patterns_join_only_when_each_parses_alone():
    # "a)|(?:b" and "c" joined would parse, as a pattern neither of them is
    with pytest.raises(UnsupportedSchemaError, match="cannot be parsed"):
        json_schema_to_grammar({"type": "string", "allOf": [{"not": {"pattern": "a)|(?:b"}}, {"not": {"pattern": "c"}}]})


def test_a_grammar_past_the_shared_memo_keeps_one_label_per_terminal():
    """Over MEMO_SIZE distinct terminals, the shared memo hands evicted ones back as new DFA objects: the grammar's
    own memo keeps one automaton (and one budget count) per terminal."""
    n = MEMO_SIZE + 60
    objects = [{"type": "object", "properties": {f"key_{i:05d}": {"type": t} for i in range(n)},
                "additionalProperties": False} for t in ("integer", "boolean", "null")]
    automaton = compile_automaton(json_schema_to_grammar({"anyOf": objects}))
    assert len(automaton.terminals) < n + 20


def test_a_kept_rule_automaton_takes_the_terminals_the_memo_built_again():
    """A rule automaton kept across grammars (any JSON value's, here) names its terminals by their DFAs; once the
    terminal memo has built them again, a grammar relabels the kept automaton instead of holding two copies of a
    terminal, and lays out the same tables as where the memo kept them."""
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "size": {"type": "number"}}}
    grammar = json_schema_to_grammar(schema)
    automaton._CLOSED_RULES.clear()     # (a closed rule would take its terminals' DFAs with it: see the matcher tests)
    first = compile_automaton(grammar)
    assert grammar.rules["any_value"] in automaton._RULE_DFAS
    for memo in (regex.regex_dfa, regex.terminal_dfa, regex.literal_dfa, regex.literals_dfa):
        memo.cache_clear()
    automaton._CLOSED_RULES.clear()
    again = compile_automaton(json_schema_to_grammar(schema))

    def tables(a):
        return [(first, dfa.trans.tobytes(), dfa.accept.tobytes()) for first, dfa in a.terminals]

    assert len({table[1:] for table in tables(again)}) == len(again.terminals)
    assert tables(again) == tables(first)
    assert (again.call_callee == first.call_callee).all() and (again.call_ret == first.call_ret).all()


def test_long_keys_beside_declared_ones_count_in_chunks():
    schema = {"properties": {"id": {}}, "propertyNames": {"maxLength": 2000}, "additionalProperties": {"type": "integer"}}
    check(schema, valid=[{"id": "x", "k" * 1500: 1}], invalid=[{"k" * 2001: 1}, {"id": "x", "k": "s"}])


def test_a_long_length_bound_with_a_format_is_refused_with_its_pointer():
    """The count along the format's automaton stops at the budget (fsm.counted_product), so the refusal costs
    20,000 states, not the whole product."""
    schema = {"properties": {"site": {"type": "string", "format": "uri-reference", "maxLength": 4000}}}
    with pytest.raises(UnsupportedSchemaError, match="maxLength 4000 with format 'uri-reference' cannot be enforced "
                                                     "exactly within") as error:
        compile_json_schema(schema, byte_level_bpe())
    assert error.value.pointer == "/properties/site"


def test_a_length_bound_the_format_keeps_already_adds_no_count():
    """A hostname here has at most 251 characters (four labels of 62): under maxLength 255 the count stops
    mattering from the start (unrolled, it passed the budget)."""
    tok = byte_level_bpe()
    grammar = compile_json_schema({"type": "string", "format": "hostname", "maxLength": 255}, tok)
    longest = ".".join(["a" * 62] * 4)
    assert accepts(grammar, tok, json.dumps(longest)) and accepts(grammar, tok, json.dumps("a.b"))
    assert not accepts(grammar, tok, json.dumps(longest + "b")) and not accepts(grammar, tok, json.dumps("a" * 63))


def test_a_long_length_bound_beside_an_ascii_pattern_counts_along_the_pattern():
    """About a state per character: maxLength 2048 with a pattern over ASCII compiles (the product with the
    length's own automaton would need 28,000 states)."""
    schema = {"type": "string", "pattern": "^[a-z][-a-z0-9.+]*$", "maxLength": 2048}
    tok = byte_level_bpe()
    grammar = compile_json_schema(schema, tok)
    assert accepts(grammar, tok, json.dumps("a" * 2048)) and not accepts(grammar, tok, json.dumps("a" * 2049))
    assert not accepts(grammar, tok, json.dumps("1a"))


@pytest.mark.parametrize("subschema, named, pointer", [
    # a search for a word whose 19th letter from the end is an a: the automaton must remember 19 letters
    ({"pattern": "(a|b)*a(a|b){18}"}, "pattern '(a|b)*a(a|b){18}'", "/properties/code/pattern"),
    ({"maxLength": 1024, "format": "email"}, "maxLength 1024 with format 'email'", "/properties/code"),
    # a residue per state: a million residues are past the budget
    ({"type": "integer", "multipleOf": 1000003}, "multipleOf 1000003", "/properties/code/multipleOf"),
])
def test_keywords_whose_automaton_outgrows_the_budget_are_refused_by_name_and_pointer(subschema, named, pointer):
    schema = {"properties": {"code": {"type": "string", **subschema}}}
    with pytest.raises(UnsupportedSchemaError, match=re.escape(named) + " cannot be enforced exactly") as error:
        compile_automaton(json_schema_to_grammar(schema))     # the automata are built where the grammar is
    assert error.value.pointer == pointer


def test_the_refusal_names_the_budget_that_was_outgrown():
    # 250,000 characters outgrow the regex's node budget before any state is counted
    schema = {"properties": {"code": {"type": "string", "pattern": "^x{250000}$"}}}
    with pytest.raises(UnsupportedSchemaError, match=r"cannot be enforced exactly within 200000 automaton nodes"):
        compile_automaton(json_schema_to_grammar(schema))


def test_pattern_properties_whose_overlap_outgrows_the_budget_are_refused_with_the_object_pointer():
    patterns = {"(a|b)*a(a|b){14}": {"type": "integer"}, "b(a|b){14}a": {"type": "string"}}
    message = "telling whether one key can match them all needs more than"
    with pytest.raises(UnsupportedSchemaError, match=message) as error:
        json_schema_to_grammar({"properties": {"box": {"patternProperties": patterns}}})
    assert error.value.pointer == "/properties/box"


def test_a_string_that_can_never_appear_is_not_refused_for_its_automaton():
    # The member is never written, so the over-budget automaton is never built.
    schema = {"type": "object", "properties": {"a": {"type": "string", "format": "email", "maxLength": 1300}},
              "maxProperties": 0}
    check(schema, valid=[{}], invalid=[{"a": "x@y.io"}])


def test_arrays_prefix_items_bounds_and_unique_enumerable_items():
    check({"prefixItems": [{"type": "integer"}, {"type": "string"}], "items": {"type": "boolean"}, "maxItems": 3},
          valid=[[], [1], [1, "a"], [1, "a", True]], invalid=[["a"], [1, "a", 2], [1, "a", True, False]])
    check({"items": {"enum": ["x", "y"]}, "uniqueItems": True, "minItems": 1},
          valid=[["x"], ["y", "x"]], invalid=[[], ["x", "x"]])


def test_unique_items_over_many_values_claim_each_once_in_linear_states():
    """The values are the members of an object's rule: a tag on the stack frame records which were written,
    where an automaton would need a state per subset (2^100 here)."""
    values = [f"v{i}" for i in range(100)] + [None, True, 7]
    schema = {"items": {"enum": values}, "uniqueItems": True, "minItems": 2, "maxItems": 50}
    check(schema, valid=[["v0", "v99"], [None, True, 7], values[::-1][:50]],
          invalid=[[], ["v0"], ["v0", "v0"], [7, None, 7.0], values[:51]])
    assert compile_automaton(json_schema_to_grammar(schema)).num_states < 3000
    tokenizer = byte_level_bpe()
    compiled = compile_json_schema(schema, tokenizer)
    assert accepts(compiled, tokenizer, json.dumps(["v5", None, "v50"]))
    assert not accepts(compiled, tokenizer, json.dumps(["v5", None, "v5"]))
    check({"items": {"type": "boolean"}, "uniqueItems": True, "minItems": 3}, valid=[], invalid=[[True, False]])
    check({"items": {"enum": list(range(300))}, "uniqueItems": True, "maxItems": 0}, valid=[[]], invalid=[[1]])
    # past 256 values, scalars are told apart by their texts (a number written one way), as strings are
    check({"items": {"enum": [*range(299), "x"]}, "uniqueItems": True},
          valid=[[], [1, 299 - 1], ["x", 0, 5]], invalid=[[1, 1], [1, 1.0], [299], ["x", "x"], [0.5]])
    check({"items": {"enum": [i / 4 for i in range(300)]}, "uniqueItems": True, "maxItems": 3},
          valid=[[0.25, 0.5, 74.75]], invalid=[[0.5, 0.5], [0.3], [0.25, 0.5, 1, 2]])
    with pytest.raises(UnsupportedSchemaError, match="arrays or objects are among them, not 300"):
        json_schema_to_grammar({"items": {"enum": [*range(299), [1]]}, "uniqueItems": True})
    with pytest.raises(UnsupportedSchemaError, match="only on strings, numbers and enumerable items") as error:
        json_schema_to_grammar({"items": {"type": "object"}, "uniqueItems": True})
    assert error.value.pointer == "/uniqueItems"
    # numbers are written canonically there (1, never 1.0 or 1e0), so equal texts are equal values
    check({"items": {"type": "integer", "not": {"enum": [0]}}, "uniqueItems": True}, valid=[[1, 2], [-3, 3, 10]],
          invalid=[[1, 1], [2, 1, 2], [0], [1, 1.0]])
    check({"items": {"type": "number"}, "uniqueItems": True}, valid=[[1.5, 0.25, -0.25]], invalid=[[0.5, 0.5]])
    many = [f"s{i}" for i in range(300)]     # more strings than members can be: their texts are recorded instead
    check({"items": {"enum": many}, "uniqueItems": True, "minItems": 2}, valid=[["s0", "s299"]],
          invalid=[["s0", "s0"], ["s0"], ["s0", "t"]])


@pytest.mark.parametrize("schema", [
    {"contains": {"type": "integer"}},
    {"contains": {"minimum": 3}, "minContains": 2},
    {"items": {"type": ["integer", "null"]}, "contains": {"type": "null"}, "minItems": 3},
    {"prefixItems": [{"type": "string"}], "contains": {"type": "string"}, "maxItems": 3},
    {"contains": {"const": 5}, "maxContains": 1},
    {"contains": {"type": "string"}, "minContains": 0, "maxContains": 2, "minItems": 1},
    {"contains": {"enum": [0, None]}, "minContains": 2, "maxContains": 3, "maxItems": 3},
    {"contains": {"const": 0}, "minContains": 3, "maxContains": 2},
    # several contains on one array, counted together; an item may count for more than one
    {"allOf": [{"contains": {"const": 0}}, {"contains": {"const": 5}}]},
    {"allOf": [{"contains": {"type": "integer"}}, {"contains": {"maximum": 0}}]},
    {"allOf": [{"contains": {"type": "integer"}, "maxContains": 1}, {"contains": {"type": "string"}}]},
    {"allOf": [{"contains": {"type": "null"}, "minContains": 2}, {"contains": {"const": 5}, "maxContains": 1},
               {"contains": {"const": "a"}}], "maxItems": 4},
    {"allOf": [{"not": {"items": {"type": "integer"}}}, {"not": {"items": {"type": ["string", "null"]}}}]},
])
def test_contains_counts_matching_items_exactly(schema):
    values = [0, 5, "a", None]
    arrays = [[]] + [[v] for v in values]
    arrays += [a + [v] for a in arrays[1:] for v in values]
    arrays += [a + [v] for a in arrays if len(a) == 2 for v in values]
    arrays += [a + [v] for a in arrays if len(a) == 3 for v in values]
    validator = jsonschema.Draft202012Validator(schema)
    try:
        grammar = json_schema_to_grammar(schema)
    except SchemaError:                      # unsatisfiable: right only if nothing is valid
        assert not any(validator.is_valid(a) for a in arrays)
        return
    wrong = [a for a in arrays if ir_accepts(grammar, json.dumps(a)) != validator.is_valid(a)]
    assert not wrong, wrong


@pytest.mark.parametrize("schema", [{"not": {"const": 0}}, {"not": {"enum": [2, "a"]}}, {"type": "integer", "not": {"const": 0}},
                                    {"type": "object", "not": {"additionalProperties": {"const": 0}}}])
def test_an_excluded_number_is_excluded_in_every_spelling(schema):
    """-0 and -0.0 are 0, and 2e0, 20e-1, 0e1 the numbers they look like: beside excluded values numbers are written
    without an exponent (as under bounds), and an excluded 0 with its sign; the shortest completion validates."""
    tokenizer = byte_level_bpe()
    grammar = compile_json_schema(schema, tokenizer)
    validator = jsonschema.Draft202012Validator(schema)
    wrap = (lambda t: '{"a":' + t + "}") if schema.get("type") == "object" else (lambda t: t)
    for text in ["-0", "-0.0", "0", "0e1", "0E0", "2", "2e0", "20e-1", "2.00", "5", "1.5", "-3"]:
        text = wrap(text)
        if not validator.is_valid(json.loads(text)):
            assert not accepts(grammar, tokenizer, text), text
        elif "e" not in text.lower():
            assert accepts(grammar, tokenizer, text), text
    if schema.get("type") == "object":     # the shortest completion of {"a":0 validates (it was {"a":0E0})
        matcher = grammar.matcher()
        for token in tokenizer.encode('{"a":0', add_special_tokens=False):
            matcher.advance(token)
        assert validator.is_valid(json.loads('{"a":0' + tokenizer.decode(matcher.completion_tokens())))


@pytest.mark.parametrize("key", ["minItems", "maxItems", "minLength", "maxLength", "minProperties", "maxProperties",
                                 "minContains"])
def test_a_count_past_any_float_is_refused_naming_its_keyword(key):
    """json.loads reads 1e400 as infinity: a count of it is no integer (it raised OverflowError from int())."""
    schema = json.loads(f'{{"contains": {{}}, "{key}": 1e400}}')
    with pytest.raises(SchemaError, match=rf"{key} must be a non-negative integer \(at /{key}\)"):
        json_schema_to_grammar(schema)


@pytest.mark.parametrize("schema,message", [
    ({"type": "array", "prefixItems": {}}, "prefixItems must be an array (at /prefixItems)"),
    ({"items": {"type": "array", "prefixItems": None}}, "prefixItems must be an array (at /items/prefixItems)"),
    ({"type": "array", "uniqueItems": "yes"}, "uniqueItems must be a boolean (at /uniqueItems)"),
    ({"type": "array", "uniqueItems": 1}, "uniqueItems must be a boolean (at /uniqueItems)"),
])
def test_array_keywords_of_the_wrong_type_are_refused_naming_them(schema, message):
    """An empty object as prefixItems read as no prefix, and a string as uniqueItems as false, where every other
    keyword of the wrong type is refused."""
    with pytest.raises(SchemaError, match=re.escape(message)):
        json_schema_to_grammar(schema)


def test_a_key_that_depends_on_itself_compiles():
    check({"dependentRequired": {"a": ["a"]}}, valid=[{}, {"a": 1}, {"b": 1, "a": 2}])
    check({"dependencies": {"a": ["a", "b"]}}, valid=[{"b": 1, "a": 1}, {"a": 1, "b": 1}], invalid=[{"a": 1}])


def test_a_negated_contains_and_a_contains_inside_a_negation_stay_apart():
    # counting a contains item twice over, its negation ("not contains" at /contains) and the negation of the
    # contains inside it (split from the minItems beside it, also at /contains) are two conjunctions: compiled
    # once each, not one memoised for the other (that accepted [[2], [2]] and refused [[1, 1], [2]])
    schema = {"type": "array", "items": {"anyOf": [{"const": [1, 1]}, {"const": [2]}]},
              "contains": {"not": {"contains": {"const": 1}, "minItems": 2}}, "maxContains": 1}
    values = [[1, 1], [2], [1], []]
    arrays = [[]]
    for _ in range(3):
        arrays += [a + [v] for a in arrays if len(a) == len(arrays[-1]) for v in values]
    validator = jsonschema.Draft202012Validator(schema)
    grammar = json_schema_to_grammar(schema)
    wrong = [a for a in arrays if ir_accepts(grammar, json.dumps(a)) != validator.is_valid(a)]
    assert not wrong, wrong
    assert validator.is_valid([[1, 1], [2]]) and not validator.is_valid([[2], [2]])


@pytest.mark.parametrize("schema", [
    {"not": {"properties": {"a": {"type": "integer"}, "b": False}}},
    {"not": {"type": "object", "properties": {"a": {"const": 1}}, "required": ["a"]}},
    {"not": {"type": "string", "pattern": "^a"}},
    {"if": {"properties": {"a": {"const": "x"}}}, "then": {"required": ["b"]}, "else": {"maxProperties": 1}},
    {"oneOf": [{"type": "object", "properties": {"a": {"type": "integer"}}},
               {"properties": {"b": {"type": "integer"}}, "required": ["b"]}]},
])
def test_negations_split_into_independent_keywords_and_properties(schema):
    values = [None, 0, 1, "a", "x", [], [1], {}, {"a": 1}, {"a": "x"}, {"b": 1}, {"a": 1, "b": "q"}, {"a": "a", "b": 2},
              {"b": "z"}, {"b": 2, "a": 3}, {"c": 1}]
    validator = jsonschema.Draft202012Validator(schema)
    grammar = json_schema_to_grammar(schema, property_order="any")
    wrong = [v for v in values if ir_accepts(grammar, json.dumps(v)) != validator.is_valid(v)]
    assert not wrong, wrong


def test_a_negated_objects_declared_keys_share_one_compile_of_the_rest(monkeypatch):
    # `not: {properties}` over four keys is an object with one of them failing its schema: four objects, which
    # share all but one member each, from one object builder (one each compiled the rest four times)
    schema = {"type": "object", "properties": {k: {"type": ["integer", "string"]} for k in "abcd"},
              "not": {"properties": {k: {"type": "integer"} for k in "abcd"}}}
    values = [1, "s", {}, {"a": 1}, {"a": "x"}, {"b": 1, "d": "y"}, {"a": 1, "b": 2, "c": 3, "d": 4},
              {"a": 1, "b": 2, "c": 3, "d": "z"}, {"c": "q"}, {"d": "z", "a": 1}, {"a": 1, "e": "x"}, {"e": "x"}]
    validator = jsonschema.Draft202012Validator(schema)
    builds = []
    build = json_schema_objects._ObjectBuilder.build
    monkeypatch.setattr(json_schema_objects._ObjectBuilder, "build", lambda self: builds.append(self) or build(self))
    for order in ("schema", "any"):
        builds.clear()
        grammar = json_schema_to_grammar(schema, property_order=order)
        assert len(builds) == 1
        # (in schema order the extra key, e, comes last, as sorted)
        wrong = [v for v in values if ir_accepts(grammar, json.dumps(v)) != (validator.is_valid(v) and (
            order == "any" or not isinstance(v, dict) or list(v) == sorted(v)))]
        assert not wrong, (order, wrong)


def test_the_enum_of_a_condition_is_checked_against_an_object_holding_one_of_the_failing_keys(monkeypatch):
    # the negation's object (ONE_KEY_OF) reaches jsonschema where an `if` enum's values are checked against the rest
    # of the conjunction: each value kept must hold one of the keys failing, as the grammar's instances do
    held = []
    holds_one_key = json_schema_compiler._holds_one_key
    monkeypatch.setattr(json_schema_compiler, "_holds_one_key",
                        lambda *args: held.append(args[2]) or holds_one_key(*args))
    json_schema_compiler._reading_derived.cache_clear()     # (the validator classes take the keyword at creation)
    schema = {"type": "object", "properties": {k: {"type": ["integer", "string"]} for k in "ab"},
              "not": {"properties": {k: {"type": "integer"} for k in "ab"}},
              "if": {"enum": [{"a": "x"}, {"a": 1, "b": "y"}, {"a": 1, "b": 2}, {"b": 3}]}, "then": {"required": ["a"]},
              "else": {"maxProperties": 1}}
    try:
        grammar = json_schema_to_grammar(schema, property_order="any")
    finally:
        json_schema_compiler._reading_derived.cache_clear()
    assert {"a": "x"} in held     # (a value the other keywords let through, which the keyword then checks)
    validator = jsonschema.Draft202012Validator(schema)
    values = [{"a": "x"}, {"a": 1, "b": "y"}, {"a": 1, "b": 2}, {"b": 3}, {"a": "z"}, {"a": 1}, {"b": "q"},
              {"a": "x", "b": 1}, {}]
    wrong = [v for v in values if ir_accepts(grammar, json.dumps(v)) != validator.is_valid(v)]
    assert not wrong, wrong


def test_a_conjunction_through_a_ref_compiles_once_also_where_it_needs_no_rule(monkeypatch):
    # each branch of a oneOf is compiled beside the negations of the others, which meet the same conjunctions
    # through the same $refs again, most of them NEVER (a string value failing `type: string`): those are
    # remembered as the named ones are, not compiled again at every negation
    schema = {"definitions": {
        "url": {"type": "object", "properties": {"name": {"type": "string"}, "url": {"type": "string"}},
                "required": ["url"]},
        "inline": {"type": "object", "properties": {"name": {"type": "string"}, "values": {"type": "array"}},
                   "required": ["values"]},
        "named": {"type": "object", "properties": {"name": {"type": "string"}, "source": {"type": "string"}},
                  "required": ["source"]}},
        "type": "array", "items": {"oneOf": [{"$ref": "#/definitions/url"}, {"$ref": "#/definitions/inline"},
                                             {"$ref": "#/definitions/named"}]}}
    compiled = []
    compile_parts = SchemaCompiler._compile_parts

    def counted(self, parts):
        compiled.append(frozenset((self._content.of(p.schema), p.base, p.skip, p.variant) for p in parts))
        return compile_parts(self, parts)

    monkeypatch.setattr(SchemaCompiler, "_compile_parts", counted)
    grammar = json_schema_to_grammar(schema)
    assert len(compiled) == len(set(compiled))
    validator = jsonschema.Draft7Validator(schema)
    for value in [[], [{"url": "u"}], [{"name": "n", "url": "u"}], [{"values": []}, {"source": "s"}],
                  [{"name": "n"}], [{"url": "u", "values": []}], [{"url": 1}], [{"source": "s", "url": "u"}]]:
        assert ir_accepts(grammar, json.dumps(value)) == validator.is_valid(value), value


_CLOSED = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
           "additionalProperties": False, "required": ["a"]}


@pytest.mark.parametrize("schema", [
    # an open object requiring a key the closed one does not declare: every object of it fails the closed one
    {"oneOf": [{"properties": {"c": {"type": "string"}}, "required": ["c"]}, _CLOSED]},
    # a branch that admits no object: none of its instances can fail the closed object's properties
    {"oneOf": [{"type": "string"}, _CLOSED, {"type": "object", "properties": {"a": {"type": "string"}},
                                              "additionalProperties": False, "required": ["a"]}]},
    {"allOf": [{"type": ["string", "integer"]}, {"not": _CLOSED}]},
])
def test_negated_closed_objects_settled_by_the_rest_of_the_conjunction(schema):
    values = [None, 1, "s", [], {}, {"a": 1}, {"a": "x"}, {"a": 1, "b": "x"}, {"a": 1, "c": "x"}, {"c": "x"},
              {"c": 1}, {"b": "x", "c": "y"}, {"a": "x", "c": "y"}, {"a": 1, "b": 2}]
    validator = jsonschema.Draft202012Validator(schema)
    grammar = json_schema_to_grammar(schema, property_order="any")
    wrong = [v for v in values if ir_accepts(grammar, json.dumps(v)) != validator.is_valid(v)]
    assert not wrong, wrong


@pytest.mark.parametrize("schema, reason, pointer", [
    ({"type": "object", "properties": {"a": {"type": "integer", "minimum": 5, "maximum": 1}}, "required": ["a"]},
     "minimum 5 is above maximum 1", "/properties/a"),
    ({"type": "integer", "multipleOf": 1.5, "not": {"multipleOf": 0.75}},
     "every multiple of 1.5 is a multiple of 0.75, which is excluded", ""),
])
def test_an_unsatisfiable_schema_names_the_first_impossible_value_and_where_it_is(schema, reason, pointer):
    with pytest.raises(SchemaError) as caught:
        json_schema_to_grammar(schema)
    assert str(caught.value) == f"schema is unsatisfiable: {reason} (at {pointer or '/'})"
    assert caught.value.pointer == pointer


def test_a_branch_of_annotations_only_matches_everything_so_one_of_excludes_the_other_branch():
    # `_format` is no keyword: the branch is `{}`, so oneOf admits exactly what the other branch does not
    schema = {"oneOf": [{"enum": ["", 1]}, {"_format": "email", "description": "any"}]}
    values = ["", 1, "a", 2, None, [], {}]
    grammar = json_schema_to_grammar(schema)
    assert [ir_accepts(grammar, json.dumps(v)) for v in values] == [False, False, True, True, True, True, True]
    with pytest.raises(SchemaError, match="unsatisfiable"):
        json_schema_to_grammar({"not": {"description": "nothing fails this"}})


def test_additional_items_beside_one_items_schema_is_ignored_under_not_too():
    schema = {"$schema": "http://json-schema.org/draft-07/schema#",
              "not": {"items": {"type": "number"}, "additionalItems": {"type": "string"}}}
    values = [[], [1], [1, "a"], ["a"], [None, 2], 1, "a"]
    validator = jsonschema.Draft7Validator(schema)
    grammar = json_schema_to_grammar(schema)
    assert [ir_accepts(grammar, json.dumps(v)) for v in values] == [validator.is_valid(v) for v in values]
    assert [validator.is_valid(v) for v in values] == [False, False, True, True, True, False, False]


@pytest.mark.parametrize("schema", [
    {"not": {"contains": {"const": 1}}},                              # no item is 1
    {"not": {"contains": {"const": 1}, "minContains": 2, "maxContains": 3}},   # fewer than 2 or more than 3
    {"not": {"contains": {"const": 1}, "maxContains": 1}},            # at least two
    {"type": "array", "prefixItems": [{"type": "integer"}], "not": {"contains": {"const": 1}}},
    {"oneOf": [{"contains": {"const": 1}}, {"contains": {"const": 2}}]},
    {"if": {"properties": {"a": {"contains": {"const": "x"}}}}, "then": {"required": ["b"]}},
])
def test_a_negated_contains_counts_the_matches_outside_its_bounds(schema):
    values = [[], [1], [2], [1, 1], [1, 2, 1], [1, 1, 1], [1, 1, 1, 1], ["a"], [2, 1], [2, 2], 1, "x", {},
              {"a": ["x"]}, {"a": ["x"], "b": 0}, {"a": ["y"]}, {"a": 1}]
    validator = jsonschema.Draft202012Validator(schema)
    grammar = json_schema_to_grammar(schema)
    wrong = [v for v in values if ir_accepts(grammar, json.dumps(v)) != validator.is_valid(v)]
    assert not wrong, wrong
    with pytest.raises(SchemaError, match="minContains 0 holds for every array"):
        json_schema_to_grammar({"type": "array", "not": {"contains": {"const": 1}, "minContains": 0}})


@pytest.mark.parametrize("schema", [
    {"not": {"patternProperties": {"^a": False}}},                  # an object with a key starting with a
    {"type": "object", "properties": {"ab": {"type": "integer"}}, "not": {"patternProperties": {"^a": False}}},
    {"type": "object", "not": {"propertyNames": {"pattern": "^[a-z]+$"}}},   # a key that is not lowercase
    {"type": "object", "not": {"propertyNames": {"not": {"pattern": "1"}}}},  # a key holding a 1
    # one key may serve both: under maxProperties 1 it must
    {"type": "object", "maxProperties": 1, "allOf": [{"not": {"propertyNames": {"not": {"pattern": "a"}}}},
                                                     {"not": {"propertyNames": {"not": {"pattern": "b"}}}}]},
    {"type": "object", "not": {"properties": {"a": {"type": "integer"}}, "additionalProperties": False}},
    {"type": "object", "properties": {"a": {}, "b": {}},
     "not": {"properties": {"a": {"type": "integer"}}, "additionalProperties": False}},
    {"oneOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": False},
               {"type": "object", "required": ["a"]}]},
    {"type": "object", "minProperties": 1, "not": {"patternProperties": {"^b": False, "^c": True},
                                                   "additionalProperties": False}},
])
def test_a_negation_that_closes_out_keys_asks_the_object_for_one(schema):
    values = [{}, {"a": 1}, {"a": "x"}, {"ab": 1}, {"ab": "x"}, {"b": 1}, {"B": 1}, {"A1": 1}, {"a1": 1},
              {"a": 1, "b": 2}, {"ab": 1, "c": 2}, {"ba": 1}, {"1": 2}, {"c": 1}, {"c": 1, "b": 1}, 1, "a", [], None]
    validator = jsonschema.Draft202012Validator(schema)
    grammar = json_schema_to_grammar(schema, property_order="any")
    wrong = [v for v in values if ir_accepts(grammar, json.dumps(v)) != validator.is_valid(v)]
    assert not wrong, wrong


@pytest.mark.parametrize("schema", [
    {"not": {"if": {"type": "integer"}, "then": {"minimum": 3}, "else": {"type": "string"}}},
    {"not": {"if": {"type": "integer"}, "then": {"minimum": 3}}},
    {"not": {"if": {"type": "integer"}, "else": {"type": "string"}}},
    {"oneOf": [{"if": {"type": "integer"}, "then": {"minimum": 3}, "else": {"type": "string"}},
               {"type": "string", "maxLength": 1}]},
])
def test_a_negated_conditional_fails_where_the_branch_it_takes_fails(schema):
    values = [1, 3, 5, 2.5, "a", "ab", None, [], {}]
    validator = jsonschema.Draft202012Validator(schema)
    grammar = json_schema_to_grammar(schema)
    wrong = [v for v in values if ir_accepts(grammar, json.dumps(v)) != validator.is_valid(v)]
    assert not wrong, wrong


@pytest.mark.parametrize("draft", ["http://json-schema.org/draft-04/schema#",
                                   "http://json-schema.org/draft-07/schema#",
                                   "https://json-schema.org/draft/2020-12/schema"])
@pytest.mark.parametrize("schema", [
    {"not": {"enum": [{"a": 1, "b": [1, 2]}, [1, {"b": 2}], 3, "x", {}]}},
    {"type": "object", "not": {"enum": [{"a": {"a": {}}}]}},
    {"type": "array", "items": {"enum": ["a", "b", "deleted"]}, "minItems": 1, "not": {"enum": [["deleted"]]}},
    # derived keywords of a later draft (const, prefixItems) must keep their meaning where enum values are filtered
    {"enum": [[1, 2], [3], [2, 2], ["a"]], "not": {"enum": [[2, 2], [3]]}},
    {"enum": [{"a1": 1}, {"b": 2}, {"a2": 3, "c": 1}], "not": {"patternProperties": {"^a": False}}},
])
def test_a_negated_object_or_array_value_fails_the_shape_that_pins_it_down(draft, schema):
    schema = {"$schema": draft, **schema}
    values = [{"a": 1, "b": [1, 2]}, {"a": 1, "b": [1, 2, 3]}, {"a": 1, "b": [1, 2], "c": 0}, {"a": 1.0, "b": [1, 2]},
              {"a": 1}, [1, {"b": 2}], [1, {"b": 3}], [1], 3, 3.0, "x", "y", {}, [], {"a": {"a": {}}},
              {"a": {"a": {"b": 1}}}, ["a"], ["deleted"], ["deleted", "a"], [1, 2], [3], [2, 2], {"a1": 1}, {"b": 2},
              {"a2": 3, "c": 1}, None]
    validator = jsonschema.validators.validator_for(schema)(schema)
    grammar = json_schema_to_grammar(schema, property_order="any")
    wrong = [v for v in values if ir_accepts(grammar, json.dumps(v)) != validator.is_valid(v)]
    assert not wrong, wrong


@pytest.mark.parametrize("schema", [
    {"$schema": "http://json-schema.org/draft-07/schema#",
     "not": {"dependencies": {"x": {"not": {"required": ["error"]}}, "y": ["z", "w"]}}},
    {"not": {"dependentSchemas": {"x": {"required": ["q"]}}}},
    {"not": {"dependentRequired": {"x": ["q"]}}},
    {"$schema": "http://json-schema.org/draft-07/schema#",
     "oneOf": [{"if": {"required": ["x"]}, "then": {"not": {"required": ["error"]}}, "else": {"required": ["error"]}},
               {"type": "object", "dependencies": {"x": {"not": {"required": ["error"]}}}}]},
])
def test_a_negated_dependency_holds_a_trigger_and_fails_what_it_asks_for(schema):
    values = [{}, {"x": 1}, {"x": 1, "error": 1}, {"error": 1}, {"y": 1}, {"y": 1, "z": 1}, {"y": 1, "z": 1, "w": 1},
              {"x": 1, "q": 1}, {"q": 1}, 1, "a", None, []]
    validator = jsonschema.validators.validator_for(schema)(schema)
    grammar = json_schema_to_grammar(schema, property_order="any")
    wrong = [v for v in values if ir_accepts(grammar, json.dumps(v)) != validator.is_valid(v)]
    assert not wrong, wrong


def test_a_negated_prefix_fails_at_one_position():
    schema = {"not": {"prefixItems": [{"type": "integer"}, {"type": "string"}]}}
    values = [[], [1], ["s"], [1, "s"], [1, 2], [1, "s", 3], ["s", "s"], 1, None]
    validator = jsonschema.Draft202012Validator(schema)
    grammar = json_schema_to_grammar(schema)
    assert [ir_accepts(grammar, json.dumps(v)) for v in values] == [validator.is_valid(v) for v in values]


@pytest.mark.parametrize("schema", [
    {"not": {"patternProperties": {"^a": {"type": "integer"}}}},     # a key starting with a, its value no integer
    {"type": "object", "not": {"properties": {"a": {}}, "additionalProperties": {"type": "integer"}}},
    # one key admits it: a member of its own
    {"type": "object", "propertyNames": {"maxLength": 1}, "not": {"patternProperties": {"^a": {"type": "integer"}}}},
    {"type": "object", "maxProperties": 1,
     "not": {"patternProperties": {"^a": {"type": "integer"}, "b": {"type": "string"}}}},
    # a declared member may serve, its value narrowed
    {"type": "object", "properties": {"ab": {"type": "integer"}}, "not": {"patternProperties": {"^a": {"minimum": 3}}}},
    {"type": "object", "allOf": [{"not": {"patternProperties": {"^a": {"type": "integer"}}}},
                                 {"not": {"patternProperties": {"^b": {"type": "string"}}}}]},
])
def test_a_negated_pattern_schema_asks_for_a_key_whose_value_fails_it(schema):
    values = [{}, {"a": 1}, {"a": "x"}, {"ab": 1}, {"ab": 5}, {"ab": "x"}, {"a": 1, "a1": "x"}, {"b": "s"}, {"b": 1},
              {"a1": "x", "b1": 1}, {"a1": "x", "b1": "y"}, {"a": None, "c": 1}, {"c": 1}, {"a": [], "ab": 2}, 1, None]
    validator = jsonschema.Draft202012Validator(schema)
    grammar = json_schema_to_grammar(schema, property_order="any")
    wrong = [v for v in values if ir_accepts(grammar, json.dumps(v)) != validator.is_valid(v)]
    assert not wrong, wrong


def test_a_key_held_for_its_value_is_not_written_again():
    """A repeated key keeps its last value: the key that fails the negated schema must differ from the others."""
    tok = byte_level_bpe()
    grammar = compile_json_schema({"not": {"patternProperties": {"^a": {"type": "integer"}}}}, tok,
                                  property_order="any")
    assert accepts(grammar, tok, '{"a1": "x", "a2": 1}') and accepts(grammar, tok, '{"a2": 1, "a1": "x"}')
    assert not accepts(grammar, tok, '{"a1": "x", "a1": 1}')
    assert not accepts(grammar, tok, '{"a1": 1, "a1": "x", "a1": 2}')


def test_a_key_held_by_name_counts_apart_from_the_extras():
    """A declared key failing a negated `properties` is held by name: the extras leave it out, so minProperties
    counts it apart from theirs (which must differ among themselves)."""
    tok = byte_level_bpe()
    grammar = compile_json_schema({"type": "object", "minProperties": 3, "not": {"properties": {"a": {"type": "string"}}}},
                                  tok, property_order="any")
    assert accepts(grammar, tok, '{"a": 1, "b": 2, "c": 3}') and accepts(grammar, tok, '{"b": 2, "a": 1, "c": 3}')
    assert not accepts(grammar, tok, '{"a": "x", "b": 2, "c": 3}')
    assert not accepts(grammar, tok, '{"a": 1, "b": 2, "b": 3}') and not accepts(grammar, tok, '{"a": 1, "a": 2, "b": 3}')


@pytest.mark.parametrize("schema", [
    {"type": "object", "allOf": [{"not": {"properties": {"k": {"type": "integer"}}}},
                                 {"not": {"propertyNames": {"not": {"pattern": "^k"}}}}]},
    {"allOf": [{"not": {"patternProperties": {"^k$": {"type": "integer"}}}},
               {"not": {"patternProperties": {"^k": {"type": "string"}}}}]},
])
def test_a_key_held_by_name_serves_every_negation_it_fails_and_is_not_written_again(schema):
    """One key may fail two negations: held by name for one, it serves the other too, and no extra key held
    for the other writes it again (the second value would replace the first)."""
    tok = byte_level_bpe()
    validator = jsonschema.Draft202012Validator(schema)
    for order in ("schema", "any"):
        grammar = compile_json_schema(schema, tok, property_order=order)
        for value in [{"k": None}, {"k": "x"}, {"k": 5}, {"k": None, "k1": 1}, {"k1": None}, {}]:
            assert accepts(grammar, tok, json.dumps(value)) == validator.is_valid(value), (order, value)
        assert not accepts(grammar, tok, '{"k": "x", "k": 5}') and not accepts(grammar, tok, '{"k": null, "k": 5}')


def test_each_way_of_holding_keys_counts_the_extra_keys_it_leaves():
    """Keys held by name leave the extras fewer keys: each layout's count of them is its own."""
    tok = byte_level_bpe()
    schema = {"type": "object", "propertyNames": {"pattern": "^[a-f]$"}, "properties": {"d": {}, "e": {}, "f": {}},
              "minProperties": 2, "allOf": [{"not": {"patternProperties": {"^[de]$": {"type": "null"}}}},
                                            {"not": {"patternProperties": {"^[af]$": {"type": "null"}}}}]}
    grammar = compile_json_schema(schema, tok, property_order="any")
    assert accepts(grammar, tok, '{"e": 1, "f": 1, "a": null, "b": 1, "c": 1}')
    assert not accepts(grammar, tok, '{"e": 1, "f": 1, "a": null, "b": 1, "b": 2}')
    schema["minProperties"] = 7    # six keys at most
    with pytest.raises(SchemaError, match="unsatisfiable"):
        compile_json_schema(schema, tok)


def test_keys_that_must_exist_by_pattern_are_refused_where_a_count_could_miss_a_repeat():
    # two extra keys could be one key written twice, which minProperties 2 would count twice
    with pytest.raises(UnsupportedSchemaError, match="minProperties beside a key that must exist"):
        json_schema_to_grammar({"type": "object", "minProperties": 2, "not": {"patternProperties": {"a": False}}})
    with pytest.raises(UnsupportedSchemaError, match="more than 4 keys that must exist"):
        json_schema_to_grammar({"allOf": [{"not": {"patternProperties": {c: False}}} for c in "abcde"]})


def test_negations_that_would_split_inside_a_keyword_group_are_refused():
    with pytest.raises(UnsupportedSchemaError, match="format"):
        json_schema_to_grammar({"not": {"properties": {"a": {"format": "email"}}}})


@pytest.mark.parametrize("dialect,ignored", [
    ("http://json-schema.org/draft-04/schema#", True),
    ("http://json-schema.org/draft-06/schema#", True),
    ("http://json-schema.org/draft-07/schema#", False),
    ("https://json-schema.org/draft/2020-12/schema", False),
])
def test_keywords_the_declared_draft_does_not_define_are_annotations(dialect, ignored):
    # `if`/`then` came with draft-07, `prefixItems` and `dependentRequired` with 2019-09/2020-12
    schema = {"$schema": dialect, "type": "object", "if": {"properties": {"k": {"const": 1}}, "required": ["k"]},
              "then": {"required": ["x"]}, "properties": {"p": {"prefixItems": [{"type": "string"}]}},
              "dependentRequired": {"k": ["y"]}}
    validator = jsonschema.validators.validator_for(schema)(schema)
    values = [{"k": 1}, {"k": 1, "x": 0, "y": 0}, {"k": 2}, {"p": [1]}, {"p": ["a"]}, {"k": 1, "x": 0}]
    grammar = json_schema_to_grammar(schema, property_order="any")
    assert [ir_accepts(grammar, json.dumps(v)) for v in values] == [validator.is_valid(v) for v in values]
    assert ir_accepts(grammar, json.dumps({"k": 1})) is ignored


def test_check_schema_takes_the_metaschema_of_the_draft_the_document_names():
    # an https draft-07 URI: jsonschema's exact-URI lookup took it for 2020-12, whose `items` is no array
    tuple_items = {"type": "array", "items": [{"type": "string"}]}
    json_schema_to_grammar({"$schema": "https://json-schema.org/draft-07/schema#", **tuple_items}, check_schema=True)
    with pytest.raises(SchemaError, match=r"metaschema: .* is not of type 'object', 'boolean' \(at /items\)"):
        json_schema_to_grammar({"$schema": "https://json-schema.org/draft/2020-12/schema", **tuple_items},
                               check_schema=True)
    # 2019-09's own metaschema (its documents are read as 2020-12's otherwise)
    json_schema_to_grammar({"$schema": "https://json-schema.org/draft/2019-09/schema", "additionalItems": False,
                            "$recursiveAnchor": True, **tuple_items}, check_schema=True)


def test_a_keyword_the_draft_does_not_define_is_ignored_under_not_and_oneof_too():
    draft4 = "http://json-schema.org/draft-04/schema#"
    # draft-04 has no `const`: `not: {const: 1}` is `not: {}`, which nothing satisfies
    with pytest.raises(SchemaError, match="unsatisfiable"):
        json_schema_to_grammar({"$schema": draft4, "not": {"const": 1}})
    # ...and these branches both match every instance, so no const may prove them apart
    with pytest.raises(UnsupportedSchemaError, match="oneOf"):
        json_schema_to_grammar({"$schema": draft4, "oneOf": [{"properties": {"k": {"const": 1}}},
                                                             {"properties": {"k": {"const": 2}}}]})
    # a property that happens to be called `const` is still a property
    check({"$schema": draft4, "properties": {"const": {"type": "integer"}}}, valid=[{"const": 1}],
          invalid=[{"const": "a"}])


def test_up_to_six_dependent_schemas_compile_on_objects_with_few_declared_properties():
    """MaskBench's Handwritten dep8 shape: five triggers on pattern-keyed members, against jsonschema on every
    set of keys; more triggers, or as many on many declared properties, are refused by name."""
    schema = {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object",
              "patternProperties": {"^[a-e]$": True}, "additionalProperties": False,
              "dependencies": {"a": {"anyOf": [{"required": ["c"]}, {"required": ["b"]}]},
                               "b": {"not": {"required": ["c"]}}, "c": {"required": ["e"]},
                               "d": {"not": {"required": ["e"]}}, "e": {"not": {"required": ["d", "a"]}}}}
    grammar = json_schema_to_grammar(schema)
    for n in range(32):
        instance = {key: 1 for i, key in enumerate("abcde") if n >> i & 1}
        expected = jsonschema.Draft7Validator(schema).is_valid(instance)
        assert ir_accepts(grammar, json.dumps(instance)) == expected, instance
    many = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(12)},
            "dependentSchemas": {f"p{i}": {"required": [f"p{i + 1}"]} for i in range(6)}}
    with pytest.raises(UnsupportedSchemaError, match="6 triggers .* declaring 12 properties: its 64 variants"):
        json_schema_to_grammar(many)
    seven = {"type": "object", "dependentSchemas": {k: {"required": ["z"]} for k in "abcdefg"}}
    with pytest.raises(UnsupportedSchemaError, match="more than 6 triggers"):
        json_schema_to_grammar(seven)


@pytest.mark.parametrize("schema", [
    {"type": "object", "not": {"propertyNames": {"not": {"const": "0"}}}, "patternProperties": {"\\d": {"type": "boolean"}}},
    {"not": {"propertyNames": {"not": {"enum": ["a", "b", 3]}}}},
    {"not": {"propertyNames": False}},
    {"allOf": [{"not": {"propertyNames": {"not": {"const": "a"}}}}, {"not": {"propertyNames": {"not": {"const": "b"}}}}],
     "maxProperties": 2},
])
def test_a_negated_property_names_listing_refused_keys_requires_one_of_them(schema):
    """`not: {propertyNames: {not: {enum}}}` holds for objects with a key among the values (Handwritten's notnames):
    against jsonschema on small objects, keys in any order."""
    grammar = json_schema_to_grammar(schema, property_order="any")
    keys = ["a", "b", "0", "1"]
    instances = [None, 1, "a", [], {}] + [dict(zip(chosen, values)) for n in (1, 2)
                                          for chosen in itertools.permutations(keys, n)
                                          for values in itertools.product([True, 1], repeat=n)]
    validator = jsonschema.Draft202012Validator(schema)
    for instance in instances:
        assert ir_accepts(grammar, json.dumps(instance)) == validator.is_valid(instance), instance


def test_combinators_refs_and_recursion():
    tree = {"$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"},
                                                                   "kids": {"type": "array",
                                                                            "items": {"$ref": "#/$defs/node"}}},
                               "required": ["v"], "additionalProperties": False}},
            "$ref": "#/$defs/node"}
    check(tree, valid=[{"v": 1}, {"v": 1, "kids": [{"v": 2, "kids": [{"v": 3}]}]}], invalid=[{"v": 1, "kids": [{}]}])
    check({"anyOf": [{"type": "string", "maxLength": 1}, {"type": "integer", "minimum": 5}]},
          valid=["a", 7], invalid=["ab", 4])
    check({"oneOf": [{"type": "string"}, {"type": "null"}]}, valid=["a", None], invalid=[1])
    check({"allOf": [{"minimum": 2}, {"maximum": 4}], "type": "integer"}, valid=[2, 4], invalid=[1, 5])
    check({"not": {"enum": ["a", 1]}, "type": ["string", "integer"]}, valid=["b", 2], invalid=["a", 1])
    check({"if": {"type": "string"}, "then": {"minLength": 2}, "else": {"type": "integer"}},
          valid=["ab", 3], invalid=["a", 1.5])
    check({"enum": [1, "a", {"k": [True]}], "not": {"const": "a"}}, valid=[1, 1.0, {"k": [True]}], invalid=["a"])


def _pasted(copies: int) -> dict:
    """An object whose members all hold one subschema, written out in full at each place."""
    item = {"type": "object", "properties": {"id": {"type": "integer", "minimum": 1}, "tags": {
        "type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3}}, "required": ["id"], "oneOf": [
        {"required": ["tags"]}, {"properties": {"id": {"maximum": 9}}}]}
    return {"type": "object", "properties": {f"m{i}": json.loads(json.dumps(item)) for i in range(copies)}}


def test_a_subschema_written_out_at_many_places_compiles_once():
    one, nine = json_schema_to_grammar(_pasted(1)), json_schema_to_grammar(_pasted(9))
    inside = [name for name in one.rules if name.startswith("properties_m0_")]
    assert len(inside) >= 8
    # the item's rules once, named after its first place; each member of the outer object one of its own
    assert [name for name in nine.rules if name.startswith("properties_")] == inside
    assert len(nine.rules) == len(one.rules) + 8
    check(_pasted(9), valid=[{"m0": {"id": 3}, "m8": {"id": 30, "tags": ["b"]}}],
          invalid=[{"m0": {"id": 30}}, {"m5": {"id": 3, "tags": ["a"]}}, {"m8": {"tags": []}}])


def test_subschemas_differing_only_in_annotations_compile_once():
    """Descriptions, titles, defaults and examples constrain nothing: members whose values differ only in those (a
    nested object documented at each place) share one compile.  Only where they are annotations: a property or
    an enum value named like one still tells schemas apart."""
    item = {"type": "object", "properties": {"id": {"type": "integer"}, "tags": {"type": "array"}}}
    documented = {"type": "object", "properties": {
        f"m{i}": dict(item, description=f"the {i}th", title=f"M{i}", default={"id": i}, examples=[{"id": i}])
        for i in range(6)}}
    plain = {"type": "object", "properties": {f"m{i}": item for i in range(6)}}
    assert len(json_schema_to_grammar(documented).rules) == len(json_schema_to_grammar(plain).rules)
    check(documented, valid=[{"m0": {"id": 1}, "m5": {"tags": [1]}}], invalid=[{"m3": {"id": "x"}}])
    named = {"type": "object", "properties": {
        "a": {"type": "object", "properties": {"description": {"type": "integer"}}, "required": ["description"]},
        "b": {"type": "object", "properties": {"title": {"type": "integer"}}, "required": ["title"]},
        "c": {"enum": [{"description": 1}]}, "d": {"enum": [{"description": 2}]}}}
    check(named, valid=[{"a": {"description": 1}, "b": {"title": 2}, "c": {"description": 1}, "d": {"description": 2}}],
          invalid=[{"a": {"title": 1}}, {"b": {"description": 2}}, {"c": {"description": 2}}, {"d": {"description": 1}}])


def test_a_value_that_chooses_or_repeats_is_called_from_its_member():
    """A nullable or array value is a rule of its own, called at the end of its member: the member is a plain chain
    of calls (no subset construction), and members with equal values call one rule."""
    schema = {"type": "object", "properties": {
        "a": {"type": ["string", "null"]}, "b": {"type": ["string", "null"], "description": "B"},
        "c": {"type": "array", "items": {"type": "integer"}}, "d": {"type": "string"}}}
    grammar = json_schema_to_grammar(schema)
    members = {body.items[0].text: body for body in grammar.rules.values()
               if isinstance(body, Seq) and isinstance(body.items[0], Lit)}
    values = {key: body.items[-1] for key, body in members.items()}
    assert all(isinstance(values[key], Ref) and values[key].call for key in ('"a"', '"b"', '"c"'))
    assert values['"a"'] == values['"b"'] and isinstance(values['"d"'], Terminal)
    check(schema, valid=[{"a": None, "b": "x", "c": [1, 2], "d": "y"}, {"c": []}],
          invalid=[{"a": 1}, {"c": [1, "x"]}, {"b": []}])


def test_a_member_value_recursing_through_sequences_alone_compiles():
    """Whether a value is a chain of calls follows its rules once each: a rule met again inside itself is
    recursive (called), where the walk recursed until the stack ran out."""
    schema = {"$defs": {"a": {"type": "array", "prefixItems": [{"$ref": "#/$defs/a"}], "minItems": 1, "items": False}},
              "type": "object", "properties": {"x": {"$ref": "#/$defs/a"}}}
    check(schema, valid=[{}], invalid=[{"x": []}, {"x": [[]]}])


def test_a_keyword_map_and_its_list_form_are_told_apart():
    """An invalid `properties` (a list) never shares the compile of a valid one whose single key reads 'list'."""
    schema = {"type": "object", "properties": {"a": {"type": "object", "properties": {"list": {"type": "integer"}}},
                                               "b": {"type": "object", "properties": [{"type": "integer"}]}}}
    with pytest.raises(SchemaError, match="properties must be an object"):
        json_schema_to_grammar(schema)


def test_a_shared_pattern_automaton_keeps_its_own_build_count():
    """A length bound that leaves a pattern's automaton as it is hands back the memoised automaton: what the
    intersection cost is not written onto it (later schemas would be charged it against the build budget)."""
    grammar = json_schema_to_grammar({"type": "string", "pattern": "^[a-z]+q{3}$", "minLength": 1})
    compile_automaton(grammar)
    assert regex_dfa(grammar.rules["start"].pattern).built_states == 0


def test_the_size_of_a_grammar_counts_each_called_rule_once():
    grammar = Grammar(rules={"start": Seq((Ref("value", call=True), Ref("value", call=True), Ref("inline"))),
                             "value": Seq(tuple(Lit(c) for c in "abcde")),
                             "inline": Seq((Lit("x"), Ref("value", call=True)))}, start="start")
    assert grammar_size(grammar) == 4 + 5   # start's two calls and its inlined rule's two items; the called rule once


def test_the_variants_of_an_object_share_the_members_they_leave_alone():
    """if/then/else and a negation build the object once per variant: the members no variant narrows are one rule
    each, not one per variant (prometheus' six exclusive auth keys compiled 1,200 rules, 339 now)."""
    schema = {"type": "object", "properties": {"kind": {"enum": ["x", "y"]}, "size": {"type": "integer"},
                                               "note": {"type": "string"}, "tags": {"type": "array"}},
              "if": {"properties": {"kind": {"const": "x"}}}, "then": {"required": ["size"]},
              "else": {"properties": {"size": {"maximum": 3}}}}
    grammar = json_schema_to_grammar(schema)
    members = [body.items[0].text for body in grammar.rules.values()
               if isinstance(body, Seq) and isinstance(body.items[0], Lit)]
    assert members.count('"note"') == members.count('"tags"') == 1
    assert members.count('"size"') == 2     # narrowed in one variant: any size, or at most 3
    check(schema, valid=[{"kind": "x", "size": 9}, {"kind": "y", "size": 2, "note": "n"}, {"size": 4, "tags": []}],
          invalid=[{"kind": "x"}, {"kind": "y", "size": 9}, {"tags": []}])


def test_share_names_equal_parts_once_and_an_own_rule_always_anew():
    """Equal members share a rule; an object's extras are parts of its members rule, which tells its parts apart by
    rule: two extras made alike (the keys a witness holds, the other keys) must stay two rules."""
    compiler = SchemaCompiler({}, JsonSchemaOptions())
    value = Terminal("[0-9]+")
    member = compiler.share(Seq((Lit('"a"'), Lit(":"), value)), "/a")
    assert compiler.share(Seq((Lit('"a"'), Lit(":"), value)), "/b") == member
    # an equal terminal compiled apart (one format under two descriptions) is the same value
    assert compiler.share(Seq((Lit('"a"'), Lit(":"), Terminal("[0-9]+", origin=("x", "/c")))), "/c") == member
    assert compiler.share(Seq((Lit('"b"'), Lit(":"), value)), "/b") != member
    extra = Seq((Terminal('"[a-z]+"'), Lit(":"), value))
    assert compiler.share(extra, "/x", own=True) != compiler.share(extra, "/x", own=True)


def test_values_python_equates_and_json_does_not_stay_apart():
    """The content of a subschema names it (see `_compile`): true == 1 == 1.0 in Python, key order is ignored by
    its dict equality, and one relative $ref means another target under another base."""
    check({"properties": {"a": {"const": True}, "b": {"const": 1}}},
          valid=[{"a": True, "b": 1}], invalid=[{"a": 1}, {"b": True}])
    check({"properties": {"a": {"enum": [False]}, "b": {"enum": [0]}}},
          valid=[{"a": False, "b": 0}], invalid=[{"a": 0}, {"b": False}])
    xy = {"x": {"type": "integer"}, "y": {"type": "string"}}
    yx = {"y": {"type": "string"}, "x": {"type": "integer"}}
    ordered = {"properties": {"a": {"properties": xy, "required": ["x", "y"], "additionalProperties": False},
                              "b": {"properties": yx, "required": ["x", "y"], "additionalProperties": False}}}
    grammar = json_schema_to_grammar(ordered)
    assert ir_accepts(grammar, '{"a": {"x": 1, "y": "s"}, "b": {"y": "s", "x": 1}}')
    assert not ir_accepts(grammar, '{"b": {"x": 1, "y": "s"}}')     # schema order, each object its own
    relative = {"type": "object", "properties": {"w": {"$ref": "t.json"}}}     # at two bases
    based = {"$id": "https://example.com/root.json", "properties": {
        "a": {"$id": "https://example.com/a/s.json", "properties": {"v": relative}},
        "b": {"$id": "https://example.com/b/s.json", "properties": {"v": relative}}},
        "$defs": {"ta": {"$id": "https://example.com/a/t.json", "type": "integer"},
                  "tb": {"$id": "https://example.com/b/t.json", "type": "string"}}}
    check(based, valid=[{"a": {"v": {"w": 1}}, "b": {"v": {"w": "s"}}}],
          invalid=[{"a": {"v": {"w": "s"}}}, {"b": {"v": {"w": 1}}}])


@pytest.mark.parametrize("lo,hi", [(0, 33), (10, 100), (31, 64), (64, 64), (65, 65), (40, 95), (100, None),
                                   (0, 10_000)])
def test_long_length_bounds_count_in_chunks_exactly(lo, hi):
    schema = {"type": "string", "minLength": lo} | ({} if hi is None else {"maxLength": hi})
    rng = random.Random(lo)
    top = min(hi if hi is not None else lo + 40, lo + 140)
    lengths = sorted({*range(max(0, lo - 2), lo + 3), *range(max(0, top - 2), top + 3), rng.randint(lo, top)})
    texts = ["".join(rng.choice('ab"\\é\n😀 ') for _ in range(n)) for n in lengths]
    check(schema, valid=[t for t in texts if lo <= len(t) <= (hi if hi is not None else len(t))],
          invalid=[t for t in texts if not lo <= len(t) <= (hi if hi is not None else len(t))])
    assert compile_automaton(json_schema_to_grammar(schema)).num_states < 2000  # unrolled: 10,000 x 15 states


@pytest.mark.parametrize("lo,hi", [(0, 1025), (1000, 1100), (1500, 10_000)])
def test_long_length_bounds_hold_at_both_edges(lo, hi):
    """Past _FLAT chunks with the real constants: both bounds hold exactly, whatever the levels of the count."""
    tokenizer = byte_level_bpe()
    compiled = compile_json_schema({"type": "string", "minLength": lo, "maxLength": hi}, tokenizer)
    for n in {*range(max(0, lo - 2), lo + 3), *range(hi - 2, hi + 3)}:
        text = json.dumps("ab\"é\n"[n % 5] * n, ensure_ascii=False)
        assert accepts(compiled, tokenizer, text) == (lo <= n <= hi), n


@pytest.mark.parametrize("lo,hi", [(0, 7), (0, 64), (3, 64), (10, 97), (33, 130), (0, 200), (64, 129), (91, None)])
def test_long_counts_go_in_base_chunk_exactly(monkeypatch, lo, hi):
    """The counting past _FLAT chunks, at a small scale: chunks of 2 characters, counted flat up to 4."""
    monkeypatch.setattr(json_schema_scalars, "CHUNK", 2)
    monkeypatch.setattr(json_schema_scalars, "_FLAT", 4)
    schema = {"type": "string", "minLength": lo} | ({} if hi is None else {"maxLength": hi})
    top = hi if hi is not None else lo + 40
    texts = ["ab\"é😀\n"[n % 6] * n for n in range(max(0, lo - 3), top + 4)]
    fits = [lo <= len(t) and (hi is None or len(t) <= hi) for t in texts]
    check(schema, valid=[t for t, ok in zip(texts, fits) if ok], invalid=[t for t, ok in zip(texts, fits) if not ok])


def test_a_million_characters_count_in_a_few_thousand_states():
    schema = {"type": "string", "minLength": 5, "maxLength": 1_000_000}
    check(schema, valid=["abcde"], invalid=["abcd", 5])
    compiled = compile_json_schema(schema, byte_level_bpe())
    # long texts through the automaton itself: the IR oracle tries every end of every terminal (quadratic)
    assert _matches(compiled, json.dumps("x" * 5000)) and not _matches(compiled, json.dumps("x" * 4))
    assert compiled.automaton.num_states < 5000  # counted flat: 31,250 chunks


def test_a_repeated_item_is_called_rather_than_written_out_per_repetition():
    inner = {"type": "array", "items": {"type": "string", "maxLength": 255}, "maxItems": 100}
    schema = {"type": "array", "items": inner, "maxItems": 100}
    check(schema, valid=[[], [["a"] * 100] * 3, [[], ["x" * 255]]], invalid=[[["a"] * 101], [["x" * 256]]])
    assert compile_automaton(json_schema_to_grammar(schema)).num_states < 3000  # written out: 100 x 100 strings


def _matches(compiled, text: str) -> bool:
    """Whether a compiled grammar reads `text` byte by byte to a complete end (no tokenizing: long texts)."""
    state = compiled.step(compiled.initial, text.encode())
    return state is not None and compiled.closure(state)[1]


@pytest.mark.parametrize("lo, hi", [(0, 33), (0, 100), (40, 100), (0, 999), (70, 1000), (300, 300), (5, 4097)])
def test_long_item_counts_are_counted_not_written_out(lo, hi):
    """Past a few dozen items an array's count goes in base 8 (json_schema_arrays._tail_items): every count from
    minItems to maxItems, and no other, in a few hundred automaton states at most."""
    schema = {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": lo, "maxItems": hi}
    compiled = compile_json_schema(schema, byte_level_bpe())
    for n in {lo, hi, max(lo - 1, 0), hi + 1, 8, 63, 64, 65, 512} | set(range(lo, hi + 1, max(7, (hi - lo) // 30))):
        assert _matches(compiled, json.dumps(list(range(n)))) == (lo <= n <= hi), n
    assert not _matches(compiled, json.dumps([-1] * max(lo, 1)))
    assert compiled.automaton.num_states < 400    # written out: up to 4,097 items


def test_a_long_string_held_by_many_members_is_called_once():
    """A maxLength in the thousands is counted in chunks (over a hundred automaton nodes): called, not written
    out in each member holding it."""
    schema = {"type": "object", "properties": {f"p{i}": {"type": "string", "maxLength": 32767} for i in range(40)}}
    compiled = compile_json_schema(schema, byte_level_bpe())
    assert _matches(compiled, json.dumps({"p0": "x" * 5000, "p39": "y" * 32767}))
    assert not _matches(compiled, json.dumps({"p1": "x" * 32768}))
    assert compiled.automaton.num_states < 2500   # inlined in each member: 7,833


def test_a_rule_name_is_never_handed_out_twice():
    """`a` compiled twice names its second count `defs_a_8_items_1`, which `$defs/a_8_items_1` names itself: the two
    rules must not share the name (one body replaced the other, and arrays of `q` were refused)."""
    schema = {"$defs": {"a": {"type": "array", "items": {"type": "integer"}, "maxItems": 100},
                        "a_8_items_1": {"type": "array", "items": {"type": "boolean"}}},
              "type": "object",
              "properties": {"p": {"allOf": [{"$ref": "#/$defs/a"}, {"minItems": 1}]},
                             "q": {"allOf": [{"$ref": "#/$defs/a"}, {"minItems": 2}]},
                             "t": {"$ref": "#/$defs/a_8_items_1"}}}
    check(schema, valid=[{"q": [1] * 50}, {"p": [1] * 100, "t": [True]}], invalid=[{"q": [1] * 101}, {"t": [1]}])


def test_any_value_kept_across_schemas_brings_the_rules_it_made():
    """With max_string_length, any value's strings are a counted rule of their own: a later schema reusing the kept
    any_value body gets that rule too (it raised 'refers to undefined rule')."""
    for schema in [{"type": "object"}, {"type": "array"}, {"type": "object", "properties": {"a": {}}}]:
        grammar = json_schema_to_grammar(schema, max_string_length=1000)
        compile_automaton(grammar)
        value = {"a": ["x" * 900]} if schema["type"] == "object" else ["x" * 900, {"b": "y"}]
        assert ir_accepts(grammar, json.dumps(value))


def test_an_object_with_a_thousand_optional_properties_stays_linear():
    n = 1000
    schema = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(n)},
              "additionalProperties": False}
    grammar = json_schema_to_grammar(schema)
    assert compile_automaton(grammar).num_states < 20 * n  # written out: every slot holds every later one
    tokenizer = byte_level_bpe()
    compiled = compile_json_schema(schema, tokenizer)
    valid = [{}, {"p0": 1}, {"p999": 2}, {f"p{i}": i for i in range(0, n, 97)}, {"p3": 1, "p4": 2}]
    invalid = ['{"p4": 1, "p3": 2}', '{"p5": 1, "p5": 2}', '{"q": 1}', '{"p1": "x"}']
    assert all(accepts(compiled, tokenizer, json.dumps(value)) for value in valid)
    assert not any(accepts(compiled, tokenizer, text) for text in invalid)


def test_a_recursive_object_with_many_properties_chains_its_tails_through_calls():
    props = {f"p{i}": {"type": "integer"} for i in range(12)} | {"kids": {"type": "array", "items": {"$ref": "#"}}}
    schema = {"type": "object", "properties": props, "additionalProperties": False}
    tokenizer = byte_level_bpe()
    compiled = compile_json_schema(schema, tokenizer)
    for value in [{}, {"p3": 1, "kids": [{"p0": 2}, {"kids": []}]}, {"p11": 1, "kids": [{"kids": [{"p5": 0}]}]}]:
        assert accepts(compiled, tokenizer, json.dumps(value)), value
    for text in ['{"kids": [{"p1": 1, "p0": 2}]}', '{"p1": 1, "p1": 2}', '{"kids": [{"x": 1}]}']:
        assert not accepts(compiled, tokenizer, text), text


@pytest.mark.parametrize("schema,values", [
    ({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}, "c": {}},
      "oneOf": [{"required": ["a"]}, {"required": ["b"]}]},
     [{}, {"a": 1}, {"b": 2}, {"a": 1, "b": 2}, {"c": 1}, {"a": 1, "c": 3}, {"b": 1, "zz": 2}]),
    ({"oneOf": [{"required": ["a", "b"]}, {"required": ["a", "c"]}]},
     [{"a": 1, "b": 2}, {"a": 1, "c": 2}, {"a": 1, "b": 2, "c": 3}, {"a": 1}, "x", 5]),
    ({"type": "string", "oneOf": [{"pattern": "^a"}, {"pattern": "b$"}]}, ["a", "b", "ab", "x", "axb", "ba"]),
    ({"oneOf": [{"type": "integer"}, {"type": "number"}, {"enum": ["x", 2.5]}]},
     [1, 2.5, 3.5, 7, "x", "y", 2]),
    ({"type": "object", "not": {"required": ["a", "b"]}}, [{}, {"a": 1}, {"b": 1}, {"a": 1, "b": 2}]),
    ({"not": {"pattern": "^x"}}, ["x", "xy", "y", 1, None, [1]]),
    # rewrites of one subschema reached through $ref stay apart when compiled conjunctions are memoised
    ({"$defs": {"o": {"type": "object", "properties": {"a": {}, "b": {}}}}, "$ref": "#/$defs/o",
      "oneOf": [{"required": ["a"]}, {"required": ["b"]}]}, [{"a": 1}, {"b": 1}, {"a": 1, "b": 2}, {}]),
    ({"$defs": {"o": {"type": "object"}}, "$ref": "#/$defs/o", "not": {"required": ["a", "b"]}},
     [{"a": 1}, {"b": 1}, {"a": 1, "b": 2}, {}]),
    ({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
      "dependentSchemas": {"a": {"required": ["b"], "properties": {"b": {"maxLength": 2}}}}},
     [{}, {"a": 1}, {"a": 1, "b": "xy"}, {"a": 1, "b": "xyz"}, {"b": "xyz"}]),
    ({"$schema": "http://json-schema.org/draft-07/schema#", "properties": {"a": {}, "b": {}, "c": {}},
      "dependencies": {"a": ["b"], "c": {"properties": {"a": {"type": "integer"}}}}},
     [{}, {"a": 1}, {"a": 1, "b": 2}, {"a": "s", "b": 2, "c": 3}, {"a": 5, "b": 2, "c": 3}, {"c": 1}, "x"]),
    ({"dependentSchemas": {"a": False}}, [{}, {"a": 1}, {"b": 1}, 2]),
    ({"not": {"anyOf": [{"type": "string"}, {"type": "integer"}]}}, ["a", 1, 1.5, None, True, [1], {}]),
    ({"type": "integer", "not": {"allOf": [{"enum": [1, 2, 3]}, {"enum": [2, 3, 4]}]}}, [1, 2, 3, 4, 5]),
    ({"not": {"not": {"type": "string", "maxLength": 2}}}, ["ab", "abc", 1]),
    ({"type": "object", "properties": {"a": {}, "b": {}}, "not": {"anyOf": [{"required": ["a"]}, {"required": ["b"]}]}},
     [{}, {"a": 1}, {"b": 1}, {"a": 1, "b": 2}]),
    # multipleOf by any step is a residue automaton, negated as an exclusion; several steps make one
    ({"type": "integer", "multipleOf": 3}, [0, 3, -9, 12, 3.0, 4, 10, 1.5]),
    ({"type": "number", "minimum": 0, "multipleOf": 1.5}, [0, 1.5, 3, 4.5, 4.50, 1, 2.25, -1.5]),
    ({"not": {"multipleOf": 3}}, [1, 3, 4.5, 6, 6.0, -7, "a", None]),
    ({"type": "integer", "allOf": [{"multipleOf": 4}, {"multipleOf": 6}], "not": {"multipleOf": 8}},
     [12, 24, 36, 48, 60, 8, 6]),
    ({"type": "number", "not": {"anyOf": [{"multipleOf": 2}, {"multipleOf": 0.75}]}},
     [1, 2, 0.75, 1.5, 0.5, 3.5, 2.25, 6]),
    ({"oneOf": [{"multipleOf": 3}, {"multipleOf": 5}], "type": "integer"}, [3, 5, 15, 30, 7, 9, 10]),
    # a whole step keeps one residue per state (12,012 states, where a fraction block per residue made 36,039)
    ({"type": "number", "allOf": [{"multipleOf": 12}, {"multipleOf": 1001}]},
     [0, 12012, -24024, 12012.0, 12012.5, 6006, 1001, 12, 24024.00]),
    ({"type": "integer", "multipleOf": 3, "maximum": -100, "minimum": -1000,    # differences one at a time
      "not": {"anyOf": [{"multipleOf": 2}, {"multipleOf": 5}, {"multipleOf": 7}, {"multipleOf": 11}, {"multipleOf": 13},
                        {"multipleOf": 37}]}}, [-111, -117, -129, -120, -999, -1002, 3]),
    # an excluded step that divides the required one leaves nothing (that branch); one that is a multiple of
    # another excluded step adds nothing
    ({"type": "integer", "oneOf": [{"multipleOf": 33}, {"multipleOf": 12}], "not": {"multipleOf": 11}},
     [12, 24, 33, 66, 132, 7, 0]),
    ({"type": "number", "not": {"anyOf": [{"multipleOf": 8}, {"multipleOf": 4}, {"multipleOf": 0.5}, {"multipleOf": 6}]}},
     [1, 0.25, 0.5, 1.5, 4, 6, 8, 10, 13, 2.75]),
    ({"type": "integer", "multipleOf": 1.5, "anyOf": [{"not": {"multipleOf": 0.75}}, {"maximum": 3}]},
     [3, 6, 0, 1, 2, -3]),
    # bounds negate into the opposite bound on their type; items into an item that fails them
    ({"not": {"maxLength": 2, "minLength": 1}}, ["", "a", "ab", "abc", 1]),
    ({"type": "object", "not": {"maxProperties": 1}}, [{}, {"a": 1}, {"a": 1, "b": 2}]),
    ({"type": "integer", "not": {"exclusiveMaximum": 3, "minimum": 0}}, [-1, 0, 2, 3, 4]),
    ({"$schema": "http://json-schema.org/draft-04/schema#", "not": {"minimum": 5, "exclusiveMinimum": True}},
     [4, 5, 6, 5.5]),
    ({"type": "array", "not": {"items": {"type": "string", "maxLength": 2}}}, [[], ["ab"], ["abc"], ["a", 1], [1]]),
    ({"oneOf": [{"type": "array", "items": {"type": "integer"}}, {"type": "array", "minItems": 2}]},
     [[], [1], [1, 2], ["a", "b"], ["a"]]),
    ({"type": "object", "properties": {"a": {}}, "not": {"anyOf": [{"required": ["a"]}, {"minProperties": 2}]}},
     [{}, {"a": 1}, {"b": 1}, {"b": 1, "c": 2}]),
    # a $ref negates as the conjuncts it stands for (its siblings among them)
    ({"$defs": {"short": {"type": "string", "maxLength": 2}, "digits": {"pattern": "^[0-9]+$"}},
      "oneOf": [{"$ref": "#/$defs/short"}, {"$ref": "#/$defs/digits", "type": "string"}]},
     ["a", "12", "123", "abc", "", 5]),
    ({"$defs": {"pos": {"allOf": [{"type": "integer"}, {"minimum": 1}]}}, "not": {"$ref": "#/$defs/pos"}},
     [0, 1, 2, -3, 1.5, "x"]),
    # a closed object negates where the conjunction closes the object too: its keys the other lacks
    ({"oneOf": [{"type": "object", "properties": {"a": {"type": "integer"}, "b": {}}, "additionalProperties": False},
                {"type": "object", "properties": {"a": {"type": "integer"}, "c": {}}, "additionalProperties": False}]},
     [{}, {"a": 1}, {"b": 1}, {"c": 2}, {"a": 1, "b": 2}, {"b": 1, "c": 1}, {"a": "x"}, {"d": 1}]),
    ({"oneOf": [{"properties": {"key": {"maxLength": 3, "type": "string"}}, "additionalProperties": False},
                {"properties": {"keys": {"type": "array", "items": {"type": "string"}}}, "additionalProperties": False}]},
     [{}, {"key": "ab"}, {"keys": ["a"]}, {"key": "ab", "keys": []}, {"key": "abcd"}, 1, "x"]),
    ({"type": "object", "properties": {"a": {}, "b": {"type": "string"}}, "additionalProperties": False,
      "not": {"properties": {"b": {"type": "string"}}, "additionalProperties": {"type": "integer"}}},
     [{}, {"a": 1}, {"a": "x"}, {"b": "s"}, {"a": "x", "b": "s"}]),
    # a oneOf of exclusive branches fails where each does, so it nests inside another oneOf
    ({"oneOf": [{"oneOf": [{"type": "string", "maxLength": 2}, {"type": "integer"}]}, {"type": "string", "minLength": 2}]},
     ["a", "ab", "abc", 1, 2.5, None]),
    # branches told apart by a key only as objects: a number and an integer still share the integers
    ({"oneOf": [{"type": ["number", "object"], "properties": {"k": {"const": 1}}, "required": ["k"]},
                {"type": ["integer", "object"], "properties": {"k": {"const": 2}}, "required": ["k"]}]},
     [5, 5.5, {"k": 1}, {"k": 2}, {"k": 3}]),
])
def test_keywords_rewritten_into_choices_are_exact(schema, values):
    validator = jsonschema.validators.validator_for(schema)(schema)
    check(schema, valid=[v for v in values if validator.is_valid(v)],
          invalid=[v for v in values if not validator.is_valid(v)])


@pytest.mark.parametrize("schema,values", [
    ({"not": {"anyOf": [{"type": "object", "properties": {"kind": {"const": "a"}, "x": {"type": "integer"}},
                         "required": ["kind", "x"]},
                        {"type": "object", "properties": {"kind": {"enum": ["b", "c"]}, "y": {"type": "string"}},
                         "required": ["kind"]}]}},
     [{}, {"kind": "a"}, {"kind": "a", "x": 1}, {"kind": "a", "x": "s"}, {"kind": "b"}, {"kind": "c", "y": 1},
      {"kind": "c", "y": "s"}, {"kind": "d"}, {"kind": 1}, {"x": 1}, "a", 1, None, []]),
    ({"type": "object", "not": {"oneOf": [{"properties": {"k": {"const": "a"}}, "required": ["k"]},
                                          {"properties": {"k": {"const": "b"}, "n": {"minimum": 2}}, "required": ["k"]}]}},
     [{}, {"k": "a"}, {"k": "b"}, {"k": "b", "n": 1}, {"k": "b", "n": 3}, {"k": "c"}, {"j": 1}]),
    ({"not": {"anyOf": [{"type": "object", "properties": {"t": {"enum": [1, True]}}, "required": ["t"]},
                        {"type": "object", "properties": {"t": {"const": 2}, "u": {"type": "null"}}, "required": ["t"]}]}},
     [{"t": 1}, {"t": 1.0}, {"t": True}, {"t": 2}, {"t": 2.0}, {"t": 2, "u": 1}, {"t": 3}, {"t": "1"}, 0]),
    # a recursive tagged union inside the exclusions of a oneOf (Github_hard's o91595)
    ({"$defs": {"t": {"type": "object", "oneOf": [
        {"type": "object", "properties": {"k": {"const": "leaf"}}, "required": ["k"]},
        {"type": "object", "properties": {"k": {"const": "list"}, "of": {"$ref": "#/$defs/t"}}, "required": ["k", "of"]}]}},
      "type": "object", "oneOf": [{"properties": {"a": {"type": "boolean"}}, "required": ["a"]},
                                  {"properties": {"r": {"$ref": "#/$defs/t"}}, "required": ["r"]}]},
     [{}, {"a": True}, {"r": {"k": "leaf"}}, {"a": True, "r": {"k": "leaf"}}, {"a": 1, "r": {"k": "leaf"}},
      {"a": True, "r": {"k": "list"}}, {"a": True, "r": {"k": "list", "of": {"k": "leaf"}}},
      {"a": True, "r": {"k": "list", "of": {"k": "x"}}}, {"a": True, "r": {"k": "list", "of": {"k": "list"}}},
      {"a": True, "r": 5}, {"a": True, "r": {"k": "x"}}, {"a": True, "r": {}}, {"r": {"k": "list", "of": 1}}]),
    # sized as a sum of its branches' negations: as a product (7 ** 5) the overlapping oneOf was refused
    ({"oneOf": [{"anyOf": [{"type": "object", "properties": {"kind": {"const": f"k{k}"}, "a": {"type": "integer"},
                                                             "b": {"type": "string"}, "c": {"type": "boolean"}},
                            "required": ["kind", "a"]} for k in range(5)]},
                {"type": "object", "properties": {"a": {"minimum": 10}}}]},
     [{"kind": "k0", "a": 1}, {"kind": "k0", "a": 11}, {"a": 11}, {"a": 1}, {"kind": "k9", "a": 1}, "x", {},
      {"kind": "k3", "a": 20, "b": "x"}, {"kind": "k2", "a": 3, "c": 1}, {"kind": "k2", "a": 30, "c": 1}]),
])
def test_negated_tagged_unions_fail_where_the_tag_or_its_branch_fails(schema, values, monkeypatch):
    # a tagged union (a required key whose constants tell the branches apart) fails where the tag is missing or
    # unknown, or where the branch the tag picks fails: one negated branch per tag, not every branch negated
    # together (any property order: these objects hold the keys of several branches)
    tags = []
    split = json_schema_combinators._failing_tagged
    monkeypatch.setattr(json_schema_combinators, "_failing_tagged", lambda *a: tags.append(a[4]) or split(*a))
    validator = jsonschema.validators.validator_for(schema)(schema)
    check(schema, valid=[v for v in values if validator.is_valid(v)],
          invalid=[v for v in values if not validator.is_valid(v)], property_order="any")
    assert tags and set(tags) <= {"kind", "k", "t"}


@pytest.mark.parametrize("schema", [
    {"not": {"oneOf": [{"type": "string"}, {"maxLength": 3}]}},     # strings of up to 3 match both
    {"not": {"oneOf": [{"type": "integer"}, {"minimum": 3}, {"multipleOf": 2}]}},
    {"oneOf": [{"type": "number"}, {"not": {"oneOf": [{"type": "integer"}, {"minimum": 3}]}}]},
])
def test_a_negated_oneof_whose_branches_overlap_fails_where_none_or_two_match(schema):
    values = [1, 2, 3, 4, 5, 6, 2.5, 3.5, -1, "a", "abcd", "", None, [], {}]
    validator = jsonschema.Draft202012Validator(schema)
    grammar = json_schema_to_grammar(schema)
    wrong = [v for v in values if ir_accepts(grammar, json.dumps(v)) != validator.is_valid(v)]
    assert not wrong, wrong


def test_a_oneof_branch_negates_only_the_branches_it_may_match_together_with():
    # the email branch is a string, apart from the two numbers: it is never negated (format does not negate)
    schema = {"oneOf": [{"type": "integer"}, {"type": "number", "minimum": 3}, {"type": "string", "format": "email"}]}
    values = [1, 2, 3, 4, 2.5, 3.5, -1, "a@b.c", "x", None]
    validator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())
    grammar = json_schema_to_grammar(schema)
    assert [ir_accepts(grammar, json.dumps(v)) for v in values] == [validator.is_valid(v) for v in values]
    assert [validator.is_valid(v) for v in values] == [True, True, False, False, False, True, True, True, False,
                                                      False]



_TAGGED = {"a": {"type": "object", "properties": {"t": {"const": "a"}, "x": {"type": "integer"}}, "required": ["t"]},
           "b": {"type": "object", "properties": {"t": {"const": "b"}}, "required": ["t"]},
           "c": {"type": "object", "properties": {"t": {"const": "c"}, "y": {"type": "string"}}, "required": ["t", "y"]}}


@pytest.mark.parametrize("schema,values", [
    # the values of a key both require are apart: a oneOf of tags against another tag (MARPL's rule heads)
    ({"$defs": _TAGGED, "oneOf": [
        {"type": "object", "properties": {"v": {"oneOf": [{"$ref": "#/$defs/a"}, {"$ref": "#/$defs/b"}]}}, "required": ["v"]},
        {"type": "object", "properties": {"v": {"$ref": "#/$defs/c"}}, "required": ["v"]}]},
     [{"v": {"t": "a"}}, {"v": {"t": "b"}}, {"v": {"t": "c", "y": "s"}}, {"v": {"t": "c"}}, {"v": {"t": "d"}}, {}]),
    # every branch of one side's anyOf apart from the other side
    ({"$defs": _TAGGED, "type": "array", "items": {"oneOf": [
        {"anyOf": [{"$ref": "#/$defs/a"}, {"$ref": "#/$defs/b"}]}, {"$ref": "#/$defs/c"}]}},
     [[], [{"t": "a", "x": 1}, {"t": "c", "y": "s"}], [{"t": "a", "x": "s"}], [{"t": "c"}], [{"t": "b"}, 1]]),
    # a key only one side requires, whose constant the other side's (when it is there) excludes
    ({"oneOf": [{"type": "object", "properties": {"t": {"const": "a"}}, "required": ["t"]},
                {"type": "object", "properties": {"t": {"const": "s"}, "s": {"type": "integer"}}, "required": ["s"]}]},
     [{"t": "a"}, {"s": 1}, {"t": "s", "s": 1}, {"t": "a", "s": 1}, {"s": "x"}, {}]),
])
def test_oneof_branches_proved_apart_compile_as_anyof(schema, values, monkeypatch):
    def overlapping(*args):
        raise AssertionError("branches proved apart were compiled as overlapping")
    monkeypatch.setattr(json_schema_combinators, "_exactly_one", overlapping)
    validator = jsonschema.Draft202012Validator(schema)
    check(schema, valid=[v for v in values if validator.is_valid(v)],
          invalid=[v for v in values if not validator.is_valid(v)], property_order="any")


def test_a_negation_the_rest_of_the_conjunction_implies_is_dropped(monkeypatch):
    # an object tagged "a" is never one tagged "b": the `not` adds nothing, and nothing of it is compiled
    negations = []
    rewrite = json_schema_combinators._negated_members
    monkeypatch.setattr(json_schema_combinators, "_negated_members", lambda *a: negations.append(a) or rewrite(*a))
    schema = {"type": "object", "properties": {"t": {"const": "a"}, "n": {"type": "integer"}}, "required": ["t"],
              "not": {"properties": {"t": {"const": "b"}, "n": {"minimum": 3}}, "required": ["t"]}}
    check(schema, valid=[{"t": "a"}, {"t": "a", "n": 5}], invalid=[{"t": "b"}, {}, {"t": "a", "n": "x"}])
    assert not negations


def test_a_declared_key_held_alike_on_both_sides_is_never_asked_to_fail(monkeypatch):
    # the branches overlap (an object with both "u" and "s"), so each is compiled with the other negated; "d" is a
    # string on both sides, so "a d that is no string" is never built as an object of its own
    asked = []
    holding = json_schema_combinators._holding
    monkeypatch.setattr(json_schema_combinators, "_holding",
                        lambda ctx, rest, part, witnesses, *keyword: asked.extend(w.get("name") for w in witnesses)
                        or holding(ctx, rest, part, witnesses, *keyword))
    schema = {"oneOf": [{"type": "object", "properties": {"d": {"type": "string"}, "u": {"type": "string"}},
                         "required": ["u"]},
                        {"type": "object", "properties": {"d": {"type": "string"}, "s": {"type": "integer"}},
                         "required": ["s"]}]}
    values = [{"u": "x"}, {"s": 1}, {"u": "x", "s": 1}, {"u": "x", "s": "y"}, {"u": 1, "s": 1}, {"d": "z", "u": "x"},
              {"d": 1, "u": "x"}, {}]
    validator = jsonschema.Draft202012Validator(schema)
    check(schema, valid=[v for v in values if validator.is_valid(v)],
          invalid=[v for v in values if not validator.is_valid(v)], property_order="any")
    assert "d" not in asked and {"s", "u"} <= set(asked)


_D7 = "http://json-schema.org/draft-07/schema#"
_TAG_BESIDE_REF = {"$ref": "#/definitions/s", "const": "a"}     # the const is ignored before 2019-09


@pytest.mark.parametrize("schema,values", [
    ({"$schema": _D7, "definitions": {"s": {"type": "string"}}, "type": "object", "required": ["k"],
      "properties": {"k": _TAG_BESIDE_REF}, "not": {"required": ["k"], "properties": {"k": {"const": "b"}}}},
     [{"k": "a"}, {"k": "b"}, {"k": "c"}]),
    ({"$schema": _D7, "definitions": {"s": {"type": "string"}}, "oneOf": [
        {"type": "object", "required": ["k"], "properties": {"k": _TAG_BESIDE_REF}},
        {"type": "object", "properties": {"k": {"const": "b"}}}]}, [{"k": "a"}, {"k": "b"}, {"k": "c"}, {}]),
    ({"$schema": _D7, "definitions": {"s": {"type": "string"}}, "not": {"anyOf": [
        {"type": "object", "required": ["k"], "properties": {"k": _TAG_BESIDE_REF, "v": {"type": "string"}}},
        {"type": "object", "required": ["k"], "properties": {"k": {"const": "b"}, "v": {"type": "integer"}}}]}},
     [{"k": "a"}, {"k": "c"}, {"k": "b", "v": "s"}, {"k": "b", "v": 1}, {"k": "c", "v": 1}, 5]),
    # from 2019-09 on the const beside the $ref holds: the branches are apart
    ({"definitions": {"s": {"type": "string"}}, "oneOf": [
        {"type": "object", "required": ["k"], "properties": {"k": _TAG_BESIDE_REF}},
        {"type": "object", "properties": {"k": {"const": "b"}}}]}, [{"k": "a"}, {"k": "b"}, {"k": "c"}, {}]),
])
def test_a_constant_beside_a_ref_tells_branches_apart_only_where_the_draft_reads_it(schema, values):
    validator = jsonschema.validators.validator_for(schema)(schema)
    check(schema, valid=[v for v in values if validator.is_valid(v)],
          invalid=[v for v in values if not validator.is_valid(v)], property_order="any")

def test_a_negated_oneof_overlapping_in_too_many_pairs_is_refused():
    with pytest.raises(UnsupportedSchemaError, match="more than 6 pairs") as info:
        json_schema_to_grammar({"not": {"oneOf": [{"minimum": i} for i in range(5)]}})
    assert info.value.pointer == "/not/oneOf"


_TREE = {"anyOf": [{"type": "integer"}, {"type": "array", "items": {"$ref": "#/$defs/t"}, "minItems": 1}]}
_NODE = {"type": "object", "required": ["v"], "properties": {"v": {"type": "integer"},
                                                              "kids": {"type": "array", "items": {"$ref": "#/$defs/n"}}}}


@pytest.mark.parametrize("schema", [
    {"$defs": {"t": _TREE}, "not": {"$ref": "#/$defs/t"}},
    {"$defs": {"t": _TREE}, "type": "array", "not": {"$ref": "#/$defs/t"}},
    # the second branch and not the first: an object none of whose nodes, at any depth, lacks an integer v
    {"$defs": {"n": _NODE}, "oneOf": [{"$ref": "#/$defs/n"},
                                      {"type": "object", "properties": {"kids": {"type": "array", "maxItems": 1}}}]},
])
def test_negation_through_a_recursive_ref_calls_its_own_rule(schema):
    values = [[], [[]], [[[]]], [1], [[1]], [[[1]]], 1, 1.5, "x", {}, [[], []], [[[1]], [[1]]], [[[]], [[1]]],
              [1, [2, []]], {"v": 1}, {"v": 1, "kids": []}, {"v": 1, "kids": [{"v": 2}]},
              {"v": 1, "kids": [{"v": 2}, {"v": 3}]}, {"v": 1, "kids": [{"w": 2}]}, {"kids": [1]}, {"kids": [1, 2]},
              {"v": 1, "kids": [{"v": 2, "kids": [{}]}]}, {"v": 1, "kids": [{"v": 2, "kids": [{}]}, 3]}, {"v": "a"}]
    validator = jsonschema.Draft202012Validator(schema)
    grammar = json_schema_to_grammar(schema, property_order="any")
    wrong = [v for v in values if ir_accepts(grammar, json.dumps(v)) != validator.is_valid(v)]
    assert not wrong, wrong
    assert 0 < sum(map(validator.is_valid, values)) < len(values)


def test_strings_multiplied_by_distributed_combinators_are_refused_within_the_terminal_budget():
    """allOf over anyOfs of patterns distributes into a string terminal per combination (3**6 here): the
    compile stops at the grammar's terminal budget with the pointer instead of building thousands."""
    groups = [{"anyOf": [{"pattern": f"{a}{i}"} for a in "xyz"]} for i in range(6)]
    with pytest.raises(UnsupportedSchemaError, match="automaton states") as info:
        compile_json_schema({"type": "string", "minLength": 10, "maxLength": 30, "allOf": groups}, byte_level_bpe())
    assert info.value.pointer == ""


def test_overlapping_one_of_with_branches_that_do_not_negate_is_refused():
    schema = {"$defs": {"s": {"type": "string", "format": "email"}},
              "oneOf": [{"$ref": "#/$defs/s"}, {"type": "string", "pattern": "a"}]}
    with pytest.raises(UnsupportedSchemaError, match="oneOf branches 0 and 1 may both match") as info:
        json_schema_to_grammar(schema)
    assert info.value.pointer == "/oneOf"
    with pytest.raises(UnsupportedSchemaError, match=r"not with keywords \['format'\]"):
        json_schema_to_grammar({"$defs": {"s": {"format": "email"}}, "not": {"$ref": "#/$defs/s", "type": "string"}})


_DEFS = {"A": {"type": ["string", "null", "boolean"]}, "B": {"pattern": "^a"}}
_X = {"$ref": "#/$defs/A", "not": {"$ref": "#/$defs/B", "type": "string"}}


@pytest.mark.parametrize("schema", [
    # a derived `not` over X sits at X's place + /not, where X's own `not` sits: the two negated conjuncts share a
    # place, and only their schemas tell them apart (found by review)
    {"$defs": _DEFS, "$ref": "#/$defs/A", "if": _X},
    {"$defs": _DEFS, "type": "array", "items": {"$ref": "#/$defs/A"}, "contains": _X, "maxContains": 1},
])
def test_negated_conjuncts_at_one_place_stay_apart(schema):
    values = ["abc", "b", None, True, 1, [], [None], [None, "abc"], [None, None], ["abc", "b"], ["b", "c"]]
    validator = jsonschema.Draft202012Validator(schema)
    grammar = json_schema_to_grammar(schema)
    wrong = [v for v in values if ir_accepts(grammar, json.dumps(v)) != validator.is_valid(v)]
    assert not wrong, wrong


def test_enum_values_are_filtered_by_the_numeric_bounds_a_negation_writes_in_draft_04():
    schema = {"$schema": "http://json-schema.org/draft-04/schema#", "not": {"minimum": 5},
              "anyOf": [{"enum": [3, 7]}]}
    grammar = json_schema_to_grammar(schema)
    assert [ir_accepts(grammar, v) for v in ("3", "7")] == [True, False]


@pytest.mark.parametrize("schema", [
    {"$ref": "#"},
    {"allOf": [{"$ref": "#"}], "type": "object"},
    {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"allOf": [{"$ref": "#/$defs/a"}]}}, "$ref": "#/$defs/a"},
    {"definitions": {"a": {"$ref": "#/definitions/a"}}, "properties": {"x": {"$ref": "#/definitions/a"}}},
])
def test_a_ref_cycle_through_refs_and_all_of_alone_is_refused(schema):
    # a schema that is itself, through $refs and allOf, reads nothing before it is met again: no instance is ever
    # checked to the end (jsonschema recurses without end), and the compiler did not read it as any value
    with pytest.raises(SchemaError, match="cycle that consumes no input"):
        json_schema_to_grammar(schema)


def test_a_conjunct_met_twice_without_a_cycle_is_one_conjunct():
    check({"$defs": {"x": {"type": "integer"}, "y": {"allOf": [{"$ref": "#/$defs/x"}, {"minimum": 2}]}},
           "allOf": [{"$ref": "#/$defs/x"}, {"$ref": "#/$defs/y"}, {"$ref": "#/$defs/x"}]},
          valid=[2, 30], invalid=[1, 2.5, "a"])


@pytest.mark.parametrize("schema, pointer", [
    ({"const": float("nan")}, "/const"),
    ({"properties": {"x": {"enum": [1, {"a": [float("inf")]}]}}}, "/properties/x/enum/1"),
])
def test_enum_values_json_cannot_write_are_refused_where_they_are(schema, pointer):
    with pytest.raises(SchemaError, match="NaN or Infinity") as error:
        json_schema_to_grammar(schema)
    assert error.value.pointer == pointer


def test_sizing_a_recursive_one_of_for_negation_visits_each_subschema_once(monkeypatch):
    # each $ref level leads to `node` three ways, so sizing every path would take thousands of visits; the sizes
    # are memoised per subschema (one met again while it is sized counts one), and compiling the oneOf then
    # meets `node`'s cycle through itself
    schema = {"$defs": {"node": {"anyOf": [{"type": "string", "maxLength": 3}, {"$ref": "#/$defs/node"},
                                           {"$ref": "#/$defs/pair"}]},
                        "pair": {"allOf": [{"$ref": "#/$defs/node"}, {"$ref": "#/$defs/node"}]}},
              "oneOf": [{"$ref": "#/$defs/node"}, {"type": "string", "minLength": 2}]}
    sized = []
    size_of = json_schema_combinators._size_of_negation
    monkeypatch.setattr(json_schema_combinators, "_size_of_negation",
                        lambda schema, *rest: sized.append(schema) or size_of(schema, *rest))
    with pytest.raises(SchemaError, match="cycle that consumes no input"):
        json_schema_to_grammar(schema)
    assert 0 < len(sized) < 20


def test_rules_that_call_in_sequence_skip_subset_construction_and_get_the_same_automaton():
    schema = {"type": "object", "required": ["id"],
              "properties": {"id": {"type": "integer"}, "tags": {"type": "array", "items": {"enum": ["a", "b"]}},
                             "owner": {"$ref": "#/$defs/person"}, "note": {"type": ["string", "null"]}},
              "$defs": {"person": {"type": "object", "properties": {"name": {"type": "string"},
                                                                    "friend": {"$ref": "#/$defs/person"}}}}}
    grammar = json_schema_to_grammar(schema)
    compiler = _Compiler(grammar)
    chains = 0
    for name in sorted(compiler.called | {grammar.start}):
        if name in compiler.members_rules:
            continue
        nfa = NFA()
        src, dst = nfa.node(), nfa.node()
        compiler.build(nfa, compiler.rules[name], src, dst)
        constructed = determinize_calls(nfa, src, dst, 10_000)
        rule = compiler.rule_dfa(name)
        assert (rule.accept, [tuple(c) for c in rule.calls]) == (constructed.accept, constructed.calls), name
        chains += compiler._chain(compiler.rules[name], []) is not None
    assert chains >= 4


def test_draft_04_integers_are_written_without_a_fraction():
    d4 = {"$schema": "http://json-schema.org/draft-04/schema#"}
    cases = [({**d4, "type": "integer"}, [1, -20], [1.0, 1.5]),
             ({**d4, "type": "number", "not": {"type": "integer"}}, [1.0, 2.5, 1e20], [1, -3]),
             ({"type": "integer"}, [1, 1.0], [1.5]),
             ({"type": "number", "not": {"type": "integer"}}, [2.5], [1, 1.0])]
    for schema, valid, invalid in cases:
        validator = jsonschema.validators.validator_for(schema)(schema)
        assert all(validator.is_valid(v) for v in valid) and not any(validator.is_valid(v) for v in invalid)
        check(schema, valid=valid, invalid=invalid)


def test_enums_use_json_equality_and_every_keyword():
    # 1 and 1.0 are one value, true is not 1; enums of two parts intersect; other keywords still filter
    check({"enum": [1, 1.0, True, [1], [1.0], {"a": 1}, {"a": 1.0}, "x"], "not": {"type": "string"}},
          valid=[1, True, [1], {"a": 1}], invalid=["x", False, 2, [True]])
    check({"allOf": [{"enum": [1, 2, "a", None]}, {"enum": [2.0, "a", False]}], "type": ["integer", "null"]},
          valid=[2], invalid=["a", 1, None, False])
    check({"enum": ["ab", "abc", "b"], "minLength": 2, "const": "ab"}, valid=["ab"], invalid=["abc", "b"])
    grammar = json_schema_to_grammar({"enum": [1, 2.5, -3, 10 ** 20, "1", 0.25]})
    for text in ("1", "1.0", "2.5", "2.50", "-3", "-3.00", str(10 ** 20), '"1"', "0.25"):
        assert ir_accepts(grammar, text), text
    for text in ("2", "25", "-3.5", "0", "1.5", "10", "0.2", "-1"):
        assert not ir_accepts(grammar, text), text


@pytest.mark.parametrize("dialect", ["http://json-schema.org/draft-04/schema#",
                                     "https://json-schema.org/draft/2020-12/schema"])
@pytest.mark.parametrize("types", ["integer", "number", "string", "boolean", "null", "array", "object",
                                   ["integer", "string"], ["null", "number"]])
def test_enum_values_beside_a_type_keep_what_jsonschema_keeps(dialect, types):
    # the type alone is checked without jsonschema: each value kept exactly where the validator of the draft
    # keeps it (1.0 is an integer after draft-04, true is neither an integer nor a number)
    values = [1, 1.0, 2.5, -3, True, False, None, "a", "1", [1], [], {"a": 1}, {}]
    schema = {"$schema": dialect, "type": types, "enum": values}
    validator = jsonschema.validators.validator_for(schema)(schema)
    kept = [v for v in values if validator.is_valid(v)]
    assert kept
    grammar = json_schema_to_grammar(schema)
    for value in values:
        text = json.dumps(value)
        assert ir_accepts(grammar, text) == (value in kept and any(json.dumps(k) == text for k in kept)), value


def test_draft_04_integers_inside_enum_values_are_written_without_a_fraction_where_the_schema_asks_for_integers():
    schema = {"$schema": "http://json-schema.org/draft-04/schema#", "enum": [[1, 2.0], {"n": 3}, [4]],
              "anyOf": [{"items": {"type": "integer"}, "type": "array"}, {"type": "object"}]}
    validator = jsonschema.Draft4Validator(schema)
    grammar = json_schema_to_grammar(schema)
    for text in ('[1, 2]', '[1.0, 2]', '[1, 2.0]', '{"n": 3}', '{"n": 3.0}', '[4]', '[4.0]'):
        assert ir_accepts(grammar, text) == validator.is_valid(json.loads(text)), text


def test_a_large_enum_compiles_to_its_values():
    rng = random.Random(5)
    words = sorted({"".join(rng.choice("abcdefgh ") for _ in range(rng.randint(1, 9))) for _ in range(3000)})
    tokenizer = byte_level_bpe()
    grammar = compile_json_schema({"enum": words + words[:100]}, tokenizer)
    for word in words[::97]:
        assert accepts(grammar, tokenizer, json.dumps(word))
    for wrong in ("zz", words[0] + "z", ""):
        assert (wrong in words) == accepts(grammar, tokenizer, json.dumps(wrong))


@pytest.mark.parametrize("whitespace", ["flexible", "dumps"])
def test_dumps_layout_is_accepted(whitespace):
    value = {"a": [1, 2, {"b": None}], "c": "d"}
    check({"type": "object"}, valid=[value], whitespace=whitespace)
    grammar = json_schema_to_grammar({"type": "object"}, whitespace=whitespace)
    assert ir_accepts(grammar, json.dumps(value, indent=2)) == (whitespace == "flexible")
    assert not ir_accepts(grammar, '{"a":' + " " * 40 + "1}")  # whitespace is bounded


def test_compact_layout_has_no_whitespace():
    grammar = json_schema_to_grammar({"type": "array"}, whitespace="compact")
    assert ir_accepts(grammar, "[1,2]") and not ir_accepts(grammar, "[1, 2]")


# ---- errors ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("schema, error, pointer", [
    ({"type": "string", "minLength": 5, "maxLength": 2}, UnsatisfiableSchemaError, ""),
    ({"properties": {"a": {"type": "wat"}}}, SchemaError, "/properties/a/type"),
    ({"properties": {"a": {"$ref": "#/$defs/missing"}}}, SchemaError, "/properties/a/$ref"),
    ({"items": {"contains": {"format": "email"}, "maxContains": 1}}, UnsupportedSchemaError, "/items/contains"),
    ({"allOf": [{"contains": {"type": "integer"}}, {"contains": {"format": "email"}, "maxContains": 1}]},
     UnsupportedSchemaError, "/allOf/1/contains"),
    ({"contains": {"type": "string"}, "uniqueItems": True}, UnsupportedSchemaError, "/contains"),
    ({"$ref": "http://example.com/other.json"}, UnsupportedSchemaError, "/$ref"),
    ({"oneOf": [{"type": "integer"}, {"format": "email"}]}, UnsupportedSchemaError, "/oneOf"),
    ({"properties": {"p": {"type": "string", "pattern": "(?=a)b"}}}, UnsupportedSchemaError, "/properties/p/pattern"),
    ({"type": "integer", "exclusiveMinimum": 1, "maximum": 1.5}, UnsatisfiableSchemaError, ""),
    ({"required": "a"}, SchemaError, "/required"),
    ({"properties": {"d": {"type": "string", "format": 5}}}, SchemaError, "/properties/d/format"),
    # an enum's values checked against the other keywords: a $ref to nowhere is malformed, to elsewhere unsupported
    ({"enum": [{"x": 1}], "properties": {"x": {"$ref": "#/$defs/none"}}}, SchemaError, ""),
    ({"enum": [{"x": 1}], "properties": {"x": {"$ref": "https://example.com/x.json"}}}, UnsupportedSchemaError, ""),
    ({"enum": ["a"], "pattern": "^\\p{L}$"}, UnsupportedSchemaError, ""),
])
def test_bad_schemas_raise_with_pointer(schema, error, pointer):
    with pytest.raises(error) as info:
        json_schema_to_grammar(schema)
    assert type(info.value) is error
    assert info.value.pointer == pointer, str(info.value)


def test_unsatisfiable_schema_names_the_reason():
    with pytest.raises(SchemaError, match="minLength 5 is above maxLength 2"):
        json_schema_to_grammar({"type": "string", "minLength": 5, "maxLength": 2})
    # satisfiable but for the option: the message says which
    with pytest.raises(SchemaError, match="once additional_properties=False closes it"):
        json_schema_to_grammar({"type": "object", "minProperties": 1}, additional_properties=False)


def test_bad_options_and_tokenizers_are_named():
    with pytest.raises(ValueError, match="additional_properties must be True or False, not 'no'"):
        json_schema_to_grammar({}, additional_properties="no")
    with pytest.raises(TypeError, match="a transformers tokenizer or a leapgen Vocabulary, not NoneType"):
        compile_json_schema({}, None)


_NO_TEXT = {"type": "string", "maxLength": 0, "pattern": "^x$"}   # empty only once the automaton is built


@pytest.mark.parametrize("schema", [
    {"type": "object", "minProperties": 2, "properties": {"a": _NO_TEXT, "b": {}}, "additionalProperties": False},
    {"type": "object", "properties": {"a": {"type": "object", "properties": {"x": _NO_TEXT}, "required": ["x"]}},
     "minProperties": 1, "additionalProperties": False},
    {"$defs": {"n": {"type": "object", "properties": {"next": {"$ref": "#/$defs/n"}}, "required": ["next"]}},
     "$ref": "#/$defs/n"},
], ids=["min-properties", "required-in-member", "required-recursion"])
def test_objects_needing_a_member_that_admits_no_text_are_unsatisfiable(schema):
    with pytest.raises(SchemaError, match="unsatisfiable"):
        compile_json_schema(schema, byte_level_bpe())


def test_a_member_that_admits_no_text_does_not_count_towards_min_properties():
    """Its key must never be offered, and the object must still be completed by the others (a member counted
    as available left `{"b":0,` with no way on)."""
    tok = byte_level_bpe()
    schema = {"type": "object", "minProperties": 2, "properties": {"a": _NO_TEXT, "b": {}, "c": {"type": "integer"}},
              "additionalProperties": False}
    grammar = compile_json_schema(schema, tok, whitespace="compact")
    assert accepts(grammar, tok, '{"b":0,"c":1}')
    assert grammar.step(grammar.initial, b'{"b":0,"a"') is None
    assert grammar.completion(grammar.step(grammar.initial, b'{"b":0')) == b',"c":0}'
    assert accepts(compile_json_schema({"anyOf": [{"properties": {"a": _NO_TEXT}, "required": ["a"]}, {}]}, tok), tok,
                   '"x"')


# ---- limits ---------------------------------------------------------------------------------------

def nest(levels: int, wrap, leaf=None):
    """`leaf` wrapped `levels` times by `wrap`."""
    schema = {"type": "string"} if leaf is None else leaf
    for _ in range(levels):
        schema = wrap(schema)
    return schema


def in_object(schema):
    return {"type": "object", "properties": {"a": schema}}


def chain(levels: int, wrap) -> dict:
    """`$defs` d0 .. d<levels>, each d<i> built by `wrap` around a $ref to the next."""
    defs = {f"d{i}": wrap({"$ref": f"#/$defs/d{i + 1}"}) for i in range(levels)}
    return {"$defs": {**defs, f"d{levels}": {"type": "string"}}, "$ref": "#/$defs/d0"}


@pytest.mark.parametrize("schema, pointer, limit", [
    (nest(200, in_object), "/properties/a" * (MAX_DOCUMENT_DEPTH // 2) + "/properties", MAX_DOCUMENT_DEPTH),
    (nest(200, lambda s: {"anyOf": [s, {"type": "null"}]}), "/anyOf/0" * (MAX_DOCUMENT_DEPTH // 2) + "/anyOf",
     MAX_DOCUMENT_DEPTH),
    (nest(200, lambda s: {"items": s}), "/items" * MAX_DOCUMENT_DEPTH, MAX_DOCUMENT_DEPTH),
    ({"const": nest(200, lambda v: [v], leaf=1)}, "/const" + "/0" * (MAX_DOCUMENT_DEPTH - 1), MAX_DOCUMENT_DEPTH),
    (chain(300, lambda s: {"items": s}), f"/$defs/d{MAX_SUBSCHEMA_DEPTH - 1}/items", MAX_SUBSCHEMA_DEPTH),
    (chain(300, in_object), f"/$defs/d{MAX_SUBSCHEMA_DEPTH - 1}/properties/a", MAX_SUBSCHEMA_DEPTH),
    ({"allOf": [{"anyOf": [{"required": [f"a{i}"]}, {"required": [f"b{i}"]}]} for i in range(30)]}, "",
     MAX_SUBSCHEMAS),
    ({"type": "string", "pattern": "(" * 200 + "a" + ")" * 200}, "/pattern", 100),
    ({"anyOf": [{"const": i} for i in range(1025)]}, "/anyOf", 1024),
], ids=["properties", "anyOf", "items", "const", "items-compiled", "ref-chain", "branches", "pattern", "branch-count"])
def test_limits_raise_with_the_pointer_where_they_are_hit(schema, pointer, limit):
    with pytest.raises(UnsupportedSchemaError, match=f"more than {limit}|deeper than {limit}") as info:
        json_schema_to_grammar(schema)
    assert info.value.pointer == pointer


def test_extreme_but_valid_schemas_compile_or_name_their_keyword():
    tokenizer = byte_level_bpe()
    tiny = compile_json_schema({"type": "number", "multipleOf": 1e-300}, tokenizer)   # 10**300 overflowed numpy
    assert accepts(tiny, tokenizer, "1.5") and accepts(tiny, tokenizer, "0." + "0" * 299 + "1")
    assert not accepts(tiny, tokenizer, "0." + "0" * 300 + "1")
    largest = compile_json_schema({"type": "number", "minimum": -1.7976931348623157e308,
                                   "maximum": 1.7976931348623157e308}, tokenizer)
    assert accepts(largest, tokenizer, "17976931348623157" + "0" * 292)
    assert not accepts(largest, tokenizer, "17976931348623158" + "0" * 292)
    with pytest.raises(UnsupportedSchemaError, match=r"minimum 1E\+308 cannot be enforced exactly .*nested deeper") \
            as refused:
        compile_json_schema({"type": "number", "minimum": 1e308}, tokenizer)    # 308 digits, each a group deeper
    assert refused.value.pointer == "/minimum"
    twice = compile_json_schema({"properties": {"b": {}}, "required": ["a", "b", "a"]}, tokenizer)
    assert accepts(twice, tokenizer, '{"b": 1, "a": 2}') and not accepts(twice, tokenizer, '{"b": 1}')
    needs = compile_json_schema({"type": "object", "dependentRequired": {"a": ["b", "b"]}}, tokenizer)
    assert accepts(needs, tokenizer, '{"b": 2, "a": 1}') and not accepts(needs, tokenizer, '{"a": 1}')
    draft4 = {"$schema": "http://json-schema.org/draft-04/schema#"}
    unique = compile_json_schema({**draft4, "type": "array", "uniqueItems": True,
                                  "items": {"type": "integer", "enum": [1, 2]}}, tokenizer)
    assert accepts(unique, tokenizer, "[1, 2]") and not accepts(unique, tokenizer, "[1.0]")   # no integer there
    many = compile_json_schema({"type": "array", "prefixItems": [{"const": i} for i in range(300)], "items": False},
                               tokenizer)
    assert accepts(many, tokenizer, json.dumps(list(range(300)))) and accepts(many, tokenizer, "[0, 1]")
    assert not accepts(many, tokenizer, json.dumps(list(range(301)))) and not accepts(many, tokenizer, "[1]")
    at_least_many = compile_json_schema({"type": "array", "minItems": 10 ** 5}, tokenizer)   # was written out
    assert at_least_many.matcher().completion_tokens() is not None
    small = compile_json_schema({"type": "array", "minItems": 40}, tokenizer)
    assert accepts(small, tokenizer, json.dumps([1] * 40)) and not accepts(small, tokenizer, json.dumps([1] * 39))
    assert compile_json_schema({"anyOf": [{"const": i} for i in range(1024)]}, tokenizer)


@pytest.mark.parametrize("pattern, refused", [("^a{,2}$", "{,n} is literal text in ECMA-262"),
                                              ("^a\\Z", "\\\\Z \\(write \\$\\) is Python's syntax"),
                                              ("\\Aa", "\\\\A \\(write \\^\\)"), ("(?P<x>a)", "ECMA names a group"),
                                              ("^[]a]$", "the empty class"), ("^a{,}$", "{,n} is literal"),
                                              ("\\a", "\\\\a \\(write"), ("(?x)^a b$", "inline flag"),
                                              ("^a(?#c)b$", "inline flag"), ("^a*+$", "possessive"),
                                              ("^(?>a*)$", "atomic or conditional")])
def test_patterns_python_reads_otherwise_than_ecma_are_refused(pattern, refused):
    with pytest.raises(UnsupportedSchemaError, match=refused) as info:
        compile_json_schema({"type": "string", "pattern": pattern}, byte_level_bpe())
    assert info.value.pointer == "/pattern"
    # also where only listed values are checked against it (inside jsonschema, which named no place)
    for key in ("k", "enum"):            # (a property may be named like a keyword)
        with pytest.raises(UnsupportedSchemaError, match=refused) as info:
            compile_json_schema({"enum": [{key: "a"}], "properties": {key: {"pattern": pattern}}}, byte_level_bpe())
        assert info.value.pointer == f"/properties/{key}/pattern"


def test_ecma_named_groups_and_the_class_of_any_character_compile():
    tokenizer = byte_level_bpe()
    named = compile_json_schema({"type": "string", "pattern": "^(?<x>a)+(?<y>b)$"}, tokenizer)
    assert accepts(named, tokenizer, '"aab"') and not accepts(named, tokenizer, '"b"')
    anything = compile_json_schema({"type": "string", "pattern": "^a[^]b$"}, tokenizer)
    assert accepts(anything, tokenizer, '"a\\nb"') and not accepts(anything, tokenizer, '"ab"')
    # enum values and keys are checked as the automata read the pattern, not as Python's `re` would
    listed = compile_json_schema({"enum": ["x", "a]", "ab"], "pattern": "^[^]]$"}, tokenizer)
    assert accepts(listed, tokenizer, '"a]"') and not accepts(listed, tokenizer, '"x"')
    keys = compile_json_schema({"enum": [{"ab": 1}, {"b": 1}], "patternProperties": {"^(?<x>a)": {"type": "integer"}},
                                "additionalProperties": False}, tokenizer)
    assert accepts(keys, tokenizer, '{"ab": 1}') and not accepts(keys, tokenizer, '{"b": 1}')
    for draft in ("http://json-schema.org/draft-07/schema#", "https://json-schema.org/draft/2020-12/schema"):
        named = compile_json_schema({"$schema": draft, "enum": ["x", "a]"], "pattern": "^[^]]$"}, tokenizer)
        assert accepts(named, tokenizer, '"a]"') and not accepts(named, tokenizer, '"x"'), draft
    wide = compile_json_schema({"enum": ["a" + "x" * 18 + "b", "ab"], "pattern": "a.{18}b"}, tokenizer)
    assert accepts(wide, tokenizer, json.dumps("a" + "x" * 18 + "b")) and not accepts(wide, tokenizer, '"ab"')
    with pytest.raises(UnsupportedSchemaError, match="nested deeper") as info:    # counted after `[^]` is read
        compile_json_schema({"type": "string", "pattern": "[^]" + "(" * 400 + "a" + ")" * 400}, tokenizer)
    assert info.value.pointer == "/pattern"


def test_hosts_of_up_to_eight_short_labels_are_names():
    tokenizer = byte_level_bpe()
    host = compile_json_schema({"type": "string", "format": "hostname"}, tokenizer)
    for name, valid in [("mail.eu.west.example.com", True), ("a.b.c.d.e.f.g.h", True), ("x" * 62 + ".com", True),
                        ("a.b.c.d.e.f.g.h.i", False), ("x" * 31 + ".a.b.c.d", False), ("-a.com", False)]:
        assert accepts(host, tokenizer, json.dumps(name)) == valid, name


def test_schemas_inside_the_limits_compile():
    assert json_schema_to_grammar(chain(1000, lambda s: s))  # $ref to $ref: no nesting
    with pytest.raises(UnsupportedSchemaError, match="deeper than"):
        json_schema_to_grammar("[" * 100_000 + "]" * 100_000)  # deeper than Python's JSON parser goes
    depth = MAX_DOCUMENT_DEPTH // 2
    grammar = compile_json_schema(nest(depth, lambda s: {"type": "array", "items": s}), byte_level_bpe())
    assert accepts(grammar, byte_level_bpe(), "[" * depth + '"x", "y"' + "]" * depth)
    assert accepts(compile_json_schema(nest(depth, in_object), byte_level_bpe()), byte_level_bpe(),
                   '{"a": ' * depth + '"x"' + "}" * depth)
    depth = MAX_SUBSCHEMA_DEPTH - 1    # through $ref, past the interpreter's default recursion limit
    grammar = compile_json_schema(chain(depth, lambda s: {"type": "array", "items": s}), byte_level_bpe())
    assert accepts(grammar, byte_level_bpe(), "[" * depth + '"x"' + "]" * depth)


def test_a_negated_const_nested_deep_fails_only_on_its_value():
    """`not` over a const 30 objects deep nests about five subschemas per level."""
    word = {"type": "object", "properties": {"a": {"$ref": "#/$defs/word"}}, "additionalProperties": False}
    witness = nest(30, lambda v: {"a": v}, leaf={})
    schema = {"$defs": {"word": word}, "allOf": [{"$ref": "#/$defs/word"}, {"not": {"const": witness}}]}
    check(schema, valid=[{}, nest(29, lambda v: {"a": v}, leaf={}), nest(31, lambda v: {"a": v}, leaf={})],
          invalid=[witness, {"b": 1}])


# ---- end to end with a real tokenizer -------------------------------------------------------------

def test_tokens_end_to_end_and_random_walks_validate():
    tokenizer = byte_level_bpe()
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 5},
                                               "n": {"type": "integer", "minimum": -3, "maximum": 30},
                                               "tag": {"enum": ["x", "y"]}},
              "required": ["name", "n"], "additionalProperties": False}
    grammar = compile_json_schema(schema, tokenizer)
    matcher = grammar.matcher()
    for token in tokenizer.encode(json.dumps({"name": "ab", "n": 7, "tag": "y"}), add_special_tokens=False):
        matcher.advance(token)
    assert tokenizer.eos_token_id in matcher.allowed_token_ids()
    rng = random.Random(7)
    done = 0
    for _ in range(10):
        m, out = grammar.matcher(), []
        for step in range(120):
            ids = [int(i) for i in m.allowed_token_ids()]
            if tokenizer.eos_token_id in ids and step > 3:
                break
            pool = [i for i in ids if i != tokenizer.eos_token_id]
            closing = [i for i in pool if any(c in grammar.vocabulary.token_bytes[i] for c in b'"}]')]
            token = rng.choice(closing if closing and rng.random() < step / 60 else pool)
            m.advance(token)
            out.append(grammar.vocabulary.token_bytes[token])
        else:
            continue
        jsonschema.validate(json.loads(b"".join(out)), schema)
        done += 1
    assert done >= 5


_FEATURES = {"patternProperties": {"^[a-z]+$": {"oneOf": [{}, {"items": {"$ref": "#/definitions/features"}}]}}}


@pytest.mark.parametrize("schema", [
    # a oneOf's exclusions distributed over a recursive schema meet one empty conjunction again beside other
    # conjuncts (an array item that must fail `features` beside a value that is not an array)
    {"definitions": {"features": _FEATURES},
     "items": {"allOf": [{"$ref": "#/definitions/features"}, {"properties": {"tags": {"items": {}}}}]}},
    {"items": {"anyOf": [{"type": "integer"}, {"allOf": [{"type": "string"}, {"type": "object", "anyOf": [
        {"required": ["a"]}, {"required": ["b"]}]}]}]}},
])
def test_a_conjunction_around_an_empty_one_is_not_compiled(monkeypatch, schema):
    # once a conjunction came out NEVER, one holding it is NEVER at once; and one of disjoint types (declared or
    # negated) is NEVER before its combinators distribute
    compiled, empty, distributed = [], [], []
    compile_parts, distribute = SchemaCompiler._compile_parts, json_schema_compiler.distribute

    def recorded(self, parts):
        key = frozenset((self._content.of(p.schema), p.base, p.skip, p.variant) for p in parts)
        compiled.append((key, [known for known in empty if known < key]))
        expr = compile_parts(self, parts)
        if expr == json_schema_compiler.NEVER:
            empty.append(key)
        return expr

    def distributing(ctx, parts, *args):
        distributed.append(parts)
        return distribute(ctx, parts, *args)

    monkeypatch.setattr(SchemaCompiler, "_compile_parts", recorded)
    monkeypatch.setattr(json_schema_compiler, "distribute", distributing)
    grammar = json_schema_to_grammar(schema)
    assert empty and not [key for key, holding in compiled if holding]
    assert distributed and all(_admitted_types(parts) for parts in distributed)
    validator = jsonschema.Draft202012Validator(schema)
    for value in [[], [{}], [{"a": 1}], [{"a": []}], [{"a": [1]}], [{"a": [{"b": 2}]}], [{"a": [{"b": [[]]}]}],
                  [{"a": [{}], "tags": [1]}], [{"tags": 1}], [{"A": []}], [1, "x"], [1, 2], ["x"], {}, 3]:
        assert ir_accepts(grammar, json.dumps(value)) == validator.is_valid(value), value


def test_an_empty_conjunct_under_additional_properties_false_is_not_taken_for_every_conjunction_holding_it():
    # there objects close to the keys their conjuncts declare together: `base` alone admits no object, `base` beside
    # a conjunct declaring `id` admits {"id": 1}
    defs = {"base": {"type": "object", "minProperties": 1},
            "record": {"allOf": [{"$ref": "#/$defs/base"},
                                 {"properties": {"id": {"type": "integer"}}, "required": ["id"]}]}}
    schema = {"$defs": defs, "type": "object", "required": ["meta", "rec"],
              "properties": {"meta": {"anyOf": [{"$ref": "#/$defs/base"}, {"type": "null"}]},
                             "rec": {"$ref": "#/$defs/record"}}}
    grammar = json_schema_to_grammar(schema, additional_properties=False)
    assert ir_accepts(grammar, '{"meta": null, "rec": {"id": 1}}')
    assert not ir_accepts(grammar, '{"meta": {}, "rec": {"id": 1}}')
    with pytest.raises(SchemaError, match="no object satisfies the property constraints [(]at"):
        json_schema_to_grammar({"type": "object", "additionalProperties": False, "minProperties": 1},
                               additional_properties=False)


def _admitted_types(parts) -> set:
    """The JSON types the `type` keywords of `parts` and their `not: {type}`s leave (integers as numbers)."""
    def names(declared) -> set:
        return {"number" if name == "integer" else name for name in (declared if isinstance(declared, list)
                                                                      else [declared])}

    types = {"null", "boolean", "number", "string", "array", "object"}
    for part in parts:
        if part.has("type"):
            types &= names(part.get("type"))
        negated = part.get("not") if part.has("not") else None
        if isinstance(negated, dict) and set(negated) == {"type"} and "integer" not in str(negated["type"]):
            types -= names(negated["type"])
    return types
