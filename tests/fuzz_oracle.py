"""The fuzzer's oracle and layouts: which instances are valid, and the text the compiler expects for them.

- `Oracle`: jsonschema's Draft 2020-12 over exact decimals, with the compiler's documented semantics
  where they are narrower than Python's (ECMA patterns, leapgen's email subset);
- `canonical()` + `dump()`: an instance laid out as the compiler expects (properties in schema order,
  extra keys last, no exponents, no negative zero);
- `invalid_candidates()`: mutations of a valid instance, for the oracle to sort.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from typing import Any, Iterator

import jsonschema
from hypothesis import strategies as st
from hypothesis_jsonschema import from_schema

from fuzz_schemas import EMAIL, resolve

# Text layouts each whitespace option must accept ("indent" is json.dumps(indent=2): one line break and
# at most 20 spaces per level, so only for shallow values).
LAYOUTS = {"flexible": ("dumps", "compact", "indent"), "dumps": ("dumps",), "compact": ("compact",)}
MAX_INDENT_DEPTH = 9


# ---- the oracle: jsonschema, exact decimals, ECMA patterns ------------------------------------------

def ecma_search(pattern: str, text: str) -> bool:
    """Whether ECMA-262 finds `pattern` in `text`: `$` only at the very end, `\\d` ASCII digits (Python's `$`
    also matches before a final newline and its `\\d` any Unicode digit).  Enough for PATTERNS."""
    return re.search(re.sub(r"(?<!\\)\$", r"\\Z", pattern), text, re.ASCII) is not None


def _ecma_pattern(validator, pattern: str, instance: Any, schema: dict) -> Iterator[jsonschema.ValidationError]:
    if isinstance(instance, str) and not ecma_search(pattern, instance):
        yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r} (ECMA)")


def _ecma_pattern_properties(validator, patterns: dict, instance: Any,
                             schema: dict) -> Iterator[jsonschema.ValidationError]:
    if validator.is_type(instance, "object"):
        for pattern, subschema in patterns.items():
            for name, value in instance.items():
                if ecma_search(pattern, name):
                    yield from validator.descend(value, subschema, path=name, schema_path=pattern)


def _ecma_additional_properties(validator, additional: Any, instance: Any,
                                schema: dict) -> Iterator[jsonschema.ValidationError]:
    """additionalProperties over the keys that no `properties` name and no `patternProperties` pattern (ECMA)
    takes."""
    if not validator.is_type(instance, "object"):
        return
    patterns = schema.get("patternProperties", {})
    extras = [name for name in instance if name not in schema.get("properties", {})
              and not any(ecma_search(pattern, name) for pattern in patterns)]
    for name in extras:
        yield from validator.descend(instance[name], additional, path=name)



def _exact_multiple_of(validator, factor: Any, instance: Any, schema: dict) -> Iterator[jsonschema.ValidationError]:
    """multipleOf in exact arithmetic: jsonschema's `%` needs more than the default 28 decimal digits for
    long numbers (DivisionImpossible) and cannot mix a float (inf, past 1e4000) with a Decimal."""
    if not validator.is_type(instance, "number"):
        return
    finite = not isinstance(instance, float) or math.isfinite(instance)
    if not finite or Fraction(instance) % Fraction(factor):
        yield jsonschema.ValidationError(f"{instance!r} is not a multiple of {factor}")


STANDARD_FORMATS = jsonschema.Draft202012Validator.FORMAT_CHECKER
STRICT_FORMATS = jsonschema.FormatChecker()
STRICT_FORMATS.checks("email")(lambda s: not isinstance(s, str) or EMAIL.fullmatch(s) is not None)
StandardValidator = jsonschema.validators.extend(jsonschema.Draft202012Validator, {"multipleOf": _exact_multiple_of})
EcmaValidator = jsonschema.validators.extend(StandardValidator, {
    "pattern": _ecma_pattern, "patternProperties": _ecma_pattern_properties,
    "additionalProperties": _ecma_additional_properties})


class DuplicateKey(ValueError):
    pass


def number_value(text: str) -> int | Decimal | float:
    """A JSON number exactly: integral values as int (jsonschema's integers), others as Decimal; past
    1e4000 or below 1e-4000 (only where the schema sets no bound) a float, as json.loads reads it."""
    try:
        value = Decimal(text)
    except InvalidOperation:          # an exponent beyond even Decimal's range
        return float(text)
    if not -4000 < value.adjusted() < 4000 and value:
        return float(text)
    return int(value) if value == value.to_integral_value() else value


def _object(pairs: list[tuple[str, Any]]) -> dict:
    out = {}
    for key, value in pairs:
        if key in out:
            raise DuplicateKey(f"duplicate key {key!r}")
        out[key] = value
    return out


def parse(text: str) -> Any:
    """JSON text to a value with exact numbers; DuplicateKey if an object repeats a key."""
    return json.loads(text, parse_float=number_value, parse_int=number_value, object_pairs_hook=_object)


def exact(value: Any) -> Any:
    """`value` with its floats as the exact numbers their shortest repr says (as its JSON text would)."""
    if isinstance(value, float):
        return number_value(repr(value))
    if isinstance(value, Decimal):
        return number_value(str(value))
    if isinstance(value, dict):
        return {key: exact(sub) for key, sub in value.items()}
    if isinstance(value, list):
        return [exact(sub) for sub in value]
    return value


def same(a: Any, b: Any) -> bool:
    """JSON equality as JSON Schema has it: 1 == 1.0, but true != 1."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(map(same, a, b))
    if isinstance(a, (dict, list)) or isinstance(b, (dict, list)):
        return False
    return a == b


class Oracle:
    """Validity over exact numbers, three ways: `strict` is what the compiler promises to admit (ECMA
    patterns, leapgen's email subset), `ecma` what it must refuse (ECMA patterns, jsonschema's formats),
    `standard` jsonschema's (multipleOf in exact arithmetic); strict-valid implies ecma-valid implies
    standard-valid here."""

    def __init__(self, schema: dict):
        self.schema = exact(schema)
        self.strict = EcmaValidator(self.schema, format_checker=STRICT_FORMATS)
        self.ecma = EcmaValidator(self.schema, format_checker=STANDARD_FORMATS)
        self.standard = StandardValidator(self.schema, format_checker=STANDARD_FORMATS)

    def is_valid(self, value: Any) -> bool:
        """Must be reachable."""
        return self.strict.is_valid(value)

    def is_invalid(self, value: Any) -> bool:
        """Must never be accepted (an email only leapgen's subset refuses is neither)."""
        return not self.ecma.is_valid(value)

    def error(self, value: Any) -> str | None:
        """Why `value` fails the strict or the standard validator (None when it passes both)."""
        for validator in (self.strict, self.standard):
            error = jsonschema.exceptions.best_match(validator.iter_errors(value))
            if error is not None:
                return f"{error.message} (at /{'/'.join(map(str, error.absolute_path))})"
        return None

    def branch_accepts(self, schema: Any, value: Any) -> bool:
        return self.strict.evolve(schema=schema).is_valid(value)


# ---- layout: the text the compiler expects ----------------------------------------------------------

VALIDATION_EXCEPT_ALLOF = {"type", "enum", "const", "properties", "required", "additionalProperties",
                            "patternProperties", "propertyNames", "minProperties", "maxProperties", "items",
                            "prefixItems", "minItems", "maxItems", "uniqueItems", "anyOf", "oneOf", "not", "if",
                            "then", "else", "minLength", "maxLength", "pattern", "format", "minimum", "maximum",
                            "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "dependentRequired",
                            "dependencies", "additionalItems", "contains", "minContains", "maxContains"}


@dataclass(frozen=True)
class _Part:
    schema: Any
    skip: frozenset = frozenset()

    def has(self, key: str) -> bool:
        return key not in self.skip and key in self.schema

    def get(self, key: str, default: Any = None) -> Any:
        return self.schema[key] if self.has(key) else default


class _Layout:
    """Puts object keys where the compiler's grammar has them.  The compiler flattens `$ref` and `allOf`
    into conjuncts depth first (a schema's own keywords, then its `$ref`, then each `allOf` member),
    splits on the first `anyOf`/`oneOf` (the chosen branch's conjuncts come last), writes an `enum`/
    `const` value as the schema spells it, lays an object out as its declared keys in conjunct order
    (`properties`, then `required`) followed by the other keys, and an array item that matches `contains` as
    the conjunction of its item schemas and `contains`."""

    def __init__(self, oracle: Oracle):
        self.oracle = oracle
        self.root = oracle.schema

    def expand(self, parts: list[_Part]) -> list[_Part]:
        out: list[_Part] = []
        stack = list(reversed(parts))
        while stack:
            part = stack.pop()
            if not isinstance(part.schema, dict):
                continue
            pending = []
            if part.has("$ref"):
                pending.append(_Part(resolve(self.root, part.get("$ref"))))
            if part.has("allOf"):
                pending += [_Part(sub) for sub in part.get("allOf")]
            if any(k in VALIDATION_EXCEPT_ALLOF for k in part.schema if k not in part.skip):
                out.append(_Part(part.schema, part.skip | {"allOf", "$ref"}))
            stack.extend(reversed(pending))
        return out

    def value(self, value: Any, schemas: list[Any]) -> Any:
        parts = self.expand([_Part(s) for s in schemas])
        while True:
            enumerated = [p for p in parts if p.has("enum") or p.has("const")]
            if enumerated:
                return self._enum_value(value, enumerated[0])
            split = self._split(parts, value)
            if split is None:
                break
            parts = split
        if isinstance(value, dict):
            return self._object(value, parts)
        if isinstance(value, list):
            return [self.value(item, self._item_schemas(parts, i) + self._contains_schemas(parts, item))
                    for i, item in enumerate(value)]
        return value

    @staticmethod
    def _enum_value(value: Any, part: _Part) -> Any:
        candidates = [part.get("const")] if part.has("const") else part.get("enum")
        return next((candidate for candidate in candidates if same(candidate, value)), value)

    def _split(self, parts: list[_Part], value: Any) -> list[_Part] | None:
        """Parts with the first anyOf/oneOf replaced by the first branch `value` satisfies (if/then/else by
        `if` and `then` where it satisfies `if`, else by `else`)."""
        for i, part in enumerate(parts):
            if part.has("if"):
                rest = parts[:i] + [_Part(part.schema, part.skip | {"if", "then", "else"})] + parts[i + 1:]
                taken = ["if", "then"] if self.oracle.branch_accepts(part.get("if"), value) else ["else"]
                return rest + self.expand([_Part(part.get(k)) for k in taken if part.has(k)])
            for keyword in ("anyOf", "oneOf"):
                branches = part.get(keyword)
                if branches is None:
                    continue
                rest = parts[:i] + [_Part(part.schema, part.skip | {keyword})] + parts[i + 1:]
                chosen = next((b for b in branches if self.oracle.branch_accepts(b, value)), branches[0])
                return rest + self.expand([_Part(chosen)])
        return None

    def _object(self, value: dict, parts: list[_Part]) -> dict:
        order: list[str] = []
        for part in parts:
            order += [name for name in part.get("properties", {}) if name not in order]
        for part in parts:
            order += [name for name in part.get("required", []) if name not in order]
        keys = [name for name in order if name in value] + [name for name in value if name not in order]
        return {name: self.value(value[name], self._member_schemas(parts, name)) for name in keys}

    @staticmethod
    def _member_schemas(parts: list[_Part], name: str) -> list[Any]:
        out = []
        for part in parts:
            properties = part.get("properties", {})
            hits = [sub for pattern, sub in part.get("patternProperties", {}).items() if ecma_search(pattern, name)]
            out += [properties[name]] if name in properties else []
            out += hits
            if name not in properties and not hits and part.has("additionalProperties"):
                out.append(part.get("additionalProperties"))
        return out

    def _contains_schemas(self, parts: list[_Part], item: Any) -> list[Any]:
        """The `contains` schemas `item` matches: the compiler writes a matching item as the conjunction, where
        the `contains` counts anything (`minContains: 0` alone constrains nothing, and is left out)."""
        return [part.get("contains") for part in parts
                if part.has("contains") and (part.get("minContains", 1) != 0 or part.has("maxContains"))
                and self.oracle.branch_accepts(part.get("contains"), item)]

    @staticmethod
    def _item_schemas(parts: list[_Part], index: int) -> list[Any]:
        out = []
        for part in parts:
            prefix = part.get("prefixItems", [])
            if index < len(prefix):
                out.append(prefix[index])
            elif part.has("items"):
                out.append(part.get("items"))
        return out


def canonical(value: Any, oracle: Oracle) -> Any:
    """`exact(value)` with its object keys in the compiler's order and enum values as the schema spells
    them (best effort for an invalid value)."""
    return _Layout(oracle).value(exact(value), [oracle.schema])


def shuffled(value: Any, rng: Any) -> Any:
    """`value` with the keys of every object in a random order (for property_order="any")."""
    if isinstance(value, dict):
        keys = list(value)
        rng.shuffle(keys)
        return {k: shuffled(value[k], rng) for k in keys}
    if isinstance(value, list):
        return [shuffled(v, rng) for v in value]
    return value


def _number_text(value: int | Decimal) -> str:
    if isinstance(value, int):
        return str(value)
    text = format(value, "f")           # bounded numbers are written without an exponent
    return text[1:] if text.startswith("-") and value == 0 else text    # nor as negative zero


def depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max(map(depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(depth, value), default=0)
    return 0


def dump(value: Any, layout: str, level: int = 0) -> str:
    """JSON text of an exact value: layout "compact" (",", ":"), "dumps" (", ", ": ") or "indent" (2)."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, (int, Decimal)):
        return _number_text(value)
    if isinstance(value, dict):
        items = [json.dumps(k, ensure_ascii=False) + (":" if layout == "compact" else ": ") + dump(v, layout, level + 1)
                 for k, v in value.items()]
        return _container("{", items, "}", layout, level)
    return _container("[", [dump(v, layout, level + 1) for v in value], "]", layout, level)


def _container(open_: str, items: list[str], close: str, layout: str, level: int) -> str:
    if not items:
        return open_ + close
    if layout == "indent":
        inner, outer = "\n" + "  " * (level + 1), "\n" + "  " * level
        return open_ + inner + ("," + inner).join(items) + outer + close
    return open_ + ("," if layout == "compact" else ", ").join(items) + close


def layouts_for(whitespace: str, value: Any) -> tuple[str, ...]:
    return tuple(lay for lay in LAYOUTS[whitespace] if lay != "indent" or depth(value) <= MAX_INDENT_DEPTH)


# ---- mutations: invalid instances -----------------------------------------------------------------

_REPLACEMENTS = [None, True, 0, -1, 1.5, "", "x" * 12, "2024-13-01", [], {}, {"zz": 1}, [None, None, None, None]]


def _paths(value: Any, path: tuple = ()) -> Iterator[tuple]:
    yield path
    if isinstance(value, dict):
        for key, sub in value.items():
            yield from _paths(sub, path + (key,))
    elif isinstance(value, list):
        for i, sub in enumerate(value):
            yield from _paths(sub, path + (i,))


def _get(value: Any, path: tuple) -> Any:
    for step in path:
        value = value[step]
    return value


def _set(value: Any, path: tuple, new: Any) -> Any:
    if not path:
        return new
    copy = dict(value) if isinstance(value, dict) else list(value)
    copy[path[0]] = _set(value[path[0]], path[1:], new)
    return copy


def _variants(node: Any) -> list[Any]:
    """Values near `node` that may break a constraint on it."""
    out = list(_REPLACEMENTS)
    if isinstance(node, str):
        out += [node + "x", node + "\n", node[:-1], node * 3 + "!", node.upper()]
    elif isinstance(node, (int, float, Decimal)) and not isinstance(node, bool):
        out += [node + 1, node - 1, -node - 1, node + Decimal("0.5"), node * 1000]
    elif isinstance(node, dict):
        out += [{k: v for j, (k, v) in enumerate(node.items()) if j != drop} for drop in range(len(node))]
        out += [{**node, "zz": 1}, {**node, "r": None}]
    elif isinstance(node, list):
        out += [node[:-1], node + node[-1:], node + [None], [*node, *node, *node]]
    return out


# Small scalars near the generated constraints: short strings over the patterns' letters, numbers about the bounds.
SMALL_SCALARS = st.one_of(st.text("abcqwxyzAZ019-.@ \n", max_size=8), st.integers(-100, 100),
                          st.sampled_from([0.5, -2.5, 0.001, 99.99, 1e3]))


@st.composite
def mutations(draw, value: Any) -> Any:
    """`value` with one node replaced by a nearby value (the caller keeps those the oracle rejects)."""
    path = draw(st.sampled_from(list(_paths(value))))
    return _set(value, path, draw(st.one_of(st.sampled_from(_variants(_get(value, path))), SMALL_SCALARS)))


def invalid_candidates(valid: Any) -> st.SearchStrategy:
    """Mutations of a valid instance, and arbitrary JSON values."""
    return st.one_of(mutations(valid), mutations(valid), from_schema({}))


