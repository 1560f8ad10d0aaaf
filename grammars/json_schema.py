"""JSON schema -> grammar IR -> compiled grammar: the public entry points.

What cannot be enforced exactly raises UnsupportedSchemaError naming the
keyword and its JSON pointer; a malformed or unsatisfiable schema raises
SchemaError.  The translation is split by concern: json_schema_compiler
(the dispatcher over conjunctions of subschemas, and the limits),
json_schema_scalars (strings, numbers, enum/const), json_schema_arrays,
json_schema_objects, json_schema_combinators (anyOf/oneOf/not/if) and
json_schema_refs ($ref); json_schema_context holds what they share.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from .collector import collector_paused
from .errors import EmptyLanguageError, SchemaError, UnsatisfiableSchemaError, UnsupportedSchemaError
from .ir import Grammar
from .json_schema_arrays import MAX_ITEM_CAP_NODES
from .json_schema_compiler import MAX_DOCUMENT_DEPTH, MAX_SUBSCHEMA_DEPTH, MAX_SUBSCHEMAS, SchemaCompiler
from .json_schema_context import MAX_LENGTH_CAP, JsonSchemaOptions
from .json_schema_ir import grammar_size
from .matcher import CompiledGrammar

__all__ = ["MAX_DOCUMENT_DEPTH", "MAX_LENGTH_CAP", "MAX_SUBSCHEMAS", "MAX_SUBSCHEMA_DEPTH", "JsonSchemaOptions",
           "compile_json_schema", "json_schema_to_grammar", "schema_from_text"]


def compile_json_schema(schema: Any, tokenizer: Any, **options: Any) -> CompiledGrammar:
    """Compile a JSON schema (dict, bool or JSON text) for an HF tokenizer or a Vocabulary; options: see
    JsonSchemaOptions."""
    # One pause over both halves, the IR freed inside it: with the collector back on in between, the next
    # allocation ran a collection over every object of the IR (62,508 objects, 28 ms, on a Github_hard schema)
    with collector_paused():
        return _compiled(schema, tokenizer, options)


def _compiled(schema: Any, tokenizer: Any, options: dict[str, Any]) -> CompiledGrammar:
    grammar = json_schema_to_grammar(schema, **options)
    try:
        return CompiledGrammar.from_ir(grammar, tokenizer)
    except EmptyLanguageError:
        # The IR already refuses what it can see is empty, with its pointer; this is emptiness only the
        # automata show: regexes of one value that do not intersect, objects whose required members (or
        # minProperties) need such a value, or recursion that never ends.
        raise UnsatisfiableSchemaError(
            "schema is unsatisfiable: the constraints of some value admit no text (keywords of one string or number "
            "that exclude each other, an object needing a member whose value admits none, or $ref recursion with no "
            "way out)", "") from None


def json_schema_to_grammar(schema: Any, **options: Any) -> Grammar:
    """The grammar IR for a JSON schema; raises SchemaError / UnsupportedSchemaError with a JSON pointer."""
    if isinstance(schema, (str, bytes)):
        schema = schema_from_text(schema)
    try:
        opts = JsonSchemaOptions(**options)
    except TypeError as exc:
        raise TypeError(f"unknown JSON schema option: {exc}") from None
    try:
        with collector_paused():
            return _grammar(schema, opts)
    except RecursionError:  # the limits leave ample stack; this is for callers already deep in theirs
        raise UnsupportedSchemaError("schema nested too deeply for the stack left to compile it", "") from None


def schema_from_text(text: str | bytes) -> Any:
    """A schema's JSON text as a value: SchemaError where it is not JSON, UnsupportedSchemaError where it nests
    past what json's parser reads."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise SchemaError(f"schema is not valid JSON: {exc}", "") from None
    except RecursionError:  # json's C parser recurses per level
        raise UnsupportedSchemaError(f"schema nested deeper than {MAX_DOCUMENT_DEPTH} objects and arrays",
                                     "") from None


def _grammar(schema: Any, opts: JsonSchemaOptions) -> Grammar:
    """The grammar under `opts`, less the item cap where it would grow it by more than MAX_ITEM_CAP_NODES."""
    grammar = SchemaCompiler(schema, opts).grammar()
    if opts.max_items is None:
        return grammar
    size = grammar_size(grammar)
    if size <= MAX_ITEM_CAP_NODES:
        return grammar
    uncapped = SchemaCompiler(schema, replace(opts, max_items=None)).grammar()
    return grammar if size - grammar_size(uncapped) <= MAX_ITEM_CAP_NODES else uncapped
