"""Private partition selection: which groups may appear in a result when the group keys are
themselves private (tau-thresholding).

When group keys come from the data, the mere presence of a group can reveal one unit (the only
person in a municipality with a rare occupation). Laplace thresholding releases a group only if
its noisy count of units reaches a threshold tau (Korolova, Kenthapadi, Mishra and Ntoulas,
"Releasing Search Queries and Clicks Privately", WWW 2009; Wilson et al., "Differentially
Private SQL with Bounded User Contribution", PoPETs 2020, §3.2; the Laplace strategy of Google's
differential-privacy library; Desfontaines, Voss, Gipson and Mandayam, "Differentially private
partition selection", PoPETs 2022, compare it with the optimal rule).

Here the noise is the exact *discrete* Laplace of scale t = m c / epsilon on integer counts
(m = max_groups a unit may contribute to, c = its largest contribution to one count: 1 for
COUNT(DISTINCT unit)), drawn per cell from the keyed PRF like every other DP cell
(:func:`sqlsdc.mechanisms.dp_cells.add_noise`), and a group is kept when ``noisy >= tau``.

Guarantee. Between neighbouring databases (one unit added or removed) the counts of groups
present in both change by at most c in at most m groups: epsilon-DP (L1 = m c). A group present
in only one of them has count at most c, and is released with probability
delta_g = P(c + Z >= tau). Over the m groups of the unit, the probability that any of them is
released is 1 - (1 - delta_g)^m, so choosing delta_g = 1 - (1 - delta)^(1/m) (Google's
"adjusted delta") gives (epsilon, delta)-DP. With P(Z >= k) = q^k/(1 + q), q = exp(-1/t), for
k >= 1:

    tau = c + k,  k = max(1, ceil(t ln(1 / (delta_g (1 + q)))))

the smallest integer threshold with P(c + Z >= tau) <= delta_g, computed in 60-digit decimal
arithmetic. The released noisy counts of kept groups are the same epsilon-DP counts
(post-processing), so they can be published as the groups' COUNT(DISTINCT unit).

OpenDP 0.16's ``make_laplace_threshold`` keeps ``count + Z >= threshold`` too but charges
delta = P(Z > threshold - c), leaving out the mass at the threshold (opendp/opendp#2922): its
delta at tau is this module's at tau + 1, and at epsilon = 1, delta = 1e-6 it would accept
tau = 14, where a lone unit's group is released with probability 1.65e-6. This module takes 15
(``tests/reference/test_partition_selection_peers.py``). SmartNoise SQL's ``censor_dims`` sets
its threshold for discrete-Laplace key counts with the continuous tail, 1 - ln(2 delta)/epsilon,
which can release a lone unit's group with up to 2/(1 + q) times delta; this module's
threshold is computed from the discrete tail q^k/(1 + q) itself.

The optimal rule (Desfontaines et al. 2022, Theorem 1; Google's
``NearTruncatedGeometricPartitionSelection``) releases a group of n units with the largest
probability any (epsilon, delta)-DP rule may give it:

    pi(0) = 0,  pi(n) = min(e^eps pi(n-1) + delta, 1 - e^-eps (1 - pi(n-1) - delta), 1)

(:func:`optimal_keep_probability`, in closed form), for a unit in one group; there it gives
Google's and PyDP's test values to 12 digits or more. A unit in up to m groups changes m
decisions, so each decision uses epsilon/m and delta/m (basic composition gives (epsilon,
delta)); Google's and PyDP's adjusted delta 1 - (1 - delta)^(1/m) is slightly larger than
delta/m, so they keep a group a little more often (0.5800625857 against 0.5800625670 at
n = 700, epsilon = 0.2, delta = 1e-7, m = 10). The decision is a Bernoulli(pi(n)) drawn exactly
from the keyed PRF of the cell, so the same group always gets the same decision; it releases
no count. At epsilon = 1 and delta = 1e-6 it keeps a group of 14 units with probability 0.70
where discrete-Laplace thresholding keeps it with 0.27.

Example:
    >>> sel = laplace_partition_selection(Fraction(1), Fraction(1, 10**6), max_groups=1)
    >>> sel.scale, sel.threshold
    (Fraction(1, 1), 15)
    >>> keep_partitions([3, 15, 40], sel.threshold).tolist()
    [False, True, True]
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal, localcontext
from fractions import Fraction
from functools import lru_cache

import numpy as np

from sqlsdc.mechanisms.accountant import (
    Bounding,
    Calibration,
    Noise,
    PrivacyCost,
    Statistic,
    calibrate,
    fraction,
)

__all__ = [
    "PartitionSelection",
    "google_laplace_threshold",
    "keep_partitions",
    "laplace_partition_selection",
    "optimal_keep_probability",
    "optimal_partition_selection",
    "release_probability",
]


@dataclass(frozen=True, slots=True)
class PartitionSelection:
    """Parameters of private selection: draw per group the statistic of ``calibration`` and keep
    the group when it is ``>= threshold``. Laplace thresholding draws a noisy unit count (scale
    t); the optimal rule draws the keep decision itself, 1 or 0 (threshold 1).
    ``delta_per_group`` is the delta each group's decision may spend."""

    epsilon: Fraction
    delta: Fraction
    max_groups: int
    per_group: int
    calibration: Calibration
    threshold: int
    delta_per_group: float

    @property
    def scale(self) -> Fraction | None:
        """The discrete Laplace scale of thresholding; None for the optimal rule."""
        return self.calibration.scale

    @property
    def cost(self) -> PrivacyCost:
        """epsilon of the counts; the stage adds ``delta`` to it (:attr:`DpStage.cost`) and the
        ledger adds up the deltas (basic composition), as it does epsilon."""
        return self.calibration.cost


