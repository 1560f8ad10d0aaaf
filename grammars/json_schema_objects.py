"""Objects: declared properties in schema order (or any order), extra keys after them; counts and dependencies
exactly.

An object is one rule over its members (`ir.Members`): its stack frame records which members it wrote, and the
rule's guarded edges keep each member to at most once, in schema order unless property_order="any", with the
required ones, `dependentRequired` and `min/maxProperties` checked before it closes.  Every declared (or
required) key is a member; keys not declared anywhere ("extras", allowed by
`additionalProperties`/`patternProperties`) are split into classes by which `patternProperties` they match, so
each class has one value schema.  Where extras count towards a minProperties two or more above the required
members, their keys are captured (`ir.Capture`): a repeated key would be one property, not two.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from itertools import islice, product
from typing import Any, Iterator

from .automaton import is_terminal, terminal_for
from .completion import accepted_in_order
from .errors import AutomatonTooLargeError, SchemaError, UnsupportedSchemaError
from .ir import Capture, Choice, Expr, Lit, Members, Ref, Repeat, Seq, Terminal
from .json_schema_context import (ONE_KEY_OF, SOME_KEY, STRING_KEYS, VALIDATION, Part, SchemaContext, count_of,
                                  enum_values, expect, key_matches, witness_admits)
from .json_schema_ir import NEVER, choice, json_text, seq
from .json_schema_scalars import distinct_texts, string_terminal
from .json_strings import PatternRegexes, pattern_regexes
from .object_members import EMPTY_TAG, FIRST, MemberSet
from .regex import terminal_dfa

_MAX_PATTERNS = 32
_MAX_KEY_CLASSES = 64
_MAX_TRIGGERS = 3
_MAX_WITNESSES = 4         # keys an object must hold by pattern (`SOME_KEY`): one key may serve several
_MAX_WITNESS_LAYOUTS = 32  # ways of choosing which member or extra key serves which
_MAX_FIXED_KEYS = 16       # the keys a witness holding a value admits, where each may be held by name


class _ObjectBuilder:
    def __init__(self, ctx: SchemaContext, parts: list[Part]):
        self.ctx = ctx
        self.parts = parts
        self.pointer = parts[0].pointer if parts else ""
        self.order: list[str] = []     # the keys `properties` declare
        self.required: list[str] = []
        self.patterns: list[tuple[str, Part, Any]] = []  # (regex source, owner part, subschema)
        self.dependents: dict[str, list[str]] = {}
        self.min_props, self.max_props = 0, None
        self.distinct_keys = False   # every extra key differs from the others (and from the held ones)
        for p in parts:
            self._read(p)
        self.declared = set(self.order)

    def _read(self, p: Part) -> None:
        # the checks make their pointers only where they fail: every object is read here
        props = p.get("properties", {})
        if not isinstance(props, dict):
            raise SchemaError("properties must be an object", p.at("properties"))
        self.order += [n for n in props if n not in self.order]
        req = p.get("required", [])
        if not (isinstance(req, list) and all(isinstance(n, str) for n in req)):
            raise SchemaError("required must be an array of strings", p.at("required"))
        self.required += [n for n in dict.fromkeys(req) if n not in self.required]   # a name listed twice counts once
        pats = p.get("patternProperties", {})
        if not isinstance(pats, dict):
            raise SchemaError("patternProperties must be an object", p.at("patternProperties"))
        self.patterns += [(k, p, v) for k, v in pats.items()]
        for key in ("dependentRequired", "dependencies"):
            deps = p.get(key, {})
            if not isinstance(deps, dict):
                raise SchemaError(f"{key} must be an object", p.at(key))
            for trigger, needed in deps.items():
                if needed is True or needed == {}:
                    continue
                # schema values never get here: the compiler splits them off (combinators.dependent_schemas)
                expect(isinstance(needed, list) and all(isinstance(n, str) for n in needed),
                       f"{key} lists must hold strings", p.at(key, trigger))
                self.dependents.setdefault(trigger, [])
                self.dependents[trigger] += [n for n in dict.fromkeys(needed) if n not in self.dependents[trigger]]
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
                if owner is p and key_matches(pattern, name, p.at("patternProperties", pattern)):
                    out.append(p.sub(sub, "patternProperties", pattern))
                    hit = True
            if not hit and p.has("additionalProperties"):
                out.append(p.sub(p.get("additionalProperties"), "additionalProperties"))
            if p.has("propertyNames"):
                names = p.sub(p.get("propertyNames"), "propertyNames")
                if not self.ctx.validator([names]).is_valid(name):
                    return None
        return out

    def extras(self, declared: list[str], witness: dict | None = None) -> tuple[Expr, int | None]:
        """One member `"key": value` for any key not declared, split into classes by patternProperties;
        `declared` in schema order, so the excluded names (and the grammar) do not depend on hash order.
        `witness` (see `SOME_KEY`): only keys it admits, with values it admits, not counted against minProperties.
        Keys are captured where a repeat would pass for two properties, and wherever `distinct_keys` says (a
        key held for its value must not be written again); with the member, how many keys the extras have where
        they are captured and can run out (else None)."""
        distinct = self._repeats_count() and witness is None or self.distinct_keys
        classes = self._classes(declared, witness, distinct)
        count = None
        if distinct and classes:
            counting = self._repeats_count() and not self.distinct_keys
            pointer = (next((p.at("minProperties") for p in self.parts if p.has("minProperties")), self.pointer)
                       if counting else self.pointer)
            why = ("minProperties counting extra keys" if counting else
                   "extra keys that must differ from a key held for its value")
            if witness is None and len(classes) > 1:
                raise UnsupportedSchemaError(f"{why}: keys of more than one patternProperties class cannot be told "
                                             "apart", pointer)
            captured = []
            for key, value in classes:
                text, count = distinct_texts(self.ctx, key, "the keys of minProperties" if counting else
                                             "the extra keys", pointer)
                if witness is None and count is not None and self.distinct_keys:
                    # a held key may take one of the keys the count leaves the other extras
                    raise UnsupportedSchemaError(f"{why}: finitely many cannot be counted", pointer)
                captured.append((text, value))
            classes = captured
        return choice([seq(key, self.ctx.punct.colon, value) for key, value in classes]), (
            count if witness is None else None)

    def _classes(self, declared: list[str], witness: dict | None, whole: bool) -> list[tuple[Expr, Expr]]:
        """The key terminal and value of each class of extra keys (those matching the same patternProperties)."""
        explicit = any(p.has("additionalProperties") for p in self.parts)
        if not self.patterns and (any(p.get("additionalProperties") is False for p in self.parts) or
                                  not explicit and not self.ctx.options.additional_properties):
            return []       # most objects: no extra key at all, so no terminal for "any key but the declared"
        at: dict[str, str] = {}  # each distinct patternProperties pattern, with its first pointer
        for pattern, owner, _ in self.patterns:
            at.setdefault(pattern, owner.at("patternProperties", pattern))
        regexes = list(at)
        if len(regexes) > _MAX_PATTERNS:
            raise UnsupportedSchemaError(f"more than {_MAX_PATTERNS} distinct patternProperties", self.pointer)
        regex_of = {r: pattern_regexes(r, at[r]) for r in regexes}
        names = [p.sub(p.get("propertyNames"), "propertyNames") for p in self.parts if p.has("propertyNames")]
        name_parts = self._string_parts(names)
        match = tuple((r, witness["at"]) for r in witness["match"]) if witness else ()
        avoid = tuple((r, witness["at"]) for r in witness["avoid"]) if witness else ()
        excluded = declared + [n for n in witness["outside"] if n not in declared] if witness else declared
        any_key = string_terminal(self.ctx, name_parts, excluded, match, avoid)
        if any_key == NEVER:
            return []
        classes = []
        overlapping = self._overlapping(regexes, regex_of)
        if len(overlapping) > _MAX_KEY_CLASSES:
            raise UnsupportedSchemaError(f"patternProperties overlap in more than {_MAX_KEY_CLASSES} ways",
                                         self.pointer)
        for chosen in overlapping:
            if not chosen and not explicit and not self.ctx.options.additional_properties:
                continue  # extras only where the schema allows them explicitly
            value = list(witness.get("values", ())) if witness else []
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
            if not regexes and not whole:   # most objects: the class of every extra key is `any_key`
                key = any_key
            else:
                key = string_terminal(self.ctx, name_parts, excluded, tuple((r, at[r]) for r in chosen) + match,
                                      tuple((r, at[r]) for r in regexes if r not in chosen
                                            and (not chosen or tuple(sorted((*chosen, r), key=regexes.index))
                                                 in overlapping)) + avoid, whole=whole)
            classes.append((key, value_expr))
        return classes

    def _repeats_count(self) -> bool:
        """Whether a repeated extra key could pass for two properties where the instance needs them: with r required
        members an object holding any extra has at least r + 1 distinct keys, so only minProperties >= r + 2 can
        count a repeat."""
        return self.min_props - len(self.required) >= 2

    def _overlapping(self, regexes: list[str], regex_of: dict[str, PatternRegexes]) -> list[tuple[str, ...]]:
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
                    if len(candidate) == 1 or self._intersect(candidate, regex_of):
                        nxt.append(candidate)
                        known.add(candidate)
            found += nxt
            level = nxt
        return found

    def _intersect(self, patterns: tuple[str, ...], regex_of: dict[str, PatternRegexes]) -> bool:
        """Whether some key matches every one of `patterns`."""
        each = [regex_of[x] for x in patterns]
        also = tuple(r for x in each for r in (x.regex, *x.also))
        try:
            return bool(terminal_dfa(also[0], also[1:], tuple(r for x in each for r in x.excluding)).accept.any())
        except AutomatonTooLargeError as exc:
            raise UnsupportedSchemaError(f"patternProperties {', '.join(map(repr, patterns))}: telling whether one key "
                                         f"can match them all needs more than {exc.budget}", self.pointer) from None

    def _listed_names(self) -> list[str] | None:
        """The keys a `propertyNames` enum or const allows (every other key is invalid), None without one."""
        conjuncts: list[Part] = []
        for p in self.parts:
            if p.has("propertyNames"):
                expanded = self.ctx.expand([p.sub(p.get("propertyNames"), "propertyNames")])
                conjuncts += expanded[0] if expanded is not None else []
        values = enum_values(conjuncts)
        return None if values is None else [v for v in values if isinstance(v, str)]

    def _string_parts(self, names: list[Part]) -> list[Part]:
        """The string-keyword view of propertyNames conjuncts (keys are always strings)."""
        expanded = self.ctx.expand(names)
        if expanded is None:
            return [self.parts[0].derived({"maxLength": 0, "minLength": 1}, "no key", "propertyNames")]
        out = []
        for part in expanded[0]:
            other = {k for k in part.schema if k not in STRING_KEYS} - {"type", "$ref", "allOf"}
            other -= {k for k in other if k not in VALIDATION}
            if other:
                raise UnsupportedSchemaError(f"propertyNames with {sorted(other)} cannot be enforced on extra keys",
                                             part.pointer)
            types = part.get("type")
            if types is not None and "string" not in (types if isinstance(types, list) else [types]):
                return [part.derived({"maxLength": 0, "minLength": 1}, "no key")]  # no key can satisfy it
            out.append(part)
        return out

    # ---- layout ------------------------------------------------------------------------------------

    def build(self) -> Expr:
        names = list(self.order)
        names += [n for n in self.required if n not in names]
        for trigger, needed in self.dependents.items():
            names += [n for n in dict.fromkeys([*needed, trigger]) if n not in names]  # dependents usually come first
        listed = self._listed_names()
        if listed is not None:      # every key is one of these: each a member, and no other key
            names += [n for n in listed if n not in names]
        witnesses = [w for p in self.parts for w in p.get(SOME_KEY, ())]
        # each way of choosing a witness of every ONE_KEY_OF list joins them (the lists hold witnesses by name, which
        # leave `distinct_keys` as it is)
        alternatives = list(product(*(p.get(ONE_KEY_OF) for p in self.parts if p.has(ONE_KEY_OF))))

        def fixed_keys(chosen: tuple[dict, ...] | list[dict]) -> list[list[str] | None]:
            return [self._fixed_keys(names, w) if listed is None else [] for w in chosen]

        fixed = fixed_keys(witnesses)
        # an extra held for its value must keep it: no other extra may write its key again, unless it leaves
        # no room for another extra
        self.distinct_keys = any(keys is None and w.get("values") for w, keys in zip(witnesses, fixed)) and (
            self.max_props is None or self.max_props > len(self.required) + 1)
        values: dict[str, Expr] = {}
        for name in names:
            parts = self.value_parts(name)
            values[name] = NEVER if parts is None else self.ctx.nested(parts)
        members = {n: self._member(n, v) for n, v in values.items() if v != NEVER}
        # per set of keys held by name in a layout: the extras without them, and how many keys they have left
        extras: dict[tuple[str, ...], tuple[Expr, int | None]] = {}

        def extra_without(held_keys: tuple[str, ...]) -> tuple[Expr, int | None]:
            if held_keys not in extras:
                extra, count = self.extras(names + list(held_keys)) if listed is None else (NEVER, None)
                extras[held_keys] = self.ctx.share(extra, self.pointer, own=True), count
            return extras[held_keys]

        if witnesses or alternatives != [()]:
            result = choice(self._members(names, {**members, **changed}, *extra_without(keys), self.required + needed,
                                          held)
                            for chosen in alternatives
                            for needed, changed, keys, held in self._witness_layouts(
                                names, members, witnesses + list(chosen), fixed + fixed_keys(chosen),
                                listed is None))
        else:
            result = self._members(names, members, *extra_without(()), self.required)
        if result == NEVER:
            closed = "" if self.ctx.options.additional_properties or any(
                p.has("additionalProperties") for p in self.parts) else \
                " once additional_properties=False closes it to its declared keys"
            return self.ctx.never(f"no object satisfies the property constraints{closed}", self.pointer)
        return result

    def _member(self, name: str, value: Expr) -> Expr:
        if not _chained(value, self.ctx.rules, self.ctx.chained):
            # a value that chooses or repeats (a nullable type, an array) called as a rule of its own: the member is
            # then a chain of calls, whose automaton needs no subset construction, and the value's rule, one
            # expression in every member and schema that writes it, is built once (`automaton._RULE_DFAS`).  It
            # ends the member, so the call pushes no frame.
            shared = value if type(value) is Ref else self.ctx.share(value, self.pointer)
            if type(shared) is Ref:     # (not an empty choice, which matches nothing)
                value = Ref(shared.name, call=True)
        return self.ctx.share(seq(Lit(json_text(name)), self.ctx.punct.colon, value), self.pointer)

    def _fixed_keys(self, declared: list[str], witness: dict) -> list[str] | None:
        """The keys beyond `declared` a witness asks for with a value, where there are at most _MAX_FIXED_KEYS
        (each may then be held by name, the other extras leaving it out); None where there are more, or where
        the witness asks for no value (a key held by pattern)."""
        if "name" in witness:
            return [] if witness["name"] in declared else [witness["name"]]
        if not witness.get("values"):
            return None
        keys: list[str] = []
        for key, _ in self._classes(declared, witness, True):
            dfa = terminal_for(key)
            count = dfa.size(_MAX_FIXED_KEYS - len(keys))
            if count is None:
                return None
            keys += [json.loads(text) for text in islice(accepted_in_order(dfa, 0), count)]
        return keys

    def _witness_layouts(self, names: list[str], members: dict[str, Expr], witnesses: list[dict],
                         fixed: list[list[str] | None], extras: bool
                         ) -> Iterator[tuple[list[str], dict[str, Expr], tuple[str, ...], tuple[Expr, ...]]]:
        """The ways an object holds a key each witness admits (`SOME_KEY`): per witness, a declared member it
        admits, or a key held by name that it admits (one of its own `fixed` keys or another witness's), or else
        an extra key it admits; the witnesses left to extras split into groups, one extra member each (one key
        may serve several, as under maxProperties 1), whose keys leave out those held by name.
        Each way: (members it requires, the members whose values it narrows to what their witnesses ask, the
        keys it holds by name, which no other extra writes, and the extra members it holds, each written once like
        a required member, among the other extras in schema order)."""
        # witnesses an extra key may be held for, by pattern: their groups multiply the layouts, and such a key is
        # not told apart from the other extras (a key held by name is: they leave it out)
        by_pattern = [w for w, keys in zip(witnesses, fixed) if keys is None] if extras else []
        if len(by_pattern) > _MAX_WITNESSES:
            raise UnsupportedSchemaError(f"more than {_MAX_WITNESSES} keys that must exist by pattern on one object",
                                         by_pattern[_MAX_WITNESSES]["at"])
        if by_pattern and self.min_props > len(self.required) + 1:
            # an extra key written twice is one property: the count holds only with one extra at most
            raise UnsupportedSchemaError("minProperties beside a key that must exist by pattern cannot tell repeated "
                                         "keys apart", by_pattern[0]["at"])
        # every key some witness may be held by, by name, may serve each witness that admits it
        by_name_keys = list(dict.fromkeys(k for keys in fixed if keys for k in keys)) if extras else []
        options = [[n for n in names if n in members and witness_admits(w, n)]
                   + [_Held(k) for k in by_name_keys if witness_admits(w, k)] + ([None] if keys is None else [])
                   for w, keys in zip(witnesses, fixed)]
        # per group of witnesses and the keys held by name beside it: one extra member, which leaves those out
        held_by: dict[tuple[tuple[int, ...], tuple[str, ...]], Expr] = {}

        def holding(group: list[int], by_name: tuple[str, ...]) -> Expr:
            key = (tuple(group), by_name)
            if key not in held_by:
                extra, _ = self.extras(names + list(by_name), _merged([witnesses[i] for i in group]))
                held_by[key] = self.ctx.share(extra, self.pointer, own=True)
            return held_by[key]

        def narrowed(option: str | _Held, asked: list[Part]) -> Expr:
            """The member for `option` with its value narrowed to what the witnesses choosing it ask."""
            name = option if isinstance(option, str) else option.key
            parts = self.value_parts(name)
            return NEVER if parts is None else self._member(name, self.ctx.nested(parts + asked))

        layouts = 0
        for chosen in product(*options):
            asked = {o: [v for w, c in zip(witnesses, chosen) if c == o for v in w.get("values", ())]
                     for o in dict.fromkeys(chosen) if o is not None}
            needed = [n for n in asked if isinstance(n, str)]
            changed = {n: narrowed(n, asked[n]) for n in needed if asked[n]}
            by_name = {o.key: narrowed(o, asked[o]) for o in asked if isinstance(o, _Held)}
            if NEVER in changed.values() or NEVER in by_name.values():
                continue
            left = [i for i, n in enumerate(chosen) if n is None]
            for groups in _partitions(left):
                held = tuple(by_name.values()) + tuple(holding(group, tuple(by_name)) for group in groups)
                if NEVER in held:
                    continue
                layouts += 1
                if layouts > _MAX_WITNESS_LAYOUTS:
                    raise UnsupportedSchemaError(f"keys that must exist can be held in more than "
                                                 f"{_MAX_WITNESS_LAYOUTS} ways", witnesses[0]["at"])
                yield needed, changed, tuple(by_name), held

    def _members(self, names: list[str], members: dict[str, Expr], extra: Expr, max_extras: int | None,
                 required: list[str], held: tuple[Expr, ...] = ()) -> Expr:
        """The object as one rule over its members (`ir.Members`): in schema order, extras last, or in any order;
        `held`: extra members it must write (after the declared ones, each once).  In schema order the keys no
        `properties` declares (`names` holds them after the declared ones) go among the extras, in any order."""
        keys = [n for n in names if n in members]
        while True:  # a trigger whose dependents cannot appear cannot appear either
            present = set(keys)
            blocked = {t for t, needed in self.dependents.items() if t in present and not present.issuperset(needed)}
            if not blocked:
                break
            keys = [n for n in keys if n not in blocked]
        if any(n not in keys for n in required):
            return NEVER
        index = {n: i for i, n in enumerate(keys)}
        triggers = [t for t in self.dependents if t in index]
        if len([t for t in triggers if t not in self.required]) > _MAX_TRIGGERS:
            raise UnsupportedSchemaError(f"more than {_MAX_TRIGGERS} optional dependentRequired triggers",
                                         self.pointer)
        pu = self.ctx.punct
        body = Members(pu.obj_open, tuple(members[n] for n in keys) + held, pu.comma, pu.obj_close,
                        extra=None if extra == NEVER else extra,
                        required=frozenset(index[n] for n in required) | frozenset(range(len(keys),
                                                                                      len(keys) + len(held))),
                        dependents=tuple((index[t], frozenset(index[n] for n in self.dependents[t])) for t in triggers),
                        min=self.min_props, max=self.max_props, ordered=self.ctx.options.property_order == "schema",
                        max_extras=max_extras, loose=len(keys) - len(self.declared.intersection(keys)) + len(held))
        alternatives = [pu.obj_empty] if not required and not held and self.min_props == 0 else []
        # without counts or dependencies any member or extra completes the object: no plan to search for
        plain = not triggers and self.min_props == 0 and self.max_props is None and max_extras != 0
        if (keys or held or extra != NEVER) and (plain or self.max_props != 0
                                                 and MemberSet(body).feasible(EMPTY_TAG, FIRST)):
            name = self.ctx.rule_name(self.pointer + "_object")
            self.ctx.rules[name] = body
            alternatives.append(Ref(name))
        return choice(alternatives)


@dataclass(frozen=True)
class _Held:
    """A key a witness may be held by, by name (see `_ObjectBuilder._fixed_keys`)."""

    key: str


def _merged(group: list[dict]) -> dict:
    """One witness asking for a key every witness of `group` admits."""
    return {"match": [r for w in group for r in w["match"]], "avoid": [r for w in group for r in w["avoid"]],
            "outside": [n for w in group for n in w["outside"]], "at": group[0]["at"],
            "values": [v for w in group for v in w.get("values", ())]}


def _partitions(items: list) -> Iterator[list[list]]:
    """Every way of splitting `items` into non-empty groups (one way, no group, for no items)."""
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for groups in _partitions(rest):
        yield [[first], *groups]
        for i in range(len(groups)):
            yield [*groups[:i], [first, *groups[i]], *groups[i + 1:]]


def build_object(ctx: SchemaContext, parts: list[Part]) -> Expr:
    """The IR for objects satisfying every object keyword of `parts`."""
    try:
        return _ObjectBuilder(ctx, parts).build()
    except re.error as exc:
        raise SchemaError(f"bad patternProperties regex: {exc}", parts[0].pointer if parts else "") from None


def _chained(expr: Expr, rules: dict[str, Expr], known: dict[str, bool]) -> bool:
    """Whether the automaton writes `expr` out as a chain of calls: no choice or repetition but within one terminal,
    its references followed (a reference not defined yet, or met again inside itself, is a recursive one, which is
    called).  `known`: the answers for rules, each rule asked once."""
    kind = type(expr)
    if kind is Seq:
        return all(_chained(item, rules, known) for item in expr.items)
    if kind is Ref:
        if expr.call:
            return True
        answer = known.get(expr.name)
        if answer is None:
            known[expr.name] = True     # (while it is asked: a cycle is called)
            body = rules.get(expr.name)
            answer = known[expr.name] = body is None or type(body) is Members or _chained(body, rules, known)
        return answer
    return kind is Lit or kind is Terminal or kind is Capture or (kind is Choice or kind is Repeat) and is_terminal(expr)
