"""JSON values checked against a schema the way the compiler reads it: numbers exact, patterns ECMA-262.

JSON Schema compares numbers as the decimals a text writes, and its patterns are ECMA-262 regexes; jsonschema over
`json.loads` compares binary floats and runs Python's `re`.  Where the two readings part, an output the number and
pattern automata admit would fail a plain check: 0.07 is no multiple of 0.01 in floats (0.07 / 0.01 is
7.000000000000001), `^\\s$` matches U+FEFF in ECMA-262 only.  The readers here take numbers exactly (a float as the
decimal it prints as, which is the text a schema wrote for any number of up to 15 significant digits) and patterns
as the automata do, and read a whole document in its root's dialect, as the compiler does.
"""

from __future__ import annotations

import functools
import json
import math
import re
from decimal import Decimal, InvalidOperation
from typing import Any, Callable, Iterator

from .errors import SchemaError, UnsupportedSchemaError
from .json_schema_refs import json_pointer, rewritten
from .json_strings import ecma_search


class ExactNumber(Decimal):
    """A JSON number that is not written as an integer, exactly; it prints as its text does (jsonschema's
    messages show their numbers by repr, which would read "Decimal('2.25')")."""

    __slots__ = ()

    def __repr__(self) -> str:
        return str(self)


def exact_number(text: str) -> int | Decimal | float:
    """A JSON number's text as the value it writes: an int where written as one, else an ExactNumber (so that
    draft-04's integers, which `1.0` is not, stay apart); a float, as json.loads reads it, past Decimal's exponents."""
    if "." not in text and "e" not in text and "E" not in text:
        return int(text)
    try:
        return ExactNumber(text)
    except InvalidOperation:
        return float(text)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def exact_json(text: str | bytes) -> Any:
    """`json.loads` with exact numbers (`exact_number`), refusing NaN and Infinity (which are not JSON); raises
    ValueError as json.loads does."""
    return json.loads(text, parse_float=exact_number, parse_int=exact_number, parse_constant=_no_constant)


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


def is_multiple(x: int | Decimal, step: int | Decimal) -> bool:
    """Whether `x` is a whole multiple of `step` > 0, exactly, in time bounded by their digits: their exponents
    (1e300000 is a whole number) enter through modular powers, never as ten to the power written out."""
    if not x:
        return True
    _, digits_x, exp_x = Decimal(x).as_tuple()
    _, digits_k, exp_k = Decimal(step).as_tuple()
    mx, mk = int(Decimal((0, digits_x, 0))), int(Decimal((0, digits_k, 0)))
    shift = exp_x - exp_k
    if shift >= 0:
        return mx * pow(10, shift, mk) % mk == 0
    # mx * 10^shift over mk: mk * 10^-shift divides mx, which is below 10^len(digits_x)
    return -shift <= len(digits_x) and mx % (mk * 10 ** -shift) == 0


def multiple_of(validator: Any, step: Any, instance: Any, schema: dict) -> Iterator[Any]:
    """multipleOf (and draft-03's divisibleBy) over exact numbers, a float read as the decimal it prints as
    (jsonschema divides floats, and its Decimal remainder overflows the default precision on long numbers); an
    infinite number is no multiple."""
    from jsonschema import ValidationError

    if not validator.is_type(instance, "number") or not validator.is_type(step, "number"):
        return
    x, k = exact_value(instance), exact_value(step)
    if isinstance(x, float) or isinstance(k, float) or k <= 0 or not is_multiple(x, k):
        yield ValidationError(f"{instance!r} is not a multiple of {step!r}")


# Patterns are read as the automata read them (`ecma_search`): with Python's `re` a value could pass a check the
# grammar then fails, or the reverse (`^[^]]$`, ECMA's any character then `]`)
def _pattern_keywords(found: Callable[[str, str], bool]) -> dict[str, Callable]:
    """`pattern`, `patternProperties` and `additionalProperties` for jsonschema, finding patterns with `found`."""
    from jsonschema import ValidationError

    def pattern(validator: Any, regex: str, instance: Any, schema: dict) -> Iterator[Any]:
        if isinstance(instance, str) and not found(regex, instance):
            yield ValidationError(f"{instance!r} does not match {regex!r}")

    def pattern_properties(validator: Any, patterns: dict, instance: Any, schema: dict) -> Iterator[Any]:
        if isinstance(instance, dict):
            for regex, subschema in patterns.items():
                for key, value in instance.items():
                    if found(regex, key):
                        yield from validator.descend(value, subschema, path=key, schema_path=regex)

    def additional_properties(validator: Any, additional: Any, instance: Any, schema: dict) -> Iterator[Any]:
        if not isinstance(instance, dict):
            return
        declared, patterns = schema.get("properties", {}), schema.get("patternProperties", {})
        extras = [key for key in instance if key not in declared and not any(found(p, key) for p in patterns)]
        if additional is False and extras:
            yield ValidationError(f"additional properties {extras} are not allowed")
        elif additional is not False:
            for key in extras:
                yield from validator.descend(instance[key], additional, path=key)

    return {"pattern": pattern, "patternProperties": pattern_properties, "additionalProperties": additional_properties}


