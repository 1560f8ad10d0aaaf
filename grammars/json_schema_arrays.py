"""Arrays: prefixItems/items by position, minItems/maxItems counts, the max_items cap, and uniqueItems
where the items come from a few enumerable values."""

from __future__ import annotations

from typing import Any

from .errors import UnsupportedSchemaError
from .ir import Expr, Lit, Ref, Terminal
from .json_schema_context import (Branches, Part, SchemaContext, count_of, enum_values, expect, narrow_types,
                                  satisfying)
from .json_schema_ir import EMPTY, NEVER, choice, inlined_size, literal, optional, repeat, seq

_MAX_UNIQUE_VALUES = 8
# Automaton nodes the item cap may add: the automaton writes a capped array's items out one by one, so
# caps multiply down nested arrays and with every place a rule is inlined.  One capped array may take this
# many (inner arrays are capped first, outer ones past it stay uncapped), and if all of them together grow
# the grammar by more, the schema keeps no item cap.
MAX_ITEM_CAP_NODES = 20_000


def build_array(ctx: SchemaContext, parts: list[Part]) -> Expr:
    """The IR for arrays satisfying every array keyword of `parts`."""
    layouts = []  # per part: (prefix parts, tail part or None)
    lo, hi = 0, None
    unique = False
    for p in parts:
        legacy = isinstance(p.get("items"), list)  # before 2020-12, items as an array was prefixItems
        prefix_key, tail_key = ("items", "additionalItems") if legacy else ("prefixItems", "items")
        prefix = p.get(prefix_key) or []
        expect(isinstance(prefix, list), f"{prefix_key} must be an array", p.at(prefix_key))
        tail = p.sub(p.get(tail_key), tail_key) if p.has(tail_key) else None
        layouts.append(([p.sub(s, prefix_key, i) for i, s in enumerate(prefix)], tail))
        n = count_of(p, "minItems")
        lo = max(lo, n) if n is not None else lo
        n = count_of(p, "maxItems")
        hi = n if hi is None else (min(hi, n) if n is not None else hi)
        unique = unique or p.get("uniqueItems") is True
    width = max((len(prefix) for prefix, _ in layouts), default=0)
    prefixes = [[prefix[i] if i < len(prefix) else tail for prefix, tail in layouts
                 if i < len(prefix) or tail is not None] for i in range(width)]
    rest = [tail for _, tail in layouts if tail is not None]
    pointer = parts[0].pointer if parts else ""
    if hi is not None and lo > hi:
        return ctx.never(f"minItems {lo} is above maxItems {hi}", pointer)
    if hi is not None:
        prefixes = prefixes[:hi]
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
    size += (hi - len(positions)) * inlined_size(tail_item, ctx.rules, ctx.sizes)
    return hi if size <= MAX_ITEM_CAP_NODES else None


def sequence(ctx: SchemaContext, positions: list[Expr], tail_item: Expr, lo: int, hi: int | None,
             pointer: str) -> Expr:
    """`[` positions..., then tail items `]`, with the item count in [lo, hi]."""
    pu = ctx.punct
    count = len(positions)
    out = max(count, 1)  # items before the repeated tail, the first one included
    after = repeat(seq(pu.comma, tail_item), max(0, lo - out), None if hi is None else max(0, hi - out))
    for i in reversed(range(1, count)):  # `after` = what may follow once i items are out
        step = seq(pu.comma, positions[i], after)
        after = step if i < lo else optional(step)
    first = positions[0] if positions else tail_item
    nonempty = seq(first, after) if hi != 0 else NEVER
    alternatives = ([pu.arr_empty] if lo == 0 else []) + (
        [seq(pu.arr_open, nonempty, pu.arr_close)] if nonempty != NEVER else [])
    if not alternatives:
        return ctx.never(f"no array with at least {lo} items satisfies the item schemas", pointer)
    return choice(alternatives)


def _unique_array(ctx: SchemaContext, parts, prefixes, rest, lo, hi) -> Expr:
    """uniqueItems, exact when items come from a small enumerable set (and no prefixItems)."""
    pointer = next((p.at("uniqueItems") for p in parts if p.get("uniqueItems") is True), "")
    values = _finite_values(ctx, rest) if not prefixes else None
    if values is None or len(values) > _MAX_UNIQUE_VALUES:
        raise UnsupportedSchemaError("uniqueItems is enforced only on a few enumerable item values", pointer)
    lits = [literal(v, ctx.punct) for v in values]
    hi = len(values) if hi is None else min(hi, len(values))
    pu = ctx.punct
    memo: dict[int, Expr] = {}

    def after(mask: int, count: int) -> Expr:
        """Continuations once the items in `mask` (count of them) are out."""
        if mask in memo:
            return memo[mask]
        alts = [EMPTY] if count >= lo else []
        if count < hi:
            alts += [seq(pu.comma, lits[i], after(mask | 1 << i, count + 1))
                     for i in range(len(lits)) if not mask & 1 << i]
        body = choice(alts)
        if body not in (NEVER, EMPTY) and not isinstance(body, (Lit, Terminal)):
            name = ctx.rule_name(f"{pointer}_unique")
            ctx.rules[name] = body
            body = Ref(name)
        memo[mask] = body
        return body

    nonempty = choice(seq(lits[i], after(1 << i, 1)) for i in range(len(lits))) if hi >= 1 else NEVER
    alternatives = ([pu.arr_empty] if lo == 0 else []) + (
        [seq(pu.arr_open, nonempty, pu.arr_close)] if nonempty != NEVER else [])
    return choice(alternatives) if alternatives else ctx.never("no unique array fits the bounds", pointer)


def _finite_values(ctx: SchemaContext, parts: list[Part]) -> list[Any] | None:
    """The few values a conjunction admits, when it pins them (enum, const, boolean, null)."""
    expanded = ctx.expand(parts)
    if expanded is None:
        return []
    parts = expanded[0]
    values = enum_values(parts)
    if values is not None:
        return satisfying(ctx, parts, values)
    branches = Branches()
    for p in parts:
        narrow_types(p, branches)
    if branches.types <= {"null", "boolean"} and not any(p.has(k) for p in parts for k in ("anyOf", "oneOf",
                                                                                         "not", "if")):
        return [v for t in sorted(branches.types) for v in ((None,) if t == "null" else (True, False))]
    return None
