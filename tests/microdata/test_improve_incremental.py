"""`improve` keeps candidate lists and local-search evaluations from round to round: its partition
must be the one of the straightforward algorithm, kept here as the oracle (a copy of the code
before that change: every round queries every record and evaluates every record)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from numba import njit
from scipy.spatial import cKDTree

from sqlsdc.microdata.microaggregation import (
    _centroids,
    _matrix,
    _perturb,
    _relabel,
    improve,
    mdav,
    sse,
    standardise,
)

DATA = Path("/work/shared/data")


@njit(cache=True)
def _dist2(Y, i, c):
    s = 0.0
    for j in range(Y.shape[1]):
        t = Y[i, j] - c[j]
        s += t * t
    return s


@njit(cache=True)
def _move(X, a, A, B, labels, counts, sums, members, slot):
    last = members[A, counts[A] - 1]
    members[A, slot[a]] = last
    slot[last] = slot[a]
    members[A, counts[A] - 1] = -1
    counts[A] -= 1
    members[B, counts[B]] = a
    slot[a] = counts[B]
    counts[B] += 1
    labels[a] = B
    for j in range(X.shape[1]):
        sums[A, j] -= X[a, j]
        sums[B, j] += X[a, j]


@njit(cache=True)
def _local_search(X, labels, k, candidates, max_sweeps):
    n, d = X.shape
    G = labels.max() + 1
    cap = 2 * k - 1
    counts = np.zeros(G, dtype=np.int64)
    sums = np.zeros((G, d))
    for i in range(n):
        g = labels[i]
        counts[g] += 1
        for j in range(d):
            sums[g, j] += X[i, j]
    width = max(cap, counts.max()) + 1
    members = np.full((G, width), -1, dtype=np.int64)
    fill = np.zeros(G, dtype=np.int64)
    slot = np.empty(n, dtype=np.int64)
    for i in range(n):
        g = labels[i]
        members[g, fill[g]] = i
        slot[i] = fill[g]
        fill[g] += 1
    ca = np.empty(d)
    cb = np.empty(d)
    steps = 0
    sweeps = 0
    tol = 1e-12
    while sweeps < max_sweeps:
        sweeps += 1
        changed = 0
        for a in range(n):
            A = labels[a]
            na = counts[A]
            for j in range(d):
                ca[j] = sums[A, j] / na
            daA = _dist2(X, a, ca)
            best, best_b, best_B = -tol * (1.0 + daA), -2, -1
            for t in range(candidates.shape[1]):
                B = candidates[a, t]
                if B == A or B < 0:
                    continue
                nb = counts[B]
                for j in range(d):
                    cb[j] = sums[B, j] / nb
                daB = _dist2(X, a, cb)
                if na > k and nb < cap:
                    delta = -na / (na - 1.0) * daA + nb / (nb + 1.0) * daB
                    if delta < best:
                        best, best_b, best_B = delta, -1, B
                for q in range(nb):
                    b = members[B, q]
                    dbA = _dist2(X, b, ca)
                    dbB = _dist2(X, b, cb)
                    dab = 0.0
                    for j in range(d):
                        u = X[a, j] - X[b, j]
                        dab += u * u
                    delta = dbA - daA - dab / na + daB - dbB - dab / nb
                    if delta < best:
                        best, best_b, best_B = delta, b, B
            if best_b == -2:
                continue
            B = best_B
            _move(X, a, A, B, labels, counts, sums, members, slot)
            if best_b >= 0:
                _move(X, best_b, B, A, labels, counts, sums, members, slot)
            changed += 1
        steps += changed
        if changed == 0:
            break
    return sweeps, steps


def _candidates(X, labels, neighbours):
    cents = _centroids(X, labels)
    q = min(neighbours, len(cents))
    if q == len(cents):
        return np.broadcast_to(np.arange(q), (len(X), q)).copy()
    _, near = cKDTree(cents).query(X, k=q)
    return np.ascontiguousarray(near.reshape(len(X), q), dtype=np.int64)


def _search(X, labels, k, neighbours):
    labels = labels.copy()
    while True:
        cand = _candidates(X, labels, neighbours)
        sweeps, _ = _local_search(X, labels, k, cand, 50)
        if sweeps < 50:
            return _relabel(labels)


def oracle(X, k, *, labels=None, neighbours=40, rounds=200, seed=0):
    """`improve` as it was, without its time limit."""
    X = _matrix(X, k)
    start = mdav(X, k) if labels is None else _relabel(np.asarray(labels))
    best = _search(X, start, k, neighbours)
    best_sse = sse(X, best)
    rng = np.random.default_rng(seed)
    for _ in range(rounds):
        trial = _perturb(X, best, k, rng)
        if trial is None:
            break
        trial = _search(X, trial, k, neighbours)
        value = sse(X, trial)
        if value < best_sse - 1e-9 * (1 + best_sse):
            best, best_sse = trial, value
    if labels is None or best_sse <= sse(X, start):
        return best
    return start


def _same(X, k, **kwargs):
    expected = oracle(X, k, **kwargs)
    got = improve(X, k, time_limit=1e9, **kwargs)
    assert (got == expected).all()
    return got


@pytest.mark.parametrize("d", [1, 2, 3])
@pytest.mark.parametrize("k", [3, 5, 10])
def test_same_partition_on_random_data(d, k):
    rng = np.random.default_rng(100 * d + k)
    x = rng.standard_normal((600, d)) * rng.uniform(0.5, 3, d)
    _same(x, k, rounds=60, seed=k)


@pytest.mark.parametrize("d", [1, 2, 3])
@pytest.mark.parametrize("k", [3, 5, 10])
def test_same_partition_with_ties_and_duplicates(d, k):
    """Integer values with many duplicates: equal distances to centroids, identical centroids."""
    rng = np.random.default_rng(7 * d + k)
    x = rng.integers(0, 6, (500, d)).astype(float)
    x = np.vstack([x, x[:100]])  # exact duplicate records
    _same(x, k, rounds=60, seed=d)


def test_same_partition_with_few_groups_and_few_neighbours():
    """All groups as candidates (fewer groups than neighbours), and short candidate lists."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((90, 2))
    _same(x, 3, rounds=40)
    _same(np.round(x * 2), 3, neighbours=4, rounds=40, seed=2)


def test_same_partition_with_short_candidate_lists():
    """Short lists change often between rounds: records whose list changed are evaluated again,
    records with equally distant centroids are asked again (seeds 281 and 292 fail otherwise)."""
    for seed in range(280, 295):
        rng = np.random.default_rng(seed)
        d, k, neighbours = int(rng.integers(1, 4)), int(rng.integers(2, 6)), int(rng.integers(2, 8))
        n = int(rng.integers(60, 300))
        if seed % 2:
            x = rng.integers(0, 4, (n, d)).astype(float)
        else:
            x = rng.standard_normal((n, d))
        _same(x, k, neighbours=neighbours, rounds=30, seed=seed)


def test_same_partition_from_given_labels():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((400, 2))
    _same(x, 4, labels=rng.permutation(np.arange(400) // 5), rounds=30)


@pytest.mark.slow
@pytest.mark.parametrize(("name", "k"), [("casc_census", 3), ("casc_census", 10), ("tarragona", 5)])
def test_same_partition_on_the_casc_files(name, k):
    if not DATA.is_dir():
        pytest.skip("the CASC reference files are not on this machine")
    x = standardise(pd.read_csv(DATA / f"{name}.csv").to_numpy(float))
    _same(x, k, rounds=40)
