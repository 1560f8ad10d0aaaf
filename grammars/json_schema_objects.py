"""Objects: declared properties in schema order, then extra keys; counts and dependencies exactly.

With the option property_order="any", members come in any order instead (`ir.AnyOrder`: the object's
stack frame records what it wrote).  Otherwise, layout: every declared (or required) key has its slot in schema order and may
be skipped unless required; keys not declared anywhere ("extras", allowed by
`additionalProperties`/`patternProperties`) follow the declared ones.  Extra
keys are split into classes by which `patternProperties` they match, so each
class has one value schema.  `minProperties`/`maxProperties` count members
through rule states; `dependentRequired` splits the object into variants by
whether each trigger key is present.
"""

from __future__ import annotations

import re
from itertools import product
from typing import Any

from .any_order import EMPTY_TAG, FIRST, MemberSet
from .errors import SchemaError, UnsupportedSchemaError
from .ir import AnyOrder, Expr, Lit, Ref
from .json_schema_context import STRING_KEYS, VALIDATION, Part, SchemaContext, count_of, expect
from .json_schema_ir import NEVER, choice, json_text, optional, repeat, seq
from .json_schema_scalars import string_terminal
from .json_strings import pattern_regex, regex_escape
from .regex import terminal_dfa

_MAX_PATTERNS = 32
_MAX_KEY_CLASSES = 64
_MAX_TRIGGERS = 3
_CALLED_TAILS = 8


def _key_regex(name: str) -> str:
    return regex_escape(json_text(name))


def _matches(pattern: str, name: str, pointer: str) -> bool:
    """Whether the JSON key `name` matches an ECMA `pattern` (as the grammar will judge it)."""
    return re.fullmatch(pattern_regex(pattern, pointer), json_text(name)) is not None


