"""dp-ipf and dp-catall on arrays: the digest's worked cases (T6, T7), IPF properties, the
consistency projection, structural zeros, strata and the keyed noise."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sqlsdc.errors import SynthesisError
from sqlsdc.mechanisms.prf import KeyedStream
from sqlsdc.synth.ipf import (
    consistent,
    default_margins,
    ipf,
    noisy_counts,
    postprocess,
    sample_records,
    synthesize_dp_catall,
    synthesize_dp_ipf,
    zero_mask,
)

T6 = np.array([[[10, 20], [30, 5]], [[25, 5], [15, 90]]], float)  # digest T6, n[a, b, c]


def _margins(table, sets):
    return {m: table.sum(axis=tuple(a for a in range(table.ndim) if a not in m)) for m in sets}


def test_t6_ipf_to_exact_two_way_margins():
    fit, report = ipf(_margins(T6, default_margins(3)), (2, 2, 2))
    expected = [[[21.6542, 8.3458], [18.3458, 16.6542]], [[13.3458, 16.6542], [26.6542, 78.3458]]]
    assert np.allclose(fit, expected, atol=1e-4)
    assert report["iterations"] == 7 and report["converged"]
    assert ipf(_margins(T6, default_margins(3)), (2, 2, 2), tol=1e-10)[1]["iterations"] == 13
    odds = [f[0, 0] * f[1, 1] / (f[0, 1] * f[1, 0]) for f in fit]  # no three-way interaction
    assert odds == pytest.approx([2.355413, 2.355413], abs=1e-5)


def test_t7_postprocessing_and_ipf_on_inconsistent_margins():
    noise = {(0, 1): [[2.5, -1.0], [-4.0, 0.5]], (0, 2): [[-0.5, 3.0], [1.5, -2.0]],
             (1, 2): [[0.0, -3.5], [2.0, 1.0]]}  # fmt: skip
    exact = _margins(T6, default_margins(3))
    targets = {m: postprocess(exact[m] + np.array(noise[m]), 200, prior=1) for m in exact}
    assert np.allclose(targets[(0, 1)], [[32.9146, 34.4221], [26.3819, 106.2814]], atol=1e-4)
    assert np.allclose(targets[(1, 2)], [[35.1621, 21.6958], [47.1322, 96.0100]], atol=1e-4)
    fit, report = ipf(targets, (2, 2, 2))
    assert report["iterations"] == 7 and report["converged"]
    expected = [[[22.5822, 9.0905], [17.2097, 18.0200]], [[12.5799, 12.6053], [29.9225, 77.9899]]]
    assert np.allclose(fit, expected, atol=1e-4)
    assert np.allclose(fit.sum(axis=0), targets[(1, 2)], atol=1e-6)  # fitted last: met exactly
    assert report["largest_margin_gap"] > 1  # AB and AC are not met: they disagree


@settings(max_examples=40, deadline=None)
@given(
    shape=st.lists(st.integers(2, 4), min_size=2, max_size=4),
    seed=st.integers(0, 2**32 - 1),
)
def test_ipf_meets_consistent_margins(shape, seed):
    table = np.random.default_rng(seed).integers(1, 50, size=shape).astype(float)
    margins = _margins(table, default_margins(len(shape)))
    fit, report = ipf(margins, shape, tol=1e-9, max_iterations=20_000)
    assert report["converged"]
    for m, target in margins.items():
        assert np.allclose(fit.sum(axis=tuple(a for a in range(len(shape)) if a not in m)),
                           target, atol=1e-6)  # fmt: skip


@settings(max_examples=40, deadline=None)
@given(shape=st.lists(st.integers(2, 4), min_size=3, max_size=4), seed=st.integers(0, 2**32 - 1))
def test_consistency_projection_makes_shared_margins_agree(shape, seed):
    rng = np.random.default_rng(seed)
    table = rng.integers(0, 30, size=shape).astype(float)
    noisy = {m: t + rng.laplace(0, 5, size=t.shape) for m, t in
             _margins(table, default_margins(len(shape))).items()}  # fmt: skip
    fixed = consistent(noisy)
    totals = {round(float(t.sum()), 6) for t in fixed.values()}
    assert len(totals) == 1
    for a in range(len(shape)):  # every one-way margin agrees across the margins that hold it
        ones = [t.sum(axis=1 - m.index(a)) for m, t in fixed.items() if a in m]
        assert all(np.allclose(o, ones[0], atol=1e-8) for o in ones)
    # the weighted mean of the noisy totals is kept (equal sizes: the plain mean)
    if len({t.size for t in noisy.values()}) == 1:
        assert fixed[(0, 1)].sum() == pytest.approx(np.mean([t.sum() for t in noisy.values()]))


def test_consistent_margins_are_left_as_they_are():
    exact = _margins(T6, default_margins(3))
    assert all(np.allclose(consistent(exact)[m], exact[m]) for m in exact)


def test_projection_brings_the_fit_closer_to_the_truth():
    """Averaged over noise draws, projected margins fit the true margins better (our claim
    over [RA]'s plain clamp-and-rescale)."""
    rng = np.random.default_rng(3)
    table = rng.integers(0, 40, size=(3, 4, 5, 3)).astype(float)
    exact = _margins(table, default_margins(4))
    errors = {True: 0.0, False: 0.0}
    for _ in range(30):
        noisy = {m: t + rng.laplace(0, 6, size=t.shape) for m, t in exact.items()}
        for project in (True, False):
            start = consistent(noisy) if project else noisy
            total = float(np.mean([t.sum() for t in start.values()]))
            fit, _ = ipf({m: postprocess(t, total, prior=1) for m, t in start.items()},
                         table.shape)  # fmt: skip
            errors[project] += sum(
                np.abs(fit.sum(axis=tuple(a for a in range(4) if a not in m)) - t).sum()
                for m, t in exact.items()
            )
    assert errors[True] < errors[False]


def test_ipf_reports_non_convergence():
    _, report = ipf(_margins(T6, default_margins(3)), (2, 2, 2), max_iterations=3)
    assert not report["converged"] and report["iterations"] == 3 and report["last_change"] > 1e-4


def test_structural_zeros_are_never_sampled():
    zeros = [{0: 0, 1: 1}, {2: 2}]
    mask = zero_mask((2, 3, 3), zeros)
    assert mask.sum() == 3 * 1 + 2 * 3 * 1 - 1
    table = np.full((2, 3, 3), 20.0)
    margins = {m: np.where(zero_mask((2, 3, 3), zeros, m), 0, t)
               for m, t in _margins(table, default_margins(3)).items()}  # fmt: skip
    codes, details = synthesize_dp_ipf(margins, shape=(2, 3, 3), rng=np.random.default_rng(1),
                                       zeros=zeros, n=5000)  # fmt: skip
    assert len(codes) == 5000 and details["ipf"]["converged"]
    assert not ((codes[:, 0] == 0) & (codes[:, 1] == 1)).any()
    assert not (codes[:, 2] == 2).any()
    postprocessed = postprocess(np.array([5.0, -3.0, 8.0]), 20, zeros=np.array([0, 0, 1], bool))
    assert postprocessed[2] == 0 and postprocessed.sum() == pytest.approx(20)
    with pytest.raises(SynthesisError, match="every cell of a margin is a structural zero"):
        postprocess(np.ones(2), 1, zeros=np.ones(2, bool))


def test_strata_are_fitted_apart_and_keep_their_sizes():
    table = np.zeros((2, 3, 2))
    table[0] = [[100, 0], [0, 100], [100, 0]]  # stratum 0: b and c tied one way
    table[1] = [[0, 300], [300, 0], [0, 300]]  # stratum 1: the other way, three times bigger
    margins = _margins(table, [(0, 1, 2)])  # every margin holds the stratum (axis 0)
    codes, details = synthesize_dp_ipf(margins, shape=(2, 3, 2), rng=np.random.default_rng(0),
                                       strata=0, prior=0)  # fmt: skip
    assert [d["stratum"] for d in details["ipf"]] == [0, 1]
    assert len(codes) == 1200
    share = (codes[:, 0] == 1).mean()
    assert 0.72 < share < 0.78  # 900 of 1200
    s0 = codes[codes[:, 0] == 0]
    assert set(map(tuple, s0[:, 1:])) <= {(0, 0), (1, 1), (2, 0)}


def test_noise_is_exact_discrete_laplace_keyed_per_cell():
    secret = b"a test secret of sixteen+ bytes"
    counts = np.arange(2000).reshape(40, 50)

    def stream(i):
        return KeyedStream(secret, "test", i)

    a = noisy_counts(counts, Fraction(2), stream)
    assert a.dtype == np.int64 and np.array_equal(a, noisy_counts(counts, Fraction(2), stream))
    noise = (a - counts).ravel()
    # discrete Laplace of scale t: variance 2e^{-1/t}/(1-e^{-1/t})^2 = 7.84 at t = 2
    q = np.exp(-1 / 2)
    assert np.var(noise) == pytest.approx(2 * q / (1 - q) ** 2, rel=0.15)
    assert np.var(noise) != pytest.approx(2 * np.exp(-1 / 4) / (1 - np.exp(-1 / 4)) ** 2,
                                          rel=0.15)  # scale 4 would fail  # fmt: skip
    fixed = np.zeros(counts.shape, bool)
    fixed[0, :3] = True
    b = noisy_counts(counts, Fraction(2), stream, fixed=fixed)
    assert (b[0, :3] == 0).all() and np.array_equal(b[1:], a[1:])


def test_catall_and_sampling():
    codes, details = synthesize_dp_catall(T6, rng=np.random.default_rng(5))
    assert len(codes) == 200 and details["estimated_total"] == 200
    counts = np.zeros((2, 2, 2))
    np.add.at(counts, tuple(codes.T), 1)
    assert np.abs(counts - T6).max() < 30
    assert sample_records(np.zeros((2, 2)) + 1, 0, np.random.default_rng(0)).shape == (0, 2)
    with pytest.raises(SynthesisError, match="empty"):
        sample_records(np.zeros((2, 2)), 5, np.random.default_rng(0))
