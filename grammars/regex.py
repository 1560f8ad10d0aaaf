"""Python-style regexes (matched whole, on text) compiled to minimal byte-level DFAs.

Parsing uses the standard library's own parser (`re._parser`), so the syntax and
the character-class semantics (\\d, \\w, case folding) are exactly Python's:
classes with categories or IGNORECASE are resolved by letting `re` itself scan
every code point once.  Code point sets become UTF-8 byte-range sequences.
Lookarounds, back-references, conditionals, atomic groups, possessive
quantifiers, word boundaries and anchors away from the ends are refused with
the offending position.
"""

from __future__ import annotations

import functools
import re
import warnings
from dataclasses import dataclass
from re import _constants as C
from re import _parser as sre_parse

import numpy as np

from .errors import AutomatonTooLargeError, RegexError
from .fsm import (DFA, MEMO_SIZE, NFA, BudgetExceeded, Fragment, chain_dfa, determinize, minimize, product, union,
                  without_words)
from .ir import Language
from .walk_cache import make_room

MAX_DFA_STATES = 20_000
MAX_NFA_NODES = 200_000
MAX_GROUP_DEPTH = 100  # groups in groups: parsers recurse per level; number bounds nest one per digit
_MAX_UNICODE = 0x10FFFF
_SURROGATES = (0xD800, 0xDFFF)
_ALL_RANGES = ((0, _SURROGATES[0] - 1), (_SURROGATES[1] + 1, _MAX_UNICODE))
_CATEGORY_ESCAPES = {
    C.CATEGORY_DIGIT: r"\d", C.CATEGORY_NOT_DIGIT: r"\D",
    C.CATEGORY_SPACE: r"\s", C.CATEGORY_NOT_SPACE: r"\S",
    C.CATEGORY_WORD: r"\w", C.CATEGORY_NOT_WORD: r"\W",
}


# --- code point sets -------------------------------------------------------------------------

@functools.cache
def _all_text() -> tuple[str, str]:
    return "".join(map(chr, range(_SURROGATES[0]))), "".join(map(chr, range(_SURROGATES[1] + 1, _MAX_UNICODE + 1)))


@functools.lru_cache(maxsize=4096)   # bounded as its caller's memo is: the classes come from users' patterns
def _scan_class(class_regex: str, flags: int) -> tuple[tuple[int, int], ...]:
    """Code point ranges matched by a one-character regex, found by running `re` over every code point."""
    low, high = _all_text()
    compiled = re.compile(f"(?:{class_regex})+", flags)
    ranges = [(m.start(), m.end() - 1) for m in compiled.finditer(low)]
    offset = _SURROGATES[1] + 1
    ranges += [(m.start() + offset, m.end() - 1 + offset) for m in compiled.finditer(high)]
    return tuple(ranges)


def normalize_ranges(ranges) -> tuple[tuple[int, int], ...]:
    """Sorted, merged code-point ranges (inclusive) without surrogates."""
    out: list[list[int]] = []
    for lo, hi in sorted(ranges):
        for a, b in ((lo, min(hi, _SURROGATES[0] - 1)), (max(lo, _SURROGATES[1] + 1), hi)):
            if a > b:
                continue
            if out and a <= out[-1][1] + 1:
                out[-1][1] = max(out[-1][1], b)
            else:
                out.append([a, b])
    return tuple((a, b) for a, b in out)


def complement_ranges(ranges) -> tuple[tuple[int, int], ...]:
    """Every code point (surrogates excluded) outside `ranges`."""
    out, nxt = [], 0
    for lo, hi in normalize_ranges(ranges):
        if lo > nxt:
            out.append((nxt, lo - 1))
        nxt = hi + 1
    if nxt <= _MAX_UNICODE:
        out.append((nxt, _MAX_UNICODE))
    return normalize_ranges(out)


