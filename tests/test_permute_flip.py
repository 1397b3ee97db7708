"""The draws behind permute-and-flip's coins (sqlsdc.mechanisms.permute_flip): each has its
distribution, its rare refinements (more bits of U) included."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from sqlsdc.mechanisms import permute_flip as pf
from sqlsdc.mechanisms.prf import KeyedStream

SECRET = b"sqlsdc test secret - permute-and-flip"
LEVEL = 1e-4


def test_the_thresholds_are_the_floors_of_2_16_e_minus_v():
    assert pf._RUN_BELOW.tolist() == [int(65536 * math.exp(-v)) for v in range(1, 12)]


@pytest.mark.parametrize("v", [1, 2, 7, 30])
def test_exp_above_decides_exactly_next_to_e_minus_v(v):
    near = Fraction(math.exp(-v))  # a double a few ulps from e^-v
    ulp = Fraction(math.ulp(math.exp(-v)))
    below, above = near - 4 * ulp, near + 4 * ulp
    assert pf._exp_above(v, below) and not pf._exp_above(v, above)
    assert pf._exp_above(v, Fraction(0)) and not pf._exp_above(v, Fraction(1))


def test_the_run_of_heads_is_geometric():
    """V = #{v >= 1 : U < e^-v}: P(V = v) = e^-v - e^-(v+1), over 400,000 lanes (about 70
    of them refined by more bits of U)."""
    run = pf._heads_run(KeyedStream(SECRET, "run"), 400_000)
    counts = np.bincount(run)
    p = np.array([math.exp(-v) - math.exp(-v - 1) for v in range(7)])
    observed = np.append(counts[:7], run.size - counts[:7].sum())
    expected = np.append(p, 1 - p.sum()) * run.size
    assert stats.chisquare(observed, expected).pvalue > LEVEL


def test_the_first_zero_has_p_of_l_above_k_one_over_k_factorial():
    first = pf._first_zero(KeyedStream(SECRET, "first"), 400_000)
    counts = np.bincount(first)
    p = np.array([1 / math.factorial(k - 1) - 1 / math.factorial(k) for k in range(2, 7)])
    assert first.min() == 2 and counts[:2].sum() == 0
    observed = np.append(counts[2:7], first.size - counts[2:7].sum())
    expected = np.append(p, 1 - p.sum()) * first.size
    assert stats.chisquare(observed, expected).pvalue > LEVEL


def test_refined_draws_have_their_conditional_distributions():
    """U in [0, 2^-16): V >= 11 and P(V >= 12) = 2^16 e^-12 (0.40); L >= 9 and P(L >= 10) =
    2^16/9! (0.18). U in the interval of e^-1's threshold word: V is 0 or 1."""
    n = 3_000
    base = KeyedStream(SECRET, "refined")
    runs = np.array([pf._run_of(base.derive("run", i), 0) for i in range(n)])
    firsts = np.array([pf._first_zero_of(base.derive("first", i), 0) for i in range(n)])
    assert runs.min() == 11 and firsts.min() == 9
    for hits, p in (((runs >= 12).sum(), 65536 * math.exp(-12)),
                    ((firsts >= 10).sum(), 65536 / math.factorial(9))):  # fmt: skip
        assert stats.binomtest(int(hits), n, p).pvalue > LEVEL
    at_e = {pf._run_of(base.derive("e", i), int(pf._RUN_BELOW[0])) for i in range(200)}
    assert at_e == {0, 1}
