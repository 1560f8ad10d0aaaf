"""Arrays: prefixItems/items by position, minItems/maxItems counts, the max_items cap, contains with
minContains/maxContains, and uniqueItems where the items come from a few enumerable values or are strings."""

from __future__ import annotations

import itertools
from typing import Any

from .errors import SchemaError, UnsupportedSchemaError
from .ir import Expr, Lit, Members, Ref
from .json_schema_context import (NUMBER_KEYS, STRING_KEYS, TYPES, VALIDATION, Branches, Part, SchemaContext,
                                  count_of, enum_values, is_number, narrow_types, satisfying)
from .json_schema_ir import (EMPTY, NEVER, Counting, at_most_size, canonical_number, choice, inlined_size, literal,
                             optional, repeat, seq)
from .json_schema_scalars import (distinct_texts, fractions_allowed, number, spelled_values, string_terminal,
                                  unordered_objects)

_MAX_UNIQUE_VALUES = 256  # each is a guarded call edge that every mask at an item's start checks
# `contains` counts items and matches together: one rule per (items written, matches so far) pair.
_MAX_CONTAINS_RULES = 1024
# Automaton nodes the item cap may add: the automaton writes a capped array's items out one by one, so
# caps multiply down nested arrays and with every place a rule is inlined.  One capped array may take this
# many (inner arrays are capped first, outer ones past it stay uncapped), and if all of them together grow
# the grammar by more, the schema keeps no item cap.
MAX_ITEM_CAP_NODES = 20_000
# A count of tail items up to this many is written out item by item, a longer one counted in base _ITEM_BASE: each
# level of a count adds a place the parser may be at (`Counting.at_most`), which pays only past a few dozen items
_FLAT_ITEMS = 32
_ITEM_BASE = 8


def build_array(ctx: SchemaContext, parts: list[Part]) -> Expr:
    """The IR for arrays satisfying every array keyword of `parts`."""
    layouts = []  # per part: (prefix parts, tail part or None)
    lo, hi = 0, None
    unique = False
    for p in parts:
        legacy = isinstance(p.get("items"), list)  # before 2020-12, items as an array was prefixItems
        prefix_key, tail_key = ("items", "additionalItems") if legacy else ("prefixItems", "items")
        prefix = p.get(prefix_key, [])
        if not isinstance(prefix, list):    # (the message only on failure: every array comes here)
            raise SchemaError(f"{prefix_key} must be an array", p.at(prefix_key))
        tail = p.sub(p.get(tail_key), tail_key) if p.has(tail_key) else None
        layouts.append(([p.sub(s, prefix_key, i) for i, s in enumerate(prefix)], tail))
        n = count_of(p, "minItems")
        lo = max(lo, n) if n is not None else lo
        n = count_of(p, "maxItems")
        hi = n if hi is None else (min(hi, n) if n is not None else hi)
        flag = p.get("uniqueItems", False)
        if type(flag) is not bool:
            raise SchemaError("uniqueItems must be a boolean", p.at("uniqueItems"))
        unique = unique or flag
    width = max((len(prefix) for prefix, _ in layouts), default=0)
    prefixes = [[prefix[i] if i < len(prefix) else tail for prefix, tail in layouts
                 if i < len(prefix) or tail is not None] for i in range(width)]
    rest = [tail for _, tail in layouts if tail is not None]
    pointer = parts[0].pointer if parts else ""
    if hi is not None and lo > hi:
        return ctx.never(f"minItems {lo} is above maxItems {hi}", pointer)
    if hi is not None:
        prefixes = prefixes[:hi]
    contains = _contains(parts)
    if contains:
        if unique:
            raise UnsupportedSchemaError("contains cannot be enforced together with uniqueItems",
                                         contains[0][0].pointer)
        return _containing(ctx, prefixes, rest, lo, hi, contains, pointer)
    if unique and (hi is None or hi > 1):
        if hi is None and ctx.options.max_items is not None:  # a few enumerated items: capping costs little
            hi = max(ctx.options.max_items, lo)
        return _unique_array(ctx, parts, prefixes, rest, lo, hi)
    positions = [ctx.nested(ps) for ps in prefixes]
    tail_item = ctx.share(ctx.nested(rest), pointer + "_item") if hi is None or hi > len(positions) else NEVER
    if hi is None:
        hi = item_cap(ctx, lo, positions, tail_item)
    return sequence(ctx, positions, tail_item, lo, hi, pointer)