def _class_ranges(items: tuple, flags: int) -> tuple[tuple[int, int], ...]:
    """Code point ranges of a parsed character class `[...]` (memoised: a JSON string's character class recurs
    in every string regex of a schema)."""
    # The memo keys on plain ints: the parser's opcodes are objects the garbage collector tracks, and keys
    # holding them would stay in every full collection.
    return _memoised_class_ranges(tuple((int(op), int(av) if isinstance(av, int) else av) for op, av in items), flags)


@functools.lru_cache(maxsize=4096)
def _memoised_class_ranges(items: tuple[tuple[int, object], ...], flags: int) -> tuple[tuple[int, int], ...]:
    negate = bool(items) and items[0][0] == C.NEGATE
    body = items[1:] if negate else items
    simple = all(op == C.LITERAL or op == C.RANGE for op, _ in body)
    if simple and not flags & re.IGNORECASE:
        ranges = [(av, av) if op == C.LITERAL else av for op, av in body]
        return complement_ranges(ranges) if negate else normalize_ranges(ranges)
    parts = []
    for op, av in body:
        if op == C.LITERAL:
            parts.append(f"\\U{av:08x}")
        elif op == C.RANGE:
            parts.append(f"\\U{av[0]:08x}-\\U{av[1]:08x}")
        elif op == C.CATEGORY and av in _CATEGORY_ESCAPES:
            parts.append(_CATEGORY_ESCAPES[av])
        else:
            raise ValueError(f"unsupported class item {C.OPCODES[op]}")
    keep = flags & (re.IGNORECASE | re.ASCII)
    return _scan_class(f"[{'^' if negate else ''}{''.join(parts)}]", keep)


# --- UTF-8 ---------------------------------------------------------------------------------------

def utf8_sequences(lo: int, hi: int) -> list[list[tuple[int, int]]]:
    """Byte-range sequences whose concatenations are exactly the UTF-8 encodings of lo..hi."""
    out, todo = [], [(lo, hi)]
    while todo:
        lo, hi = todo.pop()
        for limit in (0x7F, 0x7FF, 0xFFFF):
            if lo <= limit < hi:
                todo.append((limit + 1, hi))
                hi = limit
        if hi <= 0x7F:
            out.append([(lo, hi)])
            continue
        for i in (1, 2, 3):
            m = (1 << (6 * i)) - 1
            if lo & ~m != hi & ~m:
                if lo & m:
                    todo += [(lo, lo | m), ((lo | m) + 1, hi)]
                    break
                if hi & m != m:
                    todo += [(lo, (hi & ~m) - 1), (hi & ~m, hi)]
                    break
        else:
            a, b = chr(lo).encode("utf-8"), chr(hi).encode("utf-8")
            out.append(list(zip(a, b)))
    return out


@functools.lru_cache(maxsize=4096)
def _class_dfa(ranges: tuple[tuple[int, int], ...]) -> DFA:
    """Minimal DFA matching one UTF-8 encoded code point from `ranges`."""
    nfa = NFA(MAX_NFA_NODES)
    start, final = nfa.node(), nfa.node()
    for lo, hi in ranges:
        for seq in utf8_sequences(lo, hi):
            cur = start
            for k, (a, b) in enumerate(seq):
                nxt = final if k == len(seq) - 1 else nfa.node()
                nfa.byte_range(cur, a, b, nxt)
                cur = nxt
    return minimize(determinize(nfa, start, final, MAX_DFA_STATES))


# --- parsing and checks --------------------------------------------------------------------------

_UNSUPPORTED_GROUPS = (
    ("?<=", "lookbehind"), ("?<!", "negative lookbehind"), ("?=", "lookahead"), ("?!", "negative lookahead"),
    ("?P=", "back-reference"), ("?(", "conditional group"), ("?>", "atomic group"),
)


# inline flags, for the whole pattern `(?x)` or a group `(?x:...)`, `(?-x:...)`: under `x`, `#` to the end of a
# line is a comment outside classes
_INLINE_FLAGS = re.compile(r"\(\?([aiLmsux]*)(?:-([imsx]+))?([:)])")