def _found_or_read_by_python(pattern: str, text: str) -> bool:
    """`ecma_search`, or Python's `re` for a pattern the compiler cannot read (an inline flag): such values were
    written by no leapgen grammar, since the compiler refuses the schema.  A pattern neither reads raises
    UnsupportedSchemaError naming it (`\\p{L}`: an ECMA-262 class neither reader knows)."""
    try:
        try:
            return ecma_search(pattern, text)
        except UnsupportedSchemaError:
            return re.search(pattern, text) is not None
    except re.error as exc:
        raise UnsupportedSchemaError(f"pattern {pattern!r} cannot be checked: {exc}") from None


def check_metaschema(schema: Any, cls: Any) -> None:
    """SchemaError, with its JSON pointer, where `schema` does not match the metaschema of validator class `cls`."""
    import jsonschema

    error = jsonschema.exceptions.best_match(cls(cls.META_SCHEMA).iter_errors(schema))
    if error is not None:
        raise SchemaError(f"schema does not match its metaschema: {error.message}", json_pointer(error.absolute_path))


def _spellings(cls: Any) -> dict[str, Callable]:
    """Keywords for what the compiler reads in a document of any dialect where `cls`'s draft reads otherwise:
    `items` as an array of schemas with `additionalItems` after them and `dependencies` (draft-07's spellings), and
    `exclusiveMinimum`/`exclusiveMaximum` as draft-04's flags beside `minimum`/`maximum` (OpenAPI 3.0's) or as
    bounds of their own (which the compiler's derived schemas write in a draft-04 document too)."""
    import jsonschema

    mine, draft7, draft4 = cls.VALIDATORS, jsonschema.Draft7Validator.VALIDATORS, jsonschema.Draft4Validator.VALIDATORS
    out: dict[str, Callable] = {}
    if "additionalItems" not in mine:
        def items(validator: Any, value: Any, instance: Any, schema: dict) -> Iterator[Any]:
            return (draft7 if isinstance(value, list) else mine)["items"](validator, value, instance, schema)
        out["items"] = items
    out["additionalItems"] = _after_item_list(draft7["additionalItems"])
    if "dependencies" not in mine:
        out["dependencies"] = draft7["dependencies"]
    for bound, flag in (("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum")):
        out[bound] = _flagged(draft7[bound], draft4[bound], flag)
        out[flag] = _numeric_only(draft7[flag])     # a number's bound in any draft (draft-04's flag: its bound's)
    return out


def _after_item_list(check: Callable) -> Callable:
    """`additionalItems`, which constrains only beside an array of `items` (jsonschema's took a boolean `items`
    for an array, and raised on its length)."""
    def keyword(validator: Any, additional: Any, instance: Any, schema: dict) -> Iterator[Any]:
        if isinstance(schema.get("items"), list):
            yield from check(validator, additional, instance, schema)
    return keyword


def _flagged(check: Callable, flag_reading: Callable, flag: str) -> Callable:
    """`minimum`/`maximum` read by `flag_reading` (draft-04's) where the schema's `flag` is a boolean, else by `check`
    (a later draft's, which leaves a numeric `flag` its own bound: draft-04's took any number there for `true`)."""
    def keyword(validator: Any, bound: Any, instance: Any, schema: dict) -> Iterator[Any]:
        return (flag_reading if isinstance(schema.get(flag), bool) else check)(validator, bound, instance, schema)
    return keyword


def _numeric_only(check: Callable) -> Callable:
    """A later draft's exclusiveMinimum/Maximum, which only a number is: a boolean is draft-04's flag, which its
    minimum/maximum read."""
    def keyword(validator: Any, bound: Any, instance: Any, schema: dict) -> Iterator[Any]:
        if not isinstance(bound, bool):
            yield from check(validator, bound, instance, schema)
    return keyword


