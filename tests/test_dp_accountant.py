"""Privacy accounting: exact budgets, composition, sensitivities and calibration."""

from __future__ import annotations

import math
from decimal import Decimal
from fractions import Fraction

import pytest

from sqlsdc.mechanisms.accountant import (
    ZERO,
    Aggregate,
    Bounding,
    BudgetLimit,
    Noise,
    PrivacyCost,
    Statistic,
    calibrate,
    components,
    compose,
    fraction,
    norms,
    plan_aggregate,
    ratio_sd,
    sensitivity,
)
from sqlsdc.mechanisms.samplers import (
    discrete_gaussian_interval,
    discrete_gaussian_variance,
    discrete_laplace_interval,
    discrete_laplace_variance,
    zcdp_to_approx_dp,
)

HAIR = Fraction(1, 10**30)


def test_costs_are_exact_and_compose():
    a = PrivacyCost(epsilon="0.1")
    assert a.epsilon == Fraction(1, 10) and a.rho == 0
    total = compose([a] * 10)
    assert total == PrivacyCost(epsilon=1)  # ten times 0.1 is exactly 1, unlike floats
    assert 3 * PrivacyCost(rho=Fraction(1, 3)) == PrivacyCost(rho=1)
    assert (a + PrivacyCost(rho=Fraction(1, 8))).describe() == "ε = 0.1, ρ = 0.125"
    assert ZERO.is_zero and ZERO.describe() == "nothing"


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"epsilon": 0.1}, TypeError, "must be exact"),
        ({"epsilon": True}, TypeError, "must be exact"),
        ({"epsilon": -1}, ValueError, "epsilon must be >= 0"),
        ({"rho": "abc"}, ValueError, "rho: must be a number"),
    ],
)
def test_costs_refuse_inexact_or_negative_amounts(kwargs, error, match):
    with pytest.raises(error, match=match):
        PrivacyCost(**kwargs)


def test_fraction_accepts_decimals_and_strings():
    assert fraction(Decimal("0.25"), "x") == Fraction(1, 4)
    assert fraction("1/3", "x") == Fraction(1, 3)
    with pytest.raises(TypeError, match="x must be an exact number"):
        fraction(object(), "x")


def test_conversion_to_approximate_dp():
    pure = PrivacyCost(epsilon=Fraction(1, 2))
    assert pure.to_approx_dp(Fraction(1, 10**6)) == 0.5
    zcdp = PrivacyCost(rho=Fraction(1, 2))
    assert zcdp.to_approx_dp(1e-6) == zcdp_to_approx_dp(Fraction(1, 2), 1e-6)
    mixed = PrivacyCost(epsilon=Fraction(1, 10), rho=Fraction(1, 2))
    # both bounds are valid; the smaller one is reported
    split = 0.1 + zcdp_to_approx_dp(Fraction(1, 2), 1e-6)
    merged = zcdp_to_approx_dp(Fraction(1, 2) + Fraction(1, 200), 1e-6)
    assert mixed.to_approx_dp(1e-6) == min(split, merged)
    assert mixed.as_zcdp() == Fraction(1, 2) + Fraction(1, 200)


def test_limits_allow_exactly_the_budget_and_not_a_hair_more():
    limit = BudgetLimit(epsilon=1)
    spent = PrivacyCost(epsilon=Fraction(1, 3))
    assert limit.allows(spent, PrivacyCost(epsilon=Fraction(2, 3)))
    assert not limit.allows(spent, PrivacyCost(epsilon=Fraction(2, 3) + HAIR))
    assert limit.allows(spent, PrivacyCost(rho=100))  # rho is not bounded by this limit
    assert not BudgetLimit(epsilon=0).allows(ZERO, PrivacyCost(epsilon=HAIR))
    assert limit.remaining(PrivacyCost(epsilon=2)) == BudgetLimit(epsilon=0)
    assert (limit + PrivacyCost(rho=Fraction(1, 2))) == BudgetLimit(1, Fraction(1, 2))
    assert BudgetLimit().describe() == "ε unlimited, ρ unlimited, δ unlimited"
    with pytest.raises(ValueError, match="epsilon limit must be >= 0"):
        BudgetLimit(epsilon=-1)