def _scan(pattern: str) -> list[int]:
    """Refuse unsupported constructs with their position; return the positions of anchors.  Comments (`(?#...)`,
    and `# ...` under the `x` flag) are passed over, as Python's parser passes over them."""
    anchors, i, n = [], 0, len(pattern)
    in_class, class_start = False, -1
    verbose, outer = False, []      # the `x` flag here, and outside each open group
    while i < n:
        c = pattern[i]
        if verbose and not in_class and c == "#":
            i = _past(pattern, i, "\n")
            continue
        if c == "(" and not in_class and pattern.startswith("?#", i + 1):
            i = _past(pattern, i + 3, ")")
            continue
        flags = _INLINE_FLAGS.match(pattern, i) if c == "(" and not in_class else None
        if flags is not None:
            on, off, kind = flags.groups()
            if kind == ":":
                outer.append(verbose)
            verbose = (verbose or "x" in on) and not (off and "x" in off)
            i = flags.end()
            continue
        if c == "(" and not in_class:
            outer.append(verbose)
        elif c == ")" and not in_class and outer:
            verbose = outer.pop()
        if c == "\\":
            nxt = pattern[i + 1 : i + 2]
            if not in_class:
                if nxt in tuple("123456789"):
                    raise RegexError("back-references are not supported", pattern, i)
                if nxt in ("b", "B"):
                    raise RegexError("word boundaries are not supported", pattern, i)
                if nxt in ("A", "Z"):
                    anchors.append(i)
            i += 2
            continue
        if in_class:
            if c == "]" and i > class_start:
                in_class = False
            i += 1
            continue
        if c == "[":
            in_class = True
            class_start = i + 1 + (pattern[i + 1 : i + 2] == "^")
        elif c == "(" and pattern.startswith("?", i + 1):
            for prefix, what in _UNSUPPORTED_GROUPS:
                if pattern.startswith(prefix, i + 1):
                    raise RegexError(f"{what} is not supported", pattern, i)
            i += 2
            continue
        elif c in "^$":
            anchors.append(i)
        elif c in "*+?" and pattern.startswith("+", i + 1):
            raise RegexError("possessive quantifiers are not supported", pattern, i + 1)
        elif c == "}" and pattern.startswith("+", i + 1) and re.search(r"\{\d*,?\d*$", pattern[:i]):
            raise RegexError("possessive quantifiers are not supported", pattern, i + 1)
        i += 1
    return anchors


def _past(pattern: str, i: int, end: str) -> int:
    """Just past the character `end` that closes a comment whose text starts at `i` (a `#` comment's newline, a
    `(?#` comment's `)`); an escaped character, that one too, does not close it."""
    while i < len(pattern) and pattern[i] != end:
        i += 2 if pattern[i] == "\\" else 1
    return i + 1


