"""Our exact noise intervals against OpenDP's documented accuracy conversions (OpenDP 0.16,
``discrete_laplacian_scale_to_accuracy`` and ``discrete_gaussian_scale_to_accuracy``).

OpenDP's accuracy is the value ``acc`` with P(|X| >= acc) <= alpha (a real number for the
discrete Laplace, from the closed form of its tail; an integer for the discrete Gaussian);
ours is the smallest integer ``a`` with P(|X| <= a) >= 1 - alpha. For integer noise the two say
the same thing exactly when ``a = ceil(acc) - 1``. Both samplers are Canonne, Kamath & Steinke
(NeurIPS 2020) exact samplers: the discrete Laplace of scale t (P(x) ∝ exp(-|x|/t)) and the
discrete Gaussian N_Z(0, σ²); OpenDP's ``scale`` is t and σ.
"""

from __future__ import annotations

import math
from fractions import Fraction

import pytest

from sqlsdc.mechanisms.samplers import discrete_gaussian_interval, discrete_laplace_interval

SCALES = [Fraction(1, 2), 1, 2, Fraction(37, 10), 10, 25, 100, 1000]
ALPHAS = [Fraction(1, 2), Fraction(1, 5), Fraction(1, 10), Fraction(1, 20), Fraction(1, 100),
          Fraction(1, 1000), Fraction(1, 10**6)]  # fmt: skip


@pytest.fixture(scope="module")
def dp():
    prelude = pytest.importorskip("opendp.prelude")
    prelude.enable_features("contrib")
    return prelude


@pytest.mark.parametrize("scale", SCALES)
def test_discrete_laplace_interval_is_opendps_accuracy(dp, scale):
    for alpha in ALPHAS:
        acc = dp.discrete_laplacian_scale_to_accuracy(float(scale), float(alpha))
        assert discrete_laplace_interval(scale, alpha) == max(math.ceil(acc) - 1, 0)


@pytest.mark.parametrize("scale", SCALES)
def test_discrete_gaussian_interval_is_opendps_accuracy(dp, scale):
    for alpha in ALPHAS:
        acc = dp.discrete_gaussian_scale_to_accuracy(float(scale), float(alpha))
        assert discrete_gaussian_interval(Fraction(scale) ** 2, alpha) == max(acc - 1, 0)


def test_opendp_values_at_scale_10(dp):
    """t = σ = 10, alpha = 0.05: OpenDP 0.16 returns 30.44 and 21 (our intervals ±30 and ±20,
    the examples of our docstrings)."""
    assert dp.discrete_laplacian_scale_to_accuracy(10.0, 0.05) == pytest.approx(30.4448, abs=1e-4)
    assert discrete_laplace_interval(10, Fraction(1, 20)) == 30
    assert dp.discrete_gaussian_scale_to_accuracy(10.0, 0.05) == 21
    assert discrete_gaussian_interval(100, Fraction(1, 20)) == 20