def test_deltas_add_up_by_basic_composition():
    selection = PrivacyCost(epsilon=1, delta=Fraction(1, 10**6))
    total = compose([selection, PrivacyCost(rho=Fraction(1, 10)), 2 * selection])
    assert total == PrivacyCost(epsilon=3, rho=Fraction(1, 10), delta=Fraction(3, 10**6))
    assert total.describe() == "ε = 3, ρ = 0.1, δ = 0.000003"
    assert not PrivacyCost(delta=HAIR).is_zero
    # with a delta of its own, epsilon' is the basic-composition bound (delta: the sum)
    assert total.to_approx_dp(1e-6) == 3 + zcdp_to_approx_dp(Fraction(1, 10), 1e-6)
    assert selection.to_approx_dp(1e-6) == 1
    with pytest.raises(ValueError, match="delta must be >= 0"):
        PrivacyCost(delta=-HAIR)


def test_delta_limits_allow_exactly_the_budget_and_not_a_hair_more():
    limit = BudgetLimit(epsilon=1, delta=Fraction(1, 10**5))
    spent = PrivacyCost(epsilon=Fraction(1, 2), delta=Fraction(9, 10**6))
    assert limit.allows(spent, PrivacyCost(delta=Fraction(1, 10**6)))
    assert not limit.allows(spent, PrivacyCost(delta=Fraction(1, 10**6) + HAIR))
    assert BudgetLimit(epsilon=1).allows(ZERO, PrivacyCost(delta=1))  # not bounded by this one
    assert limit.remaining(spent) == BudgetLimit(Fraction(1, 2), None, Fraction(1, 10**6))
    assert BudgetLimit(epsilon=1) + PrivacyCost(delta=HAIR) == BudgetLimit(1, None, HAIR)
    assert limit + PrivacyCost(delta=HAIR) == BudgetLimit(1, None, Fraction(1, 10**5) + HAIR)
    assert limit.describe() == "ε 1, ρ unlimited, δ 0.00001"
    with pytest.raises(ValueError, match="delta limit must be >= 0"):
        BudgetLimit(delta=-1)


def test_noise_is_never_calibrated_with_a_delta():
    with pytest.raises(ValueError, match="count is pure or zCDP and spends no delta"):
        calibrate(Statistic.COUNT, Bounding(), PrivacyCost(epsilon=1, delta=HAIR))
    with pytest.raises(ValueError, match="spends no delta"):
        plan_aggregate(Aggregate.AVG, Bounding(lower=0, upper=1), PrivacyCost(rho=1, delta=HAIR))


def test_bounding_is_validated():
    with pytest.raises(ValueError, match="max_groups must be an integer >= 1"):
        Bounding(max_groups=0)
    with pytest.raises(ValueError, match="give both lower and upper"):
        Bounding(lower=0)
    with pytest.raises(ValueError, match="lower bound 5 is above upper bound 1"):
        Bounding(lower=5, upper=1)
    with pytest.raises(ValueError, match="not a multiple of the granularity 1"):
        Bounding(lower=0, upper=Fraction(1, 2))
    assert Bounding(lower=0, upper=Fraction(1, 2), granularity="0.25").upper == Fraction(1, 2)


@pytest.mark.parametrize(
    "statistic, bounding, per_cell",
    [
        (Statistic.COUNT, Bounding(max_groups=3, max_rows=2), 2),
        (Statistic.COUNT_UNITS, Bounding(max_groups=3, max_rows=2), 1),
        (Statistic.SUM, Bounding(max_groups=2, max_rows=2, lower=-30, upper=10), 60),
        (Statistic.SUM, Bounding(lower=0, upper=100, granularity=10), 10),  # grid units
        (Statistic.SUM_SQUARES, Bounding(max_rows=2, lower=-3, upper=2), 18),
        (Statistic.QUANTILE, Bounding(max_rows=3, lower=0, upper=10), 3),
    ],
)
def test_sensitivities_follow_wilson_et_al(statistic, bounding, per_cell):
    assert sensitivity(statistic, bounding) == (per_cell, bounding.max_groups)


