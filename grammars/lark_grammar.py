"""Lark grammar text -> grammar IR.

Lark's own loader parses the text and does the rewriting (`?rule`, `_rule`,
templates, `?`, `*`, `+`, `~n..m`, `%import common.*`), leaving plain BNF rules
over named terminals.  Those become IR rules: string terminals are literals,
regex terminals are Terminals (with their flags), direct left recursion (which
lark produces for repetitions) is rewritten as iteration, and `%ignore`d
terminals may appear between any two symbols and around the whole text.
The language is the character-level one (as lark's Earley `dynamic_complete`
lexer sees it), not the one a greedy standard lexer would impose: a regexp
terminal may end wherever its regex can, except that one with a lazy
quantifier ends at its first possible end, as lark's lexer ends it.  One
difference: lark matches an `%ignore`d terminal greedily, here it may end
wherever it can (a `//` comment followed by code on its line is admitted).
"""

from __future__ import annotations

import functools
import re

from . import ir
from .errors import LarkGrammarError, RegexError
from .regex import FirstEnds, check_group_depth, laziness, regex_dfa

# common.ESCAPED_STRING uses a lookbehind; this is the same set of tokens without one
# (a quoted run of non-newline characters, backslash escapes, no unescaped inner quote)
_ESCAPED_STRING = r'"(?:[^"\\\n]|\\[^\n])*"'
_FLAGS = {"i", "m", "s", "x", "u"}
MAX_NESTING = 64  # (...), [...] and {...} inside each other: lark's loader recurses per level
# comments, strings and /regexes/ (whose parentheses are groups, checked as such), and brackets
_LEXEMES = re.compile(r'//[^\n]*|"(?:\\.|[^"\\\n])*"|/(?!/)((?:\\.|[^/\\])+)/|[(\[{]|[)\]}]', re.DOTALL)


@functools.cache
def _lark_escaped_string_pattern() -> str:
    from lark import Lark

    lk = Lark("start: ESCAPED_STRING\n%import common.ESCAPED_STRING", parser="earley", lexer="dynamic")
    return next(t.pattern.value for t in lk.terminals if t.name == "ESCAPED_STRING")


def _line_of(text: str, name: str) -> int | None:
    """1-based line where `name` is first defined (or else first used)."""
    defs = re.compile(rf"^\s*[?!_]*{re.escape(name.lstrip('?!'))}\s*(\{{[^}}]*\}})?\s*(\.\s*-?\d+\s*)?:", re.M)
    m = defs.search(text) or re.search(rf"\b{re.escape(name)}\b", text)
    return text.count("\n", 0, m.start()) + 1 if m else None


def _first_use(text: str, name: str) -> int | None:
    """1-based line of the first use of `name` on the right of a definition."""
    for k, line in enumerate(text.splitlines(), 1):
        body = line.split(":", 1)[1] if ":" in line else line
        if re.search(rf"(?<![\w.]){re.escape(name)}\b", body):
            return k
    return None


def _check_nesting(text: str) -> None:
    """Refuse brackets nested deeper than MAX_NESTING and regexes nested too deeply, before lark
    (whose loader and regex compiler recurse) reads the text."""
    depth = 0
    for m in _LEXEMES.finditer(text):
        try:
            if m.group(1) is not None:
                check_group_depth(m.group(1))
            elif m.group() in ("(", "[", "{"):
                depth += 1
                if depth > MAX_NESTING:
                    raise LarkGrammarError(f"brackets nested deeper than {MAX_NESTING}")
            elif m.group() in (")", "]", "}"):
                depth -= 1
        except (RegexError, LarkGrammarError) as e:
            raise LarkGrammarError(str(e), text.count("\n", 0, m.start()) + 1) from None


# the grammars that ship inside lark; any other %import reads a file (a relative one from the folder of the
# `__main__` script): a server would open files a request names
_BUNDLED = ("common", "lark", "python", "unicode")
# anywhere, not only at a line's start: lark's lexer also takes \r, \f and \v before a statement and a backslash
# that continues a line (a %import inside a string literal is refused too, needlessly but safely)
_IMPORT = re.compile(r"%import(?:\s|\\)*((?:[.\w]|[ \t\f\v]|\\\r?\n)*)")    # (lark takes `common . x . X` too)
_COMMENT_LINE = re.compile(r"^[ \t]*//[^\n]*", re.M)


