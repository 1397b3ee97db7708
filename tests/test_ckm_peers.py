"""Magnitude CKM step by step against the peers' definition (τ-ARGUS and cellKey).

τ-ARGUS (libtauargus ``TauArgus::SetCellKeyValuesCont``, ``flexfunction``, ``LookUpVinptable``,
sdcTools/libtauargus @11ff72a) and cellKey (``.perturb_cell_flex``, ``.lookup_v_flex``,
sdcTools/cellKey @80bb032) perturb a cell x contributor by contributor:

    x_delta_j = x_j·ε_j·m(|x_j|)        (m = p_small below the flex point fp)
    if |x| < |x_delta_j|: x_delta_j = x, x_j = x/(p_small·ε_j)
    v_j = ptable at a = |x/x_delta_j|   (x the running value; interpolated, capped at D)
    x += sign(x)·|x_delta_j|·sign(v_j)·(μ + |v_j|)

The lookup position is the running *cell value* over the amplitude (a value under D·|x_delta|
reads a row whose targets stop at 0), not the contribution's: sqlsdc used |x_j/x_delta_j|
(cellKey before 2019-09-25) until session 43. ε_j weighs x_delta_j on both sides of fp in
τ-ARGUS; cellKey leaves it out below fp. sqlsdc left it out on both sides until session 43.

The ptable here is made by hand (no spread: ``step=0``), so each expected value is a line of
arithmetic.
"""

from __future__ import annotations

import numpy as np
import pytest

from sqlsdc.mechanisms.ckm import Lookup, perturb_magnitude, scrambled
from sqlsdc.mechanisms.parameters import MagnitudeCkm

M = 2**32
Q = M // 4

# rows 0, 1 and 4 (D = 4); each row cuts the keys into quarters
ENTRIES = [  # (i, v, lo, hi)
    (0, 0.0, 0, M),
    (1, -1.0, 0, Q),
    (1, 0.5, Q, 2 * Q),
    (1, 1.0, 2 * Q, 3 * Q),
    (1, 2.0, 3 * Q, M),
    (4, -2.0, 0, Q),
    (4, -0.5, Q, 2 * Q),
    (4, 1.5, 2 * Q, 3 * Q),
    (4, 3.0, 3 * Q, M),
]


@pytest.fixture(scope="module")
def table() -> Lookup:
    i, v, lo, hi = zip(*ENTRIES, strict=True)
    return Lookup(
        np.array(["all"] * len(ENTRIES)), np.array(i, float), np.array(v), np.array(lo),
        np.array(hi), step=0,
    )  # fmt: skip


def _m(x: float, p_small: float, p_large: float, fp: float, q: float) -> float:
    """cellKey ``.para_m`` / τ-ARGUS ``flexfunction`` above the flex point."""
    f1 = (p_small * x - p_large * fp) / (p_large * fp)
    return p_large * (1 + f1 * (2 * fp / (fp + x)) ** q)


def _params(**kw) -> MagnitudeCkm:
    base = dict(top_k=1, fp=500.0, p_small=0.2, p_large=0.05, q=3.0)
    return MagnitudeCkm(**(base | kw))


def test_second_contribution_amplitude_is_weighted_by_its_epsilon(table):
    """top_k 2, ε = (1, 0.5), both contributions above fp: x_delta_2 = x_2·0.5·m(x_2)
    (τ-ARGUS ``xdelta = xj*epsilon[j-1]*flexfunction(...)``; cellKey ``xj * m * epsilon[j]``).
    Fails before session 43 (x_delta_2 = x_2·m(x_2): twice the noise of the second step)."""
    m = _params(top_k=2, epsilon=(1.0, 0.5))
    key = 3 * Q + 5  # j = 1 reads v = 3 in row 4
    key2 = scrambled(key, 1)  # same_key: j = 2 reads the key rotated by 4 bits
    v2 = next(v for i, v, lo, hi in ENTRIES if i == 4 and lo <= key2 < hi)
    x1, x2 = 2000.0, 1000.0
    total = x1 + x2
    d1 = x1 * _m(x1, 0.2, 0.05, 500.0, 3.0)
    assert total / d1 > 4  # last row
    x = total + d1 * 3.0
    d2 = x2 * 0.5 * _m(x2, 0.2, 0.05, 500.0, 3.0)
    assert x / d2 > 4
    expected = x + np.sign(v2) * d2 * abs(v2)
    got = perturb_magnitude(total, [x1, x2], key, 2, m, table)
    assert got == pytest.approx(expected, rel=1e-12)
    assert v2 != 0  # the step the weight scales is not empty


