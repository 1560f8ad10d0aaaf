"""Constraints (regex, lark grammar, JSON schema) compiled to token-level matchers."""

from __future__ import annotations

from typing import Any

from . import ir
from .errors import (GrammarError, LarkGrammarError, RegexError, SchemaError, UnsatisfiableSchemaError,
                     UnsupportedSchemaError)
from .json_schema import compile_json_schema
from .lark_grammar import lark_to_ir
from .matcher import CompiledGrammar, Matcher
from .regex import regex_dfa
from .vocab import Vocabulary, as_vocabulary, vocabulary_for
from .warm_up import warm_up


def compile_regex(pattern: str, tokenizer: Any) -> CompiledGrammar:
    """Compile a Python-style regex (matched whole) for an HF tokenizer or a Vocabulary; raises RegexError.  Each
    call makes a grammar of its own, as `compile_json_schema` and `compile_lark` do (its automaton and walks come
    from the memos they share: about 50 us): a grammar is used by one thread at a time, and one handed out again
    for the same pattern would be shared by callers that never knew."""
    regex_dfa(pattern)  # validate first so errors name the regex, not a grammar
    return CompiledGrammar.from_ir(ir.Grammar({"start": ir.Terminal(pattern)}, "start"), as_vocabulary(tokenizer))


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
