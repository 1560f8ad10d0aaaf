"""Scalars: enum/const values, numbers (bounds, multipleOf, digit caps) and strings (lengths, pattern, format).

Each becomes one Terminal (or a choice of literals for enum/const), so the runtime matches it as a single
regex intersection.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Callable

from .errors import SchemaError, UnsupportedSchemaError
from .automaton import terminal_for
from .fsm import DFA, product, union
from .ir import Capture, Choice, Expr, Language, Lit, Members, Ref, Seq, Terminal
from .json_numbers import (CANONICAL, DECIMAL, INTEGER, INTEGER_VALUE, NUMBER, Multiples, at_least, at_most,
                           common_multiple, digit_cap, multiples_of)
from .json_schema_context import (STRING_KEYS, Part, SchemaContext, count_of, enum_values, expect, is_number,
                                  satisfying)
from .json_schema_ir import (INTEGRAL_TAIL, NEVER, Counting, choice, inlined_size, json_text, literal,
                             number_literal_parts, number_literal_regex, repeat, seq)
from .json_strings import (ANY_CHARS, ANY_STRING, ANY_STRING_END, FORMATS, UNENFORCEABLE_FORMATS, Chars, Length,
                           StringEnd, capped_length, format_pattern, pattern_regexes, regex_escape)
from .regex import MAX_DFA_STATES

Patterns = tuple[tuple[str, str], ...]  # ECMA patterns, each with its JSON pointer
_MAX_COUNTED_TEXTS = 1 << 20  # more distinct strings than this never run out in an object or array


def enumerated(ctx: SchemaContext, parts: list[Part]) -> Expr:
    """The enum/const values of `parts` that satisfy every other keyword of the conjunction."""
    values = enum_values(parts)
    assert values is not None
    values = spelled_values(ctx, values)
    try:
        values = satisfying(ctx, parts, values)
        allowed = fractions_allowed(ctx, parts, values)
    except UnsupportedSchemaError as exc:  # a pattern written in Python's syntax, not ECMA's
        raise UnsupportedSchemaError(exc.reason, exc.pointer or parts[0].pointer) from None
    except Exception as exc:
        from referencing.exceptions import NoSuchAnchor, PointerToNowhere, Unresolvable

        # what the compiler refuses as unsupported elsewhere (a $ref to another document, a pattern neither regex
        # reader parses) is so here too; the rest (a $ref to nowhere in this one) is the schema's fault
        cause = exc.__cause__ or exc    # (jsonschema raises referencing's error wrapped)
        unsupported = isinstance(exc, re.error) or (
            isinstance(cause, Unresolvable) and not isinstance(cause, (PointerToNowhere, NoSuchAnchor)))
        error = UnsupportedSchemaError if unsupported else SchemaError
        raise error(f"cannot check enum values against the schema: {exc}", parts[0].pointer) from None
    if not values:
        return ctx.never("no enum/const value satisfies the schema", parts[0].pointer)
    by_tail: dict[str, list[Expr]] = {}         # numbers with the same fraction regex share one terminal
    for value, fraction in zip(values, allowed):
        if is_number(value):
            whole, tail = number_literal_parts(value)
            by_tail.setdefault(tail if fraction or tail != INTEGRAL_TAIL else "", []).append(Lit(whole))
    numbers = [seq(choice(wholes), Terminal(tail)) if tail else choice(wholes) for tail, wholes in by_tail.items()]
    objects = unordered_objects(ctx, parts[0])
    return choice([*numbers, *(literal(v, ctx.punct, fraction, objects) for v, fraction in zip(values, allowed)
                               if not is_number(v))])


def unordered_objects(ctx: SchemaContext, part: Part) -> Callable[[dict, bool], Expr] | None:
    """Under property_order="any", what writes an object that an enum or const lists (`literal`'s `objects`): an
    object's rule holding each member to its value, all of them required, so they come in any order as members
    do elsewhere; None in schema order."""
    if ctx.options.property_order != "any":
        return None
    pu = ctx.punct

    def written(value: dict, fractions: bool) -> Expr:
        members = tuple(ctx.share(seq(Lit(json_text(key)), pu.colon, literal(item, pu, fractions, written)),
                                  part.pointer) for key, item in value.items())
        name = ctx.rule_name(part.pointer + "_listed_object")
        ctx.rules[name] = Members(pu.obj_open, members, pu.comma, pu.obj_close, required=frozenset(range(len(members))))
        return Ref(name)

    return written


def fractions_allowed(ctx: SchemaContext, parts: list[Part], values: list[Any]) -> list[bool]:
    """Per value, whether its integers may also be written with a zero fraction (2.0): everywhere but under
    draft-04, where only a value that still holds so written may."""
    if not ctx.draft4:
        return [True] * len(values)
    floated = [_spelled(v, float) for v in values]
    holding = set(map(id, satisfying(ctx, parts, floated)))
    return [id(f) in holding for f in floated]


def spelled_values(ctx: SchemaContext, values: list[Any]) -> list[Any]:
    """Enum values as a check should read them: draft-04 judges an integer by its spelling (1 is one, 1.0 is not),
    not by the enum's, so there its integral numbers are checked as ints."""
    return [_spelled(v, int) for v in values] if ctx.draft4 else values


def _spelled(value: Any, kind: type) -> Any:
    """`value` with its integral numbers as `kind` (int or float; floats only up to 2**53, where they are exact)."""
    if is_number(value) and (isinstance(value, int) or value.is_integer()):
        return int(value) if kind is int else float(value) if abs(value) <= 2 ** 53 else value
    if isinstance(value, list):
        return [_spelled(item, kind) for item in value]
    if isinstance(value, dict):
        return {key: _spelled(item, kind) for key, item in value.items()}
    return value


def _decimal(x: Any, pointer: str) -> Decimal:
    expect(is_number(x), "expected a number", pointer)
    d = Decimal(str(x))
    expect(d.is_finite(), "expected a finite number", pointer)
    return d


def number(ctx: SchemaContext, parts: list[Part], integer_only: bool, excluded: list[Any]) -> Expr:
    """The number terminal for the numeric keywords of `parts`, none of the `excluded` values (a
    ("non-integer",) entry there excludes integers, a Multiples entry its multiples)."""
    lo: tuple[Decimal, bool] | None = None
    hi: tuple[Decimal, bool] | None = None
    multiples: list[tuple[Decimal, str]] = []

    def tighter(cur, new, upper):
        if cur is None:
            return new
        if new[0] != cur[0]:
            return new if (new[0] < cur[0]) == upper else cur
        return (cur[0], cur[1] or new[1])

    given: dict[bool, tuple[str, str]] = {}     # per side (upper?): the keyword of the bound kept, and its pointer

    def bound(cur, p, keyword, strict, upper):
        new = (_decimal(p.get(keyword), p.at(keyword)), strict)
        kept = tighter(cur, new, upper)
        if kept is new:
            given[upper] = (keyword, p.at(keyword))
        return kept

    for p in parts:
        legacy_min = p.get("exclusiveMinimum") is True
        legacy_max = p.get("exclusiveMaximum") is True
        if p.has("minimum"):
            lo = bound(lo, p, "minimum", legacy_min, False)
        if p.has("maximum"):
            hi = bound(hi, p, "maximum", legacy_max, True)
        if p.has("exclusiveMinimum") and not isinstance(p.get("exclusiveMinimum"), bool):
            lo = bound(lo, p, "exclusiveMinimum", True, False)
        if p.has("exclusiveMaximum") and not isinstance(p.get("exclusiveMaximum"), bool):
            hi = bound(hi, p, "exclusiveMaximum", True, True)
        if p.has("multipleOf"):
            k = _decimal(p.get("multipleOf"), p.at("multipleOf"))
            expect(k > 0, "multipleOf must be positive", p.at("multipleOf"))
            multiples.append((k, p.at("multipleOf")))
    pointer = parts[0].pointer if parts else ""
    if lo and hi and (lo[0] > hi[0] or (lo[0] == hi[0] and (lo[1] or hi[1]))):
        return ctx.never(f"minimum {lo[0]} is above maximum {hi[0]}", pointer)
    if integer_only and lo and hi:
        first = int(lo[0].to_integral_value("ROUND_FLOOR")) + 1 if lo[1] or lo[0] != int(lo[0]) else int(lo[0])
        if lo[1] and lo[0] != int(lo[0]):
            first = int(lo[0].to_integral_value("ROUND_CEILING"))
        last = int(hi[0].to_integral_value("ROUND_CEILING")) - 1 if hi[1] or hi[0] != int(hi[0]) else int(hi[0])
        if hi[1] and hi[0] != int(hi[0]):
            last = int(hi[0].to_integral_value("ROUND_FLOOR"))
        if first > last:
            return ctx.never(f"no integer between {lo[0]} and {hi[0]}", pointer)
    also: list[str | Language] = []
    if lo:
        also.append(at_least(*lo))
    if hi:
        also.append(at_most(*hi))
    integral = integer_only
    if multiples:
        step = common_multiple([k for k, _ in multiples])
        also.append(multiples_of(step, multiples[0][1] if len(multiples) == 1 else pointer))
        integral = integral or step == step.to_integral_value()
    refused = _fewest_multiples([x for x in excluded if isinstance(x, Multiples)])
    values = [v for v in excluded if is_number(v)]
    if multiples:
        for x in refused:
            if step % x.step == 0:
                return ctx.never(f"every multiple of {step} is a multiple of {x.step}, which is excluded", pointer)
    if integral:
        main = INTEGER if integer_only and ctx.draft4 else INTEGER_VALUE
    else:
        # bounds, multiples and excluded values are written over decimals (an exponent would escape an excluded
        # multiple, and 2e0 or 20e-1 an excluded 2: the spellings of a number with exponents are no regular language)
        main = DECIMAL if also or refused or values else NUMBER
    if ctx.options.max_number_digits is not None:
        bounds = [b[0] for b in (lo, hi) if b is not None]
        also.append(_digit_cap(ctx.options.max_number_digits, bounds, [k for k, _ in multiples],
                               whole_open=len(bounds) < 2))
    exclude = tuple(number_literal_regex(v) for v in values) + tuple(refused)
    if ("non-integer",) in excluded:
        if integer_only or (integral and not ctx.draft4):
            return NEVER
        if ctx.draft4:  # 1.0 and 1e2 are not integers there
            exclude += (INTEGER,)
        else:
            also.append(DECIMAL)
            exclude += (INTEGER_VALUE,)
    named = ([f"multipleOf {step}"] if multiples else []) + [f"not multipleOf {x.step}" for x in refused]
    sides = [(given[upper], value) for upper, value in ((False, lo), (True, hi)) if value]
    named += [f"{keyword} {value[0]}" for (keyword, _), value in sides]
    if len(named) == 1 and sides:    # a refusal of that bound alone is about its keyword
        pointer = sides[0][0][1]
    return Terminal(main, tuple(also), exclude, origin=(" with ".join(named) or "the number", pointer))


def _fewest_multiples(refused: list[Multiples]) -> list[Multiples]:
    """The excluded multiples without those of a step that is itself a multiple of another's: each one left
    multiplies the automaton's states (allOf of oneOf branches over multipleOf distributed into 18 terminals
    of up to nine exclusions each took 200 ms)."""
    steps = sorted({x.step for x in refused})
    return [Multiples(k) for i, k in enumerate(steps) if not any(k % j == 0 for j in steps[:i])]


def _digit_cap(cap: int, bounds: list[Decimal], multiples: list[Decimal], whole_open: bool) -> str:
    """The max_number_digits (`cap`) regex for a number with these bounds and multipleOf steps; the integer
    part is capped only where the bounds leave it open (`whole_open`).  The caps keep room for the first
    allowed value past each bound (at most one step away, the step being a multiple of every multipleOf) and
    for one more fraction digit than the schema's own numbers have, so a value between two exclusive bounds
    always remains."""
    step = Decimal(1)
    for k in multiples:
        step *= max(k, Decimal(1))
    edge = max((abs(b) for b in bounds), default=Decimal(0)) + step
    int_digits = max(cap, len(str(int(edge)))) if whole_open else None
    frac = max((max(0, -d.normalize().as_tuple().exponent) for d in bounds + multiples), default=-1)
    return digit_cap(int_digits, max(cap, frac + 1))


def string_terminal(ctx: SchemaContext, parts: list[Part], excluded: list[str], extra_patterns: Patterns = (),
                    excluded_patterns: Patterns = (), whole: bool = False) -> Expr:
    """The quoted-string terminal for the string keywords of `parts`, none of the `excluded` values, also
    matching every pattern of `extra_patterns` (a class of property names) and none of `excluded_patterns`
    (`not: {pattern}`, the other classes of property names).  `whole`: one terminal even where long length
    bounds would count in chunks (a captured text is one terminal)."""
    if not (excluded or extra_patterns or excluded_patterns or ctx.options.max_string_length is not None
            or any(key not in p.skip for p in parts for key in _STRING_KEYS.intersection(p.schema))):
        return _ANY_STRING_TERMINAL      # most strings: no keyword to read, and one terminal for all of them
    lo, hi = 0, None
    patterns = list(extra_patterns)
    # each keyword as (its name in an error, its pointer)
    named = [(f"key pattern {src!r}", at) for src, at in extra_patterns]
    for p in parts:
        keywords = string_keywords(ctx, p)
        lo = max(lo, keywords.min_length)
        if keywords.max_length is not None:
            hi = keywords.max_length if hi is None else min(hi, keywords.max_length)
        patterns += keywords.patterns + keywords.formats
        named += keywords.named
    here = parts[0].pointer if parts else ""
    if hi is not None and lo > hi:
        return ctx.never(f"minLength {lo} is above maxLength {hi}", here)
    regexes = [pattern_regexes(*pattern) for pattern in patterns]
    also = tuple(r.regex for r in regexes) + tuple(regex for r in regexes for regex in r.also)
    exclude = tuple(regex_escape(json_text(v)) for v in excluded) + tuple(
        regex for r in regexes for regex in r.excluding) + tuple(
        _excluded_regexes(excluded_patterns))
    bounds = [(f"minLength {lo}", here)] * bool(lo) + [(f"maxLength {hi}", here)] * (hi is not None)
    if hi is None and ctx.options.max_string_length is not None:
        hi = capped_length(ctx.options.max_string_length, lo, [src for src, _ in patterns], also, exclude)
        bounds += [(f"the max_string_length cap of {hi}", here)] * (hi is not None)
    named = bounds + named + [(f"{len(excluded)} excluded values", here)] * bool(excluded) + [
        (f"not pattern {src!r}", at) for src, at in excluded_patterns]
    # Where the automaton outgrows the budget: the keyword's own pointer when it is alone, else the string's.
    origin = (" with ".join(name for name, _ in named), named[0][1] if len(named) == 1 and named[0][1] else here)
    if lo == 0 and hi is None and also:
        return Terminal(also[0], also[1:], exclude, origin)
    if not also and not excluded_patterns and max(lo, hi or 0) > CHUNK and not whole:
        # excluded values (declared keys) are short: strings longer than all of them need no exclusion, so
        # only the short ones are one terminal and the long ones count in chunks
        short = max((len(v) for v in excluded), default=-1)
        if lo > short:
            return _chunked_string(ctx, lo, hi)
        if hi is not None and hi > short:
            return choice([Terminal(ANY_STRING, (Length(lo, short),), exclude), _chunked_string(ctx, short + 1, hi)])
    if also:   # the length counted along the pattern's automaton (json_strings.Length): an ASCII pattern costs
        return Terminal(also[0], also[1:] + (Length(lo, hi),), exclude, origin)   # a state or two per character
    if max(lo, hi or 0) * _STATES_PER_CHARACTER > MAX_DFA_STATES:
        # the length count alone outgrows one terminal's budget: say so now, not after building most of it
        raise UnsupportedSchemaError(f"{origin[0]} cannot be enforced exactly within {MAX_DFA_STATES} automaton "
                                     "states", origin[1])
    return Terminal(ANY_STRING, (Length(lo, hi),) if lo or hi is not None else (), exclude, origin)


_ANY_STRING_TERMINAL = Terminal(ANY_STRING)
_STRING_KEYS = frozenset(STRING_KEYS)


@dataclass(frozen=True)
class StringKeywords:
    """The string keywords of one conjunct: its length bounds, its pattern and its format as ECMA patterns (each
    with its pointer; a format's pattern admits a subset of the format), and each keyword as (its name in an
    error, its pointer)."""

    min_length: int
    max_length: int | None
    patterns: Patterns
    formats: Patterns
    named: tuple[tuple[str, str], ...]


def string_keywords(ctx: SchemaContext, part: Part) -> StringKeywords:
    """The string keywords of `part`; refused where its format cannot be enforced."""
    patterns: list[tuple[str, str]] = []
    formats: list[tuple[str, str]] = []
    named: list[tuple[str, str]] = []
    if part.has("pattern"):
        expect(isinstance(part.get("pattern"), str), "pattern must be a string", part.at("pattern"))
        patterns.append((part.get("pattern"), part.at("pattern")))
        named.append((f"pattern {part.get('pattern')!r}", part.at("pattern")))
    fmt = part.get("format")
    expect(fmt is None or isinstance(fmt, str), "format must be a string", part.at("format"))
    if fmt in FORMATS:
        formats.append((format_pattern(fmt), ""))
        named.append((f"format {fmt!r}", part.at("format")))
    elif fmt in UNENFORCEABLE_FORMATS:
        raise UnsupportedSchemaError(f"format {fmt!r} cannot be enforced: {UNENFORCEABLE_FORMATS[fmt]}",
                                     part.at("format"))
    elif fmt is not None and ctx.options.strict_formats:
        raise UnsupportedSchemaError(f"format {fmt!r} is not supported", part.at("format"))
    return StringKeywords(count_of(part, "minLength") or 0, count_of(part, "maxLength"), tuple(patterns),
                          tuple(formats), tuple(named))


def _excluded_regexes(patterns: Patterns) -> tuple[str, ...]:
    """The strings matching any of `patterns`: the patterns searched for (not all alternatives anchored at the
    start) as one search regex where they join into one pattern, the anchored ones each alone.  Searched for
    together, `.*(?:a|b).*` determinizes to about the words' total length, where excluding `.*a.*` and `.*b.*`
    one by one (or their union) multiplies the two automata; an anchored pattern's automaton keeps to its own
    prefixes, and alone it is parsed once for every branch excluding it (Github_hard's o46658: a oneOf of eight
    patterns, one of several hundred alternatives, joined seven at a time took 75 ms of parsing)."""
    read = [pattern_regexes(*pattern) for pattern in patterns]
    alone = tuple(regexes.single(*pattern) for regexes, pattern in zip(read, patterns))  # each must parse alone
    searched = [pattern for regexes, pattern in zip(read, patterns) if regexes.searched]
    if len(searched) > 1:
        joined = "|".join(f"(?:{src})" for src, _ in searched)
        try:
            return tuple(regex for regexes, regex in zip(read, alone) if not regexes.searched) + (
                pattern_regexes(joined, searched[0][1]).single(joined, searched[0][1]),)
        except UnsupportedSchemaError:
            pass  # an inline flag in one of them, which only a pattern's start may hold
    return alone


CHUNK = 32  # longer length bounds count in chunks of this many characters: one terminal would unroll each one
_STATES_PER_CHARACTER = 14  # a quoted string's DFA, per character its length bound counts
# chunks counted one by one (a state each) before the count goes in base CHUNK: flat, a maxLength of 10,000 took
# 310 call states, built in every schema naming it (a tenth of Snowplow's compiles took over 10 ms); counted in
# base CHUNK, its whole string rule has 132 states, for a second parser configuration inside such strings
# (advance ~15% slower there)
_FLAT = 32
_INLINED_STRING_SIZE = 16  # automaton nodes of a length-bounded string's rule past which it is called, not inlined


def _chunked_string(ctx: SchemaContext, lo: int, hi: int | None) -> Expr:
    """A quoted string of lo..hi characters as chunks of CHUNK characters and a shorter remainder: every
    length is chunks * CHUNK + remainder in exactly one way, and the chunk and remainder terminals are the
    same few DFAs in every schema.  One rule per pair of bounds, so that where its count is long it is built
    once and called (a schema bounding fifty fields at 32,767 characters builds its 190 counting states
    once).  Past _FLAT chunks the count goes in base CHUNK (`Counting`), so a maxLength of
    1,000,000 costs about 300 call states instead of 31,250."""
    name = f"<string of {lo} to {hi} characters>"   # not a name `rule_name` makes
    if name not in ctx.rules:
        ctx.rules[name] = _counted_string_body(ctx, lo, hi)
    # inlined where short; called where counted in chunks, which takes over a hundred automaton nodes for a
    # maxLength in the thousands, too few for the automaton to call it (CALLED_RULE_SIZE) but written out again in
    # every member holding such a string (a Github schema's 80 descriptions of at most 32,767 characters took
    # 13,000 of its 17,800 automaton states)
    return Ref(name, call=inlined_size(Ref(name), ctx.rules, ctx.sizes) > _INLINED_STRING_SIZE)


def _counted_string_body(ctx: SchemaContext, lo: int, hi: int | None) -> Expr:
    """The quote and lo..hi characters of `_chunked_string`."""

    def chars(a: int, b: int | None) -> Expr:
        # the closing quote belongs to the remainder, so token walks stop only where the string may end
        return Lit('"') if b == 0 else Terminal(ANY_STRING_END, (StringEnd(a, b),))

    chunks = Counting(lambda level: _units(ctx, level), CHUNK, _FLAT)
    first, rest = divmod(lo, CHUNK)
    if hi is None:
        body = seq(chunks.exactly(first), chars(rest, None))
    else:
        last, top = divmod(hi, CHUNK)
        if first == last:
            tail = chars(rest, top)
        else:
            between = last - first - 1   # chunks after the first more one, when neither edge bounds the remainder
            tail = choice([chars(rest, CHUNK - 1),
                           seq(chunks.exactly(1), chunks.at_most(between - 1), chars(0, CHUNK - 1)) if between
                           else NEVER,
                           seq(chunks.exactly(last - first), chars(0, top))])
        body = seq(chunks.exactly(first), tail)
    return seq(Lit('"'), body)


def _units(ctx: SchemaContext, level: int) -> Expr:
    """CHUNK ** level chunks of a string's body, as one rule of the schema: level 0 is the chunk terminal, and
    each level above calls the one below CHUNK times."""
    name = f"<{CHUNK ** (level + 1)} string characters>"   # not a name `rule_name` makes
    if name not in ctx.rules:
        ctx.rules[name] = (Terminal(ANY_CHARS, (Chars(CHUNK),)) if level == 0
                           else repeat(_units(ctx, level - 1), CHUNK, CHUNK))
    # the chunk rule is inlined to its terminal call; the levels above are called, so each stays one rule
    return Ref(name, call=level > 0)


def distinct_texts(ctx: SchemaContext, expr: Expr, what: str, pointer: str) -> tuple[Capture, int | None]:
    """The scalar items `expr` (strings, numbers, literals, or a choice of them) as one captured terminal, so
    that the extras of an object (`what`: its keys) or the items of an array never write the same text twice;
    and how many texts it has, where they can run out (None: more than _MAX_COUNTED_TEXTS).  Numbers are
    spelled canonically there (json_numbers.CANONICAL: `1` and `1.0` are one value, so only `1` is written),
    which makes equal texts equal values, as they are for strings.  Refused where the items are not scalars of
    one terminal each (an anyOf of string schemas with patterns of their own)."""
    options = _terminal_options(ctx, expr, set())
    if options is None:
        raise UnsupportedSchemaError(f"{what} must differ, and telling them apart needs them to be strings, "
                                     "numbers or literals of one terminal each", pointer)
    options = list(dict.fromkeys(Terminal(CANONICAL, (o.pattern, *o.also), o.excluding, o.origin)
                                 if isinstance(o, Terminal) and o.pattern in _NUMBER_PATTERNS else o for o in options))
    if len(options) == 1:
        text: Expr = options[0]
    elif all(isinstance(o, Lit) for o in options):
        text = Choice(tuple(options))
    else:    # a string or null: one automaton for them all, so that the frame records every text
        text = Terminal(_ANY_TEXT, (Either(tuple(options)),))
    return Capture(text), terminal_for(text).size(_MAX_COUNTED_TEXTS)


def _terminal_options(ctx: SchemaContext, expr: Expr, seen: set[str]) -> list[Lit | Terminal] | None:
    """The literals and terminals `expr` chooses between, through rule references; None where it is more."""
    if isinstance(expr, Ref):
        if expr.name in seen:
            return None
        return _terminal_options(ctx, ctx.rules[expr.name], seen | {expr.name})
    if isinstance(expr, Seq) and len(expr.items) == 1:
        return _terminal_options(ctx, expr.items[0], seen)
    if isinstance(expr, Choice):
        out: list[Lit | Terminal] = []
        for item in expr.items:
            options = _terminal_options(ctx, item, seen)
            if options is None:
                return None
            out += options
        return out
    return [expr] if isinstance(expr, (Lit, Terminal)) else None


@dataclass(frozen=True)
class Either:
    """The texts of any of several literals and terminals, as one Language (see `distinct_texts`)."""

    options: tuple[Lit | Terminal, ...]

    def dfa(self) -> DFA:
        return union([terminal_for(option) for option in self.options], MAX_DFA_STATES)

    def intersect(self, dfa: DFA, max_states: int) -> DFA:
        return product(dfa, self.dfa(), True, max_states)


_ANY_TEXT = "(?s:.*)"
_NUMBER_PATTERNS = {INTEGER, INTEGER_VALUE, DECIMAL, NUMBER}   # what `number` writes numbers with