def test_epsilon_weighs_a_contribution_below_the_flex_point(table):
    """Below fp τ-ARGUS's amplitude is x_j·ε_j·s1 (``flexfunction`` returns s1 = p_small),
    as its rescaling x_j = x/(ε_j·s1) inverts; cellKey writes x_j·p_small there. Fails before
    session 43."""
    m = _params(top_k=2, epsilon=(1.0, 0.25))
    key = 2 * Q + 9  # v = 1.5 in row 4
    key2 = scrambled(key, 1)
    v2 = next(v for i, v, lo, hi in ENTRIES if i == 4 and lo <= key2 < hi)
    x1, x2 = 300.0, 200.0  # both below fp = 500
    x = 500.0 + 300.0 * 0.2 * 1.5
    d2 = 200.0 * 0.25 * 0.2
    assert x / d2 > 4
    got = perturb_magnitude(500.0, [x1, x2], key, 2, m, table)
    assert got == pytest.approx(x + np.sign(v2) * d2 * abs(v2), rel=1e-12)


def test_lookup_position_is_the_cell_value_over_the_amplitude(table):
    """p_small 0.5 beside D = 4: a one-person cell of 100 sits at a = 100/50 = 2 (rows 1 and 4
    interpolated, λ = 1/3); a cell of three such persons at a = 300/50 = 6, the last row. With
    the contribution's position |x_1/x_delta| both read a = 2. Fails before session 43 for the
    three-person cell."""
    m = _params(p_small=0.5, p_large=0.1)
    key = 3 * Q + 1  # v = 2 in row 1, 3 in row 4
    one = perturb_magnitude(100.0, [100.0], key, 1, m, table)
    assert one == pytest.approx(100.0 + 50.0 * ((2 / 3) * 2.0 + (1 / 3) * 3.0), rel=1e-12)
    three = perturb_magnitude(300.0, [100.0], key, 3, m, table)
    assert three == pytest.approx(300.0 + 50.0 * 3.0, rel=1e-12)


def test_a_rescaled_amplitude_reads_row_one(table):
    """A sum of both signs below its amplitude: x = 10 from +1,000 and −990, x_delta = 200 >
    |x|, so x_delta = x = 10 and a = |x/x_delta| = 1: row 1, whose targets stop at 0 (τ-ARGUS
    and cellKey alike). The contribution's position was |x_1/x_delta| = (10/0.2)/10 = 5: the
    last row. Fails before session 43."""
    m = _params()
    key = 2 * Q + 3  # v = 1 in row 1, 1.5 in row 4
    got = perturb_magnitude(10.0, [1000.0], key, 2, m, table)
    assert got == pytest.approx(10.0 + 10.0 * 1.0, rel=1e-12)


def test_a_second_contribution_below_the_separation_point_adds_nothing(table):
    """With a small-cells ptable (z_s = √m1² / (√Σε²·p_small) = 1/(√1.25·0.2) = 4.47), a
    contribution j >= 2 under z_s adds nothing (τ-ARGUS: ``if (fabs(xj) >= z_s) ... // else
    add zero``; cellKey's stated intent, "perturbation value should be 0 for all cells below
    the separation point ... and j > 1"). Fails before session 43: 1 was added from the
    small-cells table."""
    small = Lookup(
        np.array(["all", "all"]), np.array([0.0, 1.0]), np.array([0.0, 1.0]),
        np.array([0, 0]), np.array([M, M]), step=0,
    )  # fmt: skip
    m = _params(top_k=2, epsilon=(1.0, 0.5))
    key = 3 * Q + 5  # j = 1: v = 3 in row 4
    d1 = 1000.0 * _m(1000.0, 0.2, 0.05, 500.0, 3.0)
    got = perturb_magnitude(1003.0, [1000.0, 3.0], key, 2, m, table, small, m1sq=1.0)
    assert got == pytest.approx(1003.0 + d1 * 3.0, rel=1e-12)