def item_cap(ctx: SchemaContext, lo: int, positions: list[Expr], tail_item: Expr) -> int | None:
    """The maxItems that max_items gives an array without one (never below minItems or its prefixItems),
    or None: no cap, or the capped array would outgrow MAX_ITEM_CAP_NODES."""
    if ctx.options.max_items is None:
        return None
    hi = max(ctx.options.max_items, lo, len(positions))
    size = sum(inlined_size(p, ctx.rules, ctx.sizes) for p in positions)
    out = max(len(positions), 1)    # as `sequence` counts them: without positions the first item is a tail item
    tail_lo, tail_hi = max(0, lo - out), max(0, hi - out)
    item = inlined_size(tail_item, ctx.rules, ctx.sizes)
    size += 0 if positions else item
    if not _counted(tail_lo, tail_hi):
        size += tail_hi * item
    else:   # a separator and a call per unit, the item built once
        size += 2 * (at_most_size(tail_hi - tail_lo, _ITEM_BASE, _FLAT_ITEMS) + tail_lo) + item
    return hi if size <= MAX_ITEM_CAP_NODES else None


def sequence(ctx: SchemaContext, positions: list[Expr], tail_item: Expr, lo: int, hi: int | None,
             pointer: str) -> Expr:
    """`[` positions..., then tail items `]`, with the item count in [lo, hi]."""
    pu = ctx.punct
    count = len(positions)
    out = max(count, 1)  # items before the repeated tail, the first one included
    after = _tail_items(ctx, tail_item, max(0, lo - out), None if hi is None else max(0, hi - out), pointer)
    for i in reversed(range(1, count)):  # `after` = what may follow once i items are out
        step = seq(pu.comma, positions[i], after)
        after = step if i < lo else optional(step)
        if (count - i) % _FLAT_ITEMS == 0:  # named: each position nests the next, and 300 overflowed the stack
            after = ctx.share(after, f"{pointer}_after_{i}")
    first = positions[0] if positions else tail_item
    nonempty = seq(first, after) if hi != 0 else NEVER
    alternatives = ([pu.arr_empty] if lo == 0 else []) + (
        [seq(pu.arr_open, nonempty, pu.arr_close)] if nonempty != NEVER else [])
    if not alternatives:
        return ctx.never(f"no array with at least {lo} items satisfies the item schemas", pointer)
    return choice(alternatives)


def _tail_items(ctx: SchemaContext, tail_item: Expr, lo: int, hi: int | None, pointer: str) -> Expr:
    """A separator and `tail_item`, lo..hi times; past _FLAT_ITEMS optional ones, counted in base _ITEM_BASE
    (`Counting`), the item called: written out, a maxItems of 1,000 took 999 copies of its item."""
    if not _counted(lo, hi):
        return repeat(seq(ctx.punct.comma, tail_item), lo, hi)
    # the automaton calls the rules of an item repeated often enough; counted, no repetition is that long
    item = seq(ctx.punct.comma, Ref(tail_item.name, call=True) if isinstance(tail_item, Ref) else tail_item)
    names: list[str] = []

    def unit(level: int) -> Expr:
        # a loop, not a recursive call: a function calling itself by name holds itself in its closure, a cycle that
        # kept the compiler and all its IR alive until the next full collection
        while len(names) < level:   # each level a rule calling the one below _ITEM_BASE times
            below = Ref(names[-1], call=True) if names else item
            names.append(ctx.rule_name(f"{pointer}_{_ITEM_BASE ** (len(names) + 1)}_items"))
            ctx.rules[names[-1]] = repeat(below, _ITEM_BASE, _ITEM_BASE)
        return Ref(names[level - 1], call=True) if level else item

    counting = Counting(unit, _ITEM_BASE, _FLAT_ITEMS)
    return seq(counting.exactly(lo), counting.at_most(hi - lo) if hi is not None else repeat(item, 0, None))


