"""Fidelity of a synthetic inference: confidence intervals, their overlap, deciles, combining rules.

Pure functions on numbers and numpy arrays (no database), shared by the verification server
(:mod:`sqlsdc.synth.verify`). References:

- [MR] McClure and Reiter, "Towards Providing Automated Feedback on the Quality of Inferences
  from Synthetic Datasets", J. Privacy and Confidentiality 4(1), 2012: the fidelity measure
  (eq. 1), the decile release with safety zones (§5), FM := 0.5 when a CI cannot be computed.
- Karr, Kohnen, Oganian, Reiter and Sanil, "A Framework for Evaluating the Utility of Data
  Altered to Protect Confidentiality", Am. Stat. 60(3), 2006: the interval overlap (the
  unclipped form of eq. 1, which goes negative for disjoint intervals).
- Reiter, "Inference for Partially Synthetic, Public Use Microdata Sets", Survey Methodology
  29(2), 2003: combining rules for m partially synthetic copies.
- Raghunathan, Reiter and Rubin, "Multiple Imputation for Statistical Disclosure Limitation",
  J. Official Statistics 19(1), 2003, with the non-negative variance of Reiter, "Satisfying
  Disclosure Restrictions With Synthetic Data Sets", JOS 18(4), 2002: fully synthetic copies.

Example:
    >>> round(fidelity((1.0, 3.0), (2.0, 5.0)), 6)  # digest T1: 1/4 + 1/6
    0.416667
    >>> decile(0.82), decile(1.0)
    ((0.8, 0.9), (0.9, 1.0))
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats

__all__ = [
    "Z95",
    "Combined",
    "combine_full",
    "combine_partial",
    "decile",
    "decile_interval",
    "fidelity",
    "fidelity_array",
    "normal_ci",
]

Z95 = 1.959964
"""The normal 97.5% quantile of the digest (B.2): confidential CIs are estimate ± Z95 · se."""

DEGENERATE_FM = 0.5
"""[MR] §5: when a confidence interval cannot be computed (standard error 0), FM := 0.5."""


def normal_ci(estimate: float, se: float, z: float = Z95) -> tuple[float, float]:
    """The large-sample interval estimate ± z·se ([MR] §2: the confidential CI)."""
    return estimate - z * se, estimate + z * se


def fidelity_array(low_d, high_d, low_s, high_s, *, clip_negative: bool = True) -> np.ndarray:
    """[MR] eq. 1 element-wise: FM = I/(2(U_d − L_d)) + I/(2(U_s − L_s)), I the length of
    the intersection of the confidential interval (L_d, U_d) and the synthetic one (L_s, U_s).

    ``clip_negative`` (default, [MR]): I is taken as 0 for disjoint intervals, so FM is in
    [0, 1]; without it, Karr et al.'s interval overlap, negative for disjoint intervals (the
    form [BQ] eq. 28 uses). Where either interval has zero or undefined length, FM is 0.5.
    """
    low_d, high_d, low_s, high_s = np.broadcast_arrays(
        *(np.asarray(x, dtype=float) for x in (low_d, high_d, low_s, high_s))
    )
    inter = np.minimum(high_d, high_s) - np.maximum(low_d, low_s)
    if clip_negative:
        inter = np.maximum(inter, 0.0)
    width_d, width_s = high_d - low_d, high_s - low_s
    ok = (width_d > 0) & (width_s > 0) & np.isfinite(width_d) & np.isfinite(width_s)
    with np.errstate(divide="ignore", invalid="ignore"):
        fm = inter / (2 * width_d) + inter / (2 * width_s)
    return np.where(ok, fm, DEGENERATE_FM)


def fidelity(
    confidential: tuple[float, float],
    synthetic: tuple[float, float],
    *,
    clip_negative: bool = True,
) -> float:
    """[MR] eq. 1 for one pair of intervals (see :func:`fidelity_array`).

    Example:
        >>> fidelity((1, 3), (4, 5)), fidelity((1, 3), (4, 5), clip_negative=False)
        (0.0, -0.75)
    """
    return float(fidelity_array(*confidential, *synthetic, clip_negative=clip_negative))


def _tenth(x: float) -> int:
    """⌊10x⌋ for x in [0, 1], robust to binary rounding (10 · 0.3 is 2.9999999999999996)."""
    return min(9, max(0, math.floor(round(10 * float(x), 9))))


def decile(fm: float) -> tuple[float, float]:
    """The decile holding ``fm``: [⌊10x⌋/10, ⌊10x⌋/10 + 0.1], with 1 in (0.9, 1.0) (digest
    B.2). FM values outside [0, 1] (unclipped overlaps) are clipped first."""
    k = _tenth(min(1.0, max(0.0, fm)))
    return k / 10, (k + 1) / 10


def decile_interval(values) -> tuple[float, float]:
    """[MR] §5 step 8: from the lower bound of the smallest value's decile to the upper bound of
    the largest value's decile (min .43 and max .81 give (0.4, 0.9))."""
    values = np.asarray(values, dtype=float)
    return decile(float(values.min()))[0], decile(float(values.max()))[1]