class _Builder:
    """Turns a parsed regex into NFA fragments between two nodes."""

    def __init__(self, pattern: str, anchors: list[int]):
        self.pattern = pattern
        self.anchors = anchors
        self.anchor_index = 0
        self.nfa = NFA(MAX_NFA_NODES)

    def seq(self, items, src: int, dst: int, flags: int, lead: bool, trail: bool) -> None:
        items = list(items)
        cur = src
        # the items after which only anchors follow (found once: asked per item, a long literal took quadratic time)
        last = next((k for k in range(len(items) - 1, -1, -1) if items[k][0] is not C.AT), -1)
        for k, (op, av) in enumerate(items):
            nxt = dst if k == len(items) - 1 else self.nfa.node()
            self.item(op, av, cur, nxt, flags, lead, trail and k >= last)
            if op is not C.AT:
                lead = False
            cur = nxt
        if not items:
            self.nfa.epsilon(src, dst)

    def chars(self, ranges, src: int, dst: int) -> None:
        if len(ranges) == 1 and ranges[0][0] == ranges[0][1]:
            data = chr(ranges[0][0]).encode("utf-8")
            cur = src
            for k, b in enumerate(data):
                nxt = dst if k == len(data) - 1 else self.nfa.node()
                self.nfa.byte_range(cur, b, b, nxt)
                cur = nxt
        elif ranges and ranges[-1][1] < 0x80:
            for lo, hi in ranges:  # ASCII: one byte per character
                self.nfa.byte_range(src, lo, hi, dst)
        elif ranges:
            self.nfa.embed(_class_dfa(tuple(ranges)), src, dst)

    def item(self, op, av, src: int, dst: int, flags: int, lead: bool, trail: bool) -> None:
        if op is C.LITERAL and not flags & re.IGNORECASE and not _SURROGATES[0] <= av <= _SURROGATES[1]:
            self.chars(((av, av),), src, dst)   # most items of most patterns: one character, no class to look up
        elif op is C.LITERAL or op is C.NOT_LITERAL:
            items = ((C.LITERAL, av),) if op is C.LITERAL else ((C.NEGATE, None), (C.LITERAL, av))
            self.chars(_class_ranges(items, flags), src, dst)
        elif op is C.ANY:
            self.chars(_ALL_RANGES if flags & re.DOTALL else complement_ranges([(10, 10)]), src, dst)
        elif op is C.IN:
            self.chars(_class_ranges(tuple(av), flags), src, dst)
        elif op is C.BRANCH:
            for branch in av[1]:
                self.seq(branch.data, src, dst, flags, lead, trail)
        elif op is C.SUBPATTERN:
            _group, add, remove, sub = av
            if add & _TYPE_FLAGS:   # a group's (?u:...) inside (?a) reads Unicode classes again, as Python's does
                flags &= ~_TYPE_FLAGS
            self.seq(sub.data, src, dst, (flags | add) & ~remove, lead, trail)
        elif op in (C.MAX_REPEAT, C.MIN_REPEAT):
            self.repeat(av, src, dst, flags)
        elif op is C.AT:
            self.anchor(av, src, dst, lead, trail)
        else:
            raise RegexError(f"unsupported regex construct {str(op).lower()}", self.pattern)

    def repeat(self, av, src: int, dst: int, flags: int) -> None:
        lo, hi, sub = av
        nfa, cur = self.nfa, src
        copies = lo + (1 if hi is C.MAXREPEAT else hi - lo)
        body = self._body(sub.data, flags) if copies >= _SPLICED_COPIES else None

        def place(a: int, b: int) -> None:
            if body is None:
                self.seq(sub.data, a, b, flags, False, False)
            else:
                nfa.splice(body, a, b)

        for _ in range(lo):
            nxt = nfa.node()
            place(cur, nxt)
            cur = nxt
        if hi is C.MAXREPEAT:
            # A loop node of its own: looping back to `src` let `a*b|c` match "ac" (the loop re-entered
            # the other branches that leave src).
            loop, loop_end = nfa.node(), nfa.node()
            nfa.epsilon(cur, loop)
            place(loop, loop_end)
            nfa.epsilon(loop_end, loop)
            nfa.epsilon(loop, dst)
            return
        for _ in range(hi - lo):
            nfa.epsilon(cur, dst)
            nxt = nfa.node()
            place(cur, nxt)
            cur = nxt
        nfa.epsilon(cur, dst)

    def _body(self, items, flags: int) -> Fragment | None:
        """A repeated group's NFA built once, for copies spliced in by numpy: built again per copy, the parse
        tree was walked in Python each time (`(?:\\S+\\s+){0,199}`, 85 ms of its 128).  None for a single
        character or class (already one cached automaton, embedded per copy) and for a group holding an anchor
        (refused inside a repeat, with its position, by the plain build)."""
        if len(items) == 1 and items[0][0] in _ONE_CHARACTER or _has_anchor(items):
            return None
        part = _Builder(self.pattern, [])
        start, final = part.nfa.node(), part.nfa.node()
        part.seq(items, start, final, flags, False, False)
        return part.nfa.fragment(start, final)

    def anchor(self, code, src: int, dst: int, lead: bool, trail: bool) -> None:
        pos = self.anchors[self.anchor_index] if self.anchor_index < len(self.anchors) else None
        self.anchor_index += 1
        if code in (C.AT_BEGINNING, C.AT_BEGINNING_STRING) and lead:
            self.nfa.epsilon(src, dst)
        elif code in (C.AT_END, C.AT_END_STRING) and trail:
            self.nfa.epsilon(src, dst)
        else:
            raise RegexError("anchors are only supported at the start or end of the regex", self.pattern, pos)


