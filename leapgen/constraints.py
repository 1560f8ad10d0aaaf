"""Constraint specs users put on a request (`SamplingParams(constraint=...)` or `generate(..., constraint=...)`).

The engine compiles each spec once for its model's vocabulary (by `key()`); the grammar compiler is
imported on first use so that `import leapgen` stays light.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from leapgen.decoding.constraint import ConstraintSpec


@dataclass(frozen=True)
class JsonSchema:
    """Output is one JSON value valid against `schema` (a dict, a JSON string or a pydantic model class);
    `options` go to the compiler (`whitespace="flexible"|"dumps"|"compact"`, `additional_properties=False`, ...)."""

    schema: dict | str | type
    options: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict:
        """The schema as a dict."""
        if isinstance(self.schema, str):
            return json.loads(self.schema)
        if _is_pydantic_model(self.schema):
            return self.schema.model_json_schema()
        if isinstance(self.schema, dict):
            return self.schema
        raise TypeError(f"JsonSchema takes a dict, a JSON string or a pydantic model class, "
                        f"got {type(self.schema).__name__}")

    def key(self) -> tuple:
        return ("json", json.dumps(self.as_dict(), sort_keys=True), json.dumps(self.options, sort_keys=True))

    def compile(self, vocabulary):
        from leapgen.grammars import compile_json_schema

        return compile_json_schema(self.as_dict(), vocabulary, **self.options)


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


def _is_pydantic_model(value: Any) -> bool:
    return isinstance(value, type) and callable(getattr(value, "model_json_schema", None))


def load_schema(source: str) -> dict | type:
    """The schema a command-line argument names: `module:Model` or `path/to/file.py:Model` (a pydantic model
    class), else the path of a JSON Schema file.  ValueError says what is wrong with it."""
    module_name, colon, attribute = source.rpartition(":")
    if colon and module_name and attribute.isidentifier() and not Path(source).exists():
        model = getattr(_import_module(module_name), attribute, None)
        if model is None:
            raise ValueError(f"{source}: module {module_name!r} has no attribute {attribute!r}")
        if not _is_pydantic_model(model):
            raise ValueError(f"{source}: {attribute} is not a pydantic model class")
        return model
    try:
        text = Path(source).read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"{source}: cannot read it ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise ValueError(f"{source}: not UTF-8 text") from None
    try:
        schema = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{source}: not valid JSON ({exc})") from None
    except RecursionError:
        raise ValueError(f"{source}: JSON nested too deeply to read") from None
    if not isinstance(schema, (dict, bool)):
        raise ValueError(f"{source}: a JSON Schema is an object or a boolean, not {type(schema).__name__}")
    return schema


def _import_module(name: str) -> ModuleType:
    """`name` as a module: a dotted import name, or the path of a .py file."""
    if name.endswith(".py"):
        path = Path(name)
        if not path.is_file():
            raise ValueError(f"{name}: no such file")
        spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise ValueError(f"cannot import {name!r}: {exc}") from None

