"""String schemas whose `not`, `anyOf`, `oneOf` and `if` nest: one automaton from boolean operations on the
automata of their string keywords.

Elsewhere combinators are distributed: an anyOf becomes a choice of alternatives, each compiled with the rest of
the conjunction, and a `not` over an anyOf a conjunction of negations.  Over strings nested negations multiply:
`not: {anyOf: [{not: {anyOf: [a, b, c]}}, ...]}` three deep over three branches is 27 alternatives, two such
conjuncts 729, each a terminal of its own.  Where a conjunction admits strings only, negates a combination of
string keywords, and distributing it would give more than _MAX_ALTERNATIVES alternatives, it becomes one
terminal instead: the boolean formula of its keywords (`Strings`), whose automaton is built by products, unions
and complements, each minimized, and its top-level length bounds counted last, along the formula's own states
(json_strings.Length).  A format's regex admits a subset of the format, so a format under a negation leaves the
conjunction to the distributing compiler (which refuses it).
"""

from __future__ import annotations

import functools
import math
import weakref
from dataclasses import dataclass
from typing import Union

from .automaton import terminal_for
from .fsm import DFA, MEMO_SIZE, BudgetExceeded, product, union
from .ir import Expr, Terminal
from .json_schema_context import Branches, Part, SchemaContext, count_of, enum_values, expect, narrow_types
from .json_schema_ir import json_text
from .json_schema_scalars import string_keywords
from .json_strings import ANY_STRING, Length, pattern_regexes, regex_escape
from .regex import MAX_DFA_STATES, regex_dfa

_MAX_ALTERNATIVES = 16    # distributed alternatives past which a string conjunction is one formula
_MAX_NESTING = 64         # subschemas inside each other in one formula ($ref cycles end here)
_MAX_SUBSCHEMAS = 1024    # distinct subschemas in one formula
_MAX_FORMULA_WORK = 100_000   # automaton states built by all of a formula's products, unions and complements
_COMBINATORS = frozenset({"not", "anyOf", "oneOf", "if"})
_STRING_TYPE = ("string", ["string"])

Item = Union["Strings", Terminal, bool]    # True: every string, False: none


@dataclass(frozen=True, eq=False)
class Strings:
    """Quoted JSON strings as a boolean formula over string terminals: those in every item (`op` "all"), in some
    item ("any") or in no item ("none"); an ir.Language.  Made only by `_strings`, which hash-conses them: equal
    formulas are one object, so equality and hashing are by identity, where a dataclass's would walk every path
    of a formula that shares the subschemas several branches refer to (a graph)."""

    op: str
    items: tuple[Strings | Terminal, ...]

    def dfa(self) -> DFA:
        return _formula_dfa(self)

    def intersect(self, dfa: DFA, max_states: int) -> DFA:
        return product(dfa, self.dfa(), True, max_states)


@functools.lru_cache(maxsize=MEMO_SIZE)
def _formula_dfa(formula: Strings) -> DFA:
    """The minimal DFA of a formula, each node built once; fsm.BudgetExceeded past MAX_DFA_STATES in any step or
    past _MAX_FORMULA_WORK states built in all of them (a formula nesting deep enough takes seconds otherwise)."""
    return _FormulaBuilder().build(formula)


class _FormulaBuilder:
    """One formula's DFAs, node by node.  Methods, not a closure calling itself: that closure would be a reference
    cycle holding every DFA built here until a full collection, which then lands in some later token mask."""

    def __init__(self) -> None:
        self.built: dict[int, DFA] = {}
        self.work = 0

    def counted(self, dfa: DFA) -> DFA:
        self.work += dfa.num_states
        if self.work > _MAX_FORMULA_WORK:
            raise BudgetExceeded(_MAX_FORMULA_WORK, "automaton states built")
        return dfa

    def build(self, item: Strings | Terminal) -> DFA:
        if isinstance(item, Terminal):
            return terminal_for(item)
        if id(item) not in self.built:
            dfas = sorted((self.build(i) for i in item.items), key=lambda d: d.num_states)
            if item.op == "all":   # smallest first: each product stays within what the smaller ones allow
                out = functools.reduce(lambda a, b: self.counted(product(a, b, True, MAX_DFA_STATES)), dfas)
            else:
                out = dfas[0] if len(dfas) == 1 else self.counted(union(dfas, MAX_DFA_STATES))
                if item.op == "none":
                    out = self.counted(product(regex_dfa(ANY_STRING), out, False, MAX_DFA_STATES))
            self.built[id(item)] = out
        return self.built[id(item)]


