"""JSON string terminals: canonical escaping, decoded-length bounds, ECMA `pattern` and `format`.

Every regex built here describes the *encoded* form of a JSON string, quotes
included, exactly as `json.dumps(value, ensure_ascii=False)` writes it: `"` and
`\\` and the control characters are escaped (short escapes where JSON has one,
`\\u00xx` otherwise), everything else is literal.  Because that encoding is a
bijection, a regex over decoded text translates character by character.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cache, lru_cache

import numpy as np

try:  # Python 3.11+ moved the parser; fall back to the old name.
    from re import _constants as _c, _parser as _sre
except ImportError:  # pragma: no cover
    import sre_constants as _c  # type: ignore[no-redef]
    import sre_parse as _sre  # type: ignore[no-redef]

from .errors import RegexError, UnsupportedSchemaError
from .fsm import DFA, MEMO_SIZE, RUN_CAP, BudgetExceeded, counted_product, minimize, product, without_words
from .regex import (REGEX_META, check_group_depth, complement_ranges, dfa_fullmatch, normalize_ranges, parse_quietly,
                    regex_dfa, terminal_dfa)

MAX_CODE_POINT = 0x10FFFF
_encoded = json.JSONEncoder(ensure_ascii=False).encode    # a string as this module's regexes spell it

# Intervals of code points (inclusive, sorted, disjoint).
CharSet = tuple[tuple[int, int], ...]

_SHORT_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def encode_char(ch: str) -> str:
    """The canonical JSON encoding of one decoded character (json.dumps, ensure_ascii=False)."""
    if ch in _SHORT_ESCAPES:
        return _SHORT_ESCAPES[ch]
    if ord(ch) < 0x20:
        return f"\\u{ord(ch):04x}"
    return ch


def regex_escape(text: str) -> str:
    """Escape literal text for the IR's regex syntax (controls as \\xNN, metacharacters with a backslash)."""
    return _ESCAPED.sub(_escape_match, text)


_ESCAPED = re.compile("[" + re.escape("".join(sorted(REGEX_META))) + r"\x00-\x1f\x7f]")


def _escape_match(match: re.Match) -> str:
    ch = match.group()
    return "\\" + ch if ch in REGEX_META else f"\\x{ord(ch):02x}"


def _class_char(cp: int) -> str:
    ch = chr(cp)
    if ch in "\\]^-[":
        return "\\" + ch
    if cp < 0x20 or cp == 0x7F:
        return f"\\x{cp:02x}"
    return ch


def _subtract(cs: CharSet, remove: CharSet) -> CharSet:
    keep = complement_ranges(remove)
    out = []
    for lo, hi in cs:
        for klo, khi in keep:
            if klo <= hi and khi >= lo:
                out.append((max(lo, klo), min(hi, khi)))
    return normalize_ranges(out)


_SPECIAL: CharSet = normalize_ranges([(0, 0x1F), (ord('"'), ord('"')), (ord("\\"), ord("\\"))])


def encoded_class(cs: CharSet) -> str:
    """A regex matching the JSON encoding of exactly one character of `cs`."""
    plain = _subtract(cs, _SPECIAL)
    alts = []
    if plain:
        body = "".join(_class_char(lo) if lo == hi else f"{_class_char(lo)}-{_class_char(hi)}" for lo, hi in plain)
        alts.append(f"[{body}]")
    short, low, high = [], [], []  # escape tails: \\x, \\u000x, \\u001x
    for lo, hi in cs:
        for cp in range(lo, min(hi, 0x5C) + 1):
            if cp < 0x20 or chr(cp) in '"\\':
                tail = encode_char(chr(cp))[1:]
                if len(tail) == 1:
                    short.append(_class_char(ord(tail)))
                else:
                    (low if cp < 0x10 else high).append(tail[-1])
    escapes = []
    if short:
        escapes.append(short[0] if len(short) == 1 and short[0].isalpha() else "[" + "".join(short) + "]")
    hex_alts = [f"{d}[{''.join(ds)}]" for d, ds in (("0", low), ("1", high)) if ds]
    if hex_alts:
        escapes.append("u00" + (hex_alts[0] if len(hex_alts) == 1 else "(?:" + "|".join(hex_alts) + ")"))
    if escapes:
        alts.append("\\\\" + (escapes[0] if len(escapes) == 1 else "(?:" + "|".join(escapes) + ")"))
    if not alts:
        return "(?!)"  # never produced: callers prune empty classes first
    return alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"


ANY_CHAR: CharSet = ((0, MAX_CODE_POINT),)
#: One encoded character of any JSON string.
CHAR = encoded_class(normalize_ranges(ANY_CHAR))


