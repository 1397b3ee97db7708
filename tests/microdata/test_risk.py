"""Risk measures: frequencies, k-anonymity, Benedetti–Franconi risk on the digest's case T4."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from sqlsdc.errors import MicrodataError
from sqlsdc.microdata.microaggregation import microaggregate
from sqlsdc.microdata.risk import (
    frequencies,
    individual_risk,
    k_anonymity_violations,
    linkage_rate,
    mahalanobis_sq,
    risk_summary,
)


@pytest.mark.parametrize(
    ("f", "F", "r"),
    [(1, 10, 0.255843), (1, 2, 0.693147), (2, 10, 0.149410), (2, 4, 0.306853), (3, 30, 0.046368)],
)
def test_benedetti_franconi_worked_case_t4(f, F, r):
    assert individual_risk([f], [F])[0] == pytest.approx(r, abs=5e-7)


@pytest.mark.parametrize("f", [1, 2, 3, 7, 40, 300])
@pytest.mark.parametrize("p", [1e-4, 0.01, 0.3, 0.5, 0.9, 0.999])
def test_stable_form_equals_the_hypergeometric_definition(f, p):
    """r = (p^f/f)·₂F₁(f, f; f+1; 1−p) (digest §12) in 50-digit arithmetic, also where p^f
    underflows and SciPy's hyp2f1 fails."""
    mpmath = pytest.importorskip("mpmath")
    mpmath.mp.dps = 50
    pp = mpmath.mpf(p)
    exact = pp**f / f * mpmath.hyp2f1(f, f, f + 1, 1 - pp)
    assert individual_risk([f], [f / p])[0] == pytest.approx(float(exact), rel=1e-9)


def _mu_argus(f: int, p: float) -> float:
    """μ-ARGUS 4.1's closed forms (sdcMicro ``compute_risk``, its unused second branch): exact
    for f = 1, 2, 3, the series Σ_(n<8) n! q^n/(f+1)_n times p/f from f = 4."""
    q = 1 - p
    if f == 1:
        return p / q * -np.log(p)
    if f == 2:
        return p / q**2 * (p * np.log(p) + q)
    if f == 3:
        return p / (2 * q**3) * (q * (3 * q - 2) - 2 * p * p * np.log(p))
    term, total = 1.0, 1.0
    for n in range(1, 8):
        term *= n * q / (f + n)
        total += term
    return p / f * total


@pytest.mark.parametrize("f", [1, 2, 3, 4, 10, 50])
@pytest.mark.parametrize("p", [0.05, 0.3, 0.6, 0.95])
def test_mu_argus_closed_forms(f, p):
    """The risk is μ-ARGUS's: its closed forms for f <= 3 to 1e-9 (rounding near q = 0), its
    7-term series for f >= 4 to what the series leaves out (its tail from n = 8). sdcMicro's
    ``measure_risk`` differs on purpose: it shifts p by −0.0001 and takes p/(f − q) from f = 3
    (f = 3, p = 0.3: 0.1304 against the exact 0.1254)."""
    got = individual_risk([f], [f / p])[0]
    if f <= 3:
        assert got == pytest.approx(_mu_argus(f, p), rel=1e-9)
    else:
        left_out = p / f * np.prod([n * (1 - p) / (f + n) for n in range(1, 9)]) / (1 - (1 - p))
        assert abs(got - _mu_argus(f, p)) <= 1.01 * left_out + 1e-15


def test_risk_limits_and_clamping():
    assert individual_risk([1, 2, 5], [1, 2, 5]).tolist() == [1.0, 0.5, 0.2]  # p = 1 → 1/f
    assert individual_risk([3], [1.5])[0] == pytest.approx(1 / 3)  # F̂ < f clamped to f
    with pytest.raises(MicrodataError, match="whole numbers of at least 1"):
        individual_risk([0], [3])


def test_frequencies_and_violations():
    df = pd.DataFrame(
        {
            "zip": ["47906", "47906", "47906", "47907", None],
            "age": [30, 30, 45, 30, 30],
            "w": [10.0, 20.0, 5.0, 1.0, 2.0],
        }
    )
    freq = frequencies(df, ["zip", "age"], "w")
    assert freq["fk"].tolist() == [3, 3, 1, 2, 4]  # row 5 (zip missing, 30) matches 1, 2, 4
    assert freq["Fk"].tolist() == [32.0, 32.0, 5.0, 3.0, 33.0]
    # a missing value matches any value
    assert frequencies(df, ["zip"])["fk"].tolist() == [4, 4, 4, 2, 5]
    plain = frequencies(df.dropna(), ["zip", "age"], "w")
    assert plain["fk"].tolist() == [2, 2, 1, 1] and plain["Fk"].tolist() == [30, 30, 5, 1]
    assert k_anonymity_violations(df, ["zip", "age"], (2, 3)) == {2: 1, 3: 2}


def test_risk_summary():
    df = pd.DataFrame({"a": [1, 1, 2, 3], "w": [5.0, 5.0, 10.0, 1.0]})
    s = risk_summary(df, ["a"], weights="w", ks=(2,), threshold=0.5)
    r = individual_risk([2, 2, 1, 1], [10, 10, 10, 1])
    assert s.sample_uniques == 2 and s.violations == {2: 2}
    assert s.expected_reidentifications == pytest.approx(r.sum())
    assert s.global_risk == pytest.approx(r.mean())
    assert s.max_risk == 1.0 and s.above_threshold == 1
    assert s.to_dict()["violations"] == {"2": 2}


def test_bad_keys_and_weights():
    df = pd.DataFrame({"a": [1, 2], "w": [1.0, -1.0]})
    with pytest.raises(MicrodataError, match="not in the data"):
        frequencies(df, ["b"])
    with pytest.raises(MicrodataError, match="non-negative"):
        frequencies(df, ["a"], "w")


def test_mahalanobis_case_t13():
    C = [[2, 1.8], [1.8, 2]]
    assert mahalanobis_sq([[1, -1], [1, 1]], C) == pytest.approx([10.0, 0.5263], abs=1e-4)


def test_linkage_rate():
    rng = np.random.default_rng(6)
    X = rng.standard_normal((600, 3)) @ [[1, 0.8, 0], [0, 1, 0.5], [0, 0, 1]]
    for metric in ("euclidean", "mahalanobis"):
        assert linkage_rate(X, X, metric=metric) == 1.0
        noisy = linkage_rate(X, X + rng.normal(0, 0.5, X.shape), metric=metric)
        assert 0 < noisy < 1
    df = pd.DataFrame(X, columns=list("abc"))
    masked = microaggregate(df, list("abc"), 5).data.to_numpy()
    assert linkage_rate(X, masked) <= 1 / 5 + 0.05
    with pytest.raises(MicrodataError, match="unknown metric"):
        linkage_rate(X, X, metric="cosine")
