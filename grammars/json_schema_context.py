"""What the JSON schema builders share: options, conjuncts (`Part`), keyword sets, type narrowing, and
`SchemaContext`, the view of the compiler that each builder module is handed.

The builders (scalars, arrays, objects, combinators) take a SchemaContext instead of importing the
compiler, so they depend on this module only and the compiler is the one place that ties them together.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Protocol

from .errors import AutomatonTooLargeError, SchemaError, UnsupportedSchemaError
from .ir import Expr
from .json_schema_ir import Punctuation, json_key, json_text
from .json_schema_refs import escape_token
from .json_strings import check_readable, pattern_regexes

TYPES = ("null", "boolean", "number", "string", "array", "object")

# Keywords that validate and that this front end cannot enforce exactly in any form.
UNSUPPORTED = ("unevaluatedProperties", "unevaluatedItems", "$dynamicRef", "$recursiveRef")
# Keywords that constrain instances (the rest are annotations or unknown, ignored as JSON Schema says).
VALIDATION = {"type", "enum", "const", "properties", "required", "additionalProperties", "patternProperties",
              "propertyNames", "minProperties", "maxProperties", "items", "prefixItems", "additionalItems",
              "minItems", "maxItems", "uniqueItems", "anyOf", "oneOf", "allOf", "not", "if", "then", "else",
              "minLength", "maxLength", "pattern", "format", "minimum", "maximum", "exclusiveMinimum",
              "exclusiveMaximum", "multipleOf", "dependentRequired", "dependencies", "dependentSchemas", "contains",
              "minContains", "maxContains", *UNSUPPORTED}
_CONSTRAINING = (VALIDATION | {"$ref"}) - {"enum", "const"}
STRING_KEYS = {"minLength", "maxLength", "pattern", "format"}
NUMBER_KEYS = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"}
# A keyword only the compiler writes, in the schemas it derives (JSON Schema keywords hold no NUL): the object
# holds the key "name", or else a key matching every pattern of "match", none of "avoid" and none of the names of
# "outside", whose value satisfies every part of "values" (none: any value) (the negations of `properties`,
# `patternProperties`, `propertyNames` and `additionalProperties`); its value is a list of such witnesses, "at"
# the pointer each comes from.
SOME_KEY = "\x00some key"
# Its disjunction: the object holds a key one of the listed witnesses admits, each asking for a key by name (the
# negation of `properties` by its declared keys: one object per key, but the rest of the conjunction compiled once).
ONE_KEY_OF = "\x00one key of"
# Keywords the compiler writes in the schemas it derives, whatever the document's draft: a jsonschema validator
# of an older draft reads them too (the document's own are gone, see `SchemaCompiler`).
DERIVED_KEYWORDS = ("const", "contains", "prefixItems")


# A length cap is a counter in a byte DFA (about 14 states per character of a string): longer caps would
# outgrow the automaton's budget for one terminal.
MAX_LENGTH_CAP = 1000


def key_matches(pattern: str, name: str, pointer: str) -> bool:
    """Whether the JSON key `name` matches an ECMA `pattern` (as the grammar will judge it)."""
    try:
        return pattern_regexes(pattern, pointer).matches(json_text(name))
    except AutomatonTooLargeError as exc:
        raise UnsupportedSchemaError(f"pattern {pattern!r} cannot be enforced exactly within {exc.budget}",
                                     pointer) from None


def witness_admits(witness: dict, name: str) -> bool:
    """Whether the key `name` is one `witness` asks for (see `SOME_KEY`)."""
    if "name" in witness:
        return name == witness["name"]
    return (name not in witness["outside"] and all(key_matches(r, name, witness["at"]) for r in witness["match"])
            and not any(key_matches(r, name, witness["at"]) for r in witness["avoid"]))


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
    property_order: 'schema' (the default) writes an object's declared properties in the order the
    schema lists them, as Outlines, XGrammar and llguidance do: a schema can ask for reasoning before an
    answer, and keys in a fixed order are forced tokens.  'any' accepts them in any order, each at most
    once, so that every valid instance stays reachable (scoring or checking given JSON).

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
    property_order: str = "schema"

    def __post_init__(self) -> None:
        for name in ("additional_properties", "strict_formats", "check_schema"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"JSON schema option {name} must be True or False, not {getattr(self, name)!r}")
        if self.property_order not in ("schema", "any"):
            raise ValueError("JSON schema option property_order must be 'schema' or 'any', not "
                             f"{self.property_order!r}")
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


# Not frozen, though never changed: a frozen dataclass sets each field through object.__setattr__, which made
# building one 4x slower (0.5 against 0.12 us), and a compile builds one per conjunct of each subschema it meets
@dataclass(slots=True, unsafe_hash=True)
class Part:
    """One conjunct: a subschema, where it is, its base URI, and keywords already accounted for.  A part the
    compiler derives from the schema at `pointer` (a negation, a forbidden key) names the rewrite in
    `variant`, so that parts at one pointer stay apart where conjuncts are deduplicated and memoised."""

    schema: Any
    pointer: str
    base: str
    skip: frozenset = frozenset()
    variant: str = ""

    @property
    def key(self) -> tuple:
        """What identifies the conjunct (its schema follows from these)."""
        return self.base, self.pointer, self.skip, self.variant

    def skipping(self, *keys: str) -> "Part":
        """This part with `keys` accounted for."""
        return Part(self.schema, self.pointer, self.base, self.skip | set(keys), self.variant)

    def derived(self, schema: Any, variant: str, *tokens: Any) -> "Part":
        """A schema the compiler wrote for the place `tokens` below this part, named `variant`."""
        return Part(schema, self.at(*tokens), self.base, frozenset(), f"{self.variant}/{variant}")

    def get(self, key: str, default: Any = None) -> Any:
        return default if key in self.skip or not isinstance(self.schema, dict) else self.schema.get(key, default)

    def has(self, key: str) -> bool:
        return key not in self.skip and isinstance(self.schema, dict) and key in self.schema

    def at(self, *tokens: Any) -> str:
        pointer = self.pointer  # one or two tokens nearly always: each subschema's pointer is made here
        for token in tokens:
            pointer += "/" + escape_token(token if type(token) is str else str(token))
        return pointer

    def sub(self, schema: Any, *tokens: Any) -> "Part":
        return Part(schema, self.at(*tokens), self.base, frozenset(), self.variant)


class SchemaContext(Protocol):
    """The compiler as the builders see it: its options and rules, and the way back into it for subschemas."""

    options: JsonSchemaOptions
    punct: Punctuation
    draft4: bool  # draft-04 (or -03) document: an integer is written without a fraction (1.0 is a number)
    legacy: bool  # draft-07 or older: a $ref replaces the keywords beside it
    rules: dict[str, Expr]
    sizes: dict[str, int]  # inlined_size of each rule
    chained: dict[str, bool]  # whether the automaton writes each rule out as a chain of calls (json_schema_objects)

    def compile(self, parts: list[Part]) -> Expr:
        """The IR for instances valid against every part."""

    def nested(self, parts: list[Part]) -> Expr:
        """Compile a subschema one structural level down (inside an object or array)."""

    def expand(self, parts: list[Part]) -> tuple[list[Part], bool] | None:
        """Flatten allOf and $ref into plain conjuncts (and whether a $ref was followed); None if a
        conjunct is `false`."""

    def never(self, reason: str, pointer: str) -> Expr:
        """NEVER, remembering why for the error if the whole schema ends up unsatisfiable."""

    def share(self, expr: Expr, pointer: str, own: bool = False) -> Expr:
        """`expr` as a named rule where it is worth one, so the IR stays a small DAG; equal expressions share
        one, unless `own` (a rule no other expression uses)."""

    def rule_name(self, hint: str) -> str:
        """A fresh rule name built from `hint`."""

    def validator(self, parts: list[Part]) -> Any:
        """A jsonschema validator for the conjunction of `parts` (refs resolve in this document)."""


def expect(cond: bool, message: str, pointer: str) -> None:
    if not cond:
        raise SchemaError(message, pointer)


def is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def enum_values(parts: list[Part]) -> list[Any] | None:
    """The values that every enum and const of `parts` allows, each once (JSON equality), in the order of
    the first that names them; None when no part has either keyword."""
    values: dict[Any, Any] | None = None
    for part in parts:
        for key in ("enum", "const"):
            if not part.has(key):
                continue
            candidates = [part.get(key)] if key == "const" else part.get(key)
            expect(isinstance(candidates, list), "enum must be an array", part.at(key))
            keyed: dict[Any, Any] = {}
            for i, value in enumerate(candidates):
                expect(_writable(value), f"{key} holds a value JSON cannot write (NaN or Infinity)",
                       part.at(key) if key == "const" else part.at(key, i))
                keyed.setdefault(json_key(value), value)
            values = keyed if values is None else {k: v for k, v in values.items() if k in keyed}
    return None if values is None else list(values.values())


def _writable(value: Any) -> bool:
    """Whether `value` holds no NaN or infinity (which Python's json reads, and no JSON text can hold)."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list):
        return all(map(_writable, value))
    if isinstance(value, dict):
        return all(map(_writable, value.values()))
    return True


def satisfying(ctx: SchemaContext, parts: list[Part], values: list[Any]) -> list[Any]:
    """The `values` (from `enum_values(parts)`) that satisfy the other keywords of `parts`.  They are checked
    without the enum and const lists, which would make each check as long as the enum, and not at all when
    nothing else constrains them."""
    rest = [Part({k: v for k, v in p.schema.items() if k not in ("enum", "const")}, p.pointer, p.base, p.skip,
                 p.variant + "/without enum")
            if isinstance(p.schema, dict) else p for p in parts]
    if all(p.schema is True or (isinstance(p.schema, dict) and not p.schema.keys() & _CONSTRAINING) for p in rest):
        return values
    types = _types_only(rest)
    if types is not None:   # the usual enum beside a `type`: checked here, a hundred times faster than jsonschema
        return [v for v in values if all(any(_of_type(v, name, ctx.draft4) for name in names) for names in types)]
    validator = ctx.validator(rest)
    try:
        return [v for v in values if validator.is_valid(v)]
    except UnsupportedSchemaError as exc:
        if not exc.pointer:          # (met inside jsonschema, which knows no place): named where it is written
            for part in rest:
                _check_patterns(part.schema, part.pointer)
        raise


_LISTED = frozenset({"enum", "const", "default", "examples"})                    # values, not schemas
_NAMED = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas",  # name: schema
                    "dependencies"})