@dataclass(frozen=True)
class Length:
    """Quoted JSON strings of `min` to `max` decoded characters (`max` None: no bound) as a Language, its
    automaton laid out directly: the regex `"CHAR{5,255}"` would unroll the repeat into an NFA of thousands of
    states and determinize and minimize it (160 ms for maxLength 1024), where copying one character's minimal
    DFA once per position gives the same language for 4 ms (and, bounded, the same minimal automaton).  What a
    pattern beside a length bound is intersected with."""

    min: int
    max: int | None

    @property
    def num_states(self) -> int:
        """The states of `dfa()`, without building it: a character's inner states per position, the quotes'."""
        positions = self.max if self.max is not None else self.min + 1
        return 2 + positions * _char_width() + (self.max is not None)

    def dfa(self) -> DFA:
        return length_dfa(self.min, self.max)

    def intersect(self, dfa: DFA, max_states: int) -> DFA:
        """`dfa` (quoted strings) with its characters counted along its own states: the product with one
        character's automaton, unrolled over the count (fsm.counted_product), so an ASCII pattern under
        maxLength 2048 is about 2 states per character, where the product with this set's automaton would pass
        28,000 states.  Any string at all (a length bound alone) is this set's own automaton: bounded, already
        minimal, and ten times faster to lay out than the product."""
        if dfa is regex_dfa(ANY_STRING):
            if self.num_states > max_states:
                raise BudgetExceeded(max_states, "automaton states")
            return length_dfa(self.min, self.max) if self.max is not None else minimize(self.dfa())
        if self.max is None and self.min <= 1:
            # no bound but that a string be written, or be not empty: at most the empty string to take out, where
            # the counted product copied the whole automaton (a 3,800-state pattern under minLength 1: 18 ms)
            if self.min == 0 or not dfa_fullmatch(dfa, b'""'):
                return dfa
            fewer = without_words(dfa, [b'""'], max_states)
            if fewer is None:
                raise BudgetExceeded(max_states, "automaton states")
            return minimize(fewer)
        anything = length_dfa(0, None)   # state 0: before the opening quote; 1: between two characters
        ends_character = anything.trans == 1
        ends_character[0] = False
        return counted_product(dfa, anything, ends_character, self.min, self.max, max_states)


@lru_cache(maxsize=MEMO_SIZE)
def length_dfa(min_length: int, max_length: int | None) -> DFA:
    """The DFA of `Length(min_length, max_length)`: the opening quote, then per character position the states
    inside one character (a character is a prefix code: its DFA has one accepting state, with no way out, which
    here is the next position's start), then the closing quote from every position within the bounds."""
    char = regex_dfa(CHAR)
    (end,) = np.flatnonzero(char.accept)
    inner = np.flatnonzero(~char.accept)   # state 0 (the start) first
    width = _char_width()
    renumber = np.full(char.num_states, -1, np.int32)
    renumber[inner] = np.arange(width, dtype=np.int32)
    rows = char.trans[inner]
    missing, ends = rows < 0, rows == end
    rows = renumber[rows]
    # positions 0 .. max-1 hold a character's inner states; past the last, position `max` is a lone state
    # (bounded), or position `min` reads characters forever (unbounded)
    positions = max_length if max_length is not None else min_length + 1
    last = 1 + positions * width + (max_length is not None)   # the closing quote's state
    trans = np.empty((last + 1, 256), np.int32)
    trans[0] = trans[1 + positions * width :] = -1
    body = trans[1 : 1 + positions * width].reshape(positions, width, 256)
    first = 1 + np.arange(positions, dtype=np.int32)[:, None, None] * width
    np.add(rows, first, out=body)   # masked copies: fancy indexing over millions of cells took 20 ms more
    np.copyto(body, np.int32(-1), where=missing)
    following = first + width
    if max_length is None:
        following[-1] = 1 + min_length * width
    np.copyto(body, following, where=ends)
    quote = ord('"')
    trans[0, quote] = 1
    top = max_length if max_length is not None else min_length
    trans[1 + np.arange(min_length, top + 1) * width, quote] = last
    accept = np.zeros(last + 1, bool)
    accept[last] = True
    dfa = DFA(trans, accept)
    if max_length is not None:     # unbounded, the automaton is minimized before use (`Length.intersect`)
        dfa.like = length_dfa(0, None)
        dfa.like_states, dfa.like_depths = _like_any_string(min_length, max_length, width)
    return dfa