@pytest.mark.parametrize("statistic", [Statistic.SUM, Statistic.SUM_SQUARES, Statistic.QUANTILE])
def test_unbounded_measures_are_refused(statistic):
    with pytest.raises(ValueError, match="needs clamping bounds"):
        calibrate(statistic, Bounding(), PrivacyCost(epsilon=1))


def test_laplace_calibration_is_exact():
    b = Bounding(max_groups=4, max_rows=2, lower=-5, upper=10)
    c = calibrate(Statistic.SUM, b, PrivacyCost(epsilon=Fraction(1, 3)))
    assert c.noise is Noise.LAPLACE
    assert c.scale == 4 * 2 * 10 * 3  # m * max_rows * max|bound| / epsilon
    assert c.sd == math.sqrt(discrete_laplace_variance(c.scale))
    assert c.half_width == discrete_laplace_interval(c.scale, Fraction(1, 20))


def test_gaussian_calibration_is_exact_and_in_value_units():
    b = Bounding(max_groups=2, lower=0, upper=Fraction(5, 2), granularity=Fraction(1, 2))
    c = calibrate(Statistic.SUM, b, PrivacyCost(rho=Fraction(1, 10)))
    # 5 grid units per row, L2^2 = 2 * 25, sigma^2 = 50 / (2/10) = 250 (in grid units)
    assert c.noise is Noise.GAUSSIAN and c.sigma2 == 250 and c.unit == Fraction(1, 2)
    assert c.sd == pytest.approx(math.sqrt(discrete_gaussian_variance(250)) / 2)
    assert c.half_width == discrete_gaussian_interval(250, Fraction(1, 20)) / 2
    squares = calibrate(Statistic.SUM_SQUARES, b, PrivacyCost(rho=Fraction(1, 10)))
    assert squares.unit == Fraction(1, 4) and squares.sigma2 == 2 * 25**2 * 5


def test_calibration_needs_exactly_one_kind():
    with pytest.raises(ValueError, match="exactly one positive budget"):
        calibrate(Statistic.COUNT, Bounding(), PrivacyCost(epsilon=1, rho=1))
    with pytest.raises(ValueError, match="exactly one positive budget"):
        calibrate(Statistic.COUNT, Bounding(), ZERO)
    with pytest.raises(ValueError, match="needs epsilon, not rho"):
        calibrate(Statistic.QUANTILE, Bounding(lower=0, upper=9), PrivacyCost(rho=1))


def test_quantile_calibration():
    b = Bounding(max_groups=2, max_rows=1, lower=0, upper=99)
    c = calibrate(Statistic.QUANTILE, b, PrivacyCost(epsilon=1), alpha=Fraction(1, 4))
    # Delta = max(1, 3) = 3 per row; epsilon per cell 1/2; rate = (1/2) / (2 * 3)
    assert c.noise is Noise.PERMUTE_AND_FLIP and c.rate == Fraction(1, 12)
    assert c.rank_error95 == pytest.approx(2 * 3 * math.log(100 / 0.05) / 0.5 / 4)
    assert "alpha=1/4" in c.describe()


