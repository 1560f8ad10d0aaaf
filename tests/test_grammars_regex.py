"""Regex -> byte DFA, checked against Python's `re.fullmatch`."""

import random
import re
from dataclasses import dataclass, field

import numpy as np
import pytest

from leapgen.grammars import regex as regex_module
from leapgen.grammars.errors import AutomatonTooLargeError, RegexError
from leapgen.grammars.fsm import DFA, BudgetExceeded, minimize
from leapgen.grammars.json_strings import regex_escape
from leapgen.grammars.regex import (MAX_GROUP_DEPTH, dfa_fullmatch, literal_text, regex_dfa, terminal_dfa,
                                     utf8_sequences)

PATTERNS = [
    r"a*b|c",               # a star at the start of a branch once looped back into the other branches
    r"(?:x|y*)z|w*|v",
    r"[a-z]+\d{2,4}",
    r"(ab|cd)*e?",
    r"\w+@\w+\.(com|org)",
    r'"([^"\\]|\\.)*"',
    r"(?i)hello wörld",
    r".{0,5}",
    r"(?s).+x",
    r"\s*[\u4e00-\u9fff]+\s*",
    r"^-?(0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?$",
    r"[^a]\D\W\S",
    r"(?a)\w+",
    r"(?a:(?u:\w)|(?u:\W)\d)",   # a scoped (?u:...) reads Unicode classes again inside (?a) (it stayed ASCII)
    r"(?a)\w(?u:\s|\d)",
    r"x{3}y{2,}z{,2}",
    r"é|e\u0301|[😀-😏]",
    r"(?:a|b)*?c+?",
    r"\Aab*\Z",
    r"[\d\-_.]{1,3}[^\s\d]?",
    r"(?i:[a-cé]+)-[A-C]",
    r"",
    r"(?:ab|c\d){3,5}x",          # repeated groups: built once, copies spliced in (`_Builder._body`)
    r"((?:x|yz)+-){2,4}",
    r"(?i:aé|b){3,}",
    r"(?:ab){2,4}?(?:c[0-9]){0,3}",
    # comments read as pattern text were refused (a `\\b` or `(?=` inside them) or counted as anchors
    "(?x) \\d{2}  # year, e.g. \\b20\\b $\n -[a-z]+ $",
    r"\d+(?# digits, (?=no lookahead here)x|a(?#\)b)c",
    r"(?x) [#a]+ \# b # tail",
    "(?i)(?x)a # \\b\n b",              # flags before the `x` one, a scoped `x`, an escaped newline in a comment
    "(?x:a # \\b\n)b",
    "(?x)a # c \\\n\\b\n b(?-x: #c)",
    # plain texts between bars: their trie, not a subset construction
    r"ab|abc|b\|c|",
    r"(?:x|yz|é|😀|a\.b)",
]
ALPHABET = "abcdexyzABCDEXYZ019_-.@ \t\n\"\\éÉÊ中文😀😎٣ǅ" + "\u0301\u00a0\u2028"


def _random_strings(rng, n):
    for _ in range(n):
        yield "".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 8)))


def _dfa_samples(dfa, rng, n):
    """Random accepted byte strings, by walking the DFA (live states only lead to acceptance)."""
    out = []
    for _ in range(n):
        s, data = 0, bytearray()
        while len(data) < 40:
            if dfa.accept[s] and (rng.random() < 0.3 or not (dfa.trans[s] >= 0).any()):
                out.append(bytes(data))
                break
            options = [b for b in range(256) if dfa.trans[s, b] >= 0]
            b = rng.choice(options)
            data.append(b)
            s = int(dfa.trans[s, b])
    return out


@pytest.mark.parametrize("pattern", PATTERNS)
def test_dfa_agrees_with_re_on_random_strings(pattern):
    rng = random.Random(pattern)
    dfa = regex_dfa(pattern)
    compiled = re.compile(pattern)
    for text in _random_strings(rng, 1500):
        assert dfa_fullmatch(dfa, text.encode()) == bool(compiled.fullmatch(text)), text
    for data in _dfa_samples(dfa, rng, 200):
        assert compiled.fullmatch(data.decode("utf-8")), data