def _like_any_string(min_length: int, max_length: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """How `length_dfa(min_length, max_length)` reads like `length_dfa(0, None)` (see `DFA.like`): a state in
    step with each of its states (the same place inside a character; the lone state past the last position, a
    character's start; the closing quote's), and for how many bytes they read alike: at a position from
    `min_length` on, as many as the characters left to `max_length` (no byte adds more than one character);
    before it, none (the closing quote parts them)."""
    body = np.arange(max_length * width, dtype=np.int32)
    position = body // width
    opening = max_length + 1 if min_length == 0 else 0      # the opening quote, then as from the first position
    depths = np.concatenate(([opening], np.where(position >= min_length, max_length - position, 0), [0, RUN_CAP]))
    states = np.concatenate(([0], 1 + body % width, [1, 1 + width]))
    return states.astype(np.int32), depths.astype(np.int32)


@dataclass(frozen=True)
class StringEnd:
    """The end of a quoted JSON string: `min` to `max` decoded characters, then the closing quote (the remainder of
    a string counted in chunks), as a Language laid out like `Length`: the regex `CHAR{0,31}"` takes 2-3 ms to
    determinize and minimize, and a schema with a few length bounds meets several such remainders."""

    min: int
    max: int | None

    def dfa(self) -> DFA:
        return string_end_dfa(self.min, self.max)

    def intersect(self, dfa: DFA, max_states: int) -> DFA:
        """`dfa`'s strings that end a string within the bounds; laid out directly where `dfa` is ANY_STRING_END."""
        return _laid_out(self.dfa(), dfa, ANY_STRING_END, max_states)


@dataclass(frozen=True)
class Chars:
    """Exactly `count` characters of a JSON string's body, no quote (a chunk of a long string's count), as a
    Language laid out like `Length`, so that it reads like any string's body until its count is reached."""

    count: int

    def dfa(self) -> DFA:
        return chars_dfa(self.count)

    def intersect(self, dfa: DFA, max_states: int) -> DFA:
        """`dfa`'s strings of `count` characters; laid out directly where `dfa` is ANY_CHARS."""
        return _laid_out(self.dfa(), dfa, ANY_CHARS, max_states)


def _laid_out(own: DFA, dfa: DFA, anything: str, max_states: int) -> DFA:
    """The product of `dfa` with a Language's automaton `own`: `own` itself where `dfa` is `anything`'s."""
    if dfa is not regex_dfa(anything):
        return product(dfa, own, True, max_states)
    if own.num_states > max_states:
        raise BudgetExceeded(max_states, "automaton states")
    return own


@lru_cache(maxsize=MEMO_SIZE)
def string_end_dfa(min_length: int, max_length: int | None) -> DFA:
    """`length_dfa` less its first state (before the opening quote): the characters and the closing quote."""
    whole = length_dfa(min_length, max_length)
    dfa = DFA(_less_first_state(whole.trans[1:]), whole.accept[1:].copy())
    if max_length is None:
        return minimize(dfa)
    dfa.like, dfa.like_states, dfa.like_depths = whole.like, whole.like_states[1:], whole.like_depths[1:]
    return dfa      # bounded, it stays minimal


@lru_cache(maxsize=MEMO_SIZE)
def chars_dfa(count: int) -> DFA:
    """`length_dfa(count, count)` less its quotes: `count` characters, then a lone accepting state.  It reads like
    `body_dfa()` up to the last character (see `DFA.like`)."""
    whole = length_dfa(count, count)
    width = _char_width()
    lone = 1 + count * width
    trans = _less_first_state(whole.trans[1:lone + 1])
    trans[-1] = -1      # the closing quote's way out
    accept = np.zeros(lone, bool)
    accept[-1] = True
    dfa = DFA(trans, accept)
    dfa.like, dfa.like_states = body_dfa(), whole.like_states[1:lone + 1] - 1
    position = np.arange(lone, dtype=np.int32) // width
    # bytes short of the last character's end keep it inside the body; the lone state accepts where the body does not
    dfa.like_depths = np.where(position < count, count - 1 - position, -1).astype(np.int32)
    return dfa


@cache
def body_dfa() -> DFA:
    """The characters of a JSON string's body, never accepting: what `chars_dfa` reads like."""
    width = _char_width()
    trans = _less_first_state(length_dfa(0, None).trans[1:1 + width])
    trans[trans >= width] = -1      # the closing quote
    return DFA(trans, np.zeros(width, bool))


def _less_first_state(rows: np.ndarray) -> np.ndarray:
    """Rows of a laid-out automaton (`length_dfa`) renumbered without its first state, before the opening quote:
    every target one less, and no transition stays none (none leads back to the first state)."""
    trans = rows - 1
    trans[trans < 0] = -1
    return trans


def _char_width() -> int:
    """The states inside one character of a JSON string, its start included (its end is the next one's start)."""
    return int((~regex_dfa(CHAR).accept).sum())


def string_regex(min_length: int = 0, max_length: int | None = None) -> str:
    """A quoted JSON string whose decoded length is within [min_length, max_length]."""
    return f'"{chars_regex(min_length, max_length)}"'


def chars_regex(min_length: int = 0, max_length: int | None = None) -> str:
    """Between min_length and max_length characters of a JSON string's body, canonically escaped."""
    if min_length == 0 and max_length is None:
        rep = "*"
    elif max_length is None:
        rep = f"{{{min_length},}}"
    elif min_length == max_length:
        rep = f"{{{min_length}}}"
    else:
        rep = f"{{{min_length},{max_length}}}"
    return f"{CHAR}{rep}"


#: Any quoted JSON string: with a json_strings.Length beside it, a string of bounded length.
ANY_STRING = string_regex()
#: The characters of a JSON string and its closing quote: with a StringEnd beside it, a bounded number of them.
ANY_STRING_END = chars_regex() + '"'
#: The characters of a JSON string's body: with a Chars beside it, exactly so many of them.
ANY_CHARS = chars_regex()


# ECMA-262 character classes (JSON Schema patterns are ECMA regexes).
_DIGIT: CharSet = ((0x30, 0x39),)
_WORD: CharSet = normalize_ranges([(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)])
_SPACE: CharSet = normalize_ranges(
    [(0x09, 0x0D), (0x20, 0x20), (0xA0, 0xA0), (0x1680, 0x1680), (0x2000, 0x200A), (0x2028, 0x2029),
     (0x202F, 0x202F), (0x205F, 0x205F), (0x3000, 0x3000), (0xFEFF, 0xFEFF)]
)
_LINE_TERMINATORS: CharSet = normalize_ranges([(0x0A, 0x0A), (0x0D, 0x0D), (0x2028, 0x2029)])
_CATEGORIES = {
    _c.CATEGORY_DIGIT: _DIGIT,
    _c.CATEGORY_NOT_DIGIT: complement_ranges(_DIGIT),
    _c.CATEGORY_WORD: _WORD,
    _c.CATEGORY_NOT_WORD: complement_ranges(_WORD),
    _c.CATEGORY_SPACE: _SPACE,
    _c.CATEGORY_NOT_SPACE: complement_ranges(_SPACE),
}


class _Translator:
    """Rewrites a parsed decoded-text regex as a regex over encoded JSON string content."""

    def __init__(self, pattern: str, pointer: str):
        self.pattern = pattern
        self.pointer = pointer

    def unsupported(self, what: str) -> UnsupportedSchemaError:
        return UnsupportedSchemaError(f"pattern {self.pattern!r}: {what} cannot be compiled exactly", self.pointer)

    def charset(self, items) -> CharSet:
        negate = False
        parts = []
        for op, av in items:
            if op is _c.NEGATE:
                negate = True
            elif op is _c.LITERAL:
                parts.append((av, av))
            elif op is _c.RANGE:
                parts.append(av)
            elif op is _c.CATEGORY:
                parts.extend(_CATEGORIES[av])
            else:
                raise self.unsupported(f"class item {op}")
        cs = normalize_ranges(parts)
        return complement_ranges(cs) if negate else cs

    def seq(self, nodes) -> str:
        return "".join(self.node(op, av) for op, av in nodes)

    def node(self, op, av) -> str:
        if op is _c.LITERAL:
            return regex_escape(encode_char(chr(av)))
        if op is _c.NOT_LITERAL:
            return encoded_class(complement_ranges(normalize_ranges([(av, av)])))
        if op is _c.ANY:
            return encoded_class(complement_ranges(_LINE_TERMINATORS))
        if op is _c.IN:
            return encoded_class(self.charset(av))
        if op is _c.BRANCH:
            return "(?:" + "|".join(self.seq(b) for b in av[1]) + ")"
        if op is _c.SUBPATTERN:
            group, add_flags, del_flags, body = av
            if add_flags or del_flags:
                raise self.unsupported("inline flags")
            return "(?:" + self.seq(body) + ")"
        if op in (_c.MAX_REPEAT, _c.MIN_REPEAT):
            lo, hi, body = av
            return _repeated(self.seq(body), lo, hi)
        if op is _c.AT:
            raise self.unsupported("an anchor not at the start or end" if av in _STARTS + _ENDS else "a word boundary")
        raise self.unsupported(f"{str(op).lower()} (lookaround, back-reference or atomic group)")

    def ended(self, nodes) -> tuple[str | None, str | None, bool]:
        """For nodes holding `$` inside: (the regex of their matches that pass no `$`, the regex of those that
        pass one, so that nothing may follow but empty matches, whether they match the empty text); None: no
        such match.  `(a|$)b` is `ab`, and `$` there ends the text only if `b` could be empty, which it cannot;
        `(x(/|$))*` ends with a last `x` where the text ends."""
        cont: str | None = ""
        fin: str | None = None
        empty = True
        for op, av in nodes:
            x_cont, x_fin, x_empty = self._ended_node(op, av)
            fin = _either(_joined(cont, x_fin), fin if x_empty else None)
            cont = _joined(cont, x_cont)
            empty = empty and x_empty
        return cont, fin, empty

    def _ended_node(self, op, av) -> tuple[str | None, str | None, bool]:
        if not _has_end_anchor([(op, av)]):
            return self.node(op, av), None, _matches_empty(op, av)
        if op is _c.AT:
            return None, "", True
        if op is _c.SUBPATTERN:
            if av[1] or av[2]:
                raise self.unsupported("inline flags")
            return self.ended(av[3])
        if op is _c.BRANCH:
            parts = [self.ended(branch) for branch in av[1]]
            conts, fins = [c for c, _, _ in parts if c is not None], [f for _, f, _ in parts if f is not None]
            return _union(conts), _union(fins), any(e for _, _, e in parts)
        lo, hi, body = av   # a repeat: some iterations, then one passing `$`, then only empty ones
        x_cont, x_fin, x_empty = self.ended(body)
        cont = _repeated(x_cont, lo, hi) if x_cont is not None else ("" if lo == 0 else None)
        fin = None
        if x_fin is not None and hi != 0:
            fewest = 0 if x_empty else max(lo - 1, 0)
            before = _repeated(x_cont, fewest, hi if hi is _c.MAXREPEAT else hi - 1) if x_cont is not None else (
                "" if fewest == 0 else None)
            fin = _joined(before, x_fin)
        return cont, fin, lo == 0 or x_empty


def _has_end_anchor(nodes) -> bool:
    for op, av in nodes:
        if op is _c.AT and av in _ENDS:
            return True
        if op is _c.SUBPATTERN and _has_end_anchor(av[3]):
            return True
        if op is _c.BRANCH and any(_has_end_anchor(branch) for branch in av[1]):
            return True
        if op in (_c.MAX_REPEAT, _c.MIN_REPEAT) and _has_end_anchor(av[2]):
            return True
    return False


def _joined(a: str | None, b: str | None) -> str | None:
    return None if a is None or b is None else a + b


def _either(a: str | None, b: str | None) -> str | None:
    return _union([x for x in (a, b) if x is not None])


def _union(regexes: list[str]) -> str | None:
    if not regexes:
        return None
    return regexes[0] if len(regexes) == 1 else "(?:" + "|".join(regexes) + ")"


def _repeated(regex: str, lo: int, hi) -> str:
    """`regex` repeated lo..hi times (hi _c.MAXREPEAT: unbounded)."""
    inner = "(?:" + regex + ")"
    if hi is _c.MAXREPEAT:
        return inner + ("*" if lo == 0 else "+" if lo == 1 else f"{{{lo},}}")
    return inner + (f"{{{lo}}}" if lo == hi else "?" if (lo, hi) == (0, 1) else f"{{{lo},{hi}}}")


_STARTS = (_c.AT_BEGINNING, _c.AT_BEGINNING_STRING)
_ENDS = (_c.AT_END, _c.AT_END_STRING)


def _alternatives(nodes, start: bool = False) -> list[tuple[bool, bool, list]]:
    """Split a regex into top-level alternatives, each with its ^/$ anchoring stripped off."""
    nodes = list(nodes)
    if nodes and nodes[0][0] is _c.AT and nodes[0][1] in _STARTS:
        start, nodes = True, nodes[1:]
    if len(nodes) == 1 and nodes[0][0] is _c.BRANCH:
        return [alt for branch in nodes[0][1][1] for alt in _alternatives(branch, start)]
    if len(nodes) == 1 and nodes[0][0] is _c.SUBPATTERN and not nodes[0][1][1] and not nodes[0][1][2]:
        return _alternatives(nodes[0][1][3], start)
    end = bool(nodes) and nodes[-1][0] is _c.AT and nodes[-1][1] in _ENDS
    if end:
        nodes = nodes[:-1]
    return [(start, end, nodes)]


@lru_cache(maxsize=4096)
def pattern_regex(pattern: str, pointer: str = "") -> str:
    """A quoted JSON string whose decoded text contains a match of the ECMA regex `pattern` (search semantics)."""
    return _plain_regex(pattern, pointer, list(_parse(pattern, pointer).data))


def _plain_regex(pattern: str, pointer: str, nodes: list) -> str:
    return _search_regex(_Translator(pattern, pointer), _inline_trailing_lookahead(nodes))


@dataclass(frozen=True)
class PatternRegexes:
    """An ECMA `pattern` as a string terminal takes it: the quoted strings matching `regex` and every regex in
    `also`, and none in `excluding`."""

    regex: str
    also: tuple[str, ...] = ()
    excluding: tuple[str, ...] = ()
    searched: bool = True   # some alternative may match after the text's start (not all open with `^`)

    def matches(self, encoded: str) -> bool:
        """Whether the quoted JSON string `encoded` is one of these strings, judged by the automata the terminals
        are built from (Python's `re` would read the same regexes alike, but compiles their wide character classes
        slowly: milliseconds each)."""
        data = encoded.encode()
        return all(dfa_fullmatch(regex_dfa(r), data) for r in (self.regex, *self.also)) and not any(
            dfa_fullmatch(regex_dfa(r), data) for r in self.excluding)

    def single(self, pattern: str, pointer: str) -> str:
        """The one regex these strings are, for where a terminal takes no more (their complement under `not`):
        refused where lookaheads added an intersection or an exclusion."""
        if self.also or self.excluding:
            raise UnsupportedSchemaError(f"pattern {pattern!r}: the strings it does not match (a union, with its "
                                         "leading lookaheads) cannot be compiled exactly", pointer)
        return self.regex


def pattern_regexes(pattern: str, pointer: str = "") -> PatternRegexes:
    """`pattern_regex`, for patterns that open with lookaheads too: a lookahead at the start of the text tests a
    prefix of it, so `^(?=X)(?!Y)Z` holds where `^Z` and `^X` match and `^Y` does not.  Lookaheads anywhere
    else, and lookbehinds, stay refused (with `pointer`)."""
    try:
        return _pattern_regexes(pattern)
    except UnsupportedSchemaError as exc:
        raise UnsupportedSchemaError(exc.reason, pointer) from None


def ecma_search(pattern: str, text: str) -> bool:
    """Whether `text` holds a match of the ECMA `pattern`, read as the grammar reads it (the compiler's checks of
    enum values and keys with jsonschema use this, so that they agree with the automata).  Where the pattern has
    no automaton (a lookbehind), Python's `re` reads its translation with ASCII classes, as ECMA's `\\d`, `\\w` and
    `\\b` are; where its automaton would be too large, Python's `re` reads the same regexes the automata would be
    built from (an enum's values are literals: the grammar never needs that automaton)."""
    try:
        regexes = pattern_regexes(pattern)
    except UnsupportedSchemaError:
        return re.search(_as_python(pattern, ""), text, re.ASCII) is not None
    encoded = _encoded(text)
    try:
        return regexes.matches(encoded)
    except RegexError:
        return all(re.fullmatch(r, encoded) for r in (regexes.regex, *regexes.also)) and not any(
            re.fullmatch(r, encoded) for r in regexes.excluding)


def check_readable(pattern: str, pointer: str) -> None:
    """Raise, naming `pointer`, the UnsupportedSchemaError `ecma_search` meets reading `pattern` (Python-only
    syntax in a pattern without an automaton)."""
    try:
        pattern_regexes(pattern)
    except UnsupportedSchemaError:
        _as_python(pattern, pointer)


# memoised by the pattern alone: a schema repeats one pattern under many properties (a parse of a pattern of a
# thousand alternatives takes milliseconds), and the pointer only names where a refused one was met
@lru_cache(maxsize=MEMO_SIZE)
def _pattern_regexes(pattern: str) -> PatternRegexes:
    pointer = ""    # the caller's, on a refusal
    nodes = list(_parse(pattern, pointer).data)
    if len(nodes) < 2 or not _is_start(nodes[0]) or nodes[1][0] not in _LOOKAHEADS:
        return PatternRegexes(_plain_regex(pattern, pointer, nodes),
                              searched=not all(start for start, _, _ in _alternatives(nodes)))
    tr = _Translator(pattern, pointer)
    start, rest = nodes[0], nodes[1:]
    also, excluding = [], []
    while rest and (rest[0][0] in _LOOKAHEADS or _is_start(rest[0])):
        op, av = rest.pop(0)
        if op in _LOOKAHEADS:
            direction, body = av
            if direction != 1:
                raise tr.unsupported("a lookbehind")
            body = list(body)
            while body and _is_start(body[0]):   # it looks from the start already (pydantic's decimals: `(?!^...)`)
                body.pop(0)
            (also if op is _c.ASSERT else excluding).append(_search_regex(tr, [start, *body]))
    return PatternRegexes(_search_regex(tr, [start, *_inline_trailing_lookahead(rest)]), tuple(also),
                          tuple(excluding))


_LOOKAHEADS = (_c.ASSERT, _c.ASSERT_NOT)


def _inline_trailing_lookahead(nodes: list) -> list:
    """`A(?=B)` ending a pattern searches like `AB`: what follows a match is never looked at, so B may as well
    be consumed."""
    if nodes and nodes[-1][0] is _c.ASSERT and nodes[-1][1][0] == 1:
        return nodes[:-1] + list(nodes[-1][1][1])
    return nodes


def _is_start(node) -> bool:
    return node[0] is _c.AT and node[1] in _STARTS


def _parse(pattern: str, pointer: str):
    try:
        python = _as_python(pattern, pointer)
        check_group_depth(python)
        parsed = parse_quietly(python)
    except (re.error, OverflowError, RegexError) as exc:
        raise UnsupportedSchemaError(f"pattern {pattern!r} cannot be parsed: {exc}", pointer) from None
    if parsed.state.flags & re.IGNORECASE:
        raise UnsupportedSchemaError(f"pattern {pattern!r}: inline flags cannot be compiled exactly", pointer)
    return parsed


_NOT_ECMA = {"\\A": "\\A (write ^)", "\\Z": "\\Z (write $)", "\\a": "\\a (write \\x07)",
             "\\U": "\\U (write the character)", "\\N": "\\N{...} (write the character)",
             "(?P": "(?P...) (ECMA names a group (?<name>...))"}
_INLINE_FLAGS = re.compile(r"\(\?(?:#|[aiLmsux-]+[:)])")    # Python's comments and inline flags; ECMA has neither
_COUNT = re.compile(r"\{[0-9]+(?:,[0-9]*)?\}")      # a counted quantifier, in both
_UPPER_BOUND_ONLY = re.compile(r"\{,[0-9]*\}")     # Python's quantifier, ECMA's literal text


def _as_python(pattern: str, pointer: str) -> str:
    """An ECMA-262 `pattern` in the syntax of Python's regex parser, which reads the rest alike: a named group
    `(?<name>...)` as `(?P<name>...)`, the class `[^]` as any character.  What Python would read otherwise is
    refused: `[]` (nothing in ECMA; Python reads on to the next `]`), `\\A`, `\\Z`, `\\a`, `\\U`, `\\N` (ECMA's
    identity escapes, letters), `(?P`, `(?>`, `(?(`, possessive quantifiers, inline flags and comments (ECMA syntax
    errors) and `{,n}` (ECMA's literal text, Python's quantifier: jsonschema's Python `re` and an ECMA validator
    would disagree on it)."""
    def refused(what: str) -> UnsupportedSchemaError:
        return UnsupportedSchemaError(f"pattern {pattern!r}: {what} is Python's syntax, not ECMA-262's", pointer)

    out, i, in_class, quantified, count_end = [], 0, False, False, -1
    while i < len(pattern):
        two = pattern[i:i + 2]
        if two[0] == "\\":
            if two in _NOT_ECMA:
                raise refused(_NOT_ECMA[two])
            out.append(two)
            i += 2
            quantified = False
            continue
        if not in_class and two[0] == "+" and quantified:
            raise refused("a possessive quantifier")
        if not in_class and two[0] == "{" and (count := _COUNT.match(pattern, i)):
            count_end = count.end() - 1     # where a counted quantifier closes
        quantified = not in_class and (two[0] in "*+?" and not (two[0] == "?" and quantified) or i == count_end)
        if in_class:
            in_class = two[0] != "]"
        elif two[0] == "[":
            in_class = True
            if pattern.startswith("[]", i):     # (Python reads on to the next `]`)
                raise UnsupportedSchemaError(f"pattern {pattern!r}: the empty class [] matches nothing", pointer)
            if pattern.startswith("[^]", i):    # ECMA's class of any character
                out.append("[\\s\\S]")
                i += 3
                in_class = False
                continue
        elif pattern.startswith("(?>", i) or pattern.startswith("(?(", i):
            raise refused(f"{pattern[i:i + 3]}...) (an atomic or conditional group)")
        elif pattern.startswith("(?P", i):
            raise refused(_NOT_ECMA["(?P"])
        elif pattern.startswith("(?<", i) and pattern[i + 3:i + 4] not in ("=", "!"):
            out.append("(?P<")
            i += 3
            continue
        elif flag := _INLINE_FLAGS.match(pattern, i):
            raise refused(f"{flag.group()} (an inline flag or comment)")
        elif _UPPER_BOUND_ONLY.match(pattern, i):
            raise UnsupportedSchemaError(f"pattern {pattern!r}: {{,n}} is literal text in ECMA-262 and a quantifier "
                                         "in Python; write {0,n}, or \\{,n\\} for the text", pointer)
        out.append(two[0])
        i += 1
    return "".join(out)


def _search_regex(tr: _Translator, nodes: list) -> str:
    """The quoted JSON strings whose decoded text contains a match of the parsed regex `nodes`."""
    # alternatives anchored alike share their padding: `X*(?:a|b|c)X*` determinizes to about the sum of the
    # words' lengths, where `X*aX*|X*bX*|X*cX*` tracks which words were seen, 2^words times as many states
    anchored: dict[tuple[bool, bool], list[str]] = {}
    for start, end, alternative in _alternatives(nodes):
        if _has_end_anchor(alternative):
            cont, fin, _ = tr.ended(alternative)
            for regex, ends in ((cont, end), (fin, True)):
                if regex is not None:
                    anchored.setdefault((start, ends), []).append(regex)
            continue
        if not end:
            alternative = _searched_end(alternative)
        if not start:
            alternative = _searched_end(alternative[::-1], reverse=True)[::-1]
        anchored.setdefault((start, end), []).append(tr.seq(alternative))
    alts = []
    for (start, end), bodies in anchored.items():
        body = bodies[0] if len(bodies) == 1 else "(?:" + "|".join(bodies) + ")"
        alts.append(("" if start else f"{CHAR}*") + body + ("" if end else f"{CHAR}*"))
    regex = '"' + (alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")") + '"'
    try:
        check_group_depth(regex)  # the translation adds groups: refuse it here, where the pointer is known
    except RegexError as exc:
        raise UnsupportedSchemaError(f"pattern {tr.pattern!r}: {exc}", tr.pointer) from None
    return regex


def _searched_end(nodes: list, reverse: bool = False) -> list:
    """The regex `nodes` shortened at an end that any text may follow: `X Y .*` is `X .*` where Y matches the
    empty text, and `X Z{m,n} .*` is `X Z{m} .*`, so an optional tail (a URI's query and fragment, say) is never
    determinized against every place a match may start; that product is what makes `.*X.*` large.  With
    `reverse`, `nodes` is read backwards, for a start any text may precede."""
    nodes = list(nodes)
    while nodes:
        op, av = nodes[-1]
        if _matches_empty(op, av):
            nodes.pop()
        elif op in (_c.MAX_REPEAT, _c.MIN_REPEAT):
            lo, _, body = av
            body = list(body)[::-1] if reverse else list(body)
            nodes[-1:] = [(op, (lo - 1, lo - 1, av[2]))] * (lo > 1) + body
        elif op is _c.SUBPATTERN and not av[1] and not av[2]:
            nodes[-1:] = list(av[3])[::-1] if reverse else list(av[3])
        elif op is _c.BRANCH:
            branches = [_searched_end(list(b)[::-1] if reverse else list(b), reverse) for b in av[1]]
            nodes[-1] = (op, (av[0], [b[::-1] if reverse else b for b in branches]))
            return nodes
        else:
            return nodes
    return nodes


def _matches_empty(op, av) -> bool:
    """Whether the parsed regex node matches the empty text wherever it stands (assertions do not)."""
    if op in (_c.MAX_REPEAT, _c.MIN_REPEAT):
        return av[0] == 0 or all(_matches_empty(*node) for node in av[2])
    if op is _c.SUBPATTERN:
        return all(_matches_empty(*node) for node in av[3])
    if op is _c.BRANCH:
        return any(all(_matches_empty(*node) for node in branch) for branch in av[1])
    return False


# Formats, as regexes over decoded text.  Each is at most as permissive as
# jsonschema's FormatChecker, so what they admit validates there too.
# Years 0001-9999: Python's dates (and so jsonschema's "date" check) have no year 0.
_YEAR = r"(?:[1-9]\d{3}|0[1-9]\d\d|00[1-9]\d|000[1-9])"
_LEAP_YEAR = r"(?:\d\d(?:0[48]|[2468][048]|[13579][26])|(?:0[48]|[2468][048]|[13579][26])00)"
_DATE = (
    rf"(?:{_YEAR}-(?:(?:0[1-9]|1[0-2])-(?:0[1-9]|1\d|2[0-8])|(?:0[13-9]|1[0-2])-(?:29|30)|(?:0[13578]|1[02])-31)"
    + "|" + _LEAP_YEAR + r"-02-29)"
)
_TIME = r"(?:[01]\d|2[0-3]):[0-5]\d:[0-5]\d(?:\.\d+)?(?:[Zz]|[+-](?:[01]\d|2[0-3]):[0-5]\d)"
_DUR_TIME = r"T(?:\d+H(?:\d+M(?:\d+S)?)?|\d+M(?:\d+S)?|\d+S)"
_DUR_DATE = r"(?:\d+D|\d+M(?:\d+D)?|\d+Y(?:\d+M(?:\d+D)?)?)"
_DURATION = rf"P(?:{_DUR_DATE}(?:{_DUR_TIME})?|{_DUR_TIME}|\d+W)"
_OCTET = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
_IPV4 = rf"{_OCTET}(?:\.{_OCTET}){{3}}"
_H16 = r"[0-9A-Fa-f]{1,4}"
_LS32 = rf"(?:{_H16}:{_H16}|{_IPV4})"
_IPV6 = "(?:" + "|".join([
    rf"(?:{_H16}:){{6}}{_LS32}",
    rf"::(?:{_H16}:){{5}}{_LS32}",
    rf"(?:{_H16})?::(?:{_H16}:){{4}}{_LS32}",
    rf"(?:(?:{_H16}:){{0,1}}{_H16})?::(?:{_H16}:){{3}}{_LS32}",
    rf"(?:(?:{_H16}:){{0,2}}{_H16})?::(?:{_H16}:){{2}}{_LS32}",
    rf"(?:(?:{_H16}:){{0,3}}{_H16})?::{_H16}:{_LS32}",
    rf"(?:(?:{_H16}:){{0,4}}{_H16})?::{_LS32}",
    rf"(?:(?:{_H16}:){{0,5}}{_H16})?::{_H16}",
    rf"(?:(?:{_H16}:){{0,6}}{_H16})?::",
]) + ")"
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,60}[A-Za-z0-9])?"
_SHORT_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,28}[A-Za-z0-9])?"
# Within 253 characters without counting them (a count over labels takes some 16,000 states): up to 4 labels of up to
# 62 characters, or up to 8 of up to 30 (mail.eu.west.example.com has 5)
_HOSTNAME = rf"(?:{_LABEL}(?:\.{_LABEL}){{0,3}}|{_SHORT_LABEL}(?:\.{_SHORT_LABEL}){{4,7}})"
_EMAIL = rf"[A-Za-z0-9!#$%&'*+/=?^_`{{|}}~-]+(?:\.[A-Za-z0-9!#$%&'*+/=?^_`{{|}}~-]+)*@{_HOSTNAME}"
_UUID = r"[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}"