def _dec(x: Fraction) -> Decimal:
    return Decimal(x.numerator) / Decimal(x.denominator)


def _selection_budget(epsilon, delta) -> tuple[Fraction, Fraction]:
    """(epsilon, delta) of a selection rule, exact; epsilon > 0 and delta in (0, 1)."""
    eps = fraction(epsilon, "epsilon")
    d = fraction(delta, "delta")
    if eps <= 0:
        raise ValueError(f"epsilon must be positive, got {eps}")
    if not 0 < d < 1:
        raise ValueError(f"delta must be in (0, 1), got {d}")
    return eps, d


def _adjusted_delta(delta: Fraction, m: int) -> Decimal:
    """delta_g = 1 - (1 - delta)^(1/m), to 60 digits (rounded down: a smaller delta_g only
    raises the threshold)."""
    with localcontext() as ctx:
        ctx.prec = 60
        if m == 1:
            return _dec(delta)
        return -((Decimal(1) - _dec(delta)).ln() / m).exp() + 1


def laplace_partition_selection(
    epsilon: Fraction | int | str,
    delta: Fraction | str,
    max_groups: int,
    *,
    per_group: int = 1,
) -> PartitionSelection:
    """The discrete-Laplace threshold for (epsilon, delta)-DP selection of groups.

    Args:
        epsilon: spent on the noisy counts (exact: int, Fraction or decimal string).
        delta: total probability of releasing any group that exists only because of one unit,
            in (0, 1); exact (``Fraction(1, 10**9)`` or ``"1e-9"``).
        max_groups: groups one unit contributes to (m, enforced by the bounding step).
        per_group: a unit's largest contribution to one count (1 for COUNT(DISTINCT unit);
            max_rows for COUNT(*)).

    Raises:
        ValueError: epsilon <= 0, delta outside (0, 1), max_groups or per_group < 1.
    """
    eps, d = _selection_budget(epsilon, delta)
    if isinstance(per_group, bool) or not isinstance(per_group, int) or per_group < 1:
        raise ValueError(f"per_group must be an integer >= 1, got {per_group!r}")
    statistic = Statistic.COUNT_UNITS if per_group == 1 else Statistic.COUNT
    bounding = Bounding(max_groups=max_groups, max_rows=per_group)
    cal = calibrate(statistic, bounding, PrivacyCost(epsilon=eps))
    t = cal.scale
    dg = _adjusted_delta(d, max_groups)
    with localcontext() as ctx:
        ctx.prec = 60
        td = _dec(t)
        q = (-1 / td).exp()
        need = td * (1 / (dg * (1 + q))).ln()
        k = max(1, int(need.to_integral_value(rounding=ROUND_CEILING)))
    return PartitionSelection(eps, d, max_groups, per_group, cal, per_group + k, float(dg))


def keep_partitions(noisy_counts, threshold: int) -> np.ndarray:
    """Boolean mask: which groups are released (noisy count ``>= threshold``)."""
    return np.asarray(noisy_counts) >= threshold


