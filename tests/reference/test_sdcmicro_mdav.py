"""MDAV against sdcMicro's C++ ``Mdav`` (sdcTools/sdcMicro src/Mdav.cpp and src/Mdav.h @cf32510,
called by ``mdav()`` and ``microaggregation(method = "mdav")``), transcribed step by step since
R is not available here.

sdcMicro's loop: weights 1/Var (population variance) per variable; distances are weighted
squared Euclidean, accumulated in single precision (``TDist`` is ``float``). While at least 2k
records remain: r is the first record farthest from the centroid of the remaining ones; s is
the record farthest from r (found while ranking the distances to r, before r's group leaves);
r's k nearest form a group; then, if at least 3k records remained, s's k nearest among the rest
form the next one. The rest (k..2k − 1 records, or fewer than 2k) form the last group.

sqlsdc's :func:`~sqlsdc.microdata.microaggregation.mdav` on :func:`standardise`-d columns (sd
with ddof = 1: every distance scaled alike) gives the same partition on every case below.
"""

from __future__ import annotations

import numpy as np
import pytest

from sqlsdc.microdata.microaggregation import mdav, standardise


def _dist(rows: np.ndarray, point: np.ndarray, w: np.ndarray) -> np.ndarray:
    """``Dist``/``DistXX`` of Mdav.h: Σ_j (a_j − b_j)²·w_j, summed in float32."""
    d = np.zeros(len(rows), dtype=np.float32)
    for j in range(rows.shape[1]):
        d = (d + ((rows[:, j] - point[j]) ** 2 * w[j]).astype(np.float32)).astype(np.float32)
    return d


def _sdcmicro_mdav(M: np.ndarray, k: int) -> np.ndarray:
    var = M.var(axis=0)
    w = np.where(var != 0, 1 / np.where(var != 0, var, 1), 1.0)
    left = list(range(len(M)))  # the linked list of rows still to group, in row order
    labels = np.full(len(M), -1)
    group = 0
    while len(left) - k >= k:
        ngroups = 1 if len(left) - 2 * k < k else 2
        idx = np.array(left)
        current = idx[int(np.argmax(_dist(M[idx], M[idx].mean(axis=0), w)))]
        for _ in range(ngroups):
            idx = np.array(left)
            d = _dist(M[idx], M[current], w)
            farthest = idx[int(np.argmax(d))]
            members = idx[np.argsort(d, kind="stable")[:k]]
            labels[members] = group
            group += 1
            taken = set(members.tolist())
            left = [i for i in left if i not in taken]
            current = farthest
    if left:
        labels[np.array(left)] = group
    return labels


def _partition(labels: np.ndarray) -> list[tuple[int, ...]]:
    return sorted(tuple(np.flatnonzero(labels == g).tolist()) for g in np.unique(labels))


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("n, p, k", [(200, 3, 3), (157, 2, 5), (300, 4, 10), (50, 1, 4)])
def test_mdav_partition_is_sdcmicros(seed, n, p, k):
    X = np.random.default_rng(seed).lognormal(size=(n, p))
    ours = mdav(standardise(X), k)
    theirs = _sdcmicro_mdav(X, k)
    assert _partition(ours) == _partition(theirs)
    sizes = np.bincount(ours)
    assert sizes.min() >= k and sizes.max() <= 2 * k - 1