def _uri_char(more: str = "", colon: bool = True) -> str:
    """One character of a URI part (RFC 3986 pchar, '/' and '?' aside), with `more` ranges (IRIs)."""
    return rf"(?:[A-Za-z0-9._~!$&'()*+,;={':' if colon else ''}@{more}-]|%[0-9A-Fa-f]{{2}})"


_URI_CHAR = _uri_char()


def _absolute_uri(char: str) -> str:
    """RFC 3986 URI (RFC 3987 IRI) over `char`: a scheme, a loose hierarchical part, query and fragment."""
    return (rf"[A-Za-z][A-Za-z0-9+.-]*:(?://{char}*(?:/{char}*)*|/?(?:{char}+(?:/{char}*)*)?)"
            rf"(?:\?(?:{char}|[/?])*)?(?:#(?:{char}|[/?])*)?")


_URI = _absolute_uri(_URI_CHAR)
_UCS = "\u00a0-\ud7ff\uf900-\ufdcf\ufdf0-\uffef"  # RFC 3987 ucschar (the BMP part)
_IRI_CHAR = _uri_char(_UCS)
_IRI = _absolute_uri(_IRI_CHAR)


def _relative_ref(char: str, segment_nc: str) -> str:
    """RFC 3986 relative-ref over `char`: a network path, an absolute path, or a first segment of
    `segment_nc` (no ':')."""
    return (rf"(?://{char}*(?:/{char}*)*|/(?:{char}+(?:/{char}*)*)?|{segment_nc}+(?:/{char}*)*)?"
            rf"(?:\?(?:{char}|[/?])*)?(?:#(?:{char}|[/?])*)?")