def release_probability(count: int, scale: Fraction, threshold: int) -> float:
    """P(count + Z >= threshold) for Z discrete Laplace of scale t: q^k/(1 + q) for
    k = threshold - count >= 1, else 1 - q^(1-k)/(1 + q)."""
    t = float(fraction(scale, "scale"))
    q = math.exp(-1 / t)
    k = threshold - count
    if k >= 1:
        return math.exp(-k / t) / (1 + q)
    return 1 - math.exp(-(1 - k) / t) / (1 + q)


def google_laplace_threshold(epsilon: float, delta: float, max_groups: int) -> float:
    """Google's continuous Laplace threshold (``LaplacePartitionSelection::CalculateThreshold``):
    keep when count + Lap(m/epsilon) > 1 - (m/epsilon) ln(2 delta_g). For comparison only; the
    released mechanism is :func:`laplace_partition_selection`."""
    dg = -math.expm1(math.log1p(-delta) / max_groups)
    b = max_groups / epsilon
    if delta > 0.5:
        return 1 + b * math.log(2 * (1 - dg))
    return 1 - b * math.log(2 * dg)


def optimal_partition_selection(
    epsilon: Fraction | int | str, delta: Fraction | str, max_groups: int
) -> PartitionSelection:
    """The optimal rule (module docstring) for (epsilon, delta)-DP selection of groups whose
    units each lie in at most ``max_groups`` groups.

    Raises:
        ValueError: epsilon <= 0, delta outside (0, 1), max_groups < 1.
    """
    eps, d = _selection_budget(epsilon, delta)
    bounding = Bounding(max_groups=max_groups, max_rows=1)  # validates max_groups
    cal = Calibration(
        Statistic.COUNT_UNITS, bounding, Noise.OPTIMAL_SELECTION, PrivacyCost(epsilon=eps),
        rate=eps / max_groups, selection_delta=d / max_groups,
    )  # fmt: skip
    return PartitionSelection(eps, d, max_groups, 1, cal, 1, float(d / max_groups))


def keep_decision(units: int, calibration: Calibration, stream) -> int:
    """1 if the group of ``units`` (exact, bounded) units is kept, else 0: an exact
    Bernoulli(pi(units)) from the cell's keyed stream."""
    p = optimal_keep_probability(units, calibration.rate, calibration.selection_delta)
    return int(stream.bernoulli(p))


@lru_cache(maxsize=4096)
def optimal_keep_probability(n: int, epsilon: Fraction, delta: Fraction) -> Fraction:
    """pi_{epsilon,delta}(n) of Desfontaines, Voss, Gipson and Mandayam, "Differentially
    private partition selection", PoPETs 2022, Theorem 1 (the recurrence in the module
    docstring, in closed form): with E = e^eps,

        n <= n1:       pi(n) = delta (E^n - 1) / (E - 1)
        n1 < n <= n2:  pi(n) = pi(n1) + (1 - pi(n1) + delta/(E - 1)) (1 - E^-(n - n1))
        n > n2:        pi(n) = 1

    where n1 = 1 + floor(ln(1 + tanh(eps/2)(1/delta - 1)) / eps) and
    n2 = n1 + floor(ln(1 + (E - 1)(1 - pi(n1)) / delta) / eps). Computed to 60 digits and
    rounded down (a smaller probability only releases less), as an exact Fraction.
    """
    if n <= 0:
        return Fraction(0)
    with localcontext() as ctx:
        ctx.prec = 60
        e, d = _dec(Fraction(epsilon)), _dec(Fraction(delta))
        big = e.exp()
        half = (e / 2).exp()
        tanh = (half - 1 / half) / (half + 1 / half)
        n1 = 1 + int(((1 + tanh * (1 / d - 1)).ln() / e).to_integral_value(rounding=ROUND_FLOOR))

        def growing(k: int) -> Decimal:
            return d * (big**k - 1) / (big - 1)

        if n <= n1:
            p = growing(n)
        else:
            top = growing(n1)
            n2 = n1 + int(
                ((1 + (big - 1) * (1 - top) / d).ln() / e).to_integral_value(rounding=ROUND_FLOOR)
            )
            if n > n2:
                return Fraction(1)
            p = top + (1 - top + d / (big - 1)) * (1 - (-(n - n1) * e).exp())
        p = min(max(p, Decimal(0)), Decimal(1))
        return Fraction(p.quantize(Decimal(1).scaleb(-55), rounding=ROUND_FLOOR))
