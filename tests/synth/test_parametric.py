"""The Gaussian copula: marginals kept (KS with a fixed seed), missing values at their rate,
categories at their frequencies, dependence kept, dtypes kept."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy.stats import ks_2samp

from sqlsdc.synth.parametric import synthesize_parametric

CASC = "/work/shared/data/casc_census.csv"


def _data(n=3000, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.lognormal(10, 1, n)
    y = 0.5 * np.log(x) + rng.normal(0, 0.3, n)
    group = np.where(y > np.median(y), "high", rng.choice(["low", "mid"], n))
    age = rng.integers(18, 90, n)
    frame = pd.DataFrame({"income": x, "score": y, "group": group, "age": age})
    frame.loc[rng.random(n) < 0.1, "income"] = np.nan
    return frame


def test_marginals_pass_ks_and_fail_against_a_shifted_copy():
    data = _data()
    out, details = synthesize_parametric(data, rng=np.random.default_rng(1))
    assert out.shape == data.shape and details["numeric"] == ["income", "score", "age"]
    for column in ("income", "score", "age"):
        assert ks_2samp(data[column].dropna(), out[column].dropna()).pvalue > 0.01
    shifted = out["score"].dropna() * 1.1
    assert ks_2samp(data["score"], shifted).pvalue < 1e-6  # the test can fail


def test_missing_rates_categories_dependence_and_dtypes():
    data = _data()
    out, _ = synthesize_parametric(data, rng=np.random.default_rng(2), n=6000)
    assert len(out) == 6000
    assert out["income"].isna().mean() == pytest.approx(0.1, abs=0.015)
    assert out["score"].notna().all()
    shares = out["group"].value_counts(normalize=True)
    for level, share in data["group"].value_counts(normalize=True).items():
        assert shares[level] == pytest.approx(share, abs=0.03)
    rho = data[["income", "score"]].corr(method="spearman").iloc[0, 1]
    assert out[["income", "score"]].corr(method="spearman").iloc[0, 1] == pytest.approx(
        rho, abs=0.06
    )
    high = out.loc[out["group"] == "high", "score"].mean()
    assert high > out.loc[out["group"] != "high", "score"].mean()  # categorical dependence kept
    assert out["age"].dtype == data["age"].dtype and out["age"].between(18, 89).all()
    assert out["group"].dtype == data["group"].dtype


def test_same_generator_same_data():
    data = _data(500)
    a, _ = synthesize_parametric(data, rng=np.random.default_rng(7))
    b, _ = synthesize_parametric(data, rng=np.random.default_rng(7))
    c, _ = synthesize_parametric(data, rng=np.random.default_rng(8))
    pd.testing.assert_frame_equal(a, b)
    assert not a.equals(c)


def test_casc_census_marginals():
    data = pd.read_csv(CASC)
    out, _ = synthesize_parametric(data, rng=np.random.default_rng(0))
    assert out.dtypes.equals(data.dtypes)
    assert min(ks_2samp(data[c], out[c]).pvalue for c in data.columns) > 0.001