def test_utf8_sequences_cover_exactly_the_range():
    rng = random.Random(0)
    for _ in range(200):
        lo = rng.randint(0, 0x10FFFF)
        hi = min(0x10FFFF, lo + rng.choice([0, 5, 100, 3000, 70000]))
        seqs = utf8_sequences(lo, hi)
        for cp in [lo, hi, (lo + hi) // 2, lo - 1, hi + 1]:
            if not 0 <= cp <= 0x10FFFF or 0xD800 <= cp <= 0xDFFF:
                continue
            enc = chr(cp).encode()
            hit = any(len(s) == len(enc) and all(a <= b <= z for (a, z), b in zip(s, enc)) for s in seqs)
            assert hit == (lo <= cp <= hi), (lo, hi, cp)


def test_intersection_and_difference():
    both = terminal_dfa(r"[a-z]+", also=(r".{2,3}",), excluding=(r"ab.", "zz"))
    for text in ["a", "ab", "abc", "abd", "xyz", "zz", "zzz", "abcd", "Ab"]:
        expected = bool(re.fullmatch(r"[a-z]{2,3}", text)) and not re.fullmatch(r"ab.|zz", text)
        assert dfa_fullmatch(both, text.encode()) == expected, text


def test_branches_that_differ_in_what_they_exclude_share_their_intersection(monkeypatch):
    """A union under one allOf: each branch intersects the same patterns, then takes out its own."""
    built = []
    product = regex_module.product
    monkeypatch.setattr(regex_module, "product", lambda a, b, keep_b, limit: built.append(keep_b) or product(
        a, b, keep_b, limit))
    for left_out in (r"q.*", r".*9"):
        dfa = terminal_dfa(r"[a-z0-9]{3,6}", also=(r"[^x]*",), excluding=(left_out,))
        for text in ["abc", "qab", "ab9", "xab", "ab", "abcdefg"]:
            expected = bool(re.fullmatch(r"[a-wyz0-9]{3,6}", text)) and not re.fullmatch(left_out, text)
            assert dfa_fullmatch(dfa, text.encode()) == expected, (left_out, text)
    assert built == [True, False, False]    # the intersection once, a difference per branch


def test_the_patterns_several_terminals_leave_out_are_joined_once(monkeypatch):
    """An object's classes of extra keys: each class's key terminal takes the other classes' patterns out."""
    joined = []
    union = regex_module.union
    monkeypatch.setattr(regex_module, "union", lambda dfas, limit: joined.append(len(dfas)) or union(dfas, limit))
    for pattern, left_out in ((r"[a-z]{2,5}", (r"q.*", r".*9", "ab")), (r"[a-z0-9]+", (r".*9", r"q.*", "ab"))):
        dfa = terminal_dfa(pattern, excluding=left_out)
        for text in ["abc", "qab", "ab9", "ab", "xyz", "x9y"]:
            expected = bool(re.fullmatch(pattern, text)) and not re.fullmatch(r"q.*|.*9|ab", text)
            assert dfa_fullmatch(dfa, text.encode()) == expected, (pattern, text)
    assert joined == [3]    # the two regexes and the literal, once for both terminals


@dataclass(frozen=True)
class _PastTheBudget:
    """A Language whose intersection with anything passes the budget, counting how often it is tried (each one
    equal only to itself, so that no refusal remembered before stands for it)."""

    own: object = field(default_factory=object)
    tries: list = field(default_factory=list, compare=False, hash=False)

    def dfa(self) -> DFA:
        raise AssertionError("only intersected")

    def intersect(self, dfa: DFA, max_states: int) -> DFA:
        self.tries.append(max_states)
        raise BudgetExceeded(max_states, "automaton states")


def test_a_refusal_past_the_budget_is_remembered():
    """A refused intersection is not built again: the next schema holding it gets the same error at once."""
    language = _PastTheBudget()
    errors = []
    for _ in range(3):
        with pytest.raises(AutomatonTooLargeError) as error:
            terminal_dfa(r"[a-z]+@[a-z]+", also=(language,))
        errors.append((str(error.value), error.value.pattern, error.value.budget))
    assert len(language.tries) == 1
    assert errors[0] == errors[1] == errors[2]
    assert errors[0][0].startswith("regex combination too complex to compile (more than")


def test_a_refusal_past_the_budget_is_remembered_under_the_terminal_asked(monkeypatch):
    """The terminal's languages to leave out are taken one at a time before its literal keys: a refusal met among the
    keys is remembered under the terminal as asked, languages included, so the next ask finds it."""
    tries = []

    def past_the_budget(base, words, max_states):
        tries.append(words)
        raise BudgetExceeded(max_states, "automaton states")

    monkeypatch.setattr(regex_module, "without_words", past_the_budget)

    @dataclass(frozen=True)
    class Digits:
        own: object = field(default_factory=object)     # equal only to itself (see _PastTheBudget)

        def dfa(self) -> DFA:
            return regex_dfa("[0-9]+")

        def intersect(self, dfa: DFA, max_states: int) -> DFA:
            raise AssertionError("only left out")

    excluding = (Digits(), '"k0"')
    for _ in range(3):
        with pytest.raises(AutomatonTooLargeError, match="regex combination too complex"):
            terminal_dfa(r"[a-z0-9]+", excluding=excluding)
    assert len(tries) == 1


@pytest.mark.parametrize(
    "pattern, message, position",
    [
        (r"ab(?=c)", "lookahead", 2),
        (r"x(?<!y)z", "lookbehind", 1),
        (r"(a)b\1", "back-reference", 4),
        (r"(?P<n>a)(?P=n)", "back-reference", 8),
        (r"a\bc", "word boundaries", 1),
        (r"(?>ab)c", "atomic", 0),
        (r"a*+", "possessive", 2),
        (r"ab(", "invalid regex", 2),
        (r"[z-a]", "invalid regex", 1),
        (r"a^b", "anchors", 1),
        (r"(a$)b", "anchors", 2),
        ("(?x) a # c (?=\n \\b", "word boundaries", 16),   # past a comment, the pattern is read again
    ],
)
def test_unsupported_or_invalid_regex_names_the_position(pattern, message, position):
    with pytest.raises(RegexError, match=message) as info:
        regex_dfa(pattern)
    assert info.value.position == position
    assert f"position {position}" in str(info.value)


def test_a_repeated_group_is_built_once_with_the_language_written_out(monkeypatch):
    group = r"(?:ab|c\d|é+)"
    assert np.array_equal(regex_dfa(group + "{3}").trans, regex_dfa(group * 3).trans)
    assert np.array_equal(regex_dfa(group + "{1,3}").trans, regex_dfa(f"{group}(?:{group}{group}?)?").trans)
    walked = []
    seq = regex_module._Builder.seq
    monkeypatch.setattr(regex_module._Builder, "seq", lambda self, items, *a: walked.append(items) or seq(
        self, items, *a))
    regex_dfa.__wrapped__(r"(?:x[yz]+){2,40}")     # past the memo
    # the whole pattern, then the group's items once (not 40 times), with the two copies of `[yz]+` built in place
    assert len(walked) == 4
    with pytest.raises(RegexError, match="anchors") as info:
        regex_dfa(r"x(?:a$){3}")
    assert info.value.position == 5


def test_thousands_of_alternative_texts_compile_as_their_trie():
    """4,861 words between bars: the subset construction passed the state budget before minimising (the minimal
    automaton has 13,588 states, under it), where the same words as an enum compiled."""
    rng = random.Random(0)
    words = sorted({"".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 12)))
                    for _ in range(5000)})
    for pattern in ("|".join(words), "(?:" + "|".join(words) + ")", "(" + "|".join(words) + ")"):
        dfa = regex_dfa(pattern)
        assert dfa.num_states == 13588
        assert all(dfa_fullmatch(dfa, w.encode()) for w in words[::97])
        assert not dfa_fullmatch(dfa, words[5].encode() + b"|") and not dfa_fullmatch(dfa, b"")


