"""The verification server's measures on the digest's worked cases (seed_synth_papers.md T1, T2,
T3, T8, T9, T15) and its scans against brute-force refits."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from sqlsdc.mechanisms.prf import KeyedStream
from sqlsdc.mechanisms.samplers import discrete_laplace
from sqlsdc.synth.fidelity import (
    Z95,
    combine_full,
    combine_partial,
    decile,
    decile_interval,
    fidelity,
    fidelity_array,
)
from sqlsdc.synth.scan import (
    aggregate_ci,
    fit_ols,
    ols_ci,
    safety_zones,
    scan_aggregate,
    scan_ols,
    zone_grid,
)


def test_fidelity_measure_worked_cases_t1():
    assert fidelity((1, 3), (2, 5)) == pytest.approx(0.416667, abs=1e-6)
    assert fidelity((1, 3), (1, 3)) == pytest.approx(1.0)
    assert fidelity((1, 3), (4, 5)) == 0.0
    assert fidelity((1, 3), (4, 5), clip_negative=False) == pytest.approx(-0.75)
    assert fidelity((1, 3), (0, 4)) == pytest.approx(0.75)
    assert fidelity((1, 3), (1.5, 2.5)) == pytest.approx(0.75)
    assert fidelity((1, 3), (2, 2)) == 0.5  # a CI of zero length: FM := 0.5 ([MR] §5)


@pytest.mark.parametrize(
    ("fm", "expected"),
    [(0.0, (0.0, 0.1)), (0.3, (0.3, 0.4)), (0.416667, (0.4, 0.5)), (0.82, (0.8, 0.9)),
     (0.9, (0.9, 1.0)), (0.99999, (0.9, 1.0)), (1.0, (0.9, 1.0)), (-0.75, (0.0, 0.1))],
)  # fmt: skip
def test_decile_mapping(fm, expected):
    assert decile(fm) == expected


def test_decile_interval_spans_the_extremes():
    assert decile_interval([0.43, 0.6, 0.81]) == (0.4, 0.9)  # [MR] §5 step 8
    assert decile_interval([0.78, 0.72, 0.72]) == (0.7, 0.8)  # Fig. 6


def test_partial_combining_rules_t2():
    c = combine_partial([1.0, 1.2, 1.1], [0.04, 0.05, 0.06])
    assert c.estimate == pytest.approx(1.1)
    assert c.variance == pytest.approx(0.053333, abs=1e-6)
    assert c.df == pytest.approx(512)
    assert (c.low, c.high) == pytest.approx((0.646293, 1.553707), abs=1e-6)


def test_full_combining_rules_and_the_non_negative_variance():
    c = combine_full([1.0, 1.4, 0.6], [0.01, 0.01, 0.01], n_synthetic=100, n_observed=100)
    assert c.variance == pytest.approx(4 / 3 * 0.16 - 0.01)
    same = combine_full([1.0, 1.0, 1.0], [0.04, 0.04, 0.04], n_synthetic=50, n_observed=100)
    assert same.variance == pytest.approx(0.02) and math.isinf(same.df)  # Reiter 2002
    with pytest.raises(ValueError, match="m >= 2"):
        combine_partial([1.0], [0.1])


def test_laplace_tails_of_the_noisy_release_t3():
    """P(|Δ| > 0.5) at ε = 1 is e^-0.5 = 0.607 for FM noise of scale 1 (1000 grid units)."""
    stream = KeyedStream(b"a test secret of 16+ bytes", "t3")
    draws = np.array([discrete_laplace(Fraction(1000), stream.derive(i)) for i in range(4000)])
    assert np.mean(np.abs(draws) > 1000) == pytest.approx(math.exp(-1), abs=0.03)
    assert np.mean(np.abs(draws) > 500) == pytest.approx(math.exp(-0.5), abs=0.03)


Y = np.array([2.0, 4.0, 5.0, 7.0, 9.0])
SYNTHETIC = (3.5, 7.0)


def _fm_of_mean(values):
    est, se = aggregate_ci("avg", values.sum(), (values**2).sum(), len(values), len(values))
    return float(fidelity_array(est - Z95 * se, est + Z95 * se, *SYNTHETIC))


def test_safety_zone_decile_t8():
    assert _fm_of_mean(Y) == pytest.approx(0.869474, abs=1e-6)
    assert decile(_fm_of_mean(Y)) == (0.8, 0.9)
    grid = zone_grid(Y - 1.5, Y + 1.0)  # zone endpoints and 9 interior points
    fms = [_fm_of_mean(np.where(np.arange(5) == j, v, Y)) for j in range(5) for v in grid[j]]
    assert min(fms) == pytest.approx(0.811047, abs=1e-6)
    assert max(fms) == pytest.approx(0.944221, abs=1e-6)
    assert decile_interval([_fm_of_mean(Y), *fms]) == (0.8, 1.0)


def test_exact_fm_attack_t9_and_what_the_interval_leaves():
    """Knowing Y_1..Y_4 and the exact FM pins Y_5 to {6.002, 9.000}; the released interval
    (0.8, 1.0) leaves a wide range of Y_5 values consistent."""
    candidates = np.linspace(-20, 30, 500_001)
    fms = np.array([_fm_of_mean(np.append(Y[:4], v)) for v in candidates[::50]])
    target = _fm_of_mean(Y)
    roots = candidates[::50][np.abs(fms - target) < 2e-4]
    assert {round(r, 1) for r in roots} <= {6.0, 9.0}
    consistent = candidates[::50][(fms >= 0.8) & (fms <= 1.0)]
    assert consistent.max() - consistent.min() > 5


def test_aggregate_scan_covers_every_neighbour():
    """The scan's extremes equal brute force over value moves, removals and additions."""
    rng = np.random.default_rng(3)
    y = rng.normal(10, 3, 25)
    joiners = np.array([0.0, 40.0])
    zones = (y - 1.0, y + 2.0)
    low, high = scan_aggregate("avg", y, population=25, synthetic=SYNTHETIC, zones=zones,
                               joiners=joiners, z=Z95)  # fmt: skip
    fms = [_fm_of_mean(y)]
    grid = zone_grid(*zones)
    fms += [_fm_of_mean(np.where(np.arange(25) == j, v, y)) for j in range(25) for v in grid[j]]
    fms += [_fm_of_mean(np.delete(y, j)) for j in range(25)]
    fms += [_fm_of_mean(np.append(y, v)) for v in joiners]
    assert (low, high) == pytest.approx((min(fms), max(fms)))


