"""Warming the compiler up: its numba kernels loaded before the first request needs them.

numba keeps the compiled kernels on disk, but a process loads each on its first call: about 0.4 s in all,
which would land in a server's first constrained request (and 10-20 ms more in the first compile or mask
that reaches a rarely used kernel).
"""

from __future__ import annotations

from typing import Any

from . import fsm, token_masks
from .json_schema import compile_json_schema
from .vocab import as_vocabulary

# What a compile and its masks can run: a pattern under a length bound (a product of automata), an excluded
# value (a difference), a long bound (counted in chunks), a number range, keys beside declared ones
_SCHEMA = {
    "type": "object",
    "properties": {"id": {"type": "string", "pattern": "^[a-z]+$", "maxLength": 40},
                   "note": {"type": "string", "maxLength": 100, "not": {"const": "x"}},
                   "count": {"type": "integer", "minimum": 1, "maximum": 500}},
    "required": ["id", "note", "count"],
    "additionalProperties": {"type": "boolean"},
}
# An enum under another keyword is filtered through jsonschema, whose import (with its metaschemas) and validator
# classes (one per draft) would otherwise land in the first such compile, and outside a server's frozen heap,
# where every full collection scans them (replaying Github_hard's instances, a median full collection took 16-18
# ms with them there and 11 ms without)
_DRAFTS = ("https://json-schema.org/draft/2020-12/schema", "http://json-schema.org/draft-07/schema#",
           "http://json-schema.org/draft-04/schema#")


def warm_up(tokenizer: Any) -> None:
    """Compile a small schema for `tokenizer` (an HF tokenizer or a Vocabulary), walk its shortest completion
    mask by mask, filter an enum under each common draft, and load the kernels only large inputs reach."""
    vocabulary = as_vocabulary(tokenizer)
    compiled = compile_json_schema(_SCHEMA, vocabulary)
    matcher = compiled.matcher()
    for token in matcher.completion_tokens() or []:
        matcher.allowed_token_ids()
        matcher.advance(token)
    for draft in _DRAFTS:
        compile_json_schema({"$schema": draft, "enum": ["a", "bb", 1], "maxLength": 1}, vocabulary)
    fsm.load_kernels(compiled.automaton.terminals[0][1])
    token_masks.load_kernels(vocabulary)
