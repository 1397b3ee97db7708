"""IPF against R's ``loglin`` (Haberman 1972, Algorithm AS 51) on its own documented example:
``loglin(HairEyeColor, list(c(1, 2), c(1, 3), c(2, 3)))``, the no-three-way-interaction model
of R's HairEyeColor table (Snee 1974: 592 students by hair, eye colour and sex). R prints

    5 iterations: deviation 0.04093795
    $lrt 6.761258   $pearson 6.868292   $df 9

(R is not installed here: the printed values are quoted from R's output, and a plain numpy IPF
written for this check reproduces all three, deviation included, at cycle 5.)

R stops (default ``eps = 0.1``) after the first cycle in which every margin, measured just
before it is adjusted, was within eps: cycle 5 (largest 0.0409; cycle 4: 0.173). sqlsdc's
``tol`` bounds every margin's deviation measured after the whole cycle: 0.0532 after cycle 4,
0.0126 after cycle 5. So ``tol = 0.1`` stops one cycle earlier than R (4 cycles, G² =
6.761384), and any tol in [0.0127, 0.0531] gives R's 5 cycles and its printed statistics to
the last digit. At sqlsdc's default tolerance (1e-9 of the largest target) the fit is the
maximum-likelihood one, G² = 6.7612504188 and X² = 6.8690272, which R's eps = 0.1
approximates to 1e-6 and 1e-3.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from sqlsdc.tabular.ipf import ipf

HAIR = ["Black", "Brown", "Red", "Blond"]
EYE = ["Brown", "Blue", "Hazel", "Green"]
MALE = [[32, 11, 10, 3], [53, 50, 25, 15], [10, 10, 7, 7], [3, 30, 5, 8]]
FEMALE = [[36, 9, 5, 2], [66, 34, 29, 14], [16, 7, 7, 7], [4, 64, 5, 8]]


@pytest.fixture(scope="module")
def hair_eye_color() -> pd.Series:
    counts = np.stack([np.array(MALE), np.array(FEMALE)], axis=2).astype(float)
    index = pd.MultiIndex.from_product(
        [HAIR, EYE, ["Male", "Female"]], names=["Hair", "Eye", "Sex"]
    )
    return pd.Series(counts.ravel(), index=index)


def _fit(table: pd.Series, tol: float | None):
    margins = [table.groupby(level=pair).sum() for pair in (["Hair", "Eye"], ["Hair", "Sex"],
                                                             ["Eye", "Sex"])]  # fmt: skip
    result = ipf(pd.Series(1.0, index=table.index), margins, tol=tol)
    fitted = result.values.reindex(table.index).to_numpy()
    observed = table.to_numpy()
    lrt = 2 * float(np.sum(observed * np.log(observed / fitted)))  # no empty cell here
    pearson = float(np.sum((observed - fitted) ** 2 / fitted))
    return result, lrt, pearson


def test_the_table_is_rs_hair_eye_color(hair_eye_color):
    assert hair_eye_color.sum() == 592
    assert hair_eye_color.groupby(level="Sex").sum().to_dict() == {"Female": 313, "Male": 279}


def test_rs_five_cycles_give_its_printed_statistics(hair_eye_color):
    result, lrt, pearson = _fit(hair_eye_color, tol=0.02)
    assert result.iterations == 5 and result.max_error == pytest.approx(0.0126153, abs=1e-7)
    assert round(lrt, 6) == 6.761258 and round(pearson, 6) == 6.868292


def test_tol_bounds_the_deviation_after_a_cycle_so_0_1_stops_one_cycle_before_r(hair_eye_color):
    result, lrt, _ = _fit(hair_eye_color, tol=0.1)
    assert result.iterations == 4 and result.max_error == pytest.approx(0.0531647, abs=1e-7)
    assert lrt == pytest.approx(6.761384, abs=1e-6)


def test_the_converged_fit_is_the_maximum_likelihood_one(hair_eye_color):
    result, lrt, pearson = _fit(hair_eye_color, tol=None)
    assert result.converged and result.max_error < 1e-6
    assert lrt == pytest.approx(6.7612504188, abs=1e-9)
    assert pearson == pytest.approx(6.8690272, abs=1e-6)
    assert abs(lrt - 6.761258) < 1e-5 and abs(pearson - 6.868292) < 1e-3  # R's eps = 0.1