def test_catastrophic_regex_hits_the_state_budget():
    with pytest.raises(RegexError, match="too complex"):
        regex_dfa(r"(a|b)*a(a|b){16}")


def test_groups_nested_past_the_limit_are_refused_before_parsing():
    with pytest.raises(RegexError, match=f"nested deeper than {MAX_GROUP_DEPTH}") as info:
        regex_dfa("(" * 200 + "a" + ")" * 200)
    assert info.value.position == MAX_GROUP_DEPTH
    assert dfa_fullmatch(regex_dfa("(?:" * MAX_GROUP_DEPTH + "a" + ")" * MAX_GROUP_DEPTH), b"a")
    assert dfa_fullmatch(regex_dfa(r"[(]\(" * 200), b"((" * 200)  # escaped and in a class: no groups


def test_literal_regexes_skip_the_regex_compiler_with_the_same_language():
    texts = ['"name"', "a.b*c", "x\x01y\x7f", "é ü-/#&~", "\\d{2}", "(a|b)", "[^]", 'q"\\"']
    for text in texts:
        pattern = regex_escape(text)
        assert literal_text(pattern) == text and re.fullmatch(pattern, text), text
    for pattern in ["a.b", "a*", "[ab]", r"\d", "(a)", "a|b", "a{2}", r"\x4", r"\n"]:
        assert literal_text(pattern) is None, pattern
    keys = ['"id"', '"idx"', '"a.b"', '"é"']
    dfa = terminal_dfa(r'"[^"]*"', (), tuple(regex_escape(k) for k in keys) + (r'"x+"',))
    for s in keys + ['"i"', '"ids"', '"aXb"', '"x"', '"xx"', '"xy"', '""', '"éé"']:
        expected = s not in keys and re.fullmatch(r'"[^"]*"', s) is not None and re.fullmatch(r'"x+"', s) is None
        assert dfa_fullmatch(dfa, s.encode()) == expected, s


def test_minimize_merges_equivalent_states_on_cycles():
    # (aa)* written as a four-state cycle: no two rows are identical, yet states 0/2 and 1/3 are equivalent
    trans = np.full((4, 256), -1, np.int32)
    for s in range(4):
        trans[s, ord("a")] = (s + 1) % 4
    dfa = minimize(DFA(trans, np.array([True, False, True, False])))
    assert dfa.num_states == 2
    assert [dfa_fullmatch(dfa, b"a" * k) for k in range(7)] == [k % 2 == 0 for k in range(7)]
