"""The vectorised samplers draw exactly what the scalar CKS20 samplers draw, cell by cell.

Released values and the ledger must not depend on which path ran, so the batch sampler is
compared draw for draw with the scalar one over many streams and parameters, including the
parameters where it hands the batch to the scalar path (int64 would overflow), and through
``add_noise`` against a scalar re-implementation of the per-cell loop.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pandas as pd
import pytest

from sqlsdc.mechanisms import batch_samplers
from sqlsdc.mechanisms.accountant import Bounding, PrivacyCost, Statistic, calibrate
from sqlsdc.mechanisms.batch_samplers import discrete_gaussian_many, discrete_laplace_many
from sqlsdc.mechanisms.dp_cells import (
    CELL_LABEL,
    CellMechanism,
    CellSpace,
    add_noise,
    cell_identity,
)
from sqlsdc.mechanisms.prf import KeyedStream
from sqlsdc.mechanisms.samplers import discrete_gaussian, discrete_laplace

SECRET = b"sqlsdc test secret - not for production"
BASE = KeyedStream(SECRET, "batch-samplers")

LAPLACE_SCALES = [Fraction(1, 7), Fraction(1, 2), 1, 2, Fraction(7, 3), 10, 240,
                  Fraction(72000, 7), 10**6, 2**41]  # fmt: skip
GAUSSIAN_SIGMA2 = [Fraction(1, 4), 1, Fraction(10, 3), 100, 10**4, Fraction(10**6, 7), 10**8,
                   10**12]  # fmt: skip


@pytest.fixture(autouse=True)
def lanes_for_every_batch(monkeypatch):
    """Run the lanes on batches of any size here (outside tests, small ones go cell by cell)."""
    monkeypatch.setattr(batch_samplers, "LANES_FROM", 1)


def _streams(label: str, n: int) -> list[KeyedStream]:
    return [BASE.derive(label, i) for i in range(n)]


@pytest.mark.parametrize("scale", LAPLACE_SCALES, ids=str)
def test_laplace_batch_equals_scalar(scale):
    streams = _streams(f"laplace {scale}", 1500)
    batch = discrete_laplace_many(Fraction(scale), streams)
    assert batch == [discrete_laplace(Fraction(scale), s.derive()) for s in streams]


@pytest.mark.parametrize("sigma2", GAUSSIAN_SIGMA2, ids=str)
def test_gaussian_batch_equals_scalar(sigma2):
    streams = _streams(f"gaussian {sigma2}", 1000)
    batch = discrete_gaussian_many(Fraction(sigma2), streams)
    assert batch == [discrete_gaussian(Fraction(sigma2), s.derive()) for s in streams]


def test_batch_path_is_vectorised_where_it_fits(monkeypatch):
    """Small parameters run on the lanes (no scalar sampler call); huge ones fall back."""
    calls = []
    monkeypatch.setattr(batch_samplers, "discrete_laplace",
                        lambda *a: calls.append(a) or 0)  # fmt: skip
    discrete_laplace_many(Fraction(240), _streams("lanes", 50))
    assert calls == []
    discrete_laplace_many(Fraction(2**41), _streams("lanes", 5))
    assert len(calls) == 5


def test_small_batches_are_drawn_cell_by_cell(monkeypatch):
    """Below LANES_FROM streams the scalar samplers run (faster there; the same values)."""
    monkeypatch.setattr(batch_samplers, "LANES_FROM", 2048)
    calls = []
    monkeypatch.setattr(batch_samplers, "discrete_laplace",
                        lambda *a: calls.append(a) or 0)  # fmt: skip
    monkeypatch.setattr(batch_samplers, "discrete_gaussian",
                        lambda *a: calls.append(a) or 0)  # fmt: skip
    discrete_laplace_many(Fraction(240), _streams("small", 8))
    discrete_gaussian_many(Fraction(100), _streams("small", 8))
    assert len(calls) == 16


def test_many_blocks_per_lane():
    """A scale near 2^39 draws 40-bit integers: lanes read several 256-bit blocks."""
    streams = _streams("blocks", 400)
    scale = Fraction(2**39 - 1, 3)
    assert discrete_laplace_many(scale, streams) == [
        discrete_laplace(scale, s.derive()) for s in streams
    ]
    lanes = batch_samplers._Lanes(streams)
    lanes.laplace(np.arange(len(streams)), scale.numerator, scale.denominator)
    assert lanes.loaded.max() > 1


def test_empty_and_refused():
    assert discrete_laplace_many(Fraction(3), []) == []
    assert discrete_gaussian_many(Fraction(3), []) == []
    with pytest.raises(ValueError, match="scale must be positive"):
        discrete_laplace_many(Fraction(0), _streams("x", 1))
    with pytest.raises(TypeError, match="fractions.Fraction"):
        discrete_gaussian_many(0.5, _streams("x", 1))


def _scalar_add_noise(frame, space, column, mechanism, version):
    """The per-cell loop add_noise ran before it was vectorised."""
    streams = KeyedStream(SECRET, version, CELL_LABEL)
    cal = mechanism.calibration
    out = []
    for _, row in frame.iterrows():
        ident = cell_identity(space, mechanism, row.to_dict())
        draw = discrete_laplace if cal.scale is not None else discrete_gaussian
        param = cal.scale if cal.scale is not None else cal.sigma2
        z = draw(param, streams.derive(ident.text))
        out.append((round(Fraction(int(row[column])) / cal.unit) + z) * cal.unit)
    return out


@pytest.mark.parametrize(
    ("statistic", "bounding", "cost"),
    [
        (Statistic.COUNT, Bounding(max_groups=3), PrivacyCost(epsilon=1)),
        (
            Statistic.SUM,
            Bounding(lower=0, upper=3000, granularity=10),
            PrivacyCost(epsilon=Fraction(1, 10)),
        ),
        (Statistic.SUM, Bounding(lower=0, upper=100), PrivacyCost(rho=Fraction(1, 8))),
        (Statistic.COUNT_UNITS, Bounding(), PrivacyCost(rho=Fraction(1, 2))),
    ],
    ids=["count-laplace", "sum-laplace-grid", "sum-gaussian", "units-gaussian"],
)
def test_add_noise_unchanged(statistic, bounding, cost):
    n = 600
    frame = pd.DataFrame({
        "region": np.arange(n) % 17,
        "month": np.arange(n) // 17,
        "v": (np.arange(n) * 37) % 2000 * 10,
    })  # fmt: skip
    space = CellSpace.of("t", ["region", "month"])
    mechanism = CellMechanism("*" if statistic is Statistic.COUNT else "x",
                              calibrate(statistic, bounding, cost))  # fmt: skip
    got = add_noise(frame, space, {"v": mechanism}, secret=SECRET, policy_version=4)
    assert got.values["v"] == _scalar_add_noise(frame, space, "v", mechanism, 4)
    assert [c.value for c in got.new_cells] == got.values["v"]


def test_add_noise_mixes_cached_and_new_cells():
    frame = pd.DataFrame({"region": list(range(50)), "n": [5] * 50})
    space = CellSpace.of("t", ["region"])
    mechanism = CellMechanism("*", calibrate(Statistic.COUNT, Bounding(), PrivacyCost(epsilon=1)))
    first = add_noise(frame, space, {"n": mechanism}, secret=SECRET, policy_version=1)
    cached = {c.identity.digest: Fraction(-999) for c in first.new_cells[::3]}
    second = add_noise(frame, space, {"n": mechanism}, secret=SECRET, policy_version=1,
                       cached=cached)  # fmt: skip
    expected = [Fraction(-999) if i % 3 == 0 else v for i, v in enumerate(first.values["n"])]
    assert second.values["n"] == expected
    assert second.reused == 17 and len(second.new_cells) == 33
