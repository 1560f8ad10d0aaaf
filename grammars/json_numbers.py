"""JSON number terminals: numeric ranges as regexes over the number's text, multipleOf as residue automata.

A bounded number is the intersection of the plain JSON number regex with one
regex per bound (the IR's `Terminal.also`), so each bound is a one-sided
comparison built digit by digit.  Bounded numbers are written without an
exponent (`1e-05` is refused when a bound applies): that keeps every regex
exact and small.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction

import numpy as np

from .errors import UnsupportedSchemaError
from .fsm import DFA, minimize, product
from .regex import MAX_DFA_STATES

INTEGER = r"-?(?:0|[1-9][0-9]*)"
#: Integers in JSON Schema are mathematical: 2.0 is one.
INTEGER_VALUE = INTEGER + r"(?:\.0+)?"
NUMBER = INTEGER + r"(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?"
DECIMAL = INTEGER + r"(?:\.[0-9]+)?"
#: Each number spelled one way: no exponent, no zeros ending a fraction, no -0; equal texts are then equal values.
CANONICAL = r"(?:0|-?[1-9][0-9]*)(?:\.[0-9]*[1-9])?|-0\.[0-9]*[1-9]"


def _alt(parts: list[str]) -> str:
    parts = [p for p in parts if p is not None]
    if not parts:
        return "(?!)"
    return parts[0] if len(parts) == 1 else "(?:" + "|".join(parts) + ")"


def _digit_class(lo: int, hi: int) -> str:
    return str(lo) if lo == hi else f"[{lo}-{hi}]"


def _same_length(a: str, b: str) -> str:
    """Digit strings of len(a) == len(b) between a and b inclusive (a <= b)."""
    if not a:
        return ""
    if a == "0" * len(a) and b == "9" * len(b):
        return f"[0-9]{{{len(a)}}}" if len(a) > 1 else "[0-9]"
    if a[0] == b[0]:
        return a[0] + _same_length(a[1:], b[1:])
    rest = len(a) - 1
    if a[1:] == "0" * rest and b[1:] == "9" * rest:
        return _digit_class(int(a[0]), int(b[0])) + _same_length("0" * rest, "9" * rest)
    parts = [a[0] + _same_length(a[1:], "9" * rest)]
    if int(b[0]) - int(a[0]) > 1:
        parts.append(_digit_class(int(a[0]) + 1, int(b[0]) - 1) + _same_length("0" * rest, "9" * rest))
    parts.append(b[0] + _same_length("0" * rest, b[1:]))
    return _alt(parts)


def natural_range(lo: int, hi: int | None) -> str:
    """Canonical non-negative integers in [lo, hi] (hi None: unbounded); lo >= 0."""
    if hi is not None and lo > hi:
        return "(?!)"
    parts = []
    top = len(str(hi)) if hi is not None else len(str(lo))
    whole: list[int] = []   # a run of lengths taken whole: one counted repeat, not a [0-9]{n} per length
    for length in range(len(str(lo)), top + 1):
        first = max(lo, 10 ** (length - 1) if length > 1 else 0)
        last = 10**length - 1 if hi is None else min(hi, 10**length - 1)
        if length > 1 and first == 10 ** (length - 1) and last == 10**length - 1:
            whole.append(length - 1)
            continue
        if whole:
            parts.append(_any_digits(whole[0], whole[-1]))
            whole = []
        if first <= last:
            parts.append(_same_length(str(first).zfill(length), str(last)))
    if whole:
        parts.append(_any_digits(whole[0], whole[-1]))
    if hi is None:
        parts.append(f"[1-9][0-9]{{{top},}}")
    return _alt(parts)


def _any_digits(lo: int, hi: int) -> str:
    """Numbers of 1 + lo to 1 + hi digits, no leading zero (a bound of 300 digits takes all the shorter
    lengths: written one alternative per length, their automaton would be built from 45,000 nodes)."""
    return "[1-9][0-9]" + ("" if lo == hi == 1 else f"{{{lo}}}" if lo == hi else f"{{{lo},{hi}}}")


def _frac_ge(f: str, strict: bool) -> str:
    """Non-empty digit strings F with 0.F >= 0.f (> when strict); f has no trailing zeros."""
    parts = [f[:i] + _digit_class(int(f[i]) + 1, 9) + "[0-9]*" for i in range(len(f)) if f[i] != "9"]
    parts.append(f + ("0*[1-9][0-9]*" if strict else ("[0-9]*" if f else "[0-9]+")))
    return _alt(parts)


def _frac_le(f: str, strict: bool) -> str:
    """Non-empty digit strings F with 0.F <= 0.f (< when strict); f has no trailing zeros."""
    parts = [f[:i] + _digit_class(0, int(f[i]) - 1) + "[0-9]*" for i in range(len(f)) if f[i] != "0"]
    parts += [f[:i] for i in range(1, len(f))]
    if not strict:
        parts.append(f + ("0*" if f else "0+"))
    return _alt([p for p in parts if p])


def _split(m: Decimal) -> tuple[int, str]:
    """Integer part and fraction digits (no trailing zeros) of a non-negative decimal."""
    whole = int(m)
    frac = format(m - whole, "f")
    frac = frac.split(".")[1].rstrip("0") if "." in frac else ""
    return whole, frac


def _magnitude_ge(m: Decimal, strict: bool) -> str:
    """Unsigned decimals (no exponent) >= m (> when strict), m >= 0."""
    whole, frac = _split(m)
    above = natural_range(whole + 1, None) + r"(?:\.[0-9]+)?"
    bare_ok = not frac and not strict
    at = str(whole) + r"\." + _frac_ge(frac, strict)
    return _alt([above, at] + ([str(whole)] if bare_ok else []))


def _magnitude_le(m: Decimal, strict: bool) -> str:
    """Unsigned decimals (no exponent) <= m (< when strict), m >= 0."""
    whole, frac = _split(m)
    parts = [natural_range(0, whole - 1) + r"(?:\.[0-9]+)?"] if whole > 0 else []
    if frac or not strict:
        parts.append(str(whole))
    tail = _frac_le(frac, strict)
    if tail != "(?!)":
        parts.append(str(whole) + r"\." + tail)
    return _alt(parts)


_UNSIGNED = r"(?:0|[1-9][0-9]*)(?:\.[0-9]+)?"


def at_least(bound: Decimal, strict: bool = False) -> str:
    """JSON decimals (no exponent) >= bound (> when strict)."""
    if bound > 0 or (bound == 0 and strict):
        return _magnitude_ge(abs(bound), strict)
    # bound <= 0: every non-negative number, and negatives down to |bound|.
    # "-0" is left out: json.dumps never writes it.
    negatives = "-" + _magnitude_le(-bound, strict) if bound < 0 else None
    return _alt([_UNSIGNED, negatives] if negatives else [_UNSIGNED])


def at_most(bound: Decimal, strict: bool = False) -> str:
    """JSON decimals (no exponent) <= bound (< when strict)."""
    if bound < 0 or (bound == 0 and strict):
        return "-" + _magnitude_ge(-bound, strict)
    return _alt(["-" + _UNSIGNED, _magnitude_le(bound, strict)])


def digit_cap(int_digits: int | None, frac_digits: int) -> str:
    """JSON numbers with at most `int_digits` digits before the point (None: any number) and at most
    `frac_digits` after it and in the exponent; intersected with a number terminal, it ends runaway digits."""
    whole = "[0-9]*" if int_digits is None else f"[0-9]{{0,{int_digits - 1}}}"
    return rf"-?(?:0|[1-9]{whole})(?:\.[0-9]{{1,{frac_digits}}})?(?:[eE][+-]?[0-9]{{1,{frac_digits}}})?"


@dataclass(frozen=True)
class Multiples:
    """JSON decimals (no exponent) that are whole multiples of `step` > 0, as a residue automaton: no short
    regex says "divisible by 7", but reading digits left to right while keeping the value modulo a number is
    a finite automaton.  Scaled by 10**e (e: the step's decimal places), x is a multiple of the step exactly
    when x * 10**e is an integer multiple of K = step * 10**e, so the automaton keeps the digits read so far
    modulo K and, past the point, how many of the first e fraction digits it has read; further fraction
    digits must be zeros."""

    step: Decimal

    @property
    def num_states(self) -> int:
        """States before minimisation: start, sign, a lone 0, K per integer part; then, for a whole step, the
        point and its zeros (only a multiple may go on past the point); else K per point and fraction digit
        count."""
        scale, modulus = _scaled(self.step)
        return 3 + modulus + 2 if not scale else 3 + modulus * (scale + 2)

    def dfa(self) -> DFA:
        return _multiples_dfa(self.step)

    def intersect(self, dfa: DFA, max_states: int) -> DFA:
        return product(dfa, self.dfa(), True, max_states)


def _scaled(step: Decimal) -> tuple[int, int]:
    """(e, K): the step's decimal places and the step times 10**e, an integer."""
    step = step.normalize()
    scale = max(0, -step.as_tuple().exponent)
    return scale, int(step.scaleb(scale))


@functools.lru_cache(maxsize=256)
def _multiples_dfa(step: Decimal) -> DFA:
    scale, k = _scaled(step)
    r = np.arange(k)
    integer, point = 3, 3 + k                       # state blocks: integer part, just after the point,

    def fraction(j: int) -> int:                    # after j fraction digits (1 <= j <= scale)
        return 3 + k * (1 + j)

    trans = np.full((Multiples(step).num_states, 256), -1, np.int32)
    accept = np.zeros(len(trans), bool)
    digit = ord("0")
    for start in (0, 1):
        trans[start, digit] = 2
        trans[start, digit + 1 : digit + 10] = integer + np.arange(1, 10) % k
    trans[0, ord("-")] = 1
    accept[2] = True
    for d in range(10):
        trans[integer + r, digit + d] = integer + (10 * r + d) % k
    if not scale:   # a whole step: the point follows a multiple (0 or residue 0), then zeros only
        trans[[2, integer], ord(".")] = point
        trans[[point, point + 1], digit] = point + 1
        accept[integer] = accept[point + 1] = True
        return minimize(DFA(trans, accept))
    trans[2, ord(".")] = point
    trans[integer + r, ord(".")] = point + r
    for d in range(10):
        trans[point + r, digit + d] = fraction(1) + (10 * r + d) % k
        for j in range(1, scale):
            trans[fraction(j) + r, digit + d] = fraction(j + 1) + (10 * r + d) % k
    trans[fraction(scale) + r, digit] = fraction(scale) + r   # past the step's places only zeros keep a multiple
    # each power reduced modulo K first: numpy's int64 cannot hold 10**scale (multipleOf 1e-300)
    accept[integer + r] = r * (10**scale % k) % k == 0
    for j in range(1, scale + 1):
        accept[fraction(j) + r] = r * (10 ** (scale - j) % k) % k == 0
    return minimize(DFA(trans, accept))


def multiples_of(step: Decimal, pointer: str) -> Multiples:
    """The multiples of `step` (multipleOf at `pointer`), refused where their automaton outgrows the budget."""
    multiples = Multiples(step)
    if multiples.num_states > MAX_DFA_STATES:
        raise UnsupportedSchemaError(f"multipleOf {step} cannot be enforced exactly within {MAX_DFA_STATES} automaton "
                                     "states", pointer)
    return multiples


def common_multiple(steps: list[Decimal]) -> Decimal:
    """The least positive number that is a multiple of every step: a multiple of all of them is exactly a
    multiple of it (so several multipleOf keywords make one automaton, not a product)."""
    fractions = [Fraction(step) for step in steps]
    numerator = math.lcm(*(f.numerator for f in fractions))
    denominator = math.gcd(*(f.denominator for f in fractions))
    return Decimal(numerator) / Decimal(denominator)
