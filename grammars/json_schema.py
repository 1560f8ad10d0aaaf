"""JSON schema -> grammar IR -> compiled grammar.

A schema is translated as a *conjunction* of subschemas (`allOf`, `$ref`
siblings and merged keywords all just add conjuncts); each JSON type the
conjunction admits becomes one branch, built from every conjunct's keywords
for that type.  Referenced subschemas become named rules, so recursive
schemas stay finite.  What cannot be enforced exactly raises
UnsupportedSchemaError naming the keyword and its JSON pointer.

Limits, each refused with UnsupportedSchemaError at the JSON pointer where it is hit: the
document may nest objects and arrays MAX_DOCUMENT_DEPTH deep; subschemas compiled inside each
other (properties, items, anyOf branches..., through $ref) MAX_SUBSCHEMA_DEPTH deep; and one
schema compiles at most MAX_SUBSCHEMAS subschemas, counting each conjunct of each conjunction,
which bounds compile time where branches multiply (allOf of many anyOf) to about a second.
The largest schemas of JSONSchemaBench stay well inside: depth 24, 22 levels, 4,152 subschemas.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any

from .errors import SchemaError, UnsupportedSchemaError
from .ir import Expr, Grammar, Lit, Ref, Terminal
from .json_numbers import DECIMAL, INTEGER_VALUE, NUMBER, at_least, at_most, digit_cap, multiple_of_regex
from .json_schema_ir import (EMPTY, NEVER, choice, grammar_size, inlined_size, json_equal, literal,
                             number_literal_regex, optional, punctuation, repeat, seq)
from .json_schema_objects import build_object
from .json_schema_refs import RefResolver, escape_token
from .matcher import CompiledGrammar
from .json_strings import FORMATS, capped_length, format_pattern, pattern_regex, regex_escape, string_regex

TYPES = ("null", "boolean", "number", "string", "array", "object")
Patterns = tuple[tuple[str, str], ...]  # ECMA patterns, each with its JSON pointer

# Keywords that validate and that this front end cannot enforce exactly in any form.
_UNSUPPORTED = ("contains", "maxContains", "unevaluatedProperties", "unevaluatedItems", "dependentSchemas",
                "$dynamicRef", "$recursiveRef")
# Keywords that constrain instances (the rest are annotations or unknown, ignored as JSON Schema says).
_VALIDATION = {"type", "enum", "const", "properties", "required", "additionalProperties", "patternProperties",
               "propertyNames", "minProperties", "maxProperties", "items", "prefixItems", "additionalItems",
               "minItems", "maxItems", "uniqueItems", "anyOf", "oneOf", "allOf", "not", "if", "then", "else",
               "minLength", "maxLength", "pattern", "format", "minimum", "maximum", "exclusiveMinimum",
               "exclusiveMaximum", "multipleOf", "dependentRequired", "dependencies", *_UNSUPPORTED}
_STRING_KEYS = {"minLength", "maxLength", "pattern", "format"}
_MAX_UNIQUE_VALUES = 8
_MAX_DISTRIBUTED_BRANCHES = 64
MAX_SUBSCHEMA_DEPTH = 64  # the limits: see the module docstring
MAX_DOCUMENT_DEPTH = 2 * MAX_SUBSCHEMA_DEPTH + 1  # properties/anyOf spend two JSON levels per subschema
MAX_SUBSCHEMAS = 20_000
# A length cap is a counter in a byte DFA (about 14 states per character of a string): longer caps would
# outgrow the automaton's budget for one terminal.
MAX_LENGTH_CAP = 1000
# Automaton nodes the item cap may add: the automaton writes a capped array's items out one by one, so
# caps multiply down nested arrays and with every place a rule is inlined.  One capped array may take this
# many (inner arrays are capped first, outer ones past it stay uncapped), and if all of them together grow
# the grammar by more, the schema keeps no item cap.
_MAX_ITEM_CAP_NODES = 20_000


@dataclass(frozen=True)
class JsonSchemaOptions:
    """How a schema becomes a grammar.

    whitespace: 'flexible' (bounded whitespace around punctuation, the default),
    'dumps' (exactly json.dumps' ", " / ": " layout) or 'compact' (none).
    additional_properties: False disallows extra object keys unless the schema
    allows them explicitly (JSON Schema's own default, True, allows them).
    strict_formats: raise on formats leapgen does not know instead of treating
    them as annotations (as draft 2020-12 does by default).
    check_schema: also validate the schema against its metaschema (costs ~1 ms).

    Caps against runaway values (None: off), each applied only where the schema sets no bound of its own
    and never below what the schema requires, so every instance within the caps stays reachable:
    max_string_length: characters of a string (keys and pattern/format strings too) without maxLength,
    at least its minLength; a pattern or format is capped only where intersecting it is affordable.
    max_items: items of an array without maxItems, at least minItems and the prefixItems count; an
    array whose capped automaton would be too large (capped arrays nested deep) stays uncapped.
    max_number_digits: digits before the point of a number without both minimum and maximum, at least
    what its bound needs, and digits after the point and in the exponent of any number.
    """

    whitespace: str = "flexible"
    additional_properties: bool = True
    max_indent: int = 20
    strict_formats: bool = False
    check_schema: bool = False
    max_string_length: int | None = None
    max_items: int | None = None
    max_number_digits: int | None = None

    def __post_init__(self) -> None:
        _check_cap("max_string_length", self.max_string_length, MAX_LENGTH_CAP)
        _check_cap("max_items", self.max_items, None)
        _check_cap("max_number_digits", self.max_number_digits, MAX_LENGTH_CAP)


def _check_cap(name: str, value: Any, ceiling: int | None) -> None:
    if value is None:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"JSON schema option {name} must be an int >= 1 or None, not {value!r}")
    if ceiling is not None and value > ceiling:
        raise ValueError(f"JSON schema option {name} must be at most {ceiling}, not {value!r}")


@dataclass(frozen=True)
class Part:
    """One conjunct: a subschema, where it is, its base URI, and keywords already accounted for."""

    schema: Any
    pointer: str
    base: str
    skip: frozenset = frozenset()

    def get(self, key: str, default: Any = None) -> Any:
        return default if key in self.skip or not isinstance(self.schema, dict) else self.schema.get(key, default)

    def has(self, key: str) -> bool:
        return key not in self.skip and isinstance(self.schema, dict) and key in self.schema

    def at(self, *tokens: Any) -> str:
        return self.pointer + "".join("/" + escape_token(str(t)) for t in tokens)

    def sub(self, schema: Any, *tokens: Any) -> "Part":
        return Part(schema, self.at(*tokens), self.base)


def _expect(cond: bool, message: str, pointer: str) -> None:
    if not cond:
        raise SchemaError(message, pointer)


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _decimal(x: Any, pointer: str) -> Decimal:
    _expect(_is_number(x), "expected a number", pointer)
    d = Decimal(str(x))
    _expect(d.is_finite(), "expected a finite number", pointer)
    return d


def _count(part: Part, key: str) -> int | None:
    value = part.get(key)
    if value is None:
        return None
    _expect(_is_number(value) and value >= 0 and value == int(value), f"{key} must be a non-negative integer",
            part.at(key))
    return int(value)


@dataclass
class _Branches:
    """The JSON types a conjunction admits; 'number' may be restricted to integers."""

    types: set = field(default_factory=lambda: set(TYPES))
    integer_only: bool = False


class SchemaCompiler:
    """Translates one schema document into a Grammar (see module docstring)."""

    def __init__(self, schema: Any, options: JsonSchemaOptions):
        _expect(isinstance(schema, (dict, bool)), f"a schema must be an object or a boolean, not "
                f"{type(schema).__name__}", "")
        _check_document_depth(schema)  # first: the resolver, jsonschema and enum values recurse through it
        self.root = schema
        self.options = options
        dialect = schema.get("$schema", "") if isinstance(schema, dict) else ""
        dialect = dialect if isinstance(dialect, str) else ""
        self.legacy = any(f"draft-0{n}" in dialect for n in (3, 4, 5, 6, 7))  # $ref siblings ignored
        self.draft4 = "draft-04" in dialect or "draft-03" in dialect
        self.refs = RefResolver(schema, "id" if self.draft4 else "$id")
        self.punct = punctuation(options.whitespace, options.max_indent)
        self.rules: dict[str, Expr] = {}
        self._memo: dict[tuple, str] = {}
        self._active: dict[tuple, int] = {}
        self._depth = 0
        self._nesting = 0
        self._compiled = 0
        self._names: dict[str, int] = {}
        self._sizes: dict[str, int] = {}  # inlined_size of each rule
        self._validator = None
        self.why_never: list[str] = []

    # ---- entry -------------------------------------------------------------------------------------

    def grammar(self) -> Grammar:
        """The grammar for the whole document; SchemaError if nothing can satisfy it."""
        if self.options.check_schema:
            self._check_metaschema()
        start = self.compile([Part(self.root, "", self.refs.root_base)])
        if start == NEVER:
            reason = self.why_never[0] if self.why_never else "no JSON value satisfies it"
            raise SchemaError(f"schema is unsatisfiable: {reason}", "")
        self.rules["start"] = start
        return Grammar(rules=self.rules, start="start")

    def _check_metaschema(self) -> None:
        import jsonschema
        from jsonschema.validators import validator_for

        cls = validator_for(self.root, default=jsonschema.Draft202012Validator)
        error = jsonschema.exceptions.best_match(cls(cls.META_SCHEMA).iter_errors(self.root))
        if error is not None:
            pointer = "".join("/" + escape_token(str(t)) for t in error.absolute_path)
            raise SchemaError(f"schema does not match its metaschema: {error.message}", pointer)

    def never(self, reason: str, pointer: str) -> Expr:
        self.why_never.append(f"{reason} (at {pointer or '/'})")
        return NEVER

    def share(self, expr: Expr, pointer: str) -> Expr:
        """Name an expression the layout mentions several times, so the IR stays a small DAG
        (walking it as a tree would double the work at every nesting level)."""
        if isinstance(expr, (Lit, Terminal, Ref)) or expr in (NEVER, EMPTY):
            return expr
        name = self.rule_name(pointer + "_member")
        self.rules[name] = expr
        return Ref(name)

    def rule_name(self, hint: str) -> str:
        base = re.sub(r"[^A-Za-z0-9_]+", "_", hint).strip("_")[:40] or "root"
        n = self._names.get(base, 0)
        self._names[base] = n + 1
        return f"{base}_{n}" if n else base

    # ---- conjunctions ------------------------------------------------------------------------------

    def _expand(self, parts: list[Part]) -> tuple[list[Part], bool] | None:
        """Flatten allOf and $ref into plain conjuncts; None if a conjunct is `false`."""
        out: list[Part] = []
        seen: set = set()
        via_ref = False
        stack = list(reversed(parts))
        while stack:
            part = stack.pop()
            key = (part.base, part.pointer, part.skip)
            if key in seen:
                continue
            seen.add(key)
            schema = part.schema
            if schema is True:
                continue
            if schema is False:
                self.never("the schema is false", part.pointer)
                return None
            _expect(isinstance(schema, dict), f"a schema must be an object or a boolean, not "
                    f"{type(schema).__name__}", part.pointer)
            base = self.refs.base_for(schema, part.base)
            part = Part(schema, part.pointer, base, part.skip)
            pending: list[Part] = []
            if part.has("$ref"):
                target = self.refs.resolve(schema["$ref"], base, part.pointer)
                pending.append(Part(target.schema, target.pointer, target.base))
                via_ref = True
                if self.legacy:  # before 2019-09 a $ref replaces its siblings
                    stack.extend(reversed(pending))
                    continue
            if part.has("allOf"):
                subs = schema["allOf"]
                _expect(isinstance(subs, list) and subs, "allOf must be a non-empty array", part.at("allOf"))
                pending += [part.sub(s, "allOf", i) for i, s in enumerate(subs)]
            for keyword in _UNSUPPORTED:
                if part.has(keyword):
                    raise UnsupportedSchemaError(f"keyword {keyword!r} cannot be enforced", part.at(keyword))
            if any(k in _VALIDATION and k not in ("allOf",) for k in schema if k not in part.skip):
                out.append(Part(schema, part.pointer, base, part.skip | {"allOf", "$ref"}))  # expanded once
            stack.extend(reversed(pending))
        return out, via_ref

    def compile(self, parts: list[Part]) -> Expr:
        """The IR for instances valid against every part."""
        pointer = parts[0].pointer if parts else ""
        self._compiled += max(len(parts), 1)  # each conjunct is a subschema compiled
        if self._compiled > MAX_SUBSCHEMAS:
            raise UnsupportedSchemaError(f"schema needs more than {MAX_SUBSCHEMAS} subschemas compiled", pointer)
        if self._nesting == MAX_SUBSCHEMA_DEPTH:
            raise UnsupportedSchemaError(f"subschemas nested deeper than {MAX_SUBSCHEMA_DEPTH}", pointer)
        self._nesting += 1
        try:
            return self._compile(parts)
        finally:
            self._nesting -= 1

    def _compile(self, parts: list[Part]) -> Expr:
        expanded = self._expand(parts)
        if expanded is None:
            return NEVER
        parts, via_ref = expanded
        if not parts:
            return self._any_value()
        if not via_ref:
            return self._compile_parts(parts)
        key = tuple(sorted((p.base, p.pointer, tuple(sorted(p.skip))) for p in parts))
        if key in self._memo:
            return Ref(self._memo[key])
        if key in self._active:
            if self._active[key] == self._depth:
                raise SchemaError("$ref cycle that consumes no input", parts[0].pointer if parts else "")
            name = self.rule_name(parts[0].pointer if parts else "any")
            self._memo[key] = name
            return Ref(name)
        self._active[key] = self._depth
        body = self._compile_parts(parts)
        del self._active[key]
        if key in self._memo:  # referenced recursively while compiling
            self.rules[self._memo[key]] = body
            return Ref(self._memo[key])
        if isinstance(body, (Lit, Terminal)) or body == NEVER:
            return body
        name = self.rule_name(parts[0].pointer if parts else "any")
        self._memo[key] = name
        self.rules[name] = body
        return Ref(name)

    def _any_value(self) -> Expr:
        """Any JSON value (one shared recursive rule)."""
        if "any_value" not in self.rules:
            pu = self.punct
            value = Ref("any_value")
            string = self.string_terminal([], [])
            member = seq(string, pu.colon, value)
            self.rules["any_value"] = choice([
                Lit("null"), Lit("true"), Lit("false"), self._number([], False, []), string,
                choice([pu.obj_empty, seq(pu.obj_open, member, repeat(seq(pu.comma, member)), pu.obj_close)]),
                self._sequence([], value, 0, self._item_cap(0, [], value), "any_value"),
            ])
        return Ref("any_value")

    def nested(self, parts: list[Part]) -> Expr:
        """Compile a subschema one structural level down (inside an object or array)."""
        self._depth += 1
        try:
            return self.compile(parts)
        finally:
            self._depth -= 1

    def _compile_parts(self, parts: list[Part]) -> Expr:
        if any(p.has("enum") or p.has("const") for p in parts):
            return self._enumerated(parts)
        for part in parts:
            for keyword in ("anyOf", "oneOf"):
                if part.has(keyword):
                    return self._distribute(parts, part, keyword)
        for part in parts:
            if part.has("if"):
                return self._conditional(parts, part)
        branches = _Branches()
        for part in parts:
            self._narrow_types(part, branches)
        excluded: list[Any] = []
        for part in parts:
            if part.has("not"):
                self._negate(part, branches, excluded)
        alternatives = []
        for t in TYPES:
            if t in branches.types:
                alternatives.append(self._type_branch(t, parts, branches, excluded))
        if not any(a != NEVER for a in alternatives):
            if not branches.types:
                return self.never("no type is allowed by all of the conjuncts", parts[0].pointer if parts else "")
        return choice(alternatives)

    # ---- enum / const ------------------------------------------------------------------------------

    def validator(self, parts: list[Part]):
        """A jsonschema validator for the conjunction of `parts` (refs resolve in this document)."""
        import jsonschema
        from jsonschema.validators import validator_for

        if self._validator is None:
            cls = validator_for(self.root, default=jsonschema.Draft202012Validator) if isinstance(
                self.root, dict) else jsonschema.Draft202012Validator
            self._validator = cls(self.root, format_checker=cls.FORMAT_CHECKER)
        return self._validator.evolve(schema={"allOf": [p.schema for p in parts]})

    def _enumerated(self, parts: list[Part]) -> Expr:
        values: list[Any] | None = None
        for part in parts:
            for key in ("enum", "const"):
                if not part.has(key):
                    continue
                candidates = [part.get(key)] if key == "const" else part.get(key)
                _expect(isinstance(candidates, list), "enum must be an array", part.at(key))
                if values is None:
                    values = []
                    for v in candidates:
                        if not any(json_equal(v, w) for w in values):
                            values.append(v)
                else:
                    values = [v for v in values if any(json_equal(v, c) for c in candidates)]
        assert values is not None
        try:
            validator = self.validator(parts)
            values = [v for v in values if validator.is_valid(v)]
        except Exception as exc:  # unresolvable refs, bad regexes: the schema itself is at fault
            raise SchemaError(f"cannot check enum values against the schema: {exc}", parts[0].pointer) from None
        if not values:
            return self.never("no enum/const value satisfies the schema", parts[0].pointer)
        return choice(literal(v, self.punct) for v in values)

    # ---- anyOf / oneOf / if / not ------------------------------------------------------------------

    def _distribute(self, parts: list[Part], owner: Part, keyword: str) -> Expr:
        branches = owner.get(keyword)
        _expect(isinstance(branches, list) and branches, f"{keyword} must be a non-empty array", owner.at(keyword))
        _expect(len(branches) <= _MAX_DISTRIBUTED_BRANCHES, f"{keyword} has too many branches", owner.at(keyword))
        rest = [Part(p.schema, p.pointer, p.base, p.skip | {keyword}) if p is owner else p for p in parts]
        subs = [owner.sub(b, keyword, i) for i, b in enumerate(branches)]
        if keyword == "oneOf" and len(subs) > 1:
            self._require_exclusive(rest, subs, owner.at(keyword))
        return choice(self.compile(rest + [s]) for s in subs)

    def _require_exclusive(self, rest: list[Part], subs: list[Part], pointer: str) -> None:
        """oneOf is a union only when no instance can match two branches; prove that or refuse."""
        sigs = [self._signature(rest + [s]) for s in subs]
        for i in range(len(sigs)):
            for j in range(i + 1, len(sigs)):
                if not _disjoint(sigs[i], sigs[j]):
                    raise UnsupportedSchemaError(
                        f"oneOf branches {i} and {j} may both match one instance; exclusivity cannot be enforced",
                        pointer)

    def _signature(self, parts: list[Part]) -> dict | None:
        """What a conjunction pins down cheaply: types, enum values, required keys with their constants."""
        expanded = self._expand(parts)
        if expanded is None:
            return None
        parts = expanded[0]
        branches = _Branches()
        values = None
        required: set = set()
        consts: dict[str, list] = {}
        closed: set | None = None
        for p in parts:
            self._narrow_types(p, branches)
            for key in ("enum", "const"):
                if p.has(key):
                    vals = [p.get(key)] if key == "const" else list(p.get(key) or [])
                    values = vals if values is None else [v for v in values if any(json_equal(v, w) for w in vals)]
            req = p.get("required", [])
            required |= set(req) if isinstance(req, list) else set()
            props = p.get("properties", {})
            if isinstance(props, dict):
                for name, sub in props.items():
                    if isinstance(sub, dict) and ("const" in sub or "enum" in sub):
                        consts[name] = [sub["const"]] if "const" in sub else list(sub.get("enum") or [])
            if p.get("additionalProperties") is False and not p.has("patternProperties"):
                names = set(props) if isinstance(props, dict) else set()
                closed = names if closed is None else closed & names
        types = {"integer" if t == "number" and branches.integer_only else t for t in branches.types}
        if values is not None:
            types = {_type_of(v) for v in values}
        return {"types": types, "values": values, "required": required, "consts": consts, "closed": closed}

    def _conditional(self, parts: list[Part], owner: Part) -> Expr:
        """if/then/else as (if ∧ then) ∪ (¬if ∧ else), where ¬if is one of the shapes `not` handles."""
        rest = [Part(p.schema, p.pointer, p.base, p.skip | {"if", "then", "else"}) if p is owner else p for p in parts]
        cond = owner.sub(owner.get("if"), "if")
        then = [owner.sub(owner.get("then"), "then")] if owner.has("then") else []
        other = [owner.sub(owner.get("else"), "else")] if owner.has("else") else []
        negated = owner.sub({"not": owner.get("if")}, "if")
        return choice([self.compile(rest + [cond] + then), self.compile(rest + [negated] + other)])

    def _negate(self, part: Part, branches: _Branches, excluded: list[Any]) -> None:
        """`not` on the shapes that negate exactly: types, enum/const values, false/true."""
        inner = part.get("not")
        pointer = part.at("not")
        if inner is True or inner == {}:
            branches.types.clear()
            return
        if inner is False:
            return
        _expect(isinstance(inner, dict), "not must be a schema", pointer)
        keys = {k for k in inner if k in _VALIDATION}
        if keys == {"type"}:
            negated = _Branches()
            self._narrow_types(Part(inner, pointer, part.base), negated)
            if "number" in negated.types and not negated.integer_only:
                branches.types -= negated.types
            elif "number" in negated.types:  # not integer: numbers stay, integers go
                branches.types -= negated.types - {"number"}
                if branches.integer_only:
                    branches.types.discard("number")
                else:
                    excluded.append(("non-integer",))
            else:
                branches.types -= negated.types
            return
        if keys in ({"enum"}, {"const"}):
            values = [inner["const"]] if "const" in inner else inner["enum"]
            _expect(isinstance(values, list), "enum must be an array", pointer + "/enum")
            excluded.extend(values)
            return
        raise UnsupportedSchemaError(f"not with keywords {sorted(keys)} cannot be negated exactly", pointer)

    # ---- types -------------------------------------------------------------------------------------

    def _narrow_types(self, part: Part, branches: _Branches) -> None:
        if not part.has("type"):
            return
        declared = part.get("type")
        names = declared if isinstance(declared, list) else [declared]
        allowed: set = set()
        integer = False
        for name in names:
            _expect(name in TYPES or name == "integer", f"unknown type {name!r}", part.at("type"))
            allowed.add("number" if name == "integer" else name)
            integer = integer or name == "integer"
        if integer and "number" not in names:
            branches.integer_only = True
        branches.types &= allowed

    def _type_branch(self, t: str, parts: list[Part], branches: _Branches, excluded: list[Any]) -> Expr:
        if t == "null":
            return NEVER if any(v is None for v in excluded) else Lit("null")
        if t == "boolean":
            return choice(Lit(json.dumps(b)) for b in (True, False) if not any(v is b for v in excluded))
        if t == "number":
            return self._number(parts, branches.integer_only, excluded)
        if t == "string":
            return self.string_terminal(parts, [v for v in excluded if isinstance(v, str)])
        if any(isinstance(v, list if t == "array" else dict) for v in excluded):
            raise UnsupportedSchemaError(f"not with {t} values cannot be negated exactly", parts[0].pointer)
        return self._array(parts) if t == "array" else build_object(self, parts)

    def _number(self, parts: list[Part], integer_only: bool, excluded: list[Any]) -> Expr:
        lo: tuple[Decimal, bool] | None = None
        hi: tuple[Decimal, bool] | None = None
        multiples: list[tuple[Decimal, str]] = []

        def tighter(cur, new, upper):
            if cur is None:
                return new
            if new[0] != cur[0]:
                return new if (new[0] < cur[0]) == upper else cur
            return (cur[0], cur[1] or new[1])

        for p in parts:
            legacy_min = p.get("exclusiveMinimum") is True
            legacy_max = p.get("exclusiveMaximum") is True
            if p.has("minimum"):
                lo = tighter(lo, (_decimal(p.get("minimum"), p.at("minimum")), legacy_min), False)
            if p.has("maximum"):
                hi = tighter(hi, (_decimal(p.get("maximum"), p.at("maximum")), legacy_max), True)
            if p.has("exclusiveMinimum") and not isinstance(p.get("exclusiveMinimum"), bool):
                lo = tighter(lo, (_decimal(p.get("exclusiveMinimum"), p.at("exclusiveMinimum")), True), False)
            if p.has("exclusiveMaximum") and not isinstance(p.get("exclusiveMaximum"), bool):
                hi = tighter(hi, (_decimal(p.get("exclusiveMaximum"), p.at("exclusiveMaximum")), True), True)
            if p.has("multipleOf"):
                k = _decimal(p.get("multipleOf"), p.at("multipleOf"))
                _expect(k > 0, "multipleOf must be positive", p.at("multipleOf"))
                multiples.append((k, p.at("multipleOf")))
        pointer = parts[0].pointer if parts else ""
        if lo and hi and (lo[0] > hi[0] or (lo[0] == hi[0] and (lo[1] or hi[1]))):
            return self.never(f"minimum {lo[0]} is above maximum {hi[0]}", pointer)
        if integer_only and lo and hi:
            first = int(lo[0].to_integral_value("ROUND_FLOOR")) + 1 if lo[1] or lo[0] != int(lo[0]) else int(lo[0])
            if lo[1] and lo[0] != int(lo[0]):
                first = int(lo[0].to_integral_value("ROUND_CEILING"))
            last = int(hi[0].to_integral_value("ROUND_CEILING")) - 1 if hi[1] or hi[0] != int(hi[0]) else int(hi[0])
            if hi[1] and hi[0] != int(hi[0]):
                last = int(hi[0].to_integral_value("ROUND_FLOOR"))
            if first > last:
                return self.never(f"no integer between {lo[0]} and {hi[0]}", pointer)
        also: list[str] = []
        if lo:
            also.append(at_least(*lo))
        if hi:
            also.append(at_most(*hi))
        integral = integer_only
        for k, at in multiples:
            regex = multiple_of_regex(k, integer_only)
            if regex is None and lo and hi and (hi[0] - lo[0]) / k <= 256:
                start = (lo[0] / k).to_integral_value("ROUND_CEILING")
                stop = (hi[0] / k).to_integral_value("ROUND_FLOOR")
                regex = "(?:" + "|".join(number_literal_regex(n * k) for n in range(int(start), int(stop) + 1)) + ")"
            if regex is None:
                raise UnsupportedSchemaError(f"multipleOf {k} cannot be enforced exactly for this range", at)
            also.append(regex)
            integral = integral or k == k.to_integral_value()
        main = INTEGER_VALUE if integral else (DECIMAL if also else NUMBER)
        if self.options.max_number_digits is not None:
            bounds = [b[0] for b in (lo, hi) if b is not None]
            also.append(self._digit_cap(bounds, [k for k, _ in multiples], whole_open=len(bounds) < 2))
        exclude = tuple(number_literal_regex(v) for v in excluded if _is_number(v))
        if ("non-integer",) in excluded:
            if integral:
                return NEVER
            also.append(DECIMAL)
            exclude += (INTEGER_VALUE,)
        return Terminal(main, tuple(also), exclude)

    def _digit_cap(self, bounds: list[Decimal], multiples: list[Decimal], whole_open: bool) -> str:
        """The max_number_digits regex for a number with these bounds and multipleOf steps; the integer part
        is capped only where the bounds leave it open (`whole_open`).  The caps keep room for the first allowed
        value past each bound (at most one step away, the step being a multiple of every multipleOf) and for
        one more fraction digit than the schema's own numbers have, so a value between two exclusive bounds
        always remains."""
        cap = self.options.max_number_digits
        step = Decimal(1)
        for k in multiples:
            step *= max(k, Decimal(1))
        edge = max((abs(b) for b in bounds), default=Decimal(0)) + step
        int_digits = max(cap, len(str(int(edge)))) if whole_open else None
        frac = max((max(0, -d.normalize().as_tuple().exponent) for d in bounds + multiples), default=-1)
        return digit_cap(int_digits, max(cap, frac + 1))

    def string_terminal(self, parts: list[Part], excluded: list[str], key_patterns: Patterns = (),
                        other_key_patterns: Patterns = ()) -> Expr:
        """The quoted-string terminal for the string keywords of `parts`, none of the `excluded` values; for
        property names also matching every pattern of `key_patterns` and none of `other_key_patterns`."""
        lo, hi = 0, None
        patterns = list(key_patterns)
        for p in parts:
            n = _count(p, "minLength")
            lo = max(lo, n) if n is not None else lo
            n = _count(p, "maxLength")
            hi = n if hi is None else (min(hi, n) if n is not None else hi)
            if p.has("pattern"):
                _expect(isinstance(p.get("pattern"), str), "pattern must be a string", p.at("pattern"))
                patterns.append((p.get("pattern"), p.at("pattern")))
            fmt = p.get("format")
            if fmt in FORMATS:
                patterns.append((format_pattern(fmt), ""))
            elif fmt is not None and self.options.strict_formats:
                raise UnsupportedSchemaError(f"format {fmt!r} is not supported", p.at("format"))
        if hi is not None and lo > hi:
            return self.never(f"minLength {lo} is above maxLength {hi}", parts[0].pointer if parts else "")
        also = tuple(pattern_regex(*pattern) for pattern in patterns)
        exclude = tuple(regex_escape(json.dumps(v, ensure_ascii=False)) for v in excluded) + tuple(
            pattern_regex(*pattern) for pattern in other_key_patterns)
        if hi is None and self.options.max_string_length is not None:
            hi = capped_length(self.options.max_string_length, lo, [src for src, _ in patterns], also, exclude)
        if lo == 0 and hi is None and also:
            return Terminal(also[0], also[1:], exclude)
        return Terminal(string_regex(lo, hi), also, exclude)

    # ---- arrays ------------------------------------------------------------------------------------

    def _array(self, parts: list[Part]) -> Expr:
        layouts = []  # per part: (prefix parts, tail part or None)
        lo, hi = 0, None
        unique = False
        for p in parts:
            legacy = isinstance(p.get("items"), list)  # before 2020-12, items as an array was prefixItems
            prefix_key, tail_key = ("items", "additionalItems") if legacy else ("prefixItems", "items")
            prefix = p.get(prefix_key) or []
            _expect(isinstance(prefix, list), f"{prefix_key} must be an array", p.at(prefix_key))
            tail = p.sub(p.get(tail_key), tail_key) if p.has(tail_key) else None
            layouts.append(([p.sub(s, prefix_key, i) for i, s in enumerate(prefix)], tail))
            n = _count(p, "minItems")
            lo = max(lo, n) if n is not None else lo
            n = _count(p, "maxItems")
            hi = n if hi is None else (min(hi, n) if n is not None else hi)
            unique = unique or p.get("uniqueItems") is True
        width = max((len(prefix) for prefix, _ in layouts), default=0)
        prefixes = [[prefix[i] if i < len(prefix) else tail for prefix, tail in layouts
                     if i < len(prefix) or tail is not None] for i in range(width)]
        rest = [tail for _, tail in layouts if tail is not None]
        pointer = parts[0].pointer if parts else ""
        if hi is not None and lo > hi:
            return self.never(f"minItems {lo} is above maxItems {hi}", pointer)
        if hi is not None:
            prefixes = prefixes[:hi]
        if unique and (hi is None or hi > 1):
            if hi is None and self.options.max_items is not None:  # a few enumerated items: capping costs little
                hi = max(self.options.max_items, lo)
            return self._unique_array(parts, prefixes, rest, lo, hi)
        positions = [self.nested(ps) for ps in prefixes]
        tail_item = self.share(self.nested(rest), pointer + "_item") if hi is None or hi > len(positions) else NEVER
        if hi is None:
            hi = self._item_cap(lo, positions, tail_item)
        return self._sequence(positions, tail_item, lo, hi, pointer)

    def _item_cap(self, lo: int, positions: list[Expr], tail_item: Expr) -> int | None:
        """The maxItems that max_items gives an array without one (never below minItems or its prefixItems),
        or None: no cap, or the capped array would outgrow _MAX_ITEM_CAP_NODES."""
        if self.options.max_items is None:
            return None
        hi = max(self.options.max_items, lo, len(positions))
        size = sum(inlined_size(p, self.rules, self._sizes) for p in positions)
        size += (hi - len(positions)) * inlined_size(tail_item, self.rules, self._sizes)
        return hi if size <= _MAX_ITEM_CAP_NODES else None

    def _sequence(self, positions: list[Expr], tail_item: Expr, lo: int, hi: int | None, pointer: str) -> Expr:
        """`[` positions..., then tail items `]`, with the item count in [lo, hi]."""
        pu = self.punct
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
            return self.never(f"no array with at least {lo} items satisfies the item schemas", pointer)
        return choice(alternatives)

    def _unique_array(self, parts, prefixes, rest, lo, hi) -> Expr:
        """uniqueItems, exact when items come from a small enumerable set (and no prefixItems)."""
        pointer = next((p.at("uniqueItems") for p in parts if p.get("uniqueItems") is True), "")
        values = self._finite_values(rest) if not prefixes else None
        if values is None or len(values) > _MAX_UNIQUE_VALUES:
            raise UnsupportedSchemaError("uniqueItems is enforced only on a few enumerable item values", pointer)
        lits = [literal(v, self.punct) for v in values]
        hi = len(values) if hi is None else min(hi, len(values))
        pu = self.punct
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
                name = self.rule_name(f"{pointer}_unique")
                self.rules[name] = body
                body = Ref(name)
            memo[mask] = body
            return body

        nonempty = choice(seq(lits[i], after(1 << i, 1)) for i in range(len(lits))) if hi >= 1 else NEVER
        alternatives = ([pu.arr_empty] if lo == 0 else []) + (
            [seq(pu.arr_open, nonempty, pu.arr_close)] if nonempty != NEVER else [])
        return choice(alternatives) if alternatives else self.never("no unique array fits the bounds", pointer)

    def _finite_values(self, parts: list[Part]) -> list[Any] | None:
        """The few values a conjunction admits, when it pins them (enum, const, boolean, null)."""
        expanded = self._expand(parts)
        if expanded is None:
            return []
        parts = expanded[0]
        if any(p.has("enum") or p.has("const") for p in parts):
            values = None
            for p in parts:
                for key in ("enum", "const"):
                    if p.has(key):
                        vals = [p.get(key)] if key == "const" else list(p.get(key))
                        values = vals if values is None else [v for v in values if
                                                              any(json_equal(v, w) for w in vals)]
            validator = self.validator(parts)
            return [v for v in values if validator.is_valid(v)]
        branches = _Branches()
        for p in parts:
            self._narrow_types(p, branches)
        if branches.types <= {"null", "boolean"} and not any(p.has(k) for p in parts for k in ("anyOf", "oneOf",
                                                                                             "not", "if")):
            return [v for t in sorted(branches.types) for v in ((None,) if t == "null" else (True, False))]
        return None


def _check_document_depth(document: Any) -> None:
    """Refuse a document nested deeper than MAX_DOCUMENT_DEPTH (without recursing itself)."""
    stack = [(document, "", 1)] if isinstance(document, (dict, list)) else []
    while stack:
        value, pointer, depth = stack.pop()
        if depth > MAX_DOCUMENT_DEPTH:
            raise UnsupportedSchemaError(f"schema nested deeper than {MAX_DOCUMENT_DEPTH} objects and arrays", pointer)
        items = value.items() if isinstance(value, dict) else enumerate(value)
        stack += [(v, f"{pointer}/{escape_token(str(k))}", depth + 1) for k, v in items if isinstance(v, (dict, list))]


def _type_of(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int) or (isinstance(value, float) and value == int(value)):
        return "integer"
    if isinstance(value, float):
        return "number"
    return {str: "string", list: "array", dict: "object"}[type(value)]


def _types_overlap(a: set, b: set) -> bool:
    def widen(s):
        return s | ({"integer"} if "number" in s else set())
    a, b = widen(a), widen(b)
    return bool(a & b) or ("number" in a and "integer" in b) or ("integer" in a and "number" in b)


def _disjoint(a: dict | None, b: dict | None) -> bool:
    """True when no instance can satisfy both signatures (sound, not complete)."""
    if a is None or b is None:
        return True
    if a["values"] is not None and b["values"] is not None:
        return not any(json_equal(v, w) for v in a["values"] for w in b["values"])
    for x, y in ((a, b), (b, a)):
        if x["values"] is not None and not any(_type_of(v) in y["types"] or (_type_of(v) == "integer" and "number"
                                                                             in y["types"]) for v in x["values"]):
            return True
    if not _types_overlap(a["types"], b["types"]):
        return True
    if a["types"] & b["types"] - {"object"} and not (a["types"] <= {"object"} or b["types"] <= {"object"}):
        return False
    # Both can only be objects from here on (or overlap only on objects): look for a discriminating key.
    if (a["types"] & b["types"]) - {"object"}:
        return False
    for name in a["required"] & b["required"]:
        if name in a["consts"] and name in b["consts"]:
            if not any(json_equal(v, w) for v in a["consts"][name] for w in b["consts"][name]):
                return True
    for x, y in ((a, b), (b, a)):
        if y["closed"] is not None and x["required"] - y["closed"]:
            return True
    return False


def compile_json_schema(schema: Any, tokenizer: Any, **options: Any) -> CompiledGrammar:
    """Compile a JSON schema (dict, bool or JSON text) for an HF tokenizer or a Vocabulary; options: see
    JsonSchemaOptions."""
    return CompiledGrammar.from_ir(json_schema_to_grammar(schema, **options), tokenizer)


def json_schema_to_grammar(schema: Any, **options: Any) -> Grammar:
    """The grammar IR for a JSON schema; raises SchemaError / UnsupportedSchemaError with a JSON pointer."""
    if isinstance(schema, (str, bytes)):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as exc:
            raise SchemaError(f"schema is not valid JSON: {exc}", "") from None
        except RecursionError:  # json's C parser recurses per level
            raise UnsupportedSchemaError(f"schema nested deeper than {MAX_DOCUMENT_DEPTH} objects and arrays",
                                         "") from None
    try:
        opts = JsonSchemaOptions(**options)
    except TypeError as exc:
        raise TypeError(f"unknown JSON schema option: {exc}") from None
    try:
        return _grammar(schema, opts)
    except RecursionError:  # the limits leave ample stack; this is for callers already deep in theirs
        raise UnsupportedSchemaError("schema nested too deeply for the stack left to compile it", "") from None


def _grammar(schema: Any, opts: JsonSchemaOptions) -> Grammar:
    """The grammar under `opts`, less the item cap where it would grow it by more than _MAX_ITEM_CAP_NODES."""
    grammar = SchemaCompiler(schema, opts).grammar()
    if opts.max_items is None:
        return grammar
    size = grammar_size(grammar)
    if size <= _MAX_ITEM_CAP_NODES:
        return grammar
    uncapped = SchemaCompiler(schema, replace(opts, max_items=None)).grammar()
    return grammar if size - grammar_size(uncapped) <= _MAX_ITEM_CAP_NODES else uncapped
