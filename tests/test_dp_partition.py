"""Private partition selection: Laplace tau-thresholding with discrete noise, and the optimal
rule of Desfontaines et al. (PoPETs 2022)."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from sqlsdc.mechanisms.dp_cells import CellMechanism, CellSpace, add_noise
from sqlsdc.mechanisms.partition import (
    google_laplace_threshold,
    keep_partitions,
    laplace_partition_selection,
    optimal_keep_probability,
    optimal_partition_selection,
    release_probability,
)
from sqlsdc.mechanisms.samplers import discrete_laplace_pmf

SECRET = b"sqlsdc test secret - partitions 01"
LN3 = Fraction(math.log(3))  # the float ln 3, exactly
DELTA = 2.0894334e-24  # chosen in Google's tests so that the m = 1 threshold is 50


# Google differential-privacy, cc/algorithms/partition-selection_test.cc (ThresholdTest rows):
# (epsilon, delta, max_partitions_contributed, expected threshold, tolerance)
GOOGLE = [
    (math.log(3), DELTA, 1, 50.0, 0.05),
    (math.log(3), DELTA, 2, 100.262, 0.05),
    (math.log(3), DELTA, 3, 151.0, 0.05),
    (math.log(3), DELTA, 10, 511.959, 0.05),
    (math.log(3), DELTA, 100, 5320.18, 0.05),
    (1.0, DELTA, 1, 54.832, 0.05),
    (0.5, DELTA, 1, 108.664, 0.05),
    (2.0, DELTA, 1, 27.916, 0.05),
    (0.001, 0.99999999999, 1, -24634.3, 0.05),
]


@pytest.mark.parametrize("epsilon, delta, m, expected, tolerance", GOOGLE)
def test_continuous_reference_reproduces_googles_published_thresholds(
    epsilon, delta, m, expected, tolerance
):
    assert google_laplace_threshold(epsilon, delta, m) == pytest.approx(expected, abs=tolerance)


@pytest.mark.parametrize("epsilon, delta, m, expected, tolerance", GOOGLE[:-1])
def test_discrete_threshold_sits_just_above_the_continuous_one(
    epsilon, delta, m, expected, tolerance
):
    # discrete: P(Z >= k) = q^k/(1+q) with 1/(1+q) in (1/2, 1): k is between x - 1 and x - 1/2
    sel = laplace_partition_selection(Fraction(epsilon), Fraction(delta), m)
    assert expected <= sel.threshold < expected + 1.5


def test_the_published_case_exactly():
    # epsilon = ln 3: q = 1/3, P(Z >= k) = 3^-k * 3/4; delta = 3^-49/2 needs k = 50
    sel = laplace_partition_selection(LN3, Fraction(DELTA), 1)
    assert sel.threshold == 51 and sel.scale == 1 / LN3


@pytest.mark.parametrize(
    "epsilon, delta, m, per_group",
    [
        (Fraction(1), Fraction(1, 10**6), 1, 1),
        (Fraction(1, 2), Fraction(1, 10**9), 3, 1),
        (Fraction(2), Fraction(1, 10**5), 5, 2),
        (Fraction(1, 10), Fraction(1, 1000), 1, 1),
    ],
)
def test_threshold_is_the_smallest_with_the_required_probability(epsilon, delta, m, per_group):
    sel = laplace_partition_selection(epsilon, delta, m, per_group=per_group)
    t = m * per_group / epsilon
    assert sel.scale == t
    # direct sum of the pmf: P(c + Z >= tau) for a group holding only one unit's rows
    tail = lambda k: math.fsum(discrete_laplace_pmf(z, t) for z in range(k, k + 4000))  # noqa: E731
    at = tail(sel.threshold - per_group)
    below = tail(sel.threshold - 1 - per_group)
    assert at == pytest.approx(release_probability(per_group, t, sel.threshold), rel=1e-9)
    assert at <= sel.delta_per_group * (1 + 1e-12)
    assert below > sel.delta_per_group or sel.threshold - 1 - per_group < 1
    # over the unit's m groups: 1 - (1 - delta_g)^m <= delta
    assert -math.expm1(m * math.log1p(-at)) <= float(delta) * (1 + 1e-9)


def test_release_probability_both_sides_of_the_threshold():
    t = Fraction(2)
    for count in (0, 5, 9, 10, 11, 30):
        direct = math.fsum(discrete_laplace_pmf(z, t) for z in range(10 - count, 400))
        assert release_probability(count, t, 10) == pytest.approx(direct, rel=1e-9)


def test_keep_mask():
    assert keep_partitions(np.array([1, 14, 15, 100]), 15).tolist() == [False, False, True, True]


def test_lone_units_are_released_at_the_claimed_rate():
    # delta large enough to observe: a group with one unit is kept with probability delta_g
    sel = laplace_partition_selection(Fraction(1), Fraction(1, 20), 1)
    n = 20_000
    frame = pd.DataFrame({"g": np.arange(n), "units": np.ones(n, dtype=int)})
    out = add_noise(frame, CellSpace.of("t", ["g"]), {"units": CellMechanism("*", sel.calibration)},
                    secret=SECRET, policy_version=1)  # fmt: skip
    kept = int(keep_partitions(out.frame["units"], sel.threshold).sum())
    p = release_probability(1, sel.scale, sel.threshold)
    assert p <= 1 / 20
    assert stats.binomtest(kept, n, p).pvalue > 1e-4
    assert stats.binomtest(kept, n, 1.3 * p).pvalue < 1e-4  # the test can fail


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"epsilon": 0, "delta": "1e-6", "max_groups": 1}, ValueError, "epsilon must be positive"),
        ({"epsilon": 1, "delta": 0, "max_groups": 1}, ValueError, r"delta must be in \(0, 1\)"),
        ({"epsilon": 1, "delta": 1, "max_groups": 1}, ValueError, r"delta must be in \(0, 1\)"),
        ({"epsilon": 1, "delta": "1e-6", "max_groups": 0}, ValueError, "max_groups must be"),
        ({"epsilon": 1.0, "delta": "1e-6", "max_groups": 1}, TypeError, "must be exact"),
        ({"epsilon": 1, "delta": "1e-6", "max_groups": 1, "per_group": 0}, ValueError,
         "per_group must be"),
    ],
)  # fmt: skip
def test_bad_parameters_are_refused(kwargs, error, match):
    with pytest.raises(error, match=match):
        laplace_partition_selection(**kwargs)


# --- the optimal rule ------------------------------------------------------------------------

OPTIMAL_CASES = [
    (Fraction(1), Fraction(1, 10**6)),
    (Fraction(1, 2), Fraction(1, 10**5)),
    (Fraction(1, 10), Fraction(1, 100)),
    (Fraction(3), Fraction(1, 10**9)),
    (LN3, Fraction(DELTA)),
]


def _recurrence(epsilon: float, delta: float, n_max: int) -> list[float]:
    """The definition (Desfontaines et al. 2022, Theorem 1), step by step."""
    pi = [0.0]
    for _ in range(n_max):
        p = pi[-1]
        pi.append(min(math.exp(epsilon) * p + delta, 1 - math.exp(-epsilon) * (1 - p - delta), 1))
    return pi


@pytest.mark.parametrize("epsilon, delta", OPTIMAL_CASES)
def test_closed_form_equals_the_defining_recurrence(epsilon, delta):
    reference = _recurrence(float(epsilon), float(delta), 400)
    for n, expected in enumerate(reference):
        assert float(optimal_keep_probability(n, epsilon, delta)) == pytest.approx(
            expected, abs=1e-12
        )


@pytest.mark.parametrize("epsilon, delta", OPTIMAL_CASES)
def test_keep_probabilities_satisfy_epsilon_delta_both_ways(epsilon, delta):
    e, d = math.exp(float(epsilon)), float(delta)
    pi = [float(optimal_keep_probability(n, epsilon, delta)) for n in range(400)]
    for before, after in zip(pi, pi[1:], strict=False):  # one unit added or removed
        assert after <= e * before + d + 1e-15  # P(keep) with the unit
        assert 1 - before <= e * (1 - after) + d + 1e-15  # P(drop) without it


@pytest.mark.parametrize("epsilon, delta", OPTIMAL_CASES[:3])
def test_optimal_rule_keeps_every_group_at_least_as_often_as_thresholding(epsilon, delta):
    laplace = laplace_partition_selection(epsilon, delta, 1)
    for n in range(1, 200):
        assert (
            float(optimal_keep_probability(n, epsilon, delta))
            >= release_probability(n, laplace.scale, laplace.threshold) - 1e-12
        )


def test_small_groups_are_kept_much_more_often_than_by_thresholding():
    epsilon, delta = Fraction(1), Fraction(1, 10**6)
    laplace = laplace_partition_selection(epsilon, delta, 1)
    assert float(optimal_keep_probability(14, epsilon, delta)) == pytest.approx(0.6999, abs=1e-4)
    assert release_probability(14, laplace.scale, laplace.threshold) == pytest.approx(0.269, 1e-2)


def test_decisions_are_drawn_at_the_stated_probability_and_use_epsilon_and_delta_per_group():
    sel = optimal_partition_selection(Fraction(2), Fraction(1, 10), max_groups=2)
    assert sel.calibration.rate == 1 and sel.calibration.selection_delta == Fraction(1, 20)
    assert sel.threshold == 1 and sel.cost.epsilon == 2
    n = 20_000
    units = np.arange(n) % 4  # groups of 0, 1, 2 and 3 units
    frame = pd.DataFrame({"g": np.arange(n), "units": units})
    out = add_noise(frame, CellSpace.of("t", ["g"]), {"units": CellMechanism("*", sel.calibration)},
                    secret=SECRET, policy_version=1)  # fmt: skip
    kept = out.frame["units"].to_numpy()
    assert set(np.unique(kept)) <= {0, 1}
    for size in range(4):
        p = float(optimal_keep_probability(size, Fraction(1), Fraction(1, 20)))
        k = int(kept[units == size].sum())
        if p == 0:
            assert k == 0
        else:
            assert stats.binomtest(k, n // 4, p).pvalue > 1e-4
    again = add_noise(frame, CellSpace.of("t", ["g"]),
                      {"units": CellMechanism("*", sel.calibration)}, secret=SECRET,
                      policy_version=1)  # fmt: skip
    assert (again.frame["units"].to_numpy() == kept).all()  # keyed: the same decisions


def test_bad_parameters_of_the_optimal_rule_are_refused():
    with pytest.raises(ValueError, match="epsilon must be positive"):
        optimal_partition_selection(0, "1e-6", 1)
    with pytest.raises(ValueError, match=r"delta must be in \(0, 1\)"):
        optimal_partition_selection(1, 1, 1)
    with pytest.raises(ValueError, match="max_groups must be"):
        optimal_partition_selection(1, "1e-6", 0)