@dataclass(frozen=True, slots=True)
class Combined:
    """A combined inference from m synthetic copies: estimate, total variance, degrees of
    freedom (``inf``: normal reference) and the 95% interval."""

    estimate: float
    variance: float
    df: float
    low: float
    high: float


def _interval(q: float, t: float, df: float) -> tuple[float, float]:
    quantile = Z95 if math.isinf(df) else float(stats.t.ppf(0.975, df))
    half = quantile * math.sqrt(max(t, 0.0))
    return q - half, q + half


def _moments(q, u) -> tuple[int, float, float, float]:
    """m, q̄ = Σq/m, ū = Σu/m and b = Σ(q − q̄)²/(m − 1) of m ≥ 2 copies."""
    q, u = np.asarray(q, dtype=float), np.asarray(u, dtype=float)
    if len(q) < 2:
        raise ValueError(f"combining rules need m >= 2 copies, got {len(q)}")
    return len(q), float(q.mean()), float(u.mean()), float(q.var(ddof=1))


def combine_partial(q, u) -> Combined:
    """Reiter (2003) for m ≥ 2 partially synthetic copies (digest A.1): q̄ = Σq/m, ū = Σu/m,
    b = Σ(q − q̄)²/(m − 1), T = ū + b/m, ν = (m − 1)(1 + m·ū/b)², CI q̄ ± t_{ν,.975}·√T.
    With b = 0, ν is infinite (normal reference).

    Example (digest T2):
        >>> c = combine_partial([1.0, 1.2, 1.1], [0.04, 0.05, 0.06])
        >>> round(c.df), round(c.low, 6), round(c.high, 6)
        (512, 0.646293, 1.553707)
    """
    m, q_bar, u_bar, b = _moments(q, u)
    t = u_bar + b / m
    df = math.inf if b == 0 else (m - 1) * (1 + m * u_bar / b) ** 2
    return Combined(q_bar, t, df, *_interval(q_bar, t, df))


def combine_full(q, u, *, n_synthetic: int, n_observed: int) -> Combined:
    """Raghunathan, Reiter and Rubin (2003) for m ≥ 2 fully synthetic copies: T_f = (1 + 1/m)b
    − ū, ν_f = (m − 1)(1 − ū/((1 + 1/m)b))². T_f can be negative; then Reiter (2002)'s
    T_f* = (n_syn/n)·ū is used, with a normal reference (ν infinite).

    Example:
        >>> c = combine_full([1.0, 1.4, 0.6], [0.01, 0.01, 0.01], n_synthetic=100, n_observed=100)
        >>> round(c.variance, 6), round(c.df, 3)
        (0.203333, 1.817)
    """
    m, q_bar, u_bar, b = _moments(q, u)
    t = (1 + 1 / m) * b - u_bar
    if t <= 0:
        t, df = n_synthetic / n_observed * u_bar, math.inf
    else:
        df = (m - 1) * (1 - u_bar / ((1 + 1 / m) * b)) ** 2
    return Combined(q_bar, t, df, *_interval(q_bar, t, df))
