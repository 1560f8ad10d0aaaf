"""Constraint specs users pass to `generate(..., constraint=...)`; compiled once per tokenizer and cached."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from leapgen.grammars import compile_json_schema, compile_lark, compile_regex


@dataclass(frozen=True)
class JsonSchema:
    """Output is one JSON value valid against `schema` (a dict or a JSON string); `options` go to the compiler
    (`whitespace="flexible"|"dumps"|"compact"`, `additional_properties=False`, ...)."""

    schema: dict | str
    options: dict[str, Any] = field(default_factory=dict)

    def key(self) -> tuple:
        schema = json.loads(self.schema) if isinstance(self.schema, str) else self.schema
        return ("json", json.dumps(schema, sort_keys=True), json.dumps(self.options, sort_keys=True))

    def compile(self, tokenizer):
        schema = json.loads(self.schema) if isinstance(self.schema, str) else self.schema
        return compile_json_schema(schema, tokenizer, **self.options)


@dataclass(frozen=True)
class Regex:
    """Output matches `pattern` (Python regex syntax) as a whole."""

    pattern: str

    def key(self) -> tuple:
        return ("regex", self.pattern)

    def compile(self, tokenizer):
        return compile_regex(self.pattern, tokenizer)


@dataclass(frozen=True)
class Grammar:
    """Output is a sentence of the lark grammar `lark_text` (start rule `start`)."""

    lark_text: str

    def key(self) -> tuple:
        return ("lark", self.lark_text)

    def compile(self, tokenizer):
        return compile_lark(self.lark_text, tokenizer)


Constraint = JsonSchema | Regex | Grammar


class ConstraintCache:
    """Compiled constraints of one tokenizer, by spec: a pipeline over many documents compiles each schema once."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self._compiled: dict[tuple, Any] = {}

    def get(self, constraint: Constraint | None):
        """The compiled grammar of `constraint` (None for no constraint)."""
        if constraint is None:
            return None
        if not isinstance(constraint, (JsonSchema, Regex, Grammar)):
            raise TypeError(f"constraint must be leapgen.JsonSchema, leapgen.Regex or leapgen.Grammar, "
                            f"got {type(constraint).__name__}")
        key = constraint.key()
        if key not in self._compiled:
            self._compiled[key] = constraint.compile(self.tokenizer)
        return self._compiled[key]