def _counted(lo: int, hi: int | None) -> bool:
    """Whether `_tail_items` counts lo..hi tail items in base _ITEM_BASE rather than writing them out (a minItems
    of 100,000 with no maxItems, written out, outgrew the automaton's budget)."""
    return lo >= _FLAT_ITEMS or (hi is not None and hi - lo >= _FLAT_ITEMS)


Contains = tuple[Part, int, "int | None"]   # the contains subschema, minContains (default 1), maxContains
_MAX_CONTAINS = 3   # contains counted together on one array: each item is written in 2^k ways


def _contains(parts: list[Part]) -> list[Contains]:
    """Each `contains` that constrains the array: its subschema, how many items must match it (minContains,
    default 1) and how many may (maxContains, None: any); none where minContains 0 stands alone."""
    found = []
    for p in parts:
        if p.has("contains"):
            least, most = count_of(p, "minContains"), count_of(p, "maxContains")
            least = 1 if least is None else least
            if least or most is not None:
                found.append((p.sub(p.get("contains"), "contains"), least, most))
    if len(found) > _MAX_CONTAINS:
        raise UnsupportedSchemaError(f"more than {_MAX_CONTAINS} contains on one array cannot be counted together",
                                     found[_MAX_CONTAINS][0].pointer)
    return found


def _containing(ctx: SchemaContext, prefixes: list[list[Part]], rest: list[Part], lo: int, hi: int | None,
                contains: list[Contains], pointer: str) -> Expr:
    """Arrays of lo..hi items of which, per contains, at least `least` and at most `most` also match it.

    Each item is written in one way per choice, for every contains, of counting it as a match or not.  Without
    `most` an item not counted may be anything (it may match as well: the automaton keeps both readings); with
    it, it is one that does not match (the compiler's exact negation of the contains schema, refused where it
    has none).  Rules count the items (exactly up to the prefixItems, minItems or maxItems that matter, then
    only as "enough") together with each contains' matches (up to `least`, or exactly up to `most`)."""
    pu = ctx.punct
    n = len(prefixes)
    cap = hi if hi is not None else max(lo, n, 1)
    tops = []
    for match, least, most in contains:
        if most is not None and least > most:
            return ctx.never(f"minContains {least} is above maxContains {most}", match.pointer)
        tops.append(least if most is None else most)
    rules = cap + 1
    for top in tops:
        rules *= top + 1
    if rules > _MAX_CONTAINS_RULES:
        raise UnsupportedSchemaError(f"contains counting up to {' and '.join(map(str, tops))} matches over up to "
                                     f"{cap} counted items would need more than {_MAX_CONTAINS_RULES} rules",
                                     contains[0][0].pointer)
    others = [None if most is None else match.derived({"not": match.schema}, "an item failing contains")
              for match, _, most in contains]
    # per way of writing an item, which contains count it as a match; the first counts it for every one, so
    # that an error of the item or a contains schema names that schema, not its negation
    counting = sorted(itertools.product((0, 1), repeat=len(contains)), reverse=True)
    tail_needed = hi is None or cap > n

    def ways(ps: list[Part], hint: str) -> list[Expr]:
        """The item written in each way of `counting`."""
        out = []
        for counted in counting:
            schemas = [match if c else other for (match, _, _), other, c in zip(contains, others, counted)
                       if c or other is not None]
            try:
                item = ctx.nested([*ps, *schemas])
            except UnsupportedSchemaError as exc:
                negated = [match for (match, _, _), other, c in zip(contains, others, counted)
                           if other is not None and not c]
                if all(counted) or not negated:
                    raise
                raise UnsupportedSchemaError(f"maxContains needs the negation of contains, which cannot be "
                                             f"enforced exactly: {exc}", negated[0].pointer) from None
            name = "" if not any(counted) else "_match" + ("" if len(contains) == 1 else
                                                           "".join(str(c) for c in counted))
            out.append(ctx.share(item, pointer + hint + name) if hint else item)
        return out

    positions = [ways(ps, "") for ps in prefixes]
    tail = ways(rest, "_item") if tail_needed else [NEVER] * len(counting)
    follow = _ContainsRules(ctx, positions, tail, counting, tops, [least for _, least, _ in contains], lo, hi, cap,
                           pointer)
    first = positions[0] if n else tail
    zeros = (0,) * len(contains)
    alternatives = [pu.arr_empty] if lo == 0 and not any(follow.leasts) else []
    if hi != 0:
        starts = [seq(first[follow.none], follow.after(1, zeros))] + follow.counted(first, zeros, 1)
        alternatives.append(seq(pu.arr_open, choice(starts), pu.arr_close))
    body = choice(alternatives)
    if body == NEVER:
        wanted = " and ".join(str(least) for least in follow.leasts)
        return ctx.never(f"no array of {lo}..{hi} items has {wanted} matching contains", contains[0][0].pointer)
    return body