def test_aggregate_plans_split_the_budget_exactly():
    b = Bounding(lower=0, upper=100)
    avg = plan_aggregate(Aggregate.AVG, b, PrivacyCost(epsilon=1))
    assert [c.statistic for c in avg.components] == [Statistic.SUM, Statistic.COUNT]
    assert avg.cost == PrivacyCost(epsilon=1) and avg.sd is None
    assert avg.component(Statistic.COUNT).scale == 2
    var = plan_aggregate(Aggregate.VAR, b, PrivacyCost(rho=1), weights=(3, 2, 1))
    assert [c.cost.rho for c in var.components] == [Fraction(1, 2), Fraction(1, 3), Fraction(1, 6)]
    assert var.cost == PrivacyCost(rho=1)
    count = plan_aggregate(Aggregate.COUNT, Bounding(), PrivacyCost(epsilon=1))
    assert count.sd == count.components[0].sd and count.half_width == 3
    assert components(Aggregate.STDDEV) == components(Aggregate.VAR)
    assert components(Aggregate.COUNT_DISTINCT) == (Statistic.COUNT_UNITS,)
    with pytest.raises(ValueError, match="avg has 2 statistics"):
        plan_aggregate(Aggregate.AVG, b, PrivacyCost(epsilon=1), weights=(1,))
    with pytest.raises(ValueError, match="weights must be positive"):
        plan_aggregate(Aggregate.AVG, b, PrivacyCost(epsilon=1), weights=(1, 0))


def test_ratio_sd_is_the_delta_method():
    assert ratio_sd(10.0, 2.0, 100, 5.0) == pytest.approx(math.sqrt(100 + 25 * 4) / 100)
    assert ratio_sd(1.0, 1.0, -3, 0.0) == 1.0  # count floored at 1


# --- a cap on a unit's rows over the whole query -----------------------------------------------


def _worst_case(m: int, r: int, cap: int | None) -> tuple[int, int]:
    """Largest L1 and L2^2 of one unit's row counts per cell, by enumeration: at most m cells,
    at most r rows in each, at most ``cap`` rows in all."""
    best_l1 = best_l2 = 0

    def fill(cells_left: int, rows_left: int, counts: list[int]) -> None:
        nonlocal best_l1, best_l2
        best_l1 = max(best_l1, sum(counts))
        best_l2 = max(best_l2, sum(c * c for c in counts))
        if cells_left == 0:
            return
        for n in range(1, min(r, rows_left) + 1):
            fill(cells_left - 1, rows_left - n, counts + [n])

    fill(m, m * r if cap is None else cap, [])
    return best_l1, best_l2


@pytest.mark.parametrize("m", [1, 2, 3])
@pytest.mark.parametrize("r", [1, 2, 4])
@pytest.mark.parametrize("cap", [None, 1, 3, 5, 12])
def test_unit_row_cap_norms_are_the_worst_case_over_all_allocations(m, r, cap):
    l1, l2sq = _worst_case(m, r, cap)
    count = Bounding(max_groups=m, max_rows=r, max_unit_rows=cap)
    assert norms(Statistic.COUNT, count) == (l1, l2sq)
    total = Bounding(m, r, Fraction(-30), Fraction(20), Fraction(10), max_unit_rows=cap)
    assert norms(Statistic.SUM, total) == (3 * l1, 9 * l2sq)  # a row moves a sum by |-30|/10
    assert norms(Statistic.SUM_SQUARES, total) == (9 * l1, 81 * l2sq)
    cells = min(m, cap or m)
    assert norms(Statistic.COUNT_UNITS, count) == (cells, cells)


def test_a_unit_row_cap_calibrates_like_the_rows_it_allows():
    """24 monthly rows of one person: per-cell caps need 24 groups x 1 row (L1 24), the cap
    needs 24 rows in all: the same noise, but it keeps the person's rows in whichever months."""
    spend = PrivacyCost(epsilon=Fraction(1))
    per_cell = calibrate(Statistic.COUNT, Bounding(max_groups=24, max_rows=1), spend)
    capped = calibrate(Statistic.COUNT, Bounding(24, 24, max_unit_rows=24), spend)
    assert per_cell.scale == capped.scale == 24
    gauss = calibrate(Statistic.COUNT, Bounding(24, 24, max_unit_rows=24),
                      PrivacyCost(rho=Fraction(1, 2)))  # fmt: skip
    assert gauss.sigma2 == 24 * 24  # all 24 rows may fall in one cell: L2 = 24
    assert "unit_rows=24" in capped.describe() and "unit_rows" not in per_cell.describe()
    with pytest.raises(ValueError, match="max_unit_rows must be an integer >= 1"):
        Bounding(max_unit_rows=0)