_JSON_POINTER = r"(?:/(?:[^/~]|~[01])*)*"

# RFC 6570 level 4; the operators reserved for extensions (= , ! @ |) are refused.
_TEMPLATE_LITERAL = "(?:[!#$&(-;=?-\\[\\]_a-z~\u00a0-\ud7ff\ue000-\ufdcf\ufdf0-\uffef]|%[0-9A-Fa-f]{2})"
_VARCHAR = r"(?:[A-Za-z0-9_]|%[0-9A-Fa-f]{2})"
_VARSPEC = rf"{_VARCHAR}(?:\.?{_VARCHAR})*(?::[1-9][0-9]{{0,3}}|\*)?"
_URI_TEMPLATE = rf"(?:{_TEMPLATE_LITERAL}|\{{[+#./;?&]?{_VARSPEC}(?:,{_VARSPEC})*\}})*"

FORMATS: dict[str, str] = {
    "date": _DATE,
    "time": _TIME,
    "date-time": rf"{_DATE}[Tt]{_TIME}",
    "duration": _DURATION,
    "email": _EMAIL,
    "hostname": _HOSTNAME,
    "ipv4": _IPV4,
    "ipv6": _IPV6,
    "uuid": _UUID,
    "uri": _URI,
    "uri-template": _URI_TEMPLATE,
    "uri-reference": f"(?:{_URI}|{_relative_ref(_URI_CHAR, _uri_char(colon=False))})",
    "iri": _IRI,
    "iri-reference": f"(?:{_IRI}|{_relative_ref(_IRI_CHAR, _uri_char(_UCS, colon=False))})",
    "json-pointer": _JSON_POINTER,
    "relative-json-pointer": rf"(?:0|[1-9][0-9]*)(?:#|{_JSON_POINTER})",
}
#: Formats whose valid strings no finite automaton recognises: enforcing them exactly is impossible, and
#: ignoring them would let invalid instances through, so schemas using them are refused.
UNENFORCEABLE_FORMATS = {"regex": "valid regexes nest parentheses without bound"}