def check_imports(text: str) -> None:
    """Refuse an %import of anything but a rule of lark's own grammars (`common.NUMBER`, `common (A, B)`), naming
    its line; lines that are only a comment may mention one."""
    stripped = _COMMENT_LINE.sub("", text)     # (its newlines kept: the line numbers stay the text's)
    for m in _IMPORT.finditer(stripped):
        path = re.sub(r"[\s\\]+", "", m.group(1))
        module = path.split(".")
        if module[0] not in _BUNDLED or len(module) > 2:    # ("" first: a relative import; a.b.c: a file a/b.lark)
            raise LarkGrammarError(f"%import {path}: only lark's own grammars ({', '.join(_BUNDLED)}) can be "
                                   "imported; write the rules into the grammar", stripped.count("\n", 0, m.start()) + 1)


def _load(text: str):
    from lark import Lark
    from lark.exceptions import GrammarError as LarkError
    from lark.exceptions import LarkError as AnyLarkError
    from lark.exceptions import UnexpectedInput

    if not isinstance(text, str):
        raise LarkGrammarError(f"a lark grammar must be a str, not {type(text).__name__}")
    if not re.sub(r"//[^\n]*", "", text).strip():
        raise LarkGrammarError("the grammar is empty")
    _check_nesting(text)
    check_imports(text)
    try:
        return Lark(text, parser="earley", lexer="dynamic")
    except UnexpectedInput as e:
        raise LarkGrammarError(f"invalid lark grammar: {str(e).strip().splitlines()[0]}", e.line) from None
    except LarkError as e:
        message = str(e).strip().splitlines()[0]
        undefined = re.search(r"(Rule|Terminal) '([^']+)' used but not defined", message)
        if undefined:
            kind, name = undefined.group(1).lower(), undefined.group(2)
            raise LarkGrammarError(f"undefined {kind} {name!r}", _first_use(text, name)) from None
        m = re.search(r"(?:NonTerminal|Terminal)\('([^']+)'\)", message)
        line = _line_of(text, m.group(1)) if m else None
        m2 = re.search(r"at line (\d+)", message)
        raise LarkGrammarError(f"invalid lark grammar: {message}", int(m2.group(1)) if m2 else line) from None
    except (AnyLarkError, AssertionError, OSError) as e:     # (lark asserts, or fails to open, where an import fails)
        raise LarkGrammarError(f"invalid lark grammar: {str(e).strip().splitlines()[0]}") from None
    except _REGEX_ERRORS as e:  # a /regexp/ that lark's regex module cannot compile (it compiles every terminal)
        found = _bad_regexp(text)
        if found is None:
            raise LarkGrammarError(f"invalid regular expression: {e}") from None
        raise LarkGrammarError(f"invalid regular expression {found[0]}: {found[1] or e}", found[2]) from None


def _regex_errors() -> tuple[type[Exception], ...]:
    try:
        import regex
    except ImportError:     # (lark falls back on `re`)
        return (re.error,)
    return (re.error, regex.error)


_REGEX_ERRORS = _regex_errors()
# a /regexp/ literal and its flags (outside comments and strings, which `_LEXEMES` steps over)
_REGEXP_FLAGS = re.compile(r"[a-z]*")


def _bad_regexp(text: str) -> tuple[str, str, int] | None:
    """The first /regexp/flags of `text` that does not compile, what is wrong where that is a flag, and its line."""
    for m in _LEXEMES.finditer(text):
        if m.group(1) is None:
            continue
        flags = _REGEXP_FLAGS.match(text, m.end()).group()
        line = text.count("\n", 0, m.start()) + 1
        unknown = sorted(set(flags) - _FLAGS)
        if unknown:
            return f"/{m.group(1)}/{flags}", f"unknown flag {', '.join(map(repr, unknown))}", line
        try:
            re.compile(f"(?{flags}){m.group(1)}" if flags else m.group(1))
        except (re.error, ValueError, OverflowError):
            return f"/{m.group(1)}/{flags}", "", line
    return None