def _combined(op: str, items: list[Item]) -> Item:
    """`Strings(op, items)`, with the constants folded away."""
    deciding = op != "all"      # True decides an anyOf and a none (which negates one), False an allOf
    if any(i is deciding for i in items):
        return op == "any"
    kept = tuple(dict.fromkeys(i for i in items if not isinstance(i, bool)))
    if not kept:
        return op != "any"
    if op != "none" and len(kept) == 1:
        return kept[0]
    return _strings(op, kept)


_FORMULAS: weakref.WeakValueDictionary[tuple, Strings] = weakref.WeakValueDictionary()


def _strings(op: str, items: tuple[Strings | Terminal, ...]) -> Strings:
    """The one `Strings(op, items)` (its items are hash-consed already, so the key compares them by identity)."""
    formula = _FORMULAS.get((op, items))
    if formula is None:
        formula = _FORMULAS[(op, items)] = Strings(op, items)
    return formula


def _alternatives(item: Item, negated: bool, memo: dict[tuple[int, bool], int]) -> int:
    """How many alternatives distributing `item` (or its negation) would make, about, counted up to
    _MAX_ALTERNATIVES + 1: an anyOf sums its branches', an allOf multiplies them, and a negation swaps the two.
    Each node once (`memo`, by identity: the formula is a graph)."""
    if not isinstance(item, Strings):
        return 1
    key = (id(item), negated)
    if key not in memo:
        inner = negated != (item.op == "none")
        counts = [_alternatives(i, inner, memo) for i in item.items]
        total = math.prod(counts) if (item.op == "all") != inner else sum(counts)
        memo[key] = min(total, _MAX_ALTERNATIVES + 1)
    return memo[key]


def _negates_a_combination(item: Item, memo: dict[int, bool]) -> bool:
    """Whether `item` negates a combination of terminals anywhere: what multiplies when distributed (a negated
    choice of terminals is one terminal excluding them all, and a oneOf of literals a choice of them).  Each node
    once (`memo`, by identity)."""
    if not isinstance(item, Strings):
        return False
    if id(item) not in memo:
        memo[id(item)] = any(isinstance(i, Strings) and (item.op == "none" or _negates_a_combination(i, memo))
                             for i in item.items)
    return memo[id(item)]


class _TooLarge(Exception):
    """Subschemas nested past _MAX_NESTING (a $ref cycle through `not`) or too many of them: left to the
    distributing compiler, which bounds both."""


def string_formula(ctx: SchemaContext, parts: list[Part]) -> Expr | None:
    """The conjunction `parts` as one string terminal (see the module docstring); None where it admits more than
    strings, or distributes well, or negates a format, or nests without end."""
    # most conjunctions have no combinator or declare no string type: a hot path
    if all(_COMBINATORS.isdisjoint(p.schema) for p in parts) or not any(
            p.get("type") in _STRING_TYPE for p in parts):
        return None
    branches = Branches()
    for part in parts:
        narrow_types(part, branches)
    if branches.types != {"string"}:
        return None
    lo, hi = 0, None
    items: list[Item] = []
    reader = _Reader(ctx)
    try:
        for part in parts:
            lo = max(lo, count_of(part, "minLength") or 0)
            top = count_of(part, "maxLength")
            if top is not None:
                hi = top if hi is None else min(hi, top)
            items += reader.conjunct(part.skipping("minLength", "maxLength"), 0)
    except _TooLarge:
        return None
    formula = _combined("all", items)
    if (not _negates_a_combination(formula, {}) or _alternatives(formula, False, {}) <= _MAX_ALTERNATIVES
            or reader.negates_a_format(formula)):
        return None
    pointer = parts[0].pointer
    if formula is False or (hi is not None and lo > hi):
        return ctx.never("no string satisfies the string keywords together", pointer)
    if hi is None and ctx.options.max_string_length is not None:
        hi = max(lo, ctx.options.max_string_length)
    also = (formula,) if formula is not True else ()
    also += (Length(lo, hi),) if lo or hi is not None else ()
    return Terminal(ANY_STRING, also, (), ("the string keywords under not/anyOf/oneOf/if together", pointer))


