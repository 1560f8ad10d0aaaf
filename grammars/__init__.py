"""Constraints (regex, lark grammar, JSON schema) compiled to token-level matchers."""

from __future__ import annotations

import weakref

from . import ir
from .errors import GrammarError, LarkGrammarError, RegexError, SchemaError, UnsupportedSchemaError
from .json_schema import compile_json_schema
from .lark_grammar import lark_to_ir
from .matcher import CompiledGrammar, Matcher
from .regex import regex_dfa
from .vocab import vocab_for

_REGEX_CACHE: "weakref.WeakKeyDictionary[object, dict[str, CompiledGrammar]]" = weakref.WeakKeyDictionary()


def compile_regex(pattern: str, tokenizer) -> CompiledGrammar:
    """Compile a Python-style regex (matched whole) for an HF tokenizer; raises RegexError."""
    regex_dfa(pattern)  # validate first so errors name the regex, not a grammar
    per_tokenizer = _REGEX_CACHE.setdefault(tokenizer, {})
    hit = per_tokenizer.get(pattern)
    if hit is None:
        grammar = ir.Grammar({"start": ir.Terminal(pattern)}, "start")
        hit = per_tokenizer[pattern] = CompiledGrammar.from_ir(grammar, tokenizer)
    return hit


def compile_lark(grammar_text: str, tokenizer) -> CompiledGrammar:
    """Compile a lark grammar for an HF tokenizer; raises LarkGrammarError."""
    grammar = lark_to_ir(grammar_text)
    try:
        return CompiledGrammar.from_ir(grammar, tokenizer)
    except LarkGrammarError:
        raise
    except GrammarError as e:
        raise LarkGrammarError(str(e)) from None


def compile_grammar(grammar: ir.Grammar, tokenizer) -> CompiledGrammar:
    """Compile an IR grammar for an HF tokenizer; raises GrammarError."""
    return CompiledGrammar.from_ir(grammar, tokenizer)


__all__ = [
    "CompiledGrammar", "GrammarError", "LarkGrammarError", "Matcher", "RegexError", "SchemaError",
    "UnsupportedSchemaError", "compile_grammar", "compile_json_schema", "compile_lark", "compile_regex", "ir", "vocab_for",
]