def _terminal(name: str, pattern, text: str) -> ir.Expr:
    flags = set(pattern.flags)
    unknown = flags - _FLAGS
    if unknown:
        raise LarkGrammarError(f"terminal {name} uses unsupported regex flags {sorted(unknown)}", _line_of(text, name))
    if type(pattern).__name__ == "PatternStr":
        if not flags:
            return ir.Lit(pattern.value)
        source = re.escape(pattern.value)
    else:
        # lark's ESCAPED_STRING, alone or inlined into a larger terminal (`VALUE: INT | ESCAPED_STRING`)
        source = pattern.value.replace(_lark_escaped_string_pattern(), f"(?:{_ESCAPED_STRING})")
    if flags:
        source = f"(?{''.join(sorted(flags))}:{source})"
    try:
        regex_dfa(source)
    except RegexError as e:
        raise LarkGrammarError(f"terminal {name}: {e}", _line_of(text, name)) from None
    kind = laziness(source)
    if kind == "mixed":
        raise LarkGrammarError(f"terminal {name}: a lazy quantifier beside greedy choices (a greedy quantifier, "
                               "alternatives that may both go on) ends where Python's regex engine prefers, which no "
                               "automaton here follows exactly: make its choices all lazy, or none",
                               _line_of(text, name))
    # lark's lexer ends a lazy regex at its first possible end (`/".*?"/` at the first closing quote)
    return ir.Terminal(source, (FirstEnds(source),)) if kind == "first" else ir.Terminal(source)


def lark_to_ir(text: str) -> ir.Grammar:
    """The IR of a lark grammar (raises LarkGrammarError naming the line when known)."""
    lk = _load(text)
    terminals = {}
    for t in lk.terminals:
        if t.pattern is None:
            raise LarkGrammarError(f"declared terminal {t.name} has no definition", _line_of(text, t.name))
        terminals[t.name] = _terminal(t.name, t.pattern, text)
    ignored = [terminals[name] for name in lk.ignore_tokens if name in terminals]
    gap = ir.Repeat(ir.Choice(tuple(ignored)), 0, None) if ignored else None

    def symbol(sym) -> ir.Expr:
        if sym.is_term:
            if sym.name not in terminals:
                raise LarkGrammarError(f"undefined terminal {sym.name}", _line_of(text, sym.name))
            return terminals[sym.name]
        return ir.Ref(sym.name)

    def spaced(symbols) -> tuple[ir.Expr, ...]:
        out: list[ir.Expr] = []
        for k, sym in enumerate(symbols):
            if k and gap is not None:
                out.append(gap)
            out.append(symbol(sym))
        return tuple(out)

    alternatives: dict[str, list] = {}
    for rule in lk.rules:
        alternatives.setdefault(rule.origin.name, []).append(rule.expansion)
    rules: dict[str, ir.Expr] = {}
    for name, expansions in alternatives.items():
        bases, tails = [], []
        for exp in expansions:
            if exp and not exp[0].is_term and exp[0].name == name:
                # direct left recursion `a: a x | y` is `a: y x*`
                tail = spaced(exp[1:])
                tails.append(ir.Seq(((gap,) if gap is not None and tail else ()) + tail))
            else:
                bases.append(ir.Seq(spaced(exp)))
        if not bases:
            raise LarkGrammarError(f"rule {name} only refers to itself and matches nothing", _line_of(text, name))
        body: ir.Expr = ir.Choice(tuple(bases)) if len(bases) > 1 else bases[0]
        if tails:
            body = ir.Seq((body, ir.Repeat(ir.Choice(tuple(tails)), 0, None)))
        rules[name] = body
    start = lk.options.start[0] if isinstance(lk.options.start, list) else lk.options.start
    if start not in rules:
        raise LarkGrammarError(f"the start rule {start!r} is not defined")
    if gap is not None:
        top = "__leapgen_start"
        rules[top] = ir.Seq((gap, ir.Ref(start), gap))
        start = top
    return ir.Grammar(rules, start)