class _ContainsRules:
    """The rules of `_containing` after each count of items and matches.  A class, not two closures calling each
    other: those would be a reference cycle holding the compiler and all its IR until a full collection, which
    then lands in some later token mask."""

    def __init__(self, ctx: SchemaContext, positions: list[list[Expr]], tail: list[Expr],
                 counting: list[tuple[int, ...]], tops: list[int], leasts: list[int], lo: int, hi: int | None,
                 cap: int, pointer: str):
        self.ctx, self.positions, self.tail, self.counting = ctx, positions, tail, counting
        self.tops, self.leasts, self.lo, self.hi, self.cap, self.pointer = tops, leasts, lo, hi, cap, pointer
        self.none = len(counting) - 1   # the way that counts the item for no contains
        self.memo: dict[tuple[int, tuple[int, ...]], Expr] = {}

    def counted(self, items: list[Expr], ms: tuple[int, ...], c: int) -> list[Expr]:
        """Each way the next item may be written with `ms` matches so far, then what may follow (c items out)."""
        out = []
        for way, adds in enumerate(self.counting):
            if any(adds):
                more = tuple(m + a for m, a in zip(ms, adds))
                if all(m <= top for m, top in zip(more, self.tops)):
                    out.append(seq(items[way], self.after(c, more)))
        return out

    def after(self, c: int, ms: tuple[int, ...]) -> Expr:
        """What may follow once c items (ms[k] of them matching contains k) are out."""
        if (c, ms) in self.memo:
            return self.memo[c, ms]
        pu, hi, tail, none = self.ctx.punct, self.hi, self.tail, self.none
        enough = all(m >= least for m, least in zip(ms, self.leasts))
        if hi is None and c == self.cap:          # enough items counted: only the matches are
            ends = ([EMPTY] if enough else []) + [seq(pu.comma, alt) for alt in self.counted(tail, ms, c)]
            body = seq(repeat(seq(pu.comma, tail[none])), choice(ends))
        else:
            alts = [EMPTY] if c >= self.lo and enough else []
            if hi is None or c < hi:
                items = self.positions[c] if c < len(self.positions) else tail
                alts.append(seq(pu.comma, items[none], self.after(c + 1, ms)))
                alts += [seq(pu.comma, alt) for alt in self.counted(items, ms, c + 1)]
            body = choice(alts)
        body = self.ctx.share(body, f"{self.pointer}_contains")
        self.memo[c, ms] = body
        return body


