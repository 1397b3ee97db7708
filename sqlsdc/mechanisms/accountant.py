"""Privacy accounting: exact budgets, composition, and the cost and accuracy of DP aggregates.

Two kinds of guarantee are tracked side by side, never mixed:

- pure epsilon-DP (Dwork, McSherry, Nissim and Smith 2006), spent by discrete Laplace noise and
  by the permute-and-flip quantile;
- rho-zCDP (Bun and Steinke, "Concentrated Differential Privacy: Simplifications, Extensions,
  and Lower Bounds", TCC 2016, BS16), spent by discrete Gaussian noise.

Private group selection (:mod:`sqlsdc.mechanisms.partition`) is (epsilon, delta)-DP: its
epsilon is counted with the pure epsilon, and its delta is a third amount.

A :class:`PrivacyCost` holds one amount of each as a :class:`fractions.Fraction`. Sequential
composition adds them component by component (BS16 Lemma 2.3 for zCDP; basic composition for
epsilon and delta, Dwork and Roth 2014, Theorem 3.16). For reporting, the cost converts to one
(epsilon, delta) guarantee: pure epsilon is (epsilon^2/2)-zCDP (BS16 Prop. 1.4), zCDP composes
additively, and rho-zCDP implies (epsilon', delta)-DP by Canonne, Kamath and Steinke 2020,
Corollary 13 (:func:`sqlsdc.mechanisms.samplers.zcdp_to_approx_dp`); the cost's own delta is
added to that conversion's delta.

Bounding and sensitivities follow Wilson, Zhang, Lam, Desfontaines, Simmons-Marengo and Gipson,
"Differentially Private SQL with Bounded User Contribution", PoPETs 2020 (WZL+20): each privacy
unit contributes to at most ``max_groups`` groups (cells) and ``max_rows`` rows per group, and
values are clamped to ``[lower, upper]``. Adding or removing one unit then changes

    a COUNT(*) cell by at most  c = max_rows
    a COUNT(DISTINCT unit) cell by at most  c = 1
    a SUM cell by at most  c = max_rows * max(|lower|, |upper|)
    a SUM of squares cell by at most  c = max_rows * max(lower^2, upper^2)

in at most ``max_groups`` cells, so the L1 sensitivity of the released column is
``max_groups * c`` (Laplace: t = L1/epsilon) and its squared L2 sensitivity is
``max_groups * c^2`` (Gaussian: sigma^2 = L2^2/(2 rho), rational with no square root).

Sums are released on a grid of ``granularity`` g: every clamped value is rounded to a multiple of
g before summing (in SQL), so a sum is an integer number of grid units and integer noise is
added to it; sums of squares use the grid g^2. ``lower`` and ``upper`` must be multiples of g.

Aggregates decompose into noisy base statistics (as SmartNoise SQL and Tumult do):

    COUNT -> count;  COUNT(DISTINCT unit) -> unit count;  SUM -> sum;
    AVG -> sum, count;  VAR, STDDEV -> sum of squares, sum, count;  QUANTILE -> quantile

and the aggregate's budget is split between its statistics (equal shares unless ``weights``
say otherwise), so AVG costs what a SUM and a COUNT cost together: sequential composition. The
statistics are ordinary cells, so an AVG after a SUM and a COUNT of the same cells reuses them.

Example:
    >>> bounding = Bounding(max_groups=1, max_rows=1, lower=0, upper=100)
    >>> c = calibrate(Statistic.SUM, bounding, PrivacyCost(epsilon=Fraction(1, 2)))
    >>> c.noise.value, c.scale, round(c.sd, 1), c.half_width
    ('laplace', Fraction(200, 1), 282.8, 599.0)
    >>> plan = plan_aggregate(Aggregate.AVG, bounding, PrivacyCost(epsilon=Fraction(1)))
    >>> [(p.statistic.value, p.cost.epsilon) for p in plan.components]
    [('sum', Fraction(1, 2)), ('count', Fraction(1, 2))]
"""

from __future__ import annotations

import math
import numbers
import re
from dataclasses import dataclass, replace
from enum import StrEnum
from fractions import Fraction
from functools import lru_cache

from sqlsdc.mechanisms.samplers import (
    discrete_gaussian_interval,
    discrete_gaussian_variance,
    discrete_laplace_interval,
    discrete_laplace_variance,
    zcdp_to_approx_dp,
)

__all__ = [
    "Aggregate",
    "AggregatePlan",
    "Bounding",
    "BudgetLimit",
    "Calibration",
    "Noise",
    "PrivacyCost",
    "Statistic",
    "ZERO",
    "calibrate",
    "calibrate_report",
    "components",
    "compose",
    "fraction",
    "parse_exact",
    "plan_aggregate",
    "ratio_sd",
    "sensitivity",
]

