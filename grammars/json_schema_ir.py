"""Small IR builders for the JSON schema front end: pruning constructors and JSON punctuation.

`NEVER` (an empty choice) stands for "no text at all" while a schema is being
translated; the constructors here fold it away so that it never reaches the
runtime, except as the whole result of an unsatisfiable schema.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Callable, Hashable, Iterator

from .ir import Choice, Expr, Grammar, Lit, Members, Ref, Repeat, Seq, Terminal
from .json_strings import regex_escape

NEVER = Choice(())
EMPTY = Seq(())


# json.dumps with keyword arguments builds a new encoder per call (10 us, most of a 10,000-value enum's IR).
json_text = json.JSONEncoder(ensure_ascii=False).encode


def seq(*items: Expr) -> Expr:
    """A sequence, flattened; NEVER if any item is NEVER."""
    merged: list[Expr] = []
    for item in items:
        kind = type(item)   # exact types, NEVER as the empty choice: a hot path of every schema
        if kind is Choice and not item.items:
            return NEVER
        for part in item.items if kind is Seq else (item,):
            # adjacent literals become one, so the runtime sees longer fixed text
            if merged and type(part) is Lit and type(merged[-1]) is Lit:
                merged[-1] = Lit(merged[-1].text + part.text)
            else:
                merged.append(part)
    return merged[0] if len(merged) == 1 else Seq(tuple(merged))


def choice(items) -> Expr:
    """A choice without NEVER branches or duplicates; NEVER if nothing is left."""
    items = items if type(items) is list else list(items)
    if len(items) == 1 and type(items[0]) is not Choice:
        return items[0]     # most calls (a subschema of one type): nothing to hash
    out: dict[Expr, None] = {}       # ordered, and linear where a list's `in` made large enums quadratic
    for item in items:
        for alt in item.items if isinstance(item, Choice) else (item,):
            out.setdefault(alt)
    return next(iter(out)) if len(out) == 1 else Choice(tuple(out))


def repeat(item: Expr, lo: int = 0, hi: int | None = None) -> Expr:
    """`item` lo..hi times, folding the trivial cases."""
    if hi is not None and (hi < lo or hi < 0):
        return NEVER
    lo = max(lo, 0)
    if item == NEVER:
        return EMPTY if lo == 0 else NEVER
    if hi == 0:
        return EMPTY
    if lo == hi == 1:
        return item
    return Repeat(item, lo, hi)


def optional(item: Expr) -> Expr:
    return repeat(item, 0, 1)


class Counting:
    """Counts of one unit written in base `base`, so that a count of n takes about `base` copies per digit of n
    instead of n (the automaton writes bounded repetitions out).  `unit(level)` is the expression of base**level
    units: level 0 the unit, each level above a rule of `base` of the one below, called (built once)."""

    def __init__(self, unit: Callable[[int], Expr], base: int, flat: int):
        """`flat`: counts below it are written out one by one (see `at_most`); at least `base`, so that a count
        past it holds a unit of the level above."""
        if flat < base:
            raise ValueError(f"Counting needs flat >= base, got flat {flat} and base {base}")
        self.unit, self.base, self.flat = unit, base, flat

    def exactly(self, n: int) -> Expr:
        """Exactly `n` units: each digit of `n` counts units of its level, the highest first."""
        digits = [n % self.base]
        while n >= self.base:
            n //= self.base
            digits.append(n % self.base)
        return seq(*(repeat(self.unit(level), d, d) for level, d in reversed(list(enumerate(digits)))))

    def at_most(self, n: int) -> Expr:
        """0..n units, each count written one way: below `flat` one by one; past that, fewer units of a level
        than n holds and then any count below one unit, or exactly as many and then at most the rest of n.
        Counted flat, a parser is at one place of the count; each level adds a place it may be at (the count may
        end in any unit), and so a stack to follow per token, hence levels only where a flat count outgrows
        `flat`."""
        if n < self.flat:
            return repeat(self.unit(0), 0, n)
        level, top = _top(n, self.base, self.flat)
        below = seq(*(repeat(self.unit(k), 0, self.base - 1) for k in reversed(range(level))))
        return choice([seq(repeat(self.unit(level), 0, top - 1), below),
                       seq(repeat(self.unit(level), top, top), self.at_most(n - top * self.base ** level))])


def at_most_size(n: int, base: int, flat: int) -> int:
    """How many units of any level `Counting(unit, base, flat).at_most(n)` writes, each level's rule counted once
    (whatever the unit: a size is known before any unit is built)."""
    copies, levels = _copies(n, base, flat)
    return copies + base * levels


def _copies(n: int, base: int, flat: int) -> tuple[int, int]:
    """The units `at_most(n)` writes outside the levels' rules, and how many levels it calls."""
    if n < flat:
        return n, 0
    level, top = _top(n, base, flat)
    rest, _ = _copies(n - top * base ** level, base, flat)
    return 2 * top - 1 + (base - 1) * level + rest, level


