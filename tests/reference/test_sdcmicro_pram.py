"""Invariant PRAM against sdcMicro's ``pram()`` (sdcTools/sdcMicro R/pram.R @cf32510,
``pramWORK`` → ``calcTransitionMatrix``), transcribed line by line since R is not available.

sdcMicro builds, per variable with L categories of relative frequencies p:

    P[i, i] = pd_i,  P[i, j] = (1 − pd_i)/(L − 1)        (pd_i ~ U(pd, 1); here given)
    Qest[k, j] = P[j, k]·p_j / Σ_i p_i·P[i, k]           (the backward matrix)
    R = P %*% Qest,  Rs = α·R + (1 − α)·I                 (defaults pd = 0.8, α = 0.5)

sqlsdc's ``pram:<col>:p=..,invariant=1`` step is :func:`sqlsdc.microdata.pram.matrix_e` (nE(p):
every pd_i = p) then :func:`~sqlsdc.microdata.pram.make_invariant` (R = P·Q). With the same P it
gives sdcMicro's R to rounding; sdcMicro's defaults differ on purpose: its diagonal is drawn
from U(pd, 1) per category with R's unseeded RNG (not reproducible from a secret), and it mixes
R with the identity (α = 0.5), which keeps invariance (Tᵗ·I = Tᵗ) but halves the change
probability. sdcMicro normalises p by ``sum(as.numeric(xvec))``, the sum of the factor *codes*,
not the count; the constant cancels in Qest, so the matrix is still right.
"""

from __future__ import annotations

import numpy as np
import pytest

from sqlsdc.microdata import pram


def _sdcmicro_transition(counts, pds, alpha: float) -> np.ndarray:
    """``calcTransitionMatrix`` of R/pram.R with the runif draw replaced by ``pds``."""
    L = len(counts)
    pds = np.asarray(pds, dtype=float)
    P = np.empty((L, L))
    tri = (1 - pds) / (L - 1)
    for i in range(L):
        P[i, :] = tri[i]
    np.fill_diagonal(P, pds)
    codes = np.repeat(np.arange(1, L + 1), counts)  # as.numeric(factor): the level codes
    p = np.asarray(counts, dtype=float) / codes.sum()
    Qest = P.copy()
    for k in range(L):
        s = np.sum(p * P[:, k])
        for j in range(L):
            Qest[k, j] = P[j, k] * p[j] / s
    R = P @ Qest
    return alpha * R + (1 - alpha) * np.eye(L)


@pytest.mark.parametrize(
    "counts", [[500, 300, 200], [5576, 24, 632], [40, 25, 20, 10, 5], [7, 993]]
)
@pytest.mark.parametrize("pd", [0.8, 0.6, 0.95])
def test_sqlsdcs_invariant_matrix_is_sdcmicros_with_alpha_1(counts, pd):
    T = np.asarray(counts)
    ours = pram.make_invariant(pram.matrix_e(pd, len(T)), T)
    theirs = _sdcmicro_transition(T, [pd] * len(T), alpha=1.0)
    np.testing.assert_allclose(ours, theirs, rtol=1e-12, atol=1e-15)
    assert T @ ours == pytest.approx(T, rel=1e-12)


def test_sdcmicros_random_diagonals_and_alpha_mix_stay_invariant():
    """The same backward construction for sdcMicro's per-category pd_i and α = 0.5: what
    ``make_invariant`` gives for that P, mixed with I, is sdcMicro's Rs, and keeps Tᵗ."""
    T = np.array([40, 25, 20, 10, 5])
    pds = np.array([0.81, 0.93, 0.85, 0.99, 0.8])
    P = np.full((5, 5), 0.0)
    for i in range(5):
        P[i, :] = (1 - pds[i]) / 4
    np.fill_diagonal(P, pds)
    mixed = 0.5 * pram.make_invariant(P, T) + 0.5 * np.eye(5)
    np.testing.assert_allclose(mixed, _sdcmicro_transition(T, pds, 0.5), rtol=1e-12)
    assert T @ mixed == pytest.approx(T, rel=1e-12)
    assert np.diag(mixed).min() > 0.5  # α = 0.5 keeps at least half of every category
