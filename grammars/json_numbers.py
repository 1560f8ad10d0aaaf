"""JSON number terminals: numeric ranges and multipleOf as regexes over the number's text.

A bounded number is the intersection of the plain JSON number regex with one
regex per bound (the IR's `Terminal.also`), so each bound is a one-sided
comparison built digit by digit.  Bounded numbers are written without an
exponent (`1e-05` is refused when a bound applies): that keeps every regex
exact and small.
"""

from __future__ import annotations

from decimal import Decimal

INTEGER = r"-?(?:0|[1-9][0-9]*)"
#: Integers in JSON Schema are mathematical: 2.0 is one.
INTEGER_VALUE = INTEGER + r"(?:\.0+)?"
NUMBER = INTEGER + r"(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?"
DECIMAL = INTEGER + r"(?:\.[0-9]+)?"


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
    for length in range(len(str(lo)), top + 1):
        first = max(lo, 10 ** (length - 1) if length > 1 else 0)
        last = 10**length - 1 if hi is None else min(hi, 10**length - 1)
        if first <= last:
            parts.append(_same_length(str(first).zfill(length), str(last)))
    if hi is None:
        parts.append(f"[1-9][0-9]{{{top},}}")
    return _alt(parts)


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


def multiple_of_regex(k: Decimal, integral: bool, max_alternatives: int = 200) -> str | None:
    """Numbers that are multiples of k, when that is a regular language this module can write exactly.

    Handles k = 10**-e (at most e fraction digits that are not zero) and integer
    k dividing a power of ten (a set of allowed final digits).  Returns None
    otherwise.
    """
    if k <= 0:
        raise ValueError("multipleOf must be positive")
    k = k.normalize()
    if k == k.to_integral_value():
        n = int(k)
        m = next((m for m in range(12) if 10**m % n == 0), None)
        if m is None or 10**m // n > max_alternatives:
            return None
        if m == 0:
            return INTEGER_VALUE
        # Loose on leading zeros on purpose: it is intersected with INTEGER_VALUE.
        tails = [str(r).zfill(m) for r in range(0, 10**m, n)]
        short = [str(r) for r in range(0, 10 ** (m - 1), n)]
        return "-?" + _alt(["[0-9]*" + _alt(tails)] + short) + r"(?:\.0+)?"
    if integral:
        return None
    digits, exponent = k.as_tuple().digits, k.as_tuple().exponent
    if digits == (1,) and exponent < 0:
        return INTEGER + rf"(?:\.[0-9]{{1,{-exponent}}}0*)?"
    return None