ALPHA = Fraction(1, 20)
"""Error level of the reported intervals: 95% two-sided."""


MAX_DIGITS = 40
"""Most digits in each part of an exact number written as text."""
MAX_EXPONENT = 400
"""Largest |exponent| of an exact number written as text (1e-400 .. 1e400)."""
_EXACT_TEXT = re.compile(
    rf"([-+]?)([0-9]{{1,{MAX_DIGITS}}})(?:\.([0-9]{{1,{MAX_DIGITS}}}))?"
    rf"(?:[eE]([-+]?[0-9]{{1,20}}))?(?:/([0-9]{{1,{MAX_DIGITS}}}))?"
)


def parse_exact(text: str, name: str) -> Fraction:
    """An exact number written as text: a decimal (``0.1``, ``1e-6``) or a ratio (``1/3``).

    The parser is bounded, never evaluates anything, and refuses what ``Fraction(text)`` would
    turn into an error or an endless computation: a zero denominator, more than
    :data:`MAX_DIGITS` digits in a part, an exponent beyond :data:`MAX_EXPONENT`
    (``Fraction("1e-999999999")`` builds a billion-digit integer).

    Example:
        >>> parse_exact("1e-6", "epsilon"), parse_exact("2/4", "epsilon")
        (Fraction(1, 1000000), Fraction(1, 2))
        >>> parse_exact("1/0", "epsilon")
        Traceback (most recent call last):
        ...
        ValueError: epsilon: '1/0' divides by zero
    """
    match = _EXACT_TEXT.fullmatch(text.strip())
    if match is None:
        raise ValueError(
            f"{name}: must be a number such as 0.5, 1e-6 or 1/3 (at most {MAX_DIGITS} digits per "
            f"part), got {text!r}"
        )
    sign, whole, decimals, exponent, denominator = match.groups()
    power = int(exponent or 0)
    if abs(power) > MAX_EXPONENT:
        raise ValueError(f"{name}: the exponent of {text!r} is beyond +-{MAX_EXPONENT}")
    if denominator is not None and int(denominator) == 0:
        raise ValueError(f"{name}: {text!r} divides by zero")
    decimals = decimals or ""
    value = Fraction(int(whole + decimals), 10 ** len(decimals)) * Fraction(10) ** power
    value /= int(denominator or 1)
    return -value if sign == "-" else value


def fraction(value: object, name: str) -> Fraction:
    """``value`` as an exact Fraction: int, Fraction, Decimal or a decimal string ("0.1", "1/3").

    Floats are refused (``0.1`` is not one tenth); write ``Fraction("0.1")`` or ``"0.1"``.
    Strings and Decimals go through the bounded :func:`parse_exact`.
    """
    if isinstance(value, str):
        return parse_exact(value, name)
    if isinstance(value, bool) or isinstance(value, float):
        raise TypeError(
            f"{name} must be exact (int, Fraction, Decimal or a string such as '0.1'), got "
            f"{type(value).__name__} {value!r}"
        )
    if isinstance(value, numbers.Rational):
        return Fraction(value)
    from decimal import Decimal

    if isinstance(value, Decimal) and value.is_finite():  # Fraction(Decimal("1e-999999999"))
        return parse_exact(str(value), name)  # would build a billion-digit integer
    raise TypeError(f"{name} must be an exact number, got {type(value).__name__} {value!r}")