def test_ols_scan_matches_refits_t15():
    rng = np.random.default_rng(5)
    n = 40
    x = np.column_stack([np.ones(n), rng.normal(size=n), rng.normal(size=n)])
    y = x @ np.array([0.0, 3.0, -5.0]) + rng.normal(size=n)
    x_join, y_join = x[:3] + 0.5, y[:3] - 2.0
    fit = fit_ols(x, y)
    synthetic = (2.5, 3.3)
    zones = (y - 2.5, y + 1.5)

    def fm(xx, yy):
        est, se = ols_ci(fit_ols(xx, yy), 1)
        return fidelity((est - Z95 * se, est + Z95 * se), synthetic)

    low, high = scan_ols(fit, x, 1, synthetic=synthetic, zones=zones, y=y, x_join=x_join,
                         y_join=y_join, z=Z95)  # fmt: skip
    grid = zone_grid(*zones)
    fms = [fm(x, y)]
    fms += [fm(x, np.where(np.arange(n) == j, v, y)) for j in range(n) for v in grid[j]]
    fms += [fm(np.delete(x, j, 0), np.delete(y, j)) for j in range(n)]
    fms += [fm(np.vstack([x, x_join[i]]), np.append(y, y_join[i])) for i in range(3)]
    assert (low, high) == pytest.approx((min(fms), max(fms)), abs=1e-9)


def test_safety_zones_are_asymmetric_keyed_and_contain_the_value():
    values = np.array([100.0, 100.0, 5.0, 0.0])
    low, high = safety_zones(values, key=b"k" * 32, spread=8.0)
    assert np.all(low < values) and np.all(values < high)
    assert low[0] == low[1] and high[0] == high[1]  # equal values, equal zones
    midpoints = (low + high) / 2
    assert not np.allclose(midpoints, values)  # the midpoint does not reveal the value
    other, _ = safety_zones(values, key=b"x" * 32, spread=8.0)
    assert not np.allclose(other, low)  # the offsets depend on the secret
    assert high[3] - low[3] == pytest.approx(2.0)  # width floor: a quarter of the spread
