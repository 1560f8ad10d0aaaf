"""Statistics for the distribution tests (no scipy in the test dependencies)."""

from __future__ import annotations

import math

import numpy as np

Z_999 = 3.090232  # standard normal quantile at 0.999


def chi_square_critical(df: int) -> float:
    """Upper 0.1% point of chi-square(df), Wilson-Hilferty approximation (accurate to ~1% for df >= 3)."""
    return df * (1 - 2 / (9 * df) + Z_999 * math.sqrt(2 / (9 * df))) ** 3


def homogeneity_statistic(a: np.ndarray, b: np.ndarray, min_expected: float = 5.0) -> tuple[float, int]:
    """Chi-square statistic and degrees of freedom that counts `a` and `b` (same cells) come from one
    distribution; cells too rare to test are pooled into one."""
    total = a + b
    expected_a, expected_b = total * a.sum() / total.sum(), total * b.sum() / total.sum()
    rare = np.minimum(expected_a, expected_b) < min_expected
    a = np.append(a[~rare], a[rare].sum())
    b = np.append(b[~rare], b[rare].sum())
    total = a + b
    keep = total > 0
    a, b, total = a[keep], b[keep], total[keep]
    expected_a, expected_b = total * a.sum() / total.sum(), total * b.sum() / total.sum()
    statistic = float(((a - expected_a) ** 2 / expected_a + (b - expected_b) ** 2 / expected_b).sum())
    return statistic, len(total) - 1