class _Reader:
    """Subschemas read as formulas, each once (a definition referenced from several branches is one item)."""

    def __init__(self, ctx: SchemaContext):
        self.ctx = ctx
        self.read: dict[tuple, Item] = {}
        # a format's regex admits a subset of it: exact enough where it is asked for, never where it is negated
        self.formats: set[Terminal] = set()
        self._places: dict[Item, tuple[bool, bool]] = {}

    def negates_a_format(self, item: Item) -> bool:
        """Whether a format's terminal sits under an odd number of negations in `item`."""
        return self._format_places(item)[1]

    def _format_places(self, item: Item) -> tuple[bool, bool]:
        """Whether a format's terminal is in `item` (under an even number of negations, under an odd number)."""
        if not isinstance(item, Strings):
            return item in self.formats, False
        if item not in self._places:
            inside = [self._format_places(i) for i in item.items]
            even, odd = any(e for e, _ in inside), any(o for _, o in inside)
            self._places[item] = (odd, even) if item.op == "none" else (even, odd)
        return self._places[item]

    def subschema(self, part: Part, depth: int) -> Item:
        """The strings a subschema admits."""
        if part.key in self.read:
            return self.read[part.key]
        if depth == _MAX_NESTING or len(self.read) == _MAX_SUBSCHEMAS:
            raise _TooLarge
        expanded = self.ctx.expand([part])
        item = False if expanded is None else _combined(
            "all", [item for p in expanded[0] for item in self.conjunct(p, depth + 1)])
        self.read[part.key] = item
        return item

    def conjunct(self, part: Part, depth: int) -> list[Item]:
        """What each keyword of one conjunct (its allOf and $ref expanded) asks of a string; the keywords of
        other types ask nothing of one."""
        branches = Branches()
        narrow_types(part, branches)
        if "string" not in branches.types:
            return [False]
        keywords = string_keywords(self.ctx, part)
        items: list[Item] = []
        for pattern, pointer in keywords.patterns + keywords.formats:
            regexes = pattern_regexes(pattern, pointer)
            items.append(Terminal(regexes.regex, regexes.also, regexes.excluding))
        self.formats.update(items[len(keywords.patterns):])
        if keywords.min_length or keywords.max_length is not None:
            items.append(Terminal(ANY_STRING, (Length(keywords.min_length, keywords.max_length),)))
        values = enum_values([part])
        if values is not None:
            texts = [regex_escape(json_text(v)) for v in values if isinstance(v, str)]
            items.append(Terminal("|".join(texts)) if texts else False)
        if part.has("not"):
            items.append(_combined("none", [self.subschema(part.sub(part.get("not"), "not"), depth)]))
        for keyword in ("anyOf", "oneOf"):
            if part.has(keyword):
                listed = part.get(keyword)
                expect(isinstance(listed, list) and listed, f"{keyword} must be a non-empty array", part.at(keyword))
                subs = [self.subschema(part.sub(b, keyword, i), depth) for i, b in enumerate(listed)]
                if keyword == "oneOf":   # one branch and none of the others
                    subs = [_combined("all", [s, _combined("none", subs[:i] + subs[i + 1:])])
                            for i, s in enumerate(subs)]
                items.append(_combined("any", subs))
        if part.has("if"):
            condition = self.subschema(part.sub(part.get("if"), "if"), depth)
            then = self.subschema(part.sub(part.get("then"), "then"), depth) if part.has("then") else True
            otherwise = self.subschema(part.sub(part.get("else"), "else"), depth) if part.has("else") else True
            items.append(_combined("any", [_combined("all", [condition, then]),
                                           _combined("all", [_combined("none", [condition]), otherwise])]))
        return items