def _check_patterns(schema: Any, pointer: str) -> None:
    """`check_readable` for every pattern in `schema` (values listed in it aside)."""
    if isinstance(schema, list):
        for i, item in enumerate(schema):
            _check_patterns(item, f"{pointer}/{i}")
    if not isinstance(schema, dict):
        return
    if isinstance(schema.get("pattern"), str):
        check_readable(schema["pattern"], pointer + "/pattern")
    if isinstance(schema.get("patternProperties"), dict):
        for pattern in schema["patternProperties"]:
            check_readable(pattern, f"{pointer}/patternProperties/{escape_token(pattern)}")
    for key, value in schema.items():
        if key in _NAMED and isinstance(value, dict):      # (a property may be named "enum")
            for name, sub in value.items():
                _check_patterns(sub, f"{pointer}/{escape_token(key)}/{escape_token(name)}")
        elif key not in _LISTED:
            _check_patterns(value, f"{pointer}/{escape_token(key)}")


_PYTHON_TYPES = {"null": type(None), "boolean": bool, "number": (int, float), "string": str, "array": list,
                 "object": dict}


def _types_only(parts: list[Part]) -> list[list[str]] | None:
    """The type names of each part's `type`, where `type` is the only keyword of `parts` that constrains
    instances and names JSON types only; None otherwise."""
    out = []
    for part in parts:
        if part.schema is True:
            continue
        if not isinstance(part.schema, dict) or part.schema.keys() & _CONSTRAINING - {"type"}:
            return None
        if "type" in part.schema:
            declared = part.schema["type"]
            names = declared if isinstance(declared, list) else [declared]
            if not all(isinstance(name, str) and (name in _PYTHON_TYPES or name == "integer") for name in names):
                return None
            out.append(names)
    return out