# a repeated group is built once and spliced in from this many copies on (`_Builder._body`): below, building it
# afresh per copy costs less than the separate NFA
_SPLICED_COPIES = 3
_ONE_CHARACTER = (C.LITERAL, C.NOT_LITERAL, C.ANY, C.IN)


def _has_anchor(items) -> bool:
    """Whether parsed regex `items` hold an anchor (`^`, `$`, `\\A`, `\\Z`) at any depth."""
    return _holds(items, C.AT)


def _holds(items, wanted) -> bool:
    """Whether parsed regex `items` hold opcode `wanted` at any depth."""
    return any(op is wanted or any(_holds(inner, wanted) for inner in _nested(op, av)) for op, av in items)


def _nested(op, av) -> list:
    """The item lists a parsed regex item holds: a branch's alternatives, a group's or a repetition's body."""
    if op is C.BRANCH:
        return [branch.data for branch in av[1]]
    if op is C.SUBPATTERN:
        return [av[3].data]
    return [av[2].data] if op in (C.MAX_REPEAT, C.MIN_REPEAT) else []


def laziness(pattern: str) -> str:
    """How a lexer that takes what Python's regex engine prefers (lark's) ends a text of `pattern` (a valid
    regex): "none" where that is wherever the language allows (no lazy quantifier: lark's complete lexer tries
    every prefix of the match; or no text of the language begins another); "first" where every choice the regex
    makes is lazy (its quantifiers lazy or fixed, its alternatives single characters or starting with distinct
    ones), which ends it at its first possible end (`FirstEnds`); "mixed" for the rest, a lazy quantifier beside
    greedy choices, whose preferences no language here follows."""
    items = parse_quietly(pattern).data
    if not _holds(items, C.MIN_REPEAT):
        return "none"
    if not _chooses_greedily(items):
        return "first"
    dfa = regex_dfa(pattern)    # minimal and trimmed: an accepting state with a way on has a longer text after it
    return "mixed" if (dfa.trans[dfa.accept] >= 0).any() else "none"


def _chooses_greedily(items) -> bool:
    """Whether parsed regex `items` make a choice other than a lazy one: a greedy quantifier with a range, or
    alternatives two of which may both go on from one place (neither single characters nor distinct first
    characters)."""
    for op, av in items:
        if op is C.MAX_REPEAT and av[0] != av[1]:
            return True
        if op is C.BRANCH:
            branches = _nested(op, av)
            if not all(len(b) == 1 and b[0][0] in _ONE_CHARACTER for b in branches) and not _apart(branches):
                return True
        if any(_chooses_greedily(inner) for inner in _nested(op, av)):
            return True
    return False


def _apart(branches) -> bool:
    """Whether alternatives all start with a literal character, each another."""
    firsts = [b[0][1] if b and b[0][0] is C.LITERAL else None for b in branches]
    return None not in firsts and len(set(firsts)) == len(firsts)


@dataclass(frozen=True)
class FirstEnds:
    """The texts of regex `pattern` that no shorter text of it begins: where a lexer that takes what Python's
    regex engine prefers ends a text of a regex whose every choice is lazy (see `laziness`; `/".*?"/` ends at the
    first closing quote).  Sound for any regex (such a text matches nothing shorter, and lark's complete lexer
    also tries every prefix of the match); exact where every choice is lazy."""

    pattern: str

    def dfa(self) -> DFA:
        return _first_ends(self.pattern)

    def intersect(self, dfa: DFA, max_states: int) -> DFA:
        return product(dfa, self.dfa(), True, max_states)