def _unique_array(ctx: SchemaContext, parts, prefixes, rest, lo, hi) -> Expr:
    """uniqueItems, exact (without prefixItems) where items come from an enumerable set or are strings: the array
    is an object's rule (`ir.Members`), lo..hi of them.  Enumerable values are its members, each written at most
    once, in any order (written out, the automaton would need a state per subset of values written); strings
    are its extras, whose texts the rule records (`ir.Capture`)."""
    pointer = next((p.at("uniqueItems") for p in parts if p.get("uniqueItems") is True), "")
    if prefixes:
        raise UnsupportedSchemaError("uniqueItems cannot be enforced together with prefixItems", pointer)
    values = _finite_values(ctx, rest)
    pu = ctx.punct
    if values is None or len(values) > _MAX_UNIQUE_VALUES:
        if values is None:
            item = _distinct_items(ctx, rest)
            if item is None:
                raise UnsupportedSchemaError("uniqueItems is enforced only on strings, numbers and enumerable items "
                                             "(enum, const, booleans, null)", pointer)
        elif all(isinstance(v, str) for v in values):
            item = ctx.nested(rest)
        elif any(isinstance(v, (list, dict)) for v in values):
            raise UnsupportedSchemaError(f"uniqueItems is enforced on at most {_MAX_UNIQUE_VALUES} enumerable item "
                                         f"values where arrays or objects are among them, not {len(values)}",
                                         pointer)
        else:   # many scalars: their texts tell them apart, numbers written one way each (1.0 as 1)
            item = choice([Lit(canonical_number(v)) if is_number(v) else literal(v, pu) for v in values])
        if item == NEVER:
            return pu.arr_empty if lo == 0 else ctx.never("no item satisfies the items schema", pointer)
        item, count = distinct_texts(ctx, item, "uniqueItems: the items", pointer)
        hi = count if hi is None else (hi if count is None else min(hi, count))
        members = Members(pu.arr_open, (), pu.comma, pu.arr_close, extra=item, min=lo, max=hi, max_extras=count)
    else:
        hi = len(values) if hi is None else min(hi, len(values))
        objects = unordered_objects(ctx, parts[0])     # each value one member, however its keys are ordered
        allowed = fractions_allowed(ctx, rest, values)    # (draft-04: 1.0 is no integer)
        members = Members(pu.arr_open, tuple(literal(v, pu, f, objects) for v, f in zip(values, allowed)), pu.comma,
                          pu.arr_close, min=lo, max=hi)
    alternatives = [pu.arr_empty] if lo == 0 else []
    if hi is None or hi >= max(lo, 1):
        name = ctx.rule_name(f"{pointer}_unique")
        ctx.rules[name] = members
        alternatives.append(Ref(name))
    return choice(alternatives) if alternatives else ctx.never("no unique array fits the bounds", pointer)


def _distinct_items(ctx: SchemaContext, parts: list[Part]) -> Expr | None:
    """Items whose texts can tell their values apart: scalars, strings among them one terminal where only type,
    string and number keywords constrain the items (long length bounds too, which elsewhere count in chunks),
    else as the compiler builds them; None where objects or arrays may be items."""
    expanded = ctx.expand(parts)
    if expanded is None:
        return None
    branches = Branches()
    for p in expanded[0]:
        narrow_types(p, branches)
    if not branches.types or not branches.types <= {"string", "number", "null", "boolean"}:
        # no `type` says which: the compiled items tell (an anyOf of scalars is one terminal's choices)
        return ctx.nested(parts) if len(branches.types) == len(TYPES) else None
    plain = all(not p.has(k) or k in STRING_KEYS or k in NUMBER_KEYS or k == "type" or k not in VALIDATION
                for p in expanded[0] for k in p.schema)
    if not plain or "string" not in branches.types:
        return ctx.nested(parts)
    options = [string_terminal(ctx, expanded[0], [], whole=True)]
    if "number" in branches.types:
        options.append(number(ctx, expanded[0], branches.integer_only, []))
    options += [Lit("null")] * ("null" in branches.types) + [Lit("true"), Lit("false")] * ("boolean" in branches.types)
    return choice(options)


def _finite_values(ctx: SchemaContext, parts: list[Part]) -> list[Any] | None:
    """The few values a conjunction admits, when it pins them (enum, const, boolean, null)."""
    expanded = ctx.expand(parts)
    if expanded is None:
        return []
    parts = expanded[0]
    values = enum_values(parts)
    if values is not None:
        return satisfying(ctx, parts, spelled_values(ctx, values))
    branches = Branches()
    for p in parts:
        narrow_types(p, branches)
    if branches.types <= {"null", "boolean"} and not any(p.has(k) for p in parts for k in ("anyOf", "oneOf",
                                                                                         "not", "if")):
        return [v for t in sorted(branches.types) for v in ((None,) if t == "null" else (True, False))]
    return None