def _of_type(value: Any, name: str, draft4: bool) -> bool:
    """Whether a JSON value is of the JSON Schema type `name`, as jsonschema's validator for the draft judges it
    (an integral float is an integer after draft-04)."""
    if name == "integer":
        return is_number(value) and (isinstance(value, int) or (not draft4 and value.is_integer()))
    return isinstance(value, _PYTHON_TYPES[name]) and not (name == "number" and isinstance(value, bool))


def count_of(part: Part, key: str) -> int | None:
    """The non-negative integer keyword `key` of `part` (minItems, maxLength...), None when absent."""
    value = part.get(key)
    if value is None:
        return None
    # (the message only on failure: a hot path; 1e400 reads as infinity, which no int() takes)
    if not (is_number(value) and value >= 0 and (isinstance(value, int) or value.is_integer())):
        raise SchemaError(f"{key} must be a non-negative integer", part.at(key))
    return int(value)


@dataclass
class Branches:
    """The JSON types a conjunction admits; 'number' may be restricted to integers."""

    types: set = field(default_factory=lambda: set(TYPES))
    integer_only: bool = False


@dataclass(frozen=True)
class NotMatching:
    """An excluded ECMA pattern (from `not: {pattern}`): strings must not match it."""

    pattern: str
    pointer: str


def narrow_types(part: Part, branches: Branches) -> None:
    """Intersect `branches` with the `type` keyword of `part`."""
    if not part.has("type"):
        return
    declared = part.get("type")
    names = declared if isinstance(declared, list) else [declared]
    allowed: set = set()
    integer = False
    for name in names:
        if name not in TYPES and name != "integer":
            raise SchemaError(f"unknown type {name!r}", part.at("type"))
        allowed.add("number" if name == "integer" else name)
        integer = integer or name == "integer"
    if integer and "number" not in names:
        branches.integer_only = True
    branches.types &= allowed
