"""JSON values checked against a schema the way the compiler reads it: numbers exact, patterns ECMA-262.

JSON Schema compares numbers as the decimals a text writes, and its patterns are ECMA-262 regexes; jsonschema over
`json.loads` compares binary floats and runs Python's `re`.  Where the two readings part, an output the number and
pattern automata admit would fail a plain check: 0.07 is no multiple of 0.01 in floats (0.07 / 0.01 is
7.000000000000001), `^\\s$` matches U+FEFF in ECMA-262 only.  The readers here take numbers exactly (a float as the
decimal it prints as, which is the text a schema wrote for any number of up to 15 significant digits) and patterns
as the automata do, so the check and the compiler agree.
"""

from __future__ import annotations

import functools
import json
import math
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from typing import Any, Iterator

from .json_strings import ecma_search

# past these decimal exponents a number is read as json.loads reads it (a float, possibly infinite): Decimal's
# arithmetic would slow to a crawl on them, and no bound of a schema reaches so far
_EXACT_EXPONENTS = 4000


def exact_number(text: str) -> int | Decimal | float:
    """A JSON number's text as the value it writes: integral values as int (what jsonschema takes for an
    integer), others as Decimal."""
    try:
        value = Decimal(text)
    except InvalidOperation:      # an exponent beyond even Decimal's range
        return float(text)
    if value and not -_EXACT_EXPONENTS < value.adjusted() < _EXACT_EXPONENTS:
        return float(text)
    return int(value) if value == value.to_integral_value() else value


def exact_json(text: str | bytes) -> Any:
    """`json.loads` with exact numbers (`exact_number`); raises ValueError as json.loads does."""
    return json.loads(text, parse_float=exact_number, parse_int=exact_number)


def exact_value(value: Any) -> Any:
    """A Python value's floats as the exact numbers they print as, within lists and dicts (a schema or an instance
    loaded with plain json.loads)."""
    if isinstance(value, float):
        return exact_number(repr(value)) if math.isfinite(value) else value
    if isinstance(value, dict):
        return {key: exact_value(item) for key, item in value.items()}
    if isinstance(value, list):
        return [exact_value(item) for item in value]
    return value


def multiple_of(validator: Any, step: Any, instance: Any, schema: dict) -> Iterator[Any]:
    """multipleOf over exact numbers, a float read as the decimal it prints as (jsonschema divides floats, and its
    Decimal remainder overflows the default precision on long numbers); an infinite number is no multiple."""
    from jsonschema import ValidationError

    if not validator.is_type(instance, "number") or not validator.is_type(step, "number"):
        return
    x, k = exact_value(instance), exact_value(step)
    if isinstance(x, float) or isinstance(k, float) or not k or Fraction(x) % Fraction(k):
        yield ValidationError(f"{instance!r} is not a multiple of {step}")


def ecma_pattern(validator: Any, pattern: str, instance: Any, schema: dict) -> Iterator[Any]:
    from jsonschema import ValidationError

    if isinstance(instance, str) and not ecma_search(pattern, instance):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


def ecma_pattern_properties(validator: Any, patterns: dict, instance: Any, schema: dict) -> Iterator[Any]:
    if isinstance(instance, dict):
        for pattern, subschema in patterns.items():
            for key, value in instance.items():
                if ecma_search(pattern, key):
                    yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def ecma_additional_properties(validator: Any, additional: Any, instance: Any, schema: dict) -> Iterator[Any]:
    from jsonschema import ValidationError

    if not isinstance(instance, dict):
        return
    declared, patterns = schema.get("properties", {}), schema.get("patternProperties", {})
    extras = [key for key in instance if key not in declared and not any(ecma_search(p, key) for p in patterns)]
    if additional is False and extras:
        yield ValidationError(f"additional properties {extras} are not allowed")
    elif additional is not False:
        for key in extras:
            yield from validator.descend(instance[key], additional, path=key)


# the keywords jsonschema's validator classes are extended with, for exact numbers and ECMA patterns
EXACT_KEYWORDS = {"multipleOf": multiple_of, "pattern": ecma_pattern, "patternProperties": ecma_pattern_properties,
                  "additionalProperties": ecma_additional_properties}


@functools.cache
def _reading(cls: Any) -> Any:
    import jsonschema

    return jsonschema.validators.extend(cls, EXACT_KEYWORDS)


def schema_validator(schema: Any) -> Any:
    """A jsonschema validator for `schema` (a dict or a boolean, its dialect by `$schema`, Draft 2020-12 without
    one) that reads numbers exactly and patterns as ECMA-262 regexes and checks formats; give it values from
    `exact_json`, or plain ones through `exact_value`."""
    import jsonschema

    cls = _reading(jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
                   if isinstance(schema, dict) else jsonschema.Draft202012Validator)
    return cls(exact_value(schema), format_checker=cls.FORMAT_CHECKER)
