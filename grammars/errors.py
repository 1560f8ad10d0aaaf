"""Errors raised while compiling constraints; each names what is wrong and where."""

from __future__ import annotations


class GrammarError(ValueError):
    """A constraint that cannot be compiled (base class of all constraint errors)."""


class EmptyLanguageError(GrammarError):
    """A grammar that matches no string at all (its front end may know better where that comes from)."""


class RegexError(GrammarError):
    """An invalid or unsupported regex; `position` is the offset in `pattern`."""

    def __init__(self, message: str, pattern: str, position: int | None = None):
        where = f" at position {position}" if position is not None else ""
        super().__init__(f"{message}{where} in regex {pattern!r}")
        self.reason = message
        self.pattern = pattern
        self.position = position


class AutomatonTooLargeError(RegexError):
    """A regex (or an intersection of regexes) whose automaton outgrows `budget` ("20000 automaton states")."""

    def __init__(self, message: str, pattern: str, budget: str):
        super().__init__(message, pattern)
        self.budget = budget


class SchemaError(GrammarError):
    """A malformed JSON schema; `pointer` is the JSON pointer of the offending subschema."""

    def __init__(self, message: str, pointer: str = ""):
        super().__init__(f"{message} (at {pointer or '/'})")
        self.reason = message
        self.pointer = pointer


class UnsupportedSchemaError(SchemaError):
    """A valid schema keyword that leapgen cannot enforce exactly; never silently ignored."""


class UnsatisfiableSchemaError(SchemaError):
    """A well-formed JSON schema that no JSON value satisfies."""


class LarkGrammarError(GrammarError):
    """An invalid or unsupported lark grammar; `line` is 1-based when known."""

    def __init__(self, message: str, line: int | None = None):
        where = f" (line {line})" if line is not None else ""
        super().__init__(f"{message}{where}")
        self.line = line