def exact_text(x: Fraction) -> str:
    """An amount exactly, as every output of sqlsdc writes it: a decimal where it has one of
    at most 15 places (``0.3``, ``0.000001``), else the fraction (``1/3``), so that budgets,
    their history, the ledger, explain and refusals write one amount one way (not ``3/10``
    in one place, ``3/10 (~0.3)`` in another).

    Example:
        >>> exact_text(Fraction(3, 10)), exact_text(Fraction(1, 10**6)), exact_text(Fraction(1, 3))
        ('0.3', '0.000001', '1/3')
    """
    rest = x.denominator
    for p in (2, 5):
        while rest % p == 0:
            rest //= p
    places = 0
    while rest == 1 and (x * 10**places).denominator != 1:
        places += 1
    if rest != 1 or places > 15:
        return str(x)
    sign, digits = "-" if x < 0 else "", str(abs(x.numerator) * 10**places // x.denominator)
    if not places:
        return sign + digits
    digits = digits.rjust(places + 1, "0")
    return f"{sign}{digits[:-places]}.{digits[-places:]}"


def amount_text(x: Fraction) -> str:
    """``exact_text``, with the decimal it is near where that is a fraction (a message)."""
    text = exact_text(x)
    return f"{text} (~{float(x):.6g})" if "/" in text else text


# --- budgets ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PrivacyCost:
    """An amount of privacy loss: pure ``epsilon``, zCDP ``rho`` and ``delta``, exact and >= 0.

    ``a + b`` is sequential composition; ``k * a`` is k-fold composition. The kinds are kept
    apart: a Laplace release spends epsilon, a Gaussian release spends rho, and private group
    selection (:mod:`sqlsdc.mechanisms.partition`, (epsilon, delta)-DP) spends epsilon and
    delta. Deltas add up under composition: basic composition of (epsilon_i, delta_i)-DP
    mechanisms is (sum epsilon_i, sum delta_i)-DP (Dwork and Roth 2014, Theorem 3.16).

    Example:
        >>> PrivacyCost(epsilon=Fraction(1, 2)) + PrivacyCost(rho=Fraction(1, 8))
        PrivacyCost(epsilon=Fraction(1, 2), rho=Fraction(1, 8), delta=Fraction(0, 1))
        >>> (2 * PrivacyCost(epsilon=1, delta=Fraction(1, 10**6))).describe()
        'ε = 2, δ = 0.000002'
    """

    epsilon: Fraction = Fraction(0)
    rho: Fraction = Fraction(0)
    delta: Fraction = Fraction(0)

    def __post_init__(self) -> None:
        for name in _KINDS:
            value = fraction(getattr(self, name), name)
            if value < 0:
                raise ValueError(f"{name} must be >= 0, got {value}")
            object.__setattr__(self, name, value)

    def __add__(self, other: PrivacyCost) -> PrivacyCost:
        if not isinstance(other, PrivacyCost):
            return NotImplemented
        return PrivacyCost(
            self.epsilon + other.epsilon, self.rho + other.rho, self.delta + other.delta
        )

    def __mul__(self, k: int) -> PrivacyCost:
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            return NotImplemented
        return PrivacyCost(self.epsilon * k, self.rho * k, self.delta * k)

    __rmul__ = __mul__

    @property
    def is_zero(self) -> bool:
        return self.epsilon == 0 and self.rho == 0 and self.delta == 0

    def as_zcdp(self) -> Fraction:
        """One rho covering both parts: rho + epsilon^2/2 (epsilon-DP is (epsilon^2/2)-zCDP,
        BS16 Prop. 1.4; zCDP composes additively). An upper bound when epsilon is a sum.
        ``delta`` is not covered: a cost with a delta is not zCDP."""
        return self.rho + self.epsilon**2 / 2

    def to_approx_dp(self, delta: Fraction | float) -> float:
        """The epsilon' with this cost => (epsilon', self.delta + delta)-DP.

        The total delta is the cost's own ``delta`` (of private group selection, added up by
        basic composition) plus the ``delta`` of the conversion. Without rho: epsilon itself,
        (epsilon, self.delta)-DP (the conversion's delta unused). Otherwise epsilon +
        eps(rho, delta) by basic composition (Dwork and Roth 2014, Theorem 3.16), with
        eps(., delta) from CKS20 Corollary 13; for a cost without a delta of its own (pure
        epsilon and rho), the smaller of that and eps(rho + epsilon^2/2, delta), also valid.
        """
        if self.rho == 0:
            return float(self.epsilon)
        split = float(self.epsilon) + zcdp_to_approx_dp(self.rho, delta)
        if self.epsilon == 0 or self.delta:
            return split
        return min(split, zcdp_to_approx_dp(self.as_zcdp(), delta))

    def describe(self) -> str:
        parts = [f"ε = {amount_text(self.epsilon)}"] if self.epsilon else []
        parts += [f"ρ = {amount_text(self.rho)}"] if self.rho else []
        parts += [f"δ = {amount_text(self.delta)}"] if self.delta else []
        return ", ".join(parts) or "nothing"


_KINDS = ("epsilon", "rho", "delta")
ZERO = PrivacyCost()


def compose(costs) -> PrivacyCost:
    """Sequential composition of an iterable of costs (deltas add: basic composition)."""
    total = ZERO
    for cost in costs:
        total = total + cost
    return total


@dataclass(frozen=True, slots=True)
class BudgetLimit:
    """A limit on spending: ``None`` means this limit does not constrain that kind.

    A kind is spendable only where at least one applicable limit bounds it (fail closed; see
    :mod:`sqlsdc.catalog.budget`). ``BudgetLimit(epsilon=0)`` forbids epsilon spending. Each
    kind is limited separately: the deltas spent add up (basic composition, Dwork and Roth
    2014, Theorem 3.16) and are compared with the ``delta`` limit like epsilon and rho.
    """

    epsilon: Fraction | None = None
    rho: Fraction | None = None
    delta: Fraction | None = None

    def __post_init__(self) -> None:
        for name in _KINDS:
            value = getattr(self, name)
            if value is not None:
                value = fraction(value, name)
                if value < 0:
                    raise ValueError(f"{name} limit must be >= 0, got {value}")
                object.__setattr__(self, name, value)

    def __add__(self, grant: PrivacyCost) -> BudgetLimit:
        """The limit raised by a grant; a grant of a kind creates a limit of that kind."""
        if not isinstance(grant, PrivacyCost):
            return NotImplemented
        raised = {}
        for kind in _KINDS:
            have, more = getattr(self, kind), getattr(grant, kind)
            raised[kind] = have if not more else (have or 0) + more
        return BudgetLimit(**raised)

    def remaining(self, spent: PrivacyCost) -> BudgetLimit:
        """What is left after ``spent`` (never negative; None stays None)."""
        left = {}
        for kind in _KINDS:
            limit = getattr(self, kind)
            left[kind] = None if limit is None else max(limit - getattr(spent, kind), Fraction(0))
        return BudgetLimit(**left)

    def allows(self, spent: PrivacyCost, cost: PrivacyCost) -> bool:
        """Whether ``spent + cost`` stays within this limit (exactly: spending it all is fine)."""
        for kind in _KINDS:
            amount, limit = getattr(cost, kind), getattr(self, kind)
            if amount and limit is not None and getattr(spent, kind) + amount > limit:
                return False
        return True

    def describe(self) -> str:
        shown = []
        for kind, symbol in zip(_KINDS, _SYMBOLS, strict=True):
            limit = getattr(self, kind)
            shown.append(f"{symbol} {'unlimited' if limit is None else amount_text(limit)}")
        return ", ".join(shown)


_SYMBOLS = ("ε", "ρ", "δ")


# --- aggregates and their statistics ---------------------------------------------------------


class Noise(StrEnum):
    LAPLACE = "laplace"  # discrete Laplace, pure epsilon-DP
    GAUSSIAN = "gaussian"  # discrete Gaussian, rho-zCDP
    PERMUTE_AND_FLIP = "permute_and_flip"  # selection among candidates, pure epsilon-DP
    OPTIMAL_SELECTION = "optimal_selection"  # keep a group with probability pi(n): partition.py


class Statistic(StrEnum):
    """A noisy base statistic: one released number per cell."""

    COUNT = "count"  # COUNT(*) of bounded rows
    COUNT_UNITS = "count_units"  # COUNT(DISTINCT unit)
    SUM = "sum"  # SUM of clamped values on the grid g
    SUM_SQUARES = "sum_squares"  # SUM of squared clamped values on the grid g^2
    QUANTILE = "quantile"  # an alpha-quantile over the candidates lower, lower + g, ..., upper
    UNIT_SHARE = "unit_share"  # rows weighted 1/(the unit's rows): the bounding report


class Aggregate(StrEnum):
    COUNT = "count"
    COUNT_DISTINCT = "count_distinct"  # of the privacy unit
    SUM = "sum"
    AVG = "avg"
    VAR = "var"
    STDDEV = "stddev"
    QUANTILE = "quantile"


_COMPONENTS = {
    Aggregate.COUNT: (Statistic.COUNT,),
    Aggregate.COUNT_DISTINCT: (Statistic.COUNT_UNITS,),
    Aggregate.SUM: (Statistic.SUM,),
    Aggregate.AVG: (Statistic.SUM, Statistic.COUNT),
    Aggregate.VAR: (Statistic.SUM_SQUARES, Statistic.SUM, Statistic.COUNT),
    Aggregate.STDDEV: (Statistic.SUM_SQUARES, Statistic.SUM, Statistic.COUNT),
    Aggregate.QUANTILE: (Statistic.QUANTILE,),
}


def components(aggregate: Aggregate) -> tuple[Statistic, ...]:
    """The noisy statistics an aggregate is post-processed from (module docstring)."""
    return _COMPONENTS[Aggregate(aggregate)]


@dataclass(frozen=True, slots=True)
class Bounding:
    """Contribution bounds of WZL+20: groups and rows per unit, value clamping, output grid.

    Args:
        max_groups: cells one unit may contribute to (>= 1).
        max_rows: rows one unit may contribute to one cell (>= 1).
        lower, upper: clamping bounds of the measure (required for sums and quantiles).
        granularity: grid g of sums and quantile candidates; bounds must be multiples of g.
        max_unit_rows: rows one unit may contribute to the whole query, over all its cells
            (None: no such cap). With it a unit with many rows keeps up to this many of them
            wherever they fall, instead of the rows of only ``max_groups`` cells; see
            :func:`norms` for the sensitivity.
    """

    max_groups: int = 1
    max_rows: int = 1
    lower: Fraction | None = None
    upper: Fraction | None = None
    granularity: Fraction = Fraction(1)
    max_unit_rows: int | None = None

    def __post_init__(self) -> None:
        for name in ("max_groups", "max_rows", "max_unit_rows"):
            value = getattr(self, name)
            if value is None and name == "max_unit_rows":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        g = fraction(self.granularity, "granularity")
        if g <= 0:
            raise ValueError(f"granularity must be > 0, got {g}")
        object.__setattr__(self, "granularity", g)
        if (self.lower is None) != (self.upper is None):
            raise ValueError("give both lower and upper bounds, or neither")
        if self.lower is not None:
            lo, hi = fraction(self.lower, "lower"), fraction(self.upper, "upper")
            if lo > hi:
                raise ValueError(f"lower bound {lo} is above upper bound {hi}")
            for name, v in (("lower", lo), ("upper", hi)):
                if (v / g).denominator != 1:
                    raise ValueError(
                        f"{name} bound {v} is not a multiple of the granularity {g}; choose "
                        "bounds on the grid or a finer granularity"
                    )
            object.__setattr__(self, "lower", lo)
            object.__setattr__(self, "upper", hi)

    @property
    def bounded(self) -> bool:
        return self.lower is not None

    def describe(self) -> str:
        """Canonical text (part of every cell identity: bounding changes the exact value)."""
        bounds = f"[{self.lower},{self.upper}]" if self.bounded else "unbounded"
        unit = "" if self.max_unit_rows is None else f";unit_rows={self.max_unit_rows}"
        return (
            f"groups={self.max_groups};rows={self.max_rows};bounds={bounds};grid={self.granularity}"
            + unit
        )


def _unit(statistic: Statistic, bounding: Bounding) -> Fraction:
    """The grid of a statistic's value: 1 for counts, g for sums and quantiles, g^2 for squares."""
    if statistic in (Statistic.COUNT, Statistic.COUNT_UNITS):
        return Fraction(1)
    if statistic is Statistic.UNIT_SHARE:
        return Fraction(1, REPORT_GRID)
    if statistic is Statistic.SUM_SQUARES:
        return bounding.granularity**2
    return bounding.granularity


def _require_bounds(statistic: Statistic, bounding: Bounding) -> None:
    if not bounding.bounded:
        raise ValueError(
            f"a noisy {statistic.value} needs clamping bounds [lower, upper] on the measure; "
            "without them its sensitivity is unbounded (declare bounds in the policy)"
        )


def sensitivity(statistic: Statistic, bounding: Bounding) -> tuple[Fraction, Fraction]:
    """``(per-cell bound c, in grid units; max_groups)``: one unit changes at most ``max_groups``
    cells, each by at most ``c`` (WZL+20 §3). L1 = max_groups c, L2^2 = max_groups c^2.

    For QUANTILE ``c`` is the per-cell change of the integer score (see
    :func:`sqlsdc.mechanisms.dp_cells.quantile_scores`) for alpha = 1/2; use
    :func:`calibrate` for other alphas.
    """
    statistic = Statistic(statistic)
    if statistic is Statistic.UNIT_SHARE:  # a unit's weights add up to at most one, anywhere
        return Fraction(REPORT_GRID), Fraction(1)
    if statistic is Statistic.COUNT:
        c = Fraction(bounding.max_rows)
    elif statistic is Statistic.COUNT_UNITS:
        c = Fraction(1)
    elif statistic is Statistic.SUM:
        _require_bounds(statistic, bounding)
        m = max(abs(bounding.lower), abs(bounding.upper)) / bounding.granularity
        c = bounding.max_rows * m
    elif statistic is Statistic.SUM_SQUARES:
        _require_bounds(statistic, bounding)
        m = max(bounding.lower**2, bounding.upper**2) / bounding.granularity**2
        c = bounding.max_rows * m
    else:
        return _quantile_sensitivity(bounding, Fraction(1, 2)), Fraction(bounding.max_groups)
    return c, Fraction(bounding.max_groups)


def _quantile_sensitivity(bounding: Bounding, alpha: Fraction) -> Fraction:
    """Score |(b - a) lt - a gt| for alpha = a/b changes by <= max(a, b - a) per added or removed
    row (one of lt, gt moves by one; OpenDP ``make_quantile_score_candidates``)."""
    _require_bounds(Statistic.QUANTILE, bounding)
    a, b = alpha.numerator, alpha.denominator
    return Fraction(bounding.max_rows * max(a, b - a))


def norms(statistic: Statistic, bounding: Bounding) -> tuple[Fraction, Fraction]:
    """``(L1, L2^2)`` in grid units: how far one unit moves the vector of a statistic's cells.

    Per-cell caps alone (WZL+20 §3): a unit changes at most m = max_groups cells by at most
    c = max_rows a each (a: one row's largest contribution), so L1 = m c and L2^2 = m c^2.
    With a cap R = max_unit_rows on its rows over the whole query, it also contributes at most
    R a in total: L1 = a min(m r, R) (r = max_rows), and L2^2 = a^2 S with S the largest
    sum of squared rows per cell when R rows fill cells of at most r rows in at most m cells:
    m r^2 if R >= m r, else floor(R/r) r^2 + (R mod r)^2 (fill whole cells first: squares
    grow fastest). COUNT(DISTINCT unit) counts 1 per cell, in at most min(m, R) cells.
    """
    c, groups = sensitivity(statistic, bounding)
    if c == 0:  # bounds [0, 0]: the statistic is constant and needs no noise, but keep it DP-shaped
        c = Fraction(1)
    cap = bounding.max_unit_rows
    if cap is None or statistic is Statistic.UNIT_SHARE:
        return groups * c, groups * c * c
    if statistic is Statistic.COUNT_UNITS:
        cells = min(groups, cap)
        return Fraction(cells), Fraction(cells)
    r = bounding.max_rows
    per_row = c / r
    if cap >= groups * r:
        squares = groups * r * r
    else:
        whole, rest = divmod(cap, r)
        squares = whole * r * r + rest * rest
    return per_row * min(groups * r, cap), per_row * per_row * squares


@dataclass(frozen=True, slots=True)
class Calibration:
    """How one noisy statistic is drawn, what it costs and how accurate it is.

    ``scale`` is the discrete Laplace scale t, ``sigma2`` the discrete Gaussian parameter
    sigma^2, ``rate`` the permute-and-flip exponent per score unit (epsilon_cell/(2 Delta)); all
    in grid units and exact. ``sd`` and ``half_width`` (95%) are in value units (grid units x
    g), floats for reporting only; a quantile reports ``rank_error95`` instead: with
    probability >= 95% the released candidate's rank is within that many rows of the target
    rank (exponential-mechanism utility bound, McSherry and Talwar 2007; it holds for
    permute-and-flip, whose error is never worse, McKenna and Sheldon 2020).
    """

    statistic: Statistic
    bounding: Bounding
    noise: Noise
    cost: PrivacyCost
    scale: Fraction | None = None
    sigma2: Fraction | None = None
    rate: Fraction | None = None
    alpha: Fraction | None = None
    sd: float | None = None
    half_width: float | None = None
    rank_error95: float | None = None
    selection_delta: Fraction | None = None  # OPTIMAL_SELECTION: delta per group (rate: epsilon)

    @property
    def unit(self) -> Fraction:
        """Value of one grid unit of this statistic."""
        return _unit(self.statistic, self.bounding)

    def describe(self) -> str:
        """Canonical text of the mechanism (part of every cell identity)."""
        param = {
            Noise.LAPLACE: f"t={self.scale}",
            Noise.GAUSSIAN: f"sigma2={self.sigma2}",
            Noise.PERMUTE_AND_FLIP: f"rate={self.rate};alpha={self.alpha}",
            Noise.OPTIMAL_SELECTION: f"epsilon={self.rate};delta={self.selection_delta}",
        }[self.noise]
        return f"{self.statistic.value};{self.noise.value};{param};{self.bounding.describe()}"


def _single_kind(cost: PrivacyCost, statistic: Statistic) -> Noise:
    if cost.delta:
        raise ValueError(
            f"a noisy {statistic.value} is pure or zCDP and spends no delta; got {cost.describe()}"
        )
    if cost.epsilon and not cost.rho:
        return Noise.PERMUTE_AND_FLIP if statistic is Statistic.QUANTILE else Noise.LAPLACE
    if cost.rho and not cost.epsilon:
        if statistic is Statistic.QUANTILE:
            raise ValueError(
                "a quantile is released with permute-and-flip and needs epsilon, not rho"
            )
        return Noise.GAUSSIAN
    raise ValueError(
        f"give a noisy {statistic.value} exactly one positive budget, epsilon (Laplace) or rho "
        f"(Gaussian); got {cost.describe()}"
    )


def calibrate(
    statistic: Statistic,
    bounding: Bounding,
    cost: PrivacyCost,
    *,
    alpha: Fraction | None = None,
) -> Calibration:
    """Noise parameter and accuracy of one statistic released for every cell at ``cost``.

    epsilon: discrete Laplace, t = max_groups c / epsilon. rho: discrete Gaussian,
    sigma^2 = max_groups c^2 / (2 rho). QUANTILE: permute-and-flip per cell with
    epsilon_cell = epsilon / max_groups (a unit touches at most max_groups cells: sequential
    composition) and rate epsilon_cell / (2 Delta_score); ``alpha`` defaults to 1/2 (median).

    Example:
        >>> b = Bounding(max_groups=2, max_rows=1)
        >>> c = calibrate(Statistic.COUNT, b, PrivacyCost(rho=Fraction(1, 4)))
        >>> c.sigma2, c.half_width
        (Fraction(4, 1), 4.0)
    """
    statistic = Statistic(statistic)
    noise = _single_kind(cost, statistic)
    unit = _unit(statistic, bounding)
    if statistic is Statistic.QUANTILE:
        a = Fraction(1, 2) if alpha is None else fraction(alpha, "alpha")
        if not 0 <= a <= 1:
            raise ValueError(f"quantile alpha must be in [0, 1], got {a}")
        cap = bounding.max_unit_rows or bounding.max_rows * bounding.max_groups
        per_cell = replace(bounding, max_rows=min(bounding.max_rows, cap))
        delta = _quantile_sensitivity(per_cell, a)
        eps_cell = cost.epsilon / min(bounding.max_groups, cap)  # cells a unit can reach
        rate = eps_cell / (2 * delta)
        candidates = int((bounding.upper - bounding.lower) / bounding.granularity) + 1
        rank = 2 * float(delta) * math.log(candidates / float(ALPHA)) / float(eps_cell)
        return Calibration(
            statistic, bounding, noise, cost, rate=rate, alpha=a,
            rank_error95=rank / a.denominator,
        )  # fmt: skip
    l1, l2sq = norms(statistic, bounding)
    if noise is Noise.LAPLACE:
        t = l1 / cost.epsilon
        sd = math.sqrt(discrete_laplace_variance(t)) * float(unit)
        half = discrete_laplace_interval(t, ALPHA) * float(unit)
        return Calibration(statistic, bounding, noise, cost, scale=t, sd=sd, half_width=half)
    s2 = l2sq / (2 * cost.rho)
    sd = math.sqrt(discrete_gaussian_variance(s2)) * float(unit)
    half = discrete_gaussian_interval(s2, ALPHA) * float(unit)
    return Calibration(statistic, bounding, noise, cost, sigma2=s2, sd=sd, half_width=half)


@dataclass(frozen=True, slots=True)
class AggregatePlan:
    """The statistics behind one aggregate column, their calibrations and the total cost."""

    aggregate: Aggregate
    components: tuple[Calibration, ...]

    @property
    def cost(self) -> PrivacyCost:
        return compose(c.cost for c in self.components)

    def component(self, statistic: Statistic) -> Calibration:
        for c in self.components:
            if c.statistic is statistic:
                return c
        raise KeyError(statistic)

    @property
    def sd(self) -> float | None:
        """Standard deviation of the released aggregate when it is a single statistic (COUNT,
        SUM); ratios (AVG, VAR) depend on the data: see :func:`ratio_sd`."""
        return self.components[0].sd if len(self.components) == 1 else None

    @property
    def half_width(self) -> float | None:
        return self.components[0].half_width if len(self.components) == 1 else None


def plan_aggregate(
    aggregate: Aggregate,
    bounding: Bounding,
    cost: PrivacyCost,
    *,
    weights: tuple[int | Fraction, ...] | None = None,
    alpha: Fraction | None = None,
) -> AggregatePlan:
    """Split ``cost`` between the statistics of ``aggregate`` and calibrate each one.

    Shares are proportional to ``weights`` (default equal), exact, and add up to ``cost``; the
    aggregate therefore costs exactly ``cost`` (sequential composition).

    Raises:
        ValueError: a SUM, AVG, VAR, STDDEV or QUANTILE without bounds (fail closed), a cost with
            both or neither kinds, or weights of the wrong length.
    """
    aggregate = Aggregate(aggregate)
    exact = type(bounding) is Bounding and type(cost) is PrivacyCost
    if exact and weights is None and (alpha is None or type(alpha) is Fraction):
        return _planned(aggregate, bounding, cost, alpha)
    return _plan(aggregate, bounding, cost, weights, alpha)


@lru_cache(maxsize=256)
def _planned(aggregate: Aggregate, bounding: Bounding, cost: PrivacyCost,
             alpha: Fraction | None) -> AggregatePlan:  # fmt: skip
    """:func:`plan_aggregate` of equal weights, kept per (aggregate, bounding, cost, alpha):
    the plan is a function of these values alone and immutable, and computing it (the exact
    shares, the noise's variance and interval) took 0.2-0.25 ms of every DP check. Bounding
    and PrivacyCost hold normalised Fractions and integers (floats refused), and ``alpha`` is
    a Fraction (anything else is planned afresh), so equal keys are equal inputs."""
    return _plan(aggregate, bounding, cost, None, alpha)


def _plan(aggregate: Aggregate, bounding: Bounding, cost: PrivacyCost,
          weights: tuple[int | Fraction, ...] | None, alpha) -> AggregatePlan:  # fmt: skip
    """:func:`plan_aggregate`, computed."""
    stats = components(aggregate)
    if weights is None:
        weights = (1,) * len(stats)
    if len(weights) != len(stats):
        names = ", ".join(s.value for s in stats)
        raise ValueError(f"{aggregate.value} has {len(stats)} statistics ({names}); got "
                         f"{len(weights)} weights")  # fmt: skip
    ws = [fraction(w, "weight") for w in weights]
    if any(w <= 0 for w in ws):
        raise ValueError(f"weights must be positive, got {[str(w) for w in ws]}")
    total = sum(ws)
    parts = tuple(
        calibrate(s, bounding, PrivacyCost(cost.epsilon * w / total, cost.rho * w / total,
                                           cost.delta * w / total), alpha=alpha)
        for s, w in zip(stats, ws, strict=True)
    )  # fmt: skip
    return AggregatePlan(aggregate, parts)


REPORT_GRID = 1000
"""Grid units per unit (person) of the bounding report: its weights are multiples of 1/1000."""
REPORT_PARTS = ("dropped", "clamped", "kept")
"""The bounding report's statistics: a unit's rows removed by the row caps, kept but clamped to
the bounds, and kept as they are."""


def calibrate_report(bounding: Bounding, cost: PrivacyCost, parts: int = 3) -> Calibration:
    """The calibration of each of the bounding report's ``parts`` statistics, which together
    cost exactly ``cost`` (2 parts where nothing can be dropped: no D).

    Per cell, the report counts the rows the caps removed (D), kept but clamped (C) and kept
    unchanged (K), each row of unit u weighted 1/n_u with n_u the unit's rows in the whole query
    (on the grid 1/:data:`REPORT_GRID`, rounded down). A unit's rows add up to 1 over all cells
    and all three parts, so the whole vector (D, C, K) over all cells has L1 sensitivity 1 and
    L2 sensitivity at most 1 (a sum of non-negative weights bounds their Euclidean norm): noise
    calibrated to those norms on each coordinate makes the joint release epsilon-DP (discrete
    Laplace, t = 1/epsilon) or rho-zCDP (discrete Gaussian, sigma^2 = 1/(2 rho)): one mechanism,
    priced once. For the ledger the cost is booked in equal parts, one per statistic; they
    always go together (their identities name the same measures, see
    :func:`sqlsdc.rewrite.dp_report.bounding_report`), so the parts always add up to ``cost``.

    Example:
        >>> c = calibrate_report(Bounding(max_groups=3, max_rows=5), PrivacyCost(epsilon=1))
        >>> c.scale, c.unit, c.cost.epsilon, round(c.sd, 3)
        (Fraction(1000, 1), Fraction(1, 1000), Fraction(1, 3), 1.414)
    """
    whole = calibrate(Statistic.UNIT_SHARE, bounding, cost)
    share = PrivacyCost(cost.epsilon / parts, cost.rho / parts, cost.delta / parts)
    return replace(whole, cost=share)


def ratio_sd(sum_sd: float, count_sd: float, count: float, mean: float) -> float:
    """Delta-method standard deviation of a noisy mean S/N at count ``count`` and mean ``mean``:
    sqrt(sd_S^2 + mean^2 sd_N^2) / count (first order; for reporting only, count >= 1)."""
    n = max(float(count), 1.0)
    return math.sqrt(sum_sd**2 + (mean**2) * count_sd**2) / n
