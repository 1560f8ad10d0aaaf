"""Constraints (regex, lark grammar, JSON schema) compiled to token-level matchers."""

from __future__ import annotations

import weakref
from typing import Any

from . import ir
from .errors import (GrammarError, LarkGrammarError, RegexError, SchemaError, UnsatisfiableSchemaError,
                     UnsupportedSchemaError)
from .json_schema import compile_json_schema
from .lark_grammar import lark_to_ir
from .matcher import CompiledGrammar, Matcher
from .regex import regex_dfa
from .vocab import Vocabulary, as_vocabulary, vocabulary_for
from .walk_cache import make_room
from .warm_up import warm_up

# the grammars of the regexes compiled last, per vocabulary, the most recently used last: each holds its caches of
# masks, so a process compiling a new regex for every request must not keep them all
_REGEX_CACHE: "weakref.WeakKeyDictionary[object, dict[str, CompiledGrammar]]" = weakref.WeakKeyDictionary()
_REGEXES_KEPT = 64


def compile_regex(pattern: str, tokenizer: Any) -> CompiledGrammar:
    """Compile a Python-style regex (matched whole) for an HF tokenizer or a Vocabulary; raises RegexError."""
    regex_dfa(pattern)  # validate first so errors name the regex, not a grammar
    vocabulary = as_vocabulary(tokenizer)
    per_vocabulary = _REGEX_CACHE.setdefault(vocabulary, {})
    hit = per_vocabulary.pop(pattern, None)
    if hit is None:
        hit = CompiledGrammar.from_ir(ir.Grammar({"start": ir.Terminal(pattern)}, "start"), vocabulary)
    make_room(per_vocabulary, _REGEXES_KEPT)     # (a hit was popped above: it goes back as the most recent)
    per_vocabulary[pattern] = hit
    return hit


def compile_lark(grammar_text: str, tokenizer: Any) -> CompiledGrammar:
    """Compile a lark grammar for an HF tokenizer or a Vocabulary; raises LarkGrammarError."""
    grammar = lark_to_ir(grammar_text)
    try:
        return CompiledGrammar.from_ir(grammar, tokenizer)
    except LarkGrammarError:
        raise
    except GrammarError as e:
        raise LarkGrammarError(str(e)) from None


def compile_grammar(grammar: ir.Grammar, tokenizer: Any) -> CompiledGrammar:
    """Compile an IR grammar for an HF tokenizer or a Vocabulary; raises GrammarError."""
    return CompiledGrammar.from_ir(grammar, tokenizer)


__all__ = [
    "CompiledGrammar", "GrammarError", "LarkGrammarError", "Matcher", "RegexError", "SchemaError",
    "UnsatisfiableSchemaError", "UnsupportedSchemaError", "Vocabulary", "compile_grammar", "compile_json_schema",
    "compile_lark", "compile_regex", "ir", "vocabulary_for", "warm_up",
]
