"""Constraint specs users put on a request (`SamplingParams(constraint=...)` or `generate(..., constraint=...)`).

The engine compiles each spec once for its model's vocabulary (by `key()`); the grammar compiler is
imported on first use so that `import leapgen` stays light.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

from leapgen.decoding.constraint import ConstraintSpec
from leapgen.text_files import parse_json


@dataclass(frozen=True)
class JsonSchema:
    """Output is one JSON value valid against `schema` (a dict, a boolean, a JSON string or a pydantic model class);
    `options` go to the compiler (`whitespace="flexible"|"dumps"|"compact"`, `additional_properties=False`, ...)."""

    schema: dict | bool | str | type
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.options, dict):
            raise TypeError(f"JsonSchema options must be a dict of compiler options (such as {{'whitespace': "
                            f"'dumps'}}), got {type(self.options).__name__}")

    def as_dict(self) -> dict:
        """The schema as a dict (`true`, which every value satisfies, as {}; `false` as {"not": {}})."""
        if isinstance(self.schema, str):     # (read as the compiler reads a schema's text)
            from leapgen.grammars.json_schema import schema_from_text

            schema = schema_from_text(self.schema)
        else:
            schema = self.schema
        if _is_pydantic_model(schema):
            return _with_pydantic_formats(model_json_schema(schema))
        if isinstance(schema, bool):
            return {} if schema else {"not": {}}
        if isinstance(schema, dict):
            return schema
        held = f"a JSON string holding {type(schema).__name__}" if isinstance(self.schema, str) else (
            type(schema).__name__)
        raise TypeError(f"JsonSchema takes a dict, a boolean, a JSON string of one or a pydantic model class, "
                        f"got {held}")

    def key(self) -> tuple:
        # the schema's own key order: properties are generated in it (two schemas listing them in two orders
        # must not share a grammar), and enum or const objects are spelled in it
        options = self._compiler_options()
        try:
            return ("json", json.dumps(self.as_dict()), json.dumps(options, sort_keys=True))
        except RecursionError:   # (json's encoder recurses per level: the compiler's depth check names where)
            from leapgen.grammars.json_schema_compiler import check_document_depth

            check_document_depth(self.as_dict())
            raise

    def compile(self, vocabulary):
        from leapgen.grammars import compile_json_schema

        return compile_json_schema(self.as_dict(), vocabulary, **self._compiler_options())

    def check(self) -> None:
        """Raise what the compiler refuses in the schema itself (a keyword, with its JSON pointer), without a
        vocabulary: before a model loads."""
        from leapgen.grammars.json_schema import json_schema_to_grammar

        json_schema_to_grammar(self.as_dict(), **self._compiler_options())

    def _compiler_options(self) -> dict[str, Any]:
        """`options`, where a pydantic model also forbids undeclared keys: pydantic would drop them, so
        generating them only wastes tokens (a model with `extra="allow"` says so in its schema, which wins).
        The key holds these, so `JsonSchema(Model)` never shares a compiled grammar with its bare dict."""
        if _is_pydantic_model(self.schema):
            return {"additional_properties": False, **self.options}
        return self.options


@dataclass(frozen=True)
class Regex:
    """Output matches `pattern` (Python regex syntax) as a whole; the empty pattern means empty output."""

    pattern: str

    def key(self) -> tuple:
        return ("regex", self.pattern)

    def compile(self, vocabulary):
        from leapgen.grammars import compile_regex

        return compile_regex(self.pattern, vocabulary)


@dataclass(frozen=True)
class Grammar:
    """Output is a sentence of the lark grammar `lark_text` (start rule `start`)."""

    lark_text: str

    def key(self) -> tuple:
        return ("lark", self.lark_text)

    def compile(self, vocabulary):
        from leapgen.grammars import compile_lark

        return compile_lark(self.lark_text, vocabulary)


Constraint = JsonSchema | Regex | Grammar


def as_constraint(value: Any) -> ConstraintSpec | None:
    """A constraint spec from what a user passed: a spec (ours, or any object with the ConstraintSpec
    protocol's `key` and `compile`) as is, a pydantic model class as its JSON schema."""
    if _is_pydantic_model(value):
        return JsonSchema(value)
    if value is None or isinstance(value, ConstraintSpec):
        return value
    raise TypeError(f"constraint must be leapgen.JsonSchema, leapgen.Regex, leapgen.Grammar or a pydantic model "
                    f"class, got {type(value).__name__}")


def pydantic_model(spec: Any) -> type | None:
    """The pydantic model class a constraint validates into (a model class or `JsonSchema(Model)`), else None."""
    schema = spec.schema if isinstance(spec, JsonSchema) else spec
    return schema if _is_pydantic_model(schema) else None


def _is_pydantic_model(value: Any) -> bool:
    return isinstance(value, type) and callable(getattr(value, "model_json_schema", None))


def model_json_schema(model: type) -> dict:
    """A pydantic model class's JSON Schema; ValueError naming the model where pydantic cannot write one
    (a field of an arbitrary Python type, under `arbitrary_types_allowed`)."""
    try:
        return model.model_json_schema()
    except Exception as exc:         # PydanticInvalidForJsonSchema (a RuntimeError), or the model's own hooks
        reason = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        raise ValueError(f"pydantic model {model.__name__} has no JSON Schema: {reason}") from None


@functools.cache
def _pydantic_format_patterns() -> dict[str, str]:
    """Patterns for the `format` names pydantic writes and validates but JSON Schema does not define (unknown
    formats are annotations, so `pydantic.UUID4` fields got any string and `.parsed` came back None)."""
    from leapgen.grammars.json_strings import FORMATS

    hexes = "[0-9a-fA-F]"
    patterns = {f"uuid{v}": f"^{hexes}{{8}}-{hexes}{{4}}-{v}{hexes}{{3}}-[89abAB]{hexes}{{3}}-{hexes}{{12}}$"
                for v in range(1, 9)}     # (the RFC 4122 variant: Python's UUID has no version without it)
    patterns["ipvanyaddress"] = f"^(?:{FORMATS['ipv4']}|{FORMATS['ipv6']})$"
    return patterns


def _with_pydantic_formats(schema: Any) -> Any:
    """`schema` (a pydantic model's) with a `pattern` beside each `format` pydantic alone knows (see
    `_pydantic_format_patterns`), where the subschema has none of its own."""
    patterns = _pydantic_format_patterns()

    def walk(value: Any) -> Any:
        if isinstance(value, list):
            return [walk(item) for item in value]
        if not isinstance(value, dict):
            return value
        out = {key: walk(item) for key, item in value.items()}
        name = out.get("format")    # (not a string where "format" names a property, in a `properties` map)
        if isinstance(name, str) and name in patterns and "pattern" not in out:
            out["pattern"] = patterns[name]
        return out

    return walk(schema)


def is_valid(spec: Constraint, text: str) -> bool:
    """Whether `text` satisfies `spec` by the spec's own standard, apart from the automata that generate it:
    jsonschema for a JSON schema (formats checked; numbers read exactly and patterns as ECMA-262 regexes, as JSON
    Schema has them and the compiler reads them: 0.07 is a multiple of 0.01), `re.fullmatch` for a regex, a lark
    parse for a grammar.  A malformed spec raises what compiling it would (SchemaError with its JSON pointer,
    RegexError, LarkGrammarError), where jsonschema, `re` or lark would raise their own or read it as something else
    (`properties: 3` as no constraint); a pattern no regex reader parses raises UnsupportedSchemaError, and a text
    nested past what Python's recursion limit lets jsonschema check (about 200 levels at its default) ValueError."""
    return _validator(spec.key())(text)


@functools.lru_cache(maxsize=16)
def _validator(key: tuple) -> Callable[[str], bool]:
    """The check of the spec with this key, built once: a lark parser or a schema validator takes a while,
    and a sweep checks hundreds of samples against one spec."""
    kind, source = key[0], key[1]
    if kind == "regex":
        try:
            pattern = re.compile(source)
        except re.error as exc:
            from leapgen.grammars import RegexError

            raise RegexError(f"invalid regex: {exc.msg}", source, exc.pos) from None
        return lambda text: pattern.fullmatch(text) is not None
    if kind == "lark":
        from lark import Lark, LarkError

        from leapgen.grammars import LarkGrammarError
        from leapgen.grammars.lark_grammar import check_imports

        check_imports(source)   # (as the compiler: any other %import would read a file)
        # the language leapgen's grammar admits: a regexp terminal may end wherever its regex can (lark's default
        # lexer takes its longest match, so `/\w+/ "_id"` would refuse `user_id`)
        try:
            parser = Lark(source, start="start", parser="earley", lexer="dynamic_complete")
        except Exception as exc:    # lark's own errors, and its regex module's for a terminal's regex
            reason = str(exc).strip() or type(exc).__name__
            raise LarkGrammarError(f"invalid lark grammar: {reason.splitlines()[0]}", getattr(exc, "line", None)) \
                from None

        def parses(text: str) -> bool:
            try:
                parser.parse(text)
            except LarkError:
                return False
            return True
        return parses
    if kind == "json":
        from leapgen.grammars.json_validation import exact_json, schema_validator

        from leapgen.grammars.json_schema_compiler import check_document_depth

        schema = json.loads(source)
        check_document_depth(schema)    # (deeper, jsonschema's readers recurse past the stack: unsupported there too)
        _refuse_malformed(schema, json.loads(key[2]))
        validator = schema_validator(schema, check_formats=True)

        def checked(text: str) -> bool:
            try:
                value = exact_json(text)
            except ValueError:      # not JSON
                return False
            return validator.is_valid(value)

        def validates(text: str) -> bool:
            try:
                return checked(text)
            except RecursionError:
                # jsonschema recurses a few frames per level of the text (and per $ref it follows): past Python's
                # recursion limit no answer can be given, and raising that limit risks the C stack (a segfault on
                # a thread's smaller one)
                raise ValueError(f"too deep for jsonschema to check within Python's recursion limit "
                                 f"({sys.getrecursionlimit()}): the text nests {_nesting(text)} arrays and objects, "
                                 "and each $ref of the schema followed adds to its depth") from None
        return validates
    raise TypeError(f"is_valid takes leapgen.JsonSchema, Regex or Grammar, not a spec of kind {kind!r}")


def _nesting(text: str) -> int:
    """How deep `text` nests arrays and objects (brackets outside strings)."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def _refuse_malformed(schema: Any, options: dict[str, Any]) -> None:
    """Raise the SchemaError the compiler's reading of `schema` under `options` meets, unless it only says that the
    schema cannot be enforced exactly or that nothing satisfies it (which the check still answers).  A draft-03
    document is held to its metaschema instead: the compiler does not read that draft's own keywords
    (`type: "any"`)."""
    from leapgen.grammars import UnsatisfiableSchemaError, UnsupportedSchemaError
    from leapgen.grammars.json_schema import json_schema_to_grammar
    from leapgen.grammars.json_validation import check_metaschema, dialect_class, draft_of

    if isinstance(schema, dict) and draft_of(schema.get("$schema")) == 3:
        check_metaschema(schema, dialect_class(schema))     # (the compiler would refuse its keywords)
        return
    try:
        json_schema_to_grammar(schema, **options)
    except (UnsupportedSchemaError, UnsatisfiableSchemaError):
        pass


_RESPONSE_FORMAT_TYPES = ("json_schema", "json_object", "text")
_JSON_SCHEMA_FIELDS = ("name", "schema", "strict", "description")


def from_response_format(value: Any) -> ConstraintSpec | None:
    """The constraint an OpenAI-style `response_format` asks for: `{"type": "json_schema", "json_schema":
    {"name": ..., "schema": {...}, "strict": bool}}` (strict: no undeclared properties), `{"type": "json_object"}`
    (any JSON object), `{"type": "text"}` or None (free text, so no constraint: None), or a pydantic model class.
    ValueError names the field that is wrong (`response_format.json_schema.schema: required`)."""
    if value is None or _is_pydantic_model(value):
        return as_constraint(value)
    if not isinstance(value, dict):
        raise ValueError(f"response_format: expected an object like {{'type': 'json_schema', ...}} or a pydantic "
                         f"model class, got {type(value).__name__}")
    kind = _required(value, "type", "response_format")
    if kind not in _RESPONSE_FORMAT_TYPES:
        raise ValueError(f"response_format.type: expected 'json_schema', 'json_object' or 'text', got {kind!r}")
    _refuse_unknown_keys(value, ("type", "json_schema") if kind == "json_schema" else ("type",), "response_format")
    if kind == "json_object":
        return JsonSchema({"type": "object"})
    if kind == "json_schema":
        return _json_schema_format(_required(value, "json_schema", "response_format"))
    return None


def _json_schema_format(spec: Any) -> JsonSchema:
    """The spec of `response_format.json_schema`, checked field by field as OpenAI's API does."""
    where = "response_format.json_schema"
    _expect_type(spec, dict, "an object", where)
    _refuse_unknown_keys(spec, _JSON_SCHEMA_FIELDS, where)
    name = _required(spec, "name", where)
    if not isinstance(name, str) or not name:
        raise ValueError(f"{where}.name: expected a non-empty string, got {name!r}")
    schema = _required(spec, "schema", where)
    _expect_type(schema, dict, "an object (a JSON Schema)", f"{where}.schema")
    _expect_type(spec.get("description", ""), str, "a string", f"{where}.description")
    strict = spec.get("strict")
    if strict is not None:                        # OpenAI takes null for its default, false
        _expect_type(strict, bool, "true or false", f"{where}.strict")
    return JsonSchema(schema, options={"additional_properties": False} if strict else {})


def _required(obj: dict, key: str, where: str) -> Any:
    if key not in obj:
        raise ValueError(f"{where}.{key}: required")
    return obj[key]


def _expect_type(value: Any, expected: type, description: str, where: str) -> None:
    if not isinstance(value, expected):
        raise ValueError(f"{where}: expected {description}, got {json_type_name(value)}")


def json_type_name(value: Any) -> str:
    """A value as a JSON reader would name it (the user wrote JSON, not Python)."""
    names = {type(None): "null", bool: "boolean", int: "number", float: "number", str: "string", list: "array",
             dict: "object"}
    return names.get(type(value), type(value).__name__)


def _refuse_unknown_keys(obj: dict, allowed: tuple[str, ...], where: str) -> None:
    unknown = [key for key in obj if key not in allowed]
    if unknown:
        raise ValueError(f"{where}: unknown key{'s' if len(unknown) > 1 else ''} "
                         f"{', '.join(map(repr, unknown))} (expected {', '.join(map(repr, allowed))})")


def load_schema(source: str) -> dict | type:
    """The schema a command-line argument names: `module:Model` or `path/to/file.py:Model` (a pydantic model
    class), else the path of a JSON Schema file.  ValueError says what is wrong with it."""
    module_name, colon, attribute = source.rpartition(":")
    if colon and module_name and attribute.isidentifier() and not Path(source).exists():
        model = getattr(_import_module(module_name, source), attribute, None)
        if model is None:
            raise ValueError(f"{source}: module {module_name!r} has no attribute {attribute!r}")
        if not _is_pydantic_model(model):
            raise ValueError(f"{source}: {attribute} is not a pydantic model class")
        try:
            model_json_schema(model)     # now, so a model with no schema fails before any model loads
        except ValueError as exc:
            raise ValueError(f"{source}: {exc}") from None
        return model
    try:
        text = Path(source).read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"{source}: cannot read it ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise ValueError(f"{source}: not UTF-8 text") from None
    return checked_schema(source, parse_json(source, text))


def checked_schema(source: str, schema: Any) -> dict | bool:
    """`schema`, read from `source`, where it can be a JSON Schema at all (ValueError naming `source` if not)."""
    if not isinstance(schema, (dict, bool)):
        raise ValueError(f"{source}: a JSON Schema is an object or a boolean, not {type(schema).__name__}")
    return schema


def _import_module(name: str, source: str) -> ModuleType:
    """`name` as a module: a dotted import name, or the path of a .py file.  ValueError when it cannot be
    found, or its code fails while it runs (a SyntaxError, an exception at import), naming `source`."""
    spec = None
    if name.endswith(".py"):
        path = Path(name)
        if not path.is_file():
            raise ValueError(f"{name}: no such file")
        spec = importlib.util.spec_from_file_location(path.stem, path)
    try:
        if spec is None:
            return importlib.import_module(name)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    except Exception as exc:         # the user's module runs here, and may raise anything
        if spec is None and isinstance(exc, ImportError):
            raise ValueError(f"cannot import {name!r}: {exc}") from None
        raise ValueError(f"{source}: importing it failed: {type(exc).__name__}: {exc}") from None
