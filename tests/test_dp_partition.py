"""Private partition selection (Laplace tau-thresholding with discrete noise)."""

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