def reading_class(cls: Any, keywords: dict[str, Callable] | None = None,
                  found: Callable[[str, str], bool] = ecma_search) -> Any:
    """jsonschema validator class `cls` reading numbers exactly, patterns as ECMA-262 (`found`) and the older
    spellings the compiler takes in any document (`_spellings`), with `keywords` added: a subschema holding a
    `$schema` of its own is read in the class's dialect still (jsonschema would take the stock class of that dialect
    there, and lose these keywords), and from draft-06 on a number written `1.0` is an integer, as an integral float
    is."""
    import jsonschema

    checker = base = cls.TYPE_CHECKER
    if base.is_type(1.0, "integer"):
        checker = base.redefine("integer", lambda types, value: base.is_type(value, "integer") or (
            isinstance(value, Decimal) and value.is_finite() and value == value.to_integral_value()))
    exact = {"multipleOf": multiple_of, "divisibleBy": multiple_of, **_pattern_keywords(found)}
    known = {name: check for name, check in exact.items() if name in cls.VALIDATORS}   # (divisibleBy: draft-03's)
    extended = jsonschema.validators.extend(cls, {**_spellings(cls), **known, **(keywords or {})},
                                            type_checker=checker)
    evolve = extended.evolve

    def in_dialect(self: Any, **changes: Any) -> Any:
        schema = changes.get("schema")
        if isinstance(schema, dict) and "$schema" in schema:
            changes["schema"] = {key: value for key, value in schema.items() if key != "$schema"}
        return evolve(self, **changes)

    extended.evolve = in_dialect
    return extended


def draft_of(dialect: Any) -> int:
    """The draft a `$schema` value names, as leapgen reads documents: 3, 4, 6 or 7 by the `draft-0N` in it (http or
    https, with or without the `#`, which jsonschema's exact-URI lookup tells apart and reads as 2020-12; draft-05,
    which changed no keyword, is draft-04), 2019 for 2019-09 (its documents read as 2020-12's: only its metaschema
    differs), else 2020."""
    if isinstance(dialect, str):
        for name, draft in (("draft-03", 3), ("draft-04", 4), ("draft-05", 4), ("draft-06", 6), ("draft-07", 7),
                            ("2019-09", 2019)):
            if name in dialect:
                return draft
    return 2020


def dialect_class(schema: Any) -> Any:
    """The jsonschema validator class for a document's dialect, the draft its root's `$schema` names (`draft_of`)."""
    import jsonschema

    draft = draft_of(schema.get("$schema") if isinstance(schema, dict) else None)
    return {3: jsonschema.Draft3Validator, 4: jsonschema.Draft4Validator, 6: jsonschema.Draft6Validator,
            7: jsonschema.Draft7Validator}.get(draft, jsonschema.Draft202012Validator)


def in_root_dialect(schema: Any) -> Any:
    """`schema` as the compiler reads a document, in its root's dialect throughout: the `$schema` of every subschema
    below the root removed (jsonschema's resolver would read such a subschema's `$id`s and anchors in its own
    dialect, where draft-04 spells `id`, and leave the `$ref`s to them unresolvable); in a draft-07 or older
    document, the 2019-09 keywords the compiler reads in any document spelled as those drafts have them for the
    resolver: an `$anchor` as a plain-name id (where the subschema has no id of its own), and `$defs` as
    `definitions` too (where there are none), whose ids and anchors the resolver looks for there only."""
    if not isinstance(schema, dict):
        return schema
    draft = draft_of(schema.get("$schema"))
    ident = "id" if draft <= 4 else "$id"

    def read(sub: dict) -> dict:
        # (an id or anchor that is no string names nothing to the compiler; jsonschema's resolver raised on it)
        out = {key: value for key, value in sub.items()
               if key != "$schema" and (isinstance(value, str) or key not in (ident, "$anchor"))}
        anchor = out.get("$anchor")
        if draft <= 7 and isinstance(anchor, str) and ident not in out:
            out[ident] = "#" + anchor
        if draft <= 7 and "$defs" in out and "definitions" not in out:
            out["definitions"] = out["$defs"]
        return out

    inner = rewritten(schema, read)
    return {"$schema": schema["$schema"], **inner} if "$schema" in schema else inner


@functools.cache
def _reading(cls: Any) -> Any:
    return reading_class(cls, found=_found_or_read_by_python)


def schema_validator(schema: Any, check_formats: bool = False) -> Any:
    """A jsonschema validator for `schema` (a dict or a boolean; its dialect by its root's `$schema`, as
    `dialect_class` tells it) reading numbers exactly and patterns as ECMA-262 regexes; formats are checked when asked
    (JSON Schema's default leaves them annotations).  Give it values from `exact_json`, or plain ones through
    `exact_value`."""
    cls = _reading(dialect_class(schema))
    return cls(in_root_dialect(exact_value(schema)), format_checker=cls.FORMAT_CHECKER if check_formats else None)