def _top(n: int, base: int, flat: int) -> tuple[int, int]:
    """The lowest level at which `n` holds fewer than `flat` units, and how many it holds (n >= flat)."""
    level = 1
    while n // base ** level >= flat:
        level += 1
    return level, n // base ** level


def inlined_size(expr: Expr, rules: dict[str, Expr], sizes: dict[str, int]) -> int:
    """About how many automaton nodes `expr` takes once the automaton inlines the rules it refers to and
    writes out bounded repetitions; a rule not defined yet is being compiled around it (recursion, which
    the automaton calls instead), so it counts as one call.  `sizes` memoises rules."""
    if isinstance(expr, Ref):
        if expr.call:
            return 1
        if expr.name not in sizes:
            sizes[expr.name] = 1  # cycles end here
            if expr.name in rules:
                sizes[expr.name] = inlined_size(rules[expr.name], rules, sizes)
        return sizes[expr.name]
    if isinstance(expr, Repeat):
        copies = expr.max if expr.max is not None else expr.min + 1
        return max(copies, 1) * inlined_size(expr.item, rules, sizes)
    if isinstance(expr, (Seq, Choice)):
        return max(sum(inlined_size(item, rules, sizes) for item in expr.items), 1)
    if isinstance(expr, Members):
        return sum(inlined_size(part, rules, sizes) for part in expr.parts())
    return 1


def grammar_size(grammar: Grammar) -> int:
    """About how many automaton nodes a whole grammar takes: the inlined_size of its start rule and of each rule it
    calls (`Ref.call`: a member's value, an array's counted items), once each."""
    sizes: dict[str, int] = {}
    total, todo, seen = 0, [grammar.start], {grammar.start}
    while todo:
        name = todo.pop()
        total += inlined_size(Ref(name), grammar.rules, sizes)
        for called in _called(grammar.rules.get(name), grammar.rules, set()):
            if called not in seen:
                seen.add(called)
                todo.append(called)
    return total


def _called(expr: Expr | None, rules: dict[str, Expr], inlined: set[str]) -> Iterator[str]:
    """The rules `expr` calls, once the rules it inlines are written out (`inlined`: those met)."""
    if isinstance(expr, Ref):
        if expr.call:
            yield expr.name
        elif expr.name not in inlined:
            inlined.add(expr.name)
            yield from _called(rules.get(expr.name), rules, inlined)
    elif isinstance(expr, Repeat):
        yield from _called(expr.item, rules, inlined)
    elif isinstance(expr, (Seq, Choice)):
        for item in expr.items:
            yield from _called(item, rules, inlined)
    elif isinstance(expr, Members):
        for part in expr.parts():
            yield from _called(part, rules, inlined)


@dataclass(frozen=True)
class Punctuation:
    """The separators of one whitespace style; `*_open`/`*_close` carry the inner padding."""

    comma: Expr
    colon: Expr
    obj_open: Expr
    obj_close: Expr
    arr_open: Expr
    arr_close: Expr
    obj_empty: Expr
    arr_empty: Expr


@functools.lru_cache(maxsize=16)   # every compile asks: one set of objects, which the memos compare by identity first
def punctuation(style: str, max_indent: int) -> Punctuation:
    """Separators for whitespace style 'flexible' (bounded), 'dumps' (json.dumps) or 'compact' (none)."""
    if style == "dumps":
        return Punctuation(Lit(", "), Lit(": "), Lit("{"), Lit("}"), Lit("["), Lit("]"), Lit("{}"), Lit("[]"))
    if style == "compact":
        return Punctuation(Lit(","), Lit(":"), Lit("{"), Lit("}"), Lit("["), Lit("]"), Lit("{}"), Lit("[]"))
    if style != "flexible":
        raise ValueError(f"whitespace must be 'flexible', 'dumps' or 'compact', not {style!r}")
    # At most one line break, then bounded indentation: pretty-printed JSON fits, endless padding does not.
    ws = rf"(?:\r?\n)?[ \t]{{0,{max_indent}}}"

    def around(lit: str) -> Expr:
        return Terminal(f"{ws}{regex_escape(lit)}{ws}")

    return Punctuation(
        comma=around(","),
        colon=around(":"),
        obj_open=Terminal(rf"\{{{ws}"),
        obj_close=Terminal(rf"{ws}\}}"),
        arr_open=Terminal(rf"\[{ws}"),
        arr_close=Terminal(rf"{ws}\]"),
        obj_empty=Terminal(rf"\{{{ws}\}}"),
        arr_empty=Terminal(rf"\[{ws}\]"),
    )


