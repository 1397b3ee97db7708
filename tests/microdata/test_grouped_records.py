"""The risk report's groupings by hashing (s48h) against the sorting ones they replace: the
same combinations, inverse and counts as ``np.unique(..., axis=0)`` (missing codes -1, wide
codes that do not pack), SUDA's uniques, and the record linkage's nearest original record as
one ``cKDTree.query`` of every masked record finds it (ties: equal originals, repeated
masked values, several columns)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy.spatial import cKDTree

from sqlsdc.microdata.groups import unique_rows
from sqlsdc.microdata.risk import _nearest, frequencies, linkage_rate
from sqlsdc.microdata.suda import _unique_on


@pytest.mark.parametrize(
    ("shape", "low", "high"),
    [((2000, 3), -1, 4), ((5000, 5), -1, 30), ((1, 1), 0, 1), ((300, 1), -1, 2),
     ((400, 4), 0, 2**20), ((50, 2), 0, 1)],
)  # fmt: skip
def test_unique_rows_are_numpys(shape, low, high):
    codes = np.random.default_rng(sum(shape)).integers(low, high, size=shape)
    expected = np.unique(codes, axis=0, return_inverse=True, return_counts=True)
    combos, inverse, counts = unique_rows(codes)
    assert combos.dtype == expected[0].dtype
    assert np.array_equal(combos, expected[0])
    assert np.array_equal(inverse, expected[1].ravel())
    assert np.array_equal(counts, expected[2])


def test_suda_uniques_are_the_sorted_ones():
    rng = np.random.default_rng(3)
    for columns, high in ((1, 50), (3, 6), (4, 40), (2, 2**40)):
        codes = rng.integers(0, high, size=(3000, columns))
        _, inverse, freq = np.unique(codes, axis=0, return_inverse=True, return_counts=True)
        assert np.array_equal(_unique_on(codes), freq[inverse.ravel()] == 1)


def test_frequencies_are_the_sorted_ones():
    """fk and Fk as the np.unique formulation gives them, missing keys matching any."""
    rng = np.random.default_rng(5)
    df = pd.DataFrame({"a": rng.choice(["x", "y", None], 4000, p=[0.5, 0.45, 0.05]),
                       "b": rng.integers(0, 9, 4000), "w": rng.uniform(0.5, 3, 4000)})  # fmt: skip
    got = frequencies(df, ["a", "b"], "w")
    codes = np.stack([pd.Categorical(df[c].astype("string")).codes for c in ("a", "b")], axis=1)
    combos, inverse, counts = np.unique(codes.astype(np.int64), axis=0, return_inverse=True,
                                        return_counts=True)  # fmt: skip
    plain = ~(combos < 0).any(axis=1)
    # a record with a full key: its own combination plus those with a missing value it fits
    sums = np.bincount(inverse.ravel(), weights=df["w"].to_numpy())
    fits = ((combos[:, None, :] == combos[None, :, :]) | (combos[None, :, :] < 0)).all(axis=2)
    fk, Fk = fits @ counts, fits @ sums
    full = plain[inverse.ravel()]
    assert np.array_equal(got["fk"].to_numpy()[full], fk[inverse.ravel()][full])
    assert np.allclose(got["Fk"].to_numpy()[full], Fk[inverse.ravel()][full], rtol=1e-12)


@pytest.mark.parametrize("columns", [1, 2])
def test_nearest_is_one_kdtree_query(columns):
    rng = np.random.default_rng(columns)
    x = rng.integers(0, 40, size=(6000, columns)).astype(float)  # many equal originals
    x[:1500] = 0.0  # a block of equal ones, as the zero incomes
    z = x + rng.choice([0.0, 0.5, -0.25], size=x.shape)  # masked values repeat too
    expected = cKDTree(x).query(z, k=1)[1]
    assert np.array_equal(_nearest(x, z, chunk=700), expected)
    w = np.diag(1.0 / x.std(axis=0, ddof=1))  # linkage_rate's Euclidean scaling
    own = cKDTree(x @ w).query(z @ w, k=1)[1] == np.arange(len(x))
    assert linkage_rate(x, z) == float(own.mean())
