"""Warming the compiler up: its numba kernels loaded, and the token walks every long string shares taken, before
the first request needs them.

numba keeps the compiled kernels on disk, but a process loads each on its first call: about 0.4 s in all,
which would land in a server's first constrained request (and 10-20 ms more in the first compile or mask
that reaches a rarely used kernel).  The walks inside a long string's chunk (about 0.1 s on cl100k) would land
in the first masks of the first such string, 5-11 ms each.
"""

from __future__ import annotations

from typing import Any

from . import fsm, token_masks
from .json_schema import compile_json_schema
from .json_schema_scalars import CHUNK
from .vocab import Vocabulary, as_vocabulary

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
    mask by mask, filter an enum under each common draft, load the kernels only large inputs reach, and take the
    masks of a long string's chunk."""
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
    _walk_a_chunk(vocabulary)


def _walk_a_chunk(vocabulary: Vocabulary) -> None:
    """Take a mask at every character of a chunk of a long string: a length bound past one chunk counts the string in
    chunks of CHUNK characters, and every bound shares the chunk's automaton, whose positions within a dozen
    characters of its end walk the whole vocabulary when first met (5-11 ms each, once per process)."""
    quote, char = vocabulary.spell(b'"'), vocabulary.spell(b"a")
    if quote is None or char is None or len(quote) != 1 or len(char) != 1:
        return      # a vocabulary without these tokens: its first long strings walk these as they come
    matcher = compile_json_schema({"type": "string", "maxLength": 4 * CHUNK}, vocabulary).matcher()
    for token in quote + char * (CHUNK + 1):
        matcher.allowed_token_ids()
        matcher.advance(token)