def number_literal_regex(value: Any) -> str:
    """Every JSON spelling (without exponent) of the number `value`: 2 matches 2, 2.0, 2.00; 0 also -0, -0.0."""
    whole, tail = number_literal_parts(value)
    return ("-?" if whole == "0" else "") + whole + tail


def number_literal_parts(value: Any) -> tuple[str, str]:
    """`number_literal_regex(value)` as its fixed text (sign and integer digits) and the regex of its
    fraction, which all integers share: an enum of many numbers becomes one set of literals and one tail."""
    whole, fraction = _digits(value)
    return whole, rf"\.{fraction}0*" if fraction else INTEGRAL_TAIL


INTEGRAL_TAIL = r"(?:\.0+)?"   # an integer's optional zero fraction


def canonical_number(value: int | float) -> str:
    """The one spelling of a number that `json_numbers.CANONICAL` writes: no exponent, no trailing zero."""
    whole, fraction = _digits(value)
    return f"{whole}.{fraction}" if fraction else whole


def _digits(value: Any) -> tuple[str, str]:
    """A number's sign and integer digits, and its fraction's digits without trailing zeros."""
    d = Decimal(str(value))
    if not d.is_finite():
        raise ValueError(f"{value!r} is not a JSON number")
    sign = "-" if d < 0 else ""
    d = abs(d)
    whole = int(d)
    fraction = format(d - whole, "f")
    return f"{sign}{whole}", fraction.split(".")[1].rstrip("0") if "." in fraction else ""


def literal(value: Any, punct: Punctuation, fractions: bool = True,
            objects: Callable[[dict, bool], Expr] | None = None) -> Expr:
    """The JSON value `value` (from an enum or const), in the given whitespace style; `fractions`: its integers
    may also be written with a zero fraction (2.0), which draft-04 does not call an integer; `objects`: where
    given, what writes an object of two or more members, at any depth (its members in any order)."""
    if value is None or isinstance(value, bool) or isinstance(value, str):
        return Lit(json_text(value))
    if isinstance(value, (int, float)):
        whole, tail = number_literal_parts(value)
        return Lit(whole) if not fractions and tail == INTEGRAL_TAIL else Terminal(whole + tail)
    if isinstance(value, list):
        if not value:
            return punct.arr_empty
        items: list[Expr] = [punct.arr_open]
        for i, item in enumerate(value):
            items += ([punct.comma] if i else []) + [literal(item, punct, fractions, objects)]
        return seq(*items, punct.arr_close)
    if isinstance(value, dict):
        if objects is not None and len(value) > 1:
            return objects(value, fractions)
        if not value:
            return punct.obj_empty
        items = [punct.obj_open]
        for i, (key, item) in enumerate(value.items()):
            items += ([punct.comma] if i else []) + [Lit(json_text(key)), punct.colon,
                                                     literal(item, punct, fractions, objects)]
        return seq(*items, punct.obj_close)
    raise TypeError(f"{type(value).__name__} is not a JSON value")


def json_key(value: Any) -> Hashable:
    """A key that is equal for exactly the values JSON Schema calls equal: numbers by value (1 and 1.0),
    booleans apart from numbers, arrays and objects by content; dedupes and intersects enums in linear time."""
    if isinstance(value, bool):
        return ("boolean", value)
    if isinstance(value, (int, float)):
        return ("number", value)
    if isinstance(value, list):
        return ("array", tuple(json_key(item) for item in value))
    if isinstance(value, dict):
        return ("object", frozenset((key, json_key(item)) for key, item in value.items()))
    return (type(value).__name__, value)


def json_equal(a: Any, b: Any) -> bool:
    """JSON Schema equality (see `json_key`)."""
    return json_key(a) == json_key(b)
