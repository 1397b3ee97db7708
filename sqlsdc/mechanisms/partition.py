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
from decimal import ROUND_CEILING, Decimal, localcontext
from fractions import Fraction

import numpy as np

from sqlsdc.mechanisms.accountant import (
    Bounding,
    Calibration,
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
    "release_probability",
]


@dataclass(frozen=True, slots=True)
class PartitionSelection:
    """Parameters of Laplace tau-thresholding: draw counts with ``calibration`` (scale t),
    keep a group when its noisy count is ``>= threshold``; ``delta_per_group`` is delta_g."""

    epsilon: Fraction
    delta: Fraction
    max_groups: int
    per_group: int
    calibration: Calibration
    threshold: int
    delta_per_group: float

    @property
    def scale(self) -> Fraction:
        return self.calibration.scale

    @property
    def cost(self) -> PrivacyCost:
        """epsilon of the counts; the stage adds ``delta`` to it (:attr:`DpStage.cost`) and the
        ledger adds up the deltas (basic composition), as it does epsilon."""
        return self.calibration.cost


def _dec(x: Fraction) -> Decimal:
    return Decimal(x.numerator) / Decimal(x.denominator)


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
    eps = fraction(epsilon, "epsilon")
    d = fraction(delta, "delta")
    if eps <= 0:
        raise ValueError(f"epsilon must be positive, got {eps}")
    if not 0 < d < 1:
        raise ValueError(f"delta must be in (0, 1), got {d}")
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