class _ObjectBuilder:
    def __init__(self, ctx: SchemaContext, parts: list[Part]):
        self.ctx = ctx
        self.parts = parts
        self.pointer = parts[0].pointer if parts else ""
        self.order: list[str] = []
        self.required: list[str] = []
        self.patterns: list[tuple[str, Part, Any]] = []  # (regex source, owner part, subschema)
        self.dependents: dict[str, list[str]] = {}
        self.min_props, self.max_props = 0, None
        for p in parts:
            self._read(p)

    def _read(self, p: Part) -> None:
        props = p.get("properties", {})
        expect(isinstance(props, dict), "properties must be an object", p.at("properties"))
        self.order += [n for n in props if n not in self.order]
        req = p.get("required", [])
        expect(isinstance(req, list) and all(isinstance(n, str) for n in req), "required must be an array of "
                "strings", p.at("required"))
        self.required += [n for n in req if n not in self.required]
        pats = p.get("patternProperties", {})
        expect(isinstance(pats, dict), "patternProperties must be an object", p.at("patternProperties"))
        self.patterns += [(k, p, v) for k, v in pats.items()]
        for key in ("dependentRequired", "dependencies"):
            deps = p.get(key, {})
            expect(isinstance(deps, dict), f"{key} must be an object", p.at(key))
            for trigger, needed in deps.items():
                if needed is True or needed == {}:
                    continue
                # schema values never get here: the compiler splits them off (combinators.dependent_schemas)
                expect(isinstance(needed, list) and all(isinstance(n, str) for n in needed),
                       f"{key} lists must hold strings", p.at(key, trigger))
                self.dependents.setdefault(trigger, [])
                self.dependents[trigger] += [n for n in needed if n not in self.dependents[trigger]]
        n = count_of(p, "minProperties")
        self.min_props = max(self.min_props, n) if n is not None else self.min_props
        n = count_of(p, "maxProperties")
        self.max_props = n if self.max_props is None else (min(self.max_props, n) if n is not None
                                                           else self.max_props)

    # ---- value schemas per key ------------------------------------------------------------------

    def value_parts(self, name: str) -> list[Part] | None:
        """The conjunction a key's value must satisfy, or None when the key may not appear."""
        out = []
        for p in self.parts:
            props = p.get("properties", {})
            hit = False
            if name in props:
                out.append(p.sub(props[name], "properties", name))
                hit = True
            for pattern, owner, sub in self.patterns:
                if owner is p and _matches(pattern, name, p.at("patternProperties", pattern)):
                    out.append(p.sub(sub, "patternProperties", pattern))
                    hit = True
            if not hit and p.has("additionalProperties"):
                out.append(p.sub(p.get("additionalProperties"), "additionalProperties"))
            if p.has("propertyNames"):
                names = p.sub(p.get("propertyNames"), "propertyNames")
                if not self.ctx.validator([names]).is_valid(name):
                    return None
        return out

    def extras(self, declared: list[str]) -> Expr:
        """One member `"key": value` for any key not declared, split into classes by patternProperties;
        `declared` in schema order, so the excluded names (and the grammar) do not depend on hash order."""
        at: dict[str, str] = {}  # each distinct patternProperties pattern, with its first pointer
        for pattern, owner, _ in self.patterns:
            at.setdefault(pattern, owner.at("patternProperties", pattern))
        regexes = list(at)
        if len(regexes) > _MAX_PATTERNS:
            raise UnsupportedSchemaError(f"more than {_MAX_PATTERNS} distinct patternProperties", self.pointer)
        regex_of = {r: pattern_regex(r, at[r]) for r in regexes}
        explicit = any(p.has("additionalProperties") for p in self.parts)
        names = [p.sub(p.get("propertyNames"), "propertyNames") for p in self.parts if p.has("propertyNames")]
        name_parts = self._string_parts(names)
        if string_terminal(self.ctx, name_parts, declared) == NEVER:
            return NEVER
        classes = []
        overlapping = self._overlapping(regexes, regex_of)
        if len(overlapping) > _MAX_KEY_CLASSES:
            raise UnsupportedSchemaError(f"patternProperties overlap in more than {_MAX_KEY_CLASSES} ways",
                                         self.pointer)
        for chosen in overlapping:
            if not chosen and not explicit and not self.ctx.options.additional_properties:
                continue  # extras only where the schema allows them explicitly
            value = []
            for p in self.parts:
                hits = [p.sub(sub, "patternProperties", pat) for pat, owner, sub in self.patterns
                        if owner is p and pat in chosen]
                if hits:
                    value += hits
                elif p.has("additionalProperties"):
                    value.append(p.sub(p.get("additionalProperties"), "additionalProperties"))
            value_expr = self.ctx.nested(value)
            if value_expr == NEVER:
                continue
            key = string_terminal(self.ctx, name_parts, declared, tuple((r, at[r]) for r in chosen),
                                  tuple((r, at[r]) for r in regexes if r not in chosen
                                        and (not chosen or tuple(sorted((*chosen, r), key=regexes.index))
                                             in overlapping)))
            classes.append(seq(key, self.ctx.punct.colon, value_expr))
        return choice(classes)

    @staticmethod
    def _overlapping(regexes: list[str], regex_of: dict[str, str]) -> list[tuple[str, ...]]:
        """The sets of patterns (in `regexes` order) that some key matches all of, the empty set first.  Level
        by level: a set joins only when all its subsets did, so patterns that exclude each other (distinct
        literal prefixes) cost one intersection per pair."""
        found = [()]
        known = {()}
        level = [()]
        while level:
            nxt = []
            for chosen in level:
                start = regexes.index(chosen[-1]) + 1 if chosen else 0
                for r in regexes[start:]:
                    candidate = (*chosen, r)
                    if any(candidate[:i] + candidate[i + 1:] not in known for i in range(len(candidate))):
                        continue
                    if len(candidate) == 1 or terminal_dfa(regex_of[candidate[0]],
                                                            tuple(regex_of[x] for x in candidate[1:])).accept.any():
                        nxt.append(candidate)
                        known.add(candidate)
            found += nxt
            level = nxt
        return found

    def _string_parts(self, names: list[Part]) -> list[Part]:
        """The string-keyword view of propertyNames conjuncts (keys are always strings)."""
        expanded = self.ctx.expand(names)
        if expanded is None:
            return [self.parts[0].sub({"maxLength": 0, "minLength": 1}, "propertyNames")]
        out = []
        for part in expanded[0]:
            other = {k for k in part.schema if k not in STRING_KEYS} - {"type", "$ref", "allOf"}
            other -= {k for k in other if k not in VALIDATION}
            if other:
                raise UnsupportedSchemaError(f"propertyNames with {sorted(other)} cannot be enforced on extra keys",
                                             part.pointer)
            types = part.get("type")
            if types is not None and "string" not in (types if isinstance(types, list) else [types]):
                return [part.sub({"maxLength": 0, "minLength": 1})]  # no key can satisfy it
            out.append(part)
        return out

    # ---- layout ------------------------------------------------------------------------------------

    def build(self) -> Expr:
        names = list(self.order)
        names += [n for n in self.required if n not in names]
        for trigger, needed in self.dependents.items():
            names += [n for n in [*needed, trigger] if n not in names]  # dependents usually come first
        values: dict[str, Expr] = {}
        for name in names:
            parts = self.value_parts(name)
            values[name] = NEVER if parts is None else self.ctx.nested(parts)
        extra = self.extras(names)
        members = {n: self.ctx.share(seq(Lit(json_text(n)), self.ctx.punct.colon, v), self.pointer)
                   for n, v in values.items() if v != NEVER}
        extra = self.ctx.share(extra, self.pointer)
        if self.ctx.options.property_order == "any":
            result = self._any_order(names, members, extra)
            if result == NEVER:
                return self.ctx.never("no object satisfies the property constraints", self.pointer)
            return result
        triggers = [t for t in self.dependents if t in members and t not in self.required]
        if len(triggers) > _MAX_TRIGGERS:
            raise UnsupportedSchemaError(f"more than {_MAX_TRIGGERS} optional dependentRequired triggers",
                                         self.pointer)
        always = [t for t in self.dependents if t in self.required]
        variants = []
        for present in product((True, False), repeat=len(triggers)):
            required = set(self.required)
            forbidden = set()
            for t in always:
                required |= set(self.dependents[t])
            for t, here in zip(triggers, present):
                if here:
                    required |= {t, *self.dependents[t]}
                else:
                    forbidden.add(t)
            variants.append(self._layout(names, members, extra, required, forbidden))
        result = choice(variants)
        if result == NEVER:
            return self.ctx.never("no object satisfies the property constraints", self.pointer)
        return result

    def _layout(self, names, members, extra, required: set, forbidden: set) -> Expr:
        if any(n in forbidden or n not in members for n in required):
            return NEVER
        slots = [(members[n], n in required) for n in names if n in members and n not in forbidden]
        pu = self.ctx.punct
        lo, hi = self.min_props, self.max_props
        if lo == 0 and hi is None:
            body = self._uncounted(slots, extra)
        else:
            body = self._counted(slots, extra, lo, hi)
        empty_ok = not any(req for _, req in slots) and lo == 0
        alternatives = ([pu.obj_empty] if empty_ok else []) + (
            [seq(pu.obj_open, body, pu.obj_close)] if body != NEVER else [])
        return choice(alternatives)

    def _any_order(self, names: list[str], members: dict[str, Expr], extra: Expr) -> Expr:
        """Members in any order, each at most once, extras anywhere among them."""
        keys = [n for n in names if n in members]
        while True:  # a trigger whose dependents cannot appear cannot appear either
            blocked = {t for t, needed in self.dependents.items() if t in keys and any(n not in keys for n in needed)}
            if not blocked:
                break
            keys = [n for n in keys if n not in blocked]
        if any(n not in keys for n in self.required):
            return NEVER
        index = {n: i for i, n in enumerate(keys)}
        triggers = [t for t in self.dependents if t in index]
        if len([t for t in triggers if t not in self.required]) > _MAX_TRIGGERS:
            raise UnsupportedSchemaError(f"more than {_MAX_TRIGGERS} optional dependentRequired triggers",
                                         self.pointer)
        pu = self.ctx.punct
        body = AnyOrder(pu.obj_open, tuple(members[n] for n in keys), pu.comma, pu.obj_close,
                        extra=None if extra == NEVER else extra,
                        required=frozenset(index[n] for n in self.required),
                        dependents=tuple((index[t], frozenset(index[n] for n in self.dependents[t])) for t in triggers),
                        min=self.min_props, max=self.max_props)
        alternatives = [pu.obj_empty] if not self.required and self.min_props == 0 else []
        if (keys or extra != NEVER) and self.max_props != 0 and MemberSet(body).feasible(EMPTY_TAG, FIRST):
            name = self.ctx.rule_name(self.pointer + "_object")
            self.ctx.rules[name] = body
            alternatives.append(Ref(name, call=True))
        return choice(alternatives)

    def _uncounted(self, slots, extra) -> Expr:
        """Non-empty member lists: the first member present picks which slots may precede it."""
        comma = self.ctx.punct.comma
        extras_tail = repeat(seq(comma, extra))
        tails = [extras_tail]  # tails[k]: slots k.. after something was written
        for member, req in reversed(slots):
            step = seq(comma, member)
            tail = seq(step if req else optional(step), tails[0])
            if len(slots) > _CALLED_TAILS:
                # written out, slot k's tail holds every later slot's, and every first member writes out the
                # tail after it: quadratic; as a chain of rules each calling the next (a tail call, no stack
                # frame) the object stays linear in its slots
                name = self.ctx.rule_name(self.pointer + "_tail")
                self.ctx.rules[name] = tail
                tail = Ref(name, call=True)
            tails.insert(0, tail)
        firsts = []
        for i, (member, req) in enumerate(slots):
            firsts.append(seq(member, tails[i + 1]))
            if req:
                break
        else:
            firsts.append(seq(extra, extras_tail))
        return choice(firsts)

    def _counted(self, slots, extra, lo: int, hi: int | None) -> Expr:
        """Member lists whose length is in [lo, hi], tracked by (slot, count) rule states."""
        comma = self.ctx.punct.comma
        n = len(slots)
        clip = hi if hi is not None else lo
        memo: dict[tuple, Expr] = {}

        def after(i: int, count: int) -> Expr:
            if hi is not None and count > hi:
                return NEVER
            key = (i, min(count, clip + 1))
            if key in memo:
                return memo[key]
            if i == n:
                body = repeat(seq(comma, extra), max(0, lo - count), None if hi is None else hi - count)
            else:
                member, req = slots[i]
                take = seq(comma, member, after(i + 1, count + 1))
                body = take if req else choice([take, after(i + 1, count)])
            memo[key] = body = self.ctx.share(body, self.pointer)
            return body

        def first(i: int) -> Expr:
            if i == n:
                return seq(extra, repeat(seq(comma, extra), max(0, lo - 1), None if hi is None else hi - 1))
            member, req = slots[i]
            take = seq(member, after(i + 1, 1))
            return take if req else choice([take, first(i + 1)])

        return first(0) if hi != 0 else NEVER


def build_object(ctx: SchemaContext, parts: list[Part]) -> Expr:
    """The IR for objects satisfying every object keyword of `parts`."""
    try:
        return _ObjectBuilder(ctx, parts).build()
    except re.error as exc:
        raise SchemaError(f"bad patternProperties regex: {exc}", parts[0].pointer if parts else "") from None