@functools.lru_cache(maxsize=MEMO_SIZE)
def _first_ends(pattern: str) -> DFA:
    full = regex_dfa(pattern)
    trans = full.trans.copy()
    trans[full.accept] = -1     # a text ends at the first accepting state it reaches
    return minimize(DFA(trans, full.accept.copy()))


# what can hold a parenthesis that opens no group: an escape, a character class
_GROUP_LEXEMES = re.compile(r"\\.|\[\^?\]?(?:\\.|[^\]\\])*\]|[()]", re.DOTALL)


def check_group_depth(pattern: str) -> None:
    """Refuse groups nested deeper than MAX_GROUP_DEPTH, before anything recursive parses `pattern`."""
    depth = 0
    for m in _GROUP_LEXEMES.finditer(pattern):
        if m.group() == "(":
            depth += 1
            if depth > MAX_GROUP_DEPTH:
                raise RegexError(f"groups nested deeper than {MAX_GROUP_DEPTH}", pattern, m.start())
        elif m.group() == ")":
            depth -= 1


def parse_quietly(pattern: str):
    """Python's parse of a regex, without its FutureWarnings ("possible set difference" in a class is a hint
    about Python's future syntax, not a problem of the user's pattern)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return sre_parse.parse(pattern)


def _parse(pattern: str):
    anchors = _scan(pattern)
    check_group_depth(pattern)
    try:
        parsed = parse_quietly(pattern)
    except re.error as e:
        raise RegexError(f"invalid regex: {e.msg}", pattern, e.pos) from None
    except (OverflowError, RecursionError) as e:
        raise RegexError(f"invalid regex: {e}", pattern) from None
    if parsed.state.flags & re.LOCALE:
        raise RegexError("the LOCALE flag is not supported", pattern)
    return parsed, anchors


# What the memos below refused past the budget, by what was asked: a memo keeps only what it built, and an email under
# `maxLength: 1024` took about 10 ms to reach the budget again in every schema that held it
_REFUSED: dict[tuple, tuple[str, str]] = {}
_REFUSED_KEPT = 256


def _refused_before(key: tuple, pattern: str) -> None:
    """Raise the refusal of `key` again, where one was met."""
    known = _REFUSED.get(key)
    if known is not None:
        raise AutomatonTooLargeError(known[0], pattern, known[1])


def _refusal(key: tuple, message: str, pattern: str, budget: str) -> AutomatonTooLargeError:
    """The refusal of `key`, remembered."""
    make_room(_REFUSED, _REFUSED_KEPT)
    _REFUSED[key] = (message, budget)
    return AutomatonTooLargeError(message, pattern, budget)


@functools.lru_cache(maxsize=MEMO_SIZE)
def regex_dfa(pattern: str) -> DFA:
    """Minimal byte DFA of the UTF-8 encodings of the strings `pattern` fully matches."""
    if not isinstance(pattern, str):    # (first: a number or bytes met the texts' split as an AttributeError)
        raise RegexError(f"a regex must be a str, not {type(pattern).__name__}", repr(pattern))
    key = ("regex", pattern)
    _refused_before(key, pattern)
    words = _alternative_texts(pattern)
    if words is not None:   # a list of texts: its trie, merged, not a subset construction over thousands of branches
        return literals_dfa(tuple(sorted(set(words))))
    parsed, anchors = _parse(pattern)
    builder = _Builder(pattern, anchors)
    try:
        start, final = builder.nfa.node(), builder.nfa.node()
        builder.seq(parsed.data, start, final, parsed.state.flags, True, True)
        return minimize(determinize(builder.nfa, start, final, MAX_DFA_STATES))
    except BudgetExceeded as e:
        raise _refusal(key, f"regex too complex to compile ({e})", pattern, e.budget) from None
    except RecursionError:
        raise RegexError("regex nested too deeply", pattern) from None


@functools.lru_cache(maxsize=MEMO_SIZE)
def terminal_dfa(pattern: str, also: tuple[str | Language, ...] = (),
                 excluding: tuple[str | Language, ...] = ()) -> DFA:
    """DFA of strings matching `pattern` and every regex (or Language) in `also` and none in `excluding`."""
    key = ("terminal", pattern, also, excluding)
    _refused_before(key, pattern)
    dfa = met = _meet(pattern, also)
    built = dfa.built_states or dfa.num_states
    try:
        # Languages one at a time: the union of residue automata multiplies their states, while the running
        # difference stays within what the other keywords allow (a bounded range)
        for other in excluding:
            if not isinstance(other, str) and not dfa.matches_nothing:    # nothing left: nothing more to take out
                dfa = product(dfa, other.dfa(), False, MAX_DFA_STATES)
                built += dfa.num_states
        excluding = tuple(other for other in excluding if isinstance(other, str))
        if excluding:
            texts = [literal_text(other) for other in excluding]
            # literal texts only (declared object keys): the automaton behind a trie of them
            fewer = None if None in texts else without_words(dfa, sorted({t.encode() for t in texts}), MAX_DFA_STATES)
            if fewer is None:
                # one difference with the union (the literal texts as one trie) instead of one per regex
                regexes = tuple(sorted({other for other, text in zip(excluding, texts) if text is None}))
                fewer = product(dfa, _excluded(regexes, tuple(sorted({text for text in texts if text is not None}))),
                                False, MAX_DFA_STATES)
            dfa = fewer
            built += dfa.num_states
    except BudgetExceeded as e:
        raise _refusal(key, f"regex combination too complex to compile ({e})", pattern, e.budget) from None
    if dfa is not met:      # a fresh difference (the shared intersection keeps its own count)
        dfa.built_states = built
    return dfa


@functools.lru_cache(maxsize=MEMO_SIZE)
def _excluded(regexes: tuple[str, ...], texts: tuple[str, ...]) -> DFA:
    """DFA of the strings matching one of `regexes` (at least one) or equal to one of `texts` (memoised: the key
    terminals of an object's classes of extra keys take out the same patterns, each from its own intersection)."""
    parts = [regex_dfa(other) for other in regexes] + ([literals_dfa(texts)] if texts else [])
    return parts[0] if len(parts) == 1 else union(parts, MAX_DFA_STATES)


@functools.lru_cache(maxsize=MEMO_SIZE)
def _meet(pattern: str, also: tuple[str | Language, ...]) -> DFA:
    """DFA of strings matching `pattern` and every regex (or Language) in `also` (memoised apart from
    `terminal_dfa`: the branches of a union under one `allOf` share their intersection and differ in what
    they exclude)."""
    key = ("meet", pattern, also)
    _refused_before(key, pattern)
    dfa = start = regex_dfa(pattern)
    built = dfa.num_states
    try:
        for other in also:
            dfa = (product(dfa, regex_dfa(other), True, MAX_DFA_STATES) if isinstance(other, str) else
                   other.intersect(dfa, MAX_DFA_STATES))
            built += dfa.num_states
    except BudgetExceeded as e:
        raise _refusal(key, f"regex combination too complex to compile ({e})", pattern, e.budget) from None
    # a fresh product (a shared regex DFA keeps its own count, also where an intersection hands it back unchanged)
    if dfa is not start and dfa.built_states == 0:
        dfa.built_states = built
    return dfa


_TYPE_FLAGS = re.ASCII | re.LOCALE | re.UNICODE   # one of them at a time: which classes \w, \d, \s and \b read

#: The characters a regex escapes to mean themselves.
REGEX_META = frozenset(".^$*+?{}[]\\|()")


def _alternative_texts(pattern: str) -> list[str] | None:
    """The texts of a regex that is only plain texts between `|` (`a|bc`, `(?:a|bc)`, `(a|bc)`), else None."""
    inner = pattern
    for opening in ("(?:", "("):
        if pattern.startswith(opening) and pattern.endswith(")") and not pattern.endswith("\\)"):
            inner = pattern[len(opening):-1]
            break
    pieces, start, i = [], 0, 0
    while i < len(inner):
        if inner[i] == "\\":
            i += 2
            continue
        if inner[i] == "|":
            pieces.append(inner[start:i])
            start = i + 1
        i += 1
    pieces.append(inner[start:])
    if len(pieces) < 2:
        return None
    texts = [literal_text(piece) for piece in pieces]
    return None if None in texts else texts


def literal_text(pattern: str) -> str | None:
    """The one string a regex matches when it is plain text (metacharacters escaped, controls as \\xNN),
    else None; lets sets of literal regexes (declared object keys) skip the regex compiler."""
    # by two regexes, not a loop over characters: every object with extra keys excludes each declared key here
    if _PLAIN_TEXT.fullmatch(pattern) is None:
        return None
    return _ESCAPE.sub(_unescaped, pattern) if "\\" in pattern else pattern


# plain characters, metacharacters (REGEX_META) and a few others escaped, and controls as \xNN
_META = re.escape("".join(sorted(REGEX_META)))
_PLAIN_TEXT = re.compile(rf"(?:[^{_META}]|\\[{_META}\-/\" #&~]|\\x[0-9a-fA-F]{{2}})*")
_ESCAPE = re.compile(r"\\(?:x([0-9a-fA-F]{2})|(.))", re.S)


def _unescaped(match: re.Match) -> str:
    code, ch = match.groups()
    return ch if code is None else chr(int(code, 16))


@functools.lru_cache(maxsize=MEMO_SIZE)
def literal_dfa(text: str) -> DFA:
    """DFA of exactly the UTF-8 encoding of `text` (memoised: equal texts share one DFA)."""
    return literals_dfa((text,))


@functools.lru_cache(maxsize=MEMO_SIZE)
def literals_dfa(texts: tuple[str, ...]) -> DFA:
    """DFA of exactly the UTF-8 encodings of `texts`: their byte trie with equal subtrees merged (memoised).

    A trie's states are created after their parents, so walking them backwards meets every state after
    its children: a register of (accepting, transitions to merged children) merges equal subtrees in one
    pass, which gives the minimal DFA of a finite language in time linear in the trie (a 10,000-word enum
    in milliseconds, where generic minimisation takes seconds).
    """
    if len(texts) == 1:     # most calls (object keys, literals): the minimal DFA is the chain of the text's bytes
        return chain_dfa(texts[0].encode("utf-8"))
    rows: list[dict[int, int]] = [{}]
    accept = [False]
    for text in texts:
        s = 0
        for b in text.encode("utf-8"):
            t = rows[s].get(b)
            if t is None:
                t = rows[s][b] = len(rows)
                rows.append({})
                accept.append(False)
            s = t
        accept[s] = True
    merged: list[int] = [0] * len(rows)
    register: dict[tuple[bool, tuple[tuple[int, int], ...]], int] = {}
    for s in range(len(rows) - 1, -1, -1):
        row = rows[s]
        if len(row) == 1:           # most trie states: no sort needed for a canonical key
            [(b, t)] = row.items()
            edges: tuple[tuple[int, int], ...] = ((b, merged[t]),)
        else:
            edges = tuple(sorted((b, merged[t]) for b, t in row.items()))
        merged[s] = register.setdefault((accept[s], edges), len(register))
    # The start state is registered last (no other state has its language); number states backwards so it is 0.
    last = len(register) - 1
    trans = np.full((len(register), 256), -1, np.int32)
    final = np.zeros(len(register), bool)
    for (accepting, edges), index in register.items():
        final[last - index] = accepting
        for b, t in edges:
            trans[last - index, b] = last - t
    return DFA(trans, final)


def dfa_fullmatch(dfa: DFA, data: bytes) -> bool:
    """Whether `dfa` accepts exactly `data`."""
    state = dfa.after(0, data)
    return state >= 0 and bool(dfa.accept[state])