def format_pattern(name: str) -> str:
    """The named format (one of FORMATS) as an ECMA pattern over decoded text, anchored at both ends."""
    return "^(?:" + FORMATS[name] + ")$"


def format_regex(name: str) -> str:
    """A quoted JSON string in the named format (one of FORMATS)."""
    return pattern_regex(format_pattern(name))


# ---- length caps ----------------------------------------------------------------------------------

# Intersecting a pattern with a length cap c pairs the states of the length counter with the pattern's, and
# minimising the product takes up to c + 1 passes over the pairs.  Past this bound on that work (about a
# second at worst, most MaskBench patterns take under 0.1 s at a cap of 64) a pattern keeps no cap.
_MAX_CAP_WORK = 1 << 21


@lru_cache(maxsize=4096)
def pattern_length_range(pattern: str) -> tuple[int, int | None]:
    """Fewest and most decoded characters of a string containing a match of ECMA `pattern` (most: None when
    unbounded); the pattern must be one pattern_regex translates."""
    widths = []
    for start, end, nodes in _alternatives(parse_quietly(_as_python(pattern, "")).data):
        lo, hi = _sre.SubPattern(_sre.State(), nodes).getwidth()
        widths.append((lo, hi if start and end and hi < _c.MAXREPEAT else None))
    longest = [hi for _, hi in widths]
    return min(lo for lo, _ in widths), None if None in longest else max(longest)


def capped_length(cap: int, min_length: int, patterns: list[str], also: tuple[str, ...],
                  excluding: tuple[str, ...]) -> int | None:
    """The maxLength a length cap gives a string of at least `min_length` characters matching every ECMA pattern
    in `patterns` (`also`: their regexes; `excluding`: regexes it must not match), or None where the cap does not
    apply: the patterns are bounded within it already, or the intersection is too costly or would be empty."""
    ranges = [pattern_length_range(p) for p in patterns]
    bounded = [hi for _, hi in ranges if hi is not None]
    if bounded and min(bounded) <= cap:
        return None
    length = max([cap, min_length] + [lo for lo, _ in ranges])  # never below the shortest instance
    if not patterns:
        return length
    work = (length + 1) * Length(min_length, length).num_states
    for regex in also:
        work *= regex_dfa(regex).num_states
    if work > _MAX_CAP_WORK:
        return None
    try:  # the automaton builds this same (memoised) DFA for the terminal
        dfa = terminal_dfa(also[0], also[1:] + (Length(min_length, length),), excluding)
    except RegexError:
        return None
    return length if dfa.accept.any() else None
