"""Utility measures against the worked cases of the digest (seed_synth_papers.md T1, T4, T13,
T14) and properties that can fail both ways."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from sqlsdc.synth.utility import (
    interval_overlap,
    marginal_distances,
    null_pmse,
    propensity_pmse,
    quality_score,
    ratio_of_counts,
    regression_overlap,
    table_pmse,
    table_utility,
    utility_tables,
)


def test_table_pmse_worked_case_t4():
    r = table_pmse([30, 20, 10, 0], [25, 25, 8, 2])
    assert r["vw"] == pytest.approx(6.464646, abs=1e-6)
    assert r["df"] == 3
    assert r["u"] == pytest.approx(2.154882, abs=1e-6)
    assert r["pmse"] == pytest.approx(0.006734, abs=1e-6)
    # the direct propensity form Σ n_j (p̂_j − 0.5)² / N gives the same pMSE
    y, s = np.array([30, 20, 10, 0]), np.array([25, 25, 8, 2])
    direct = ((y + s) * (s / (y + s) - 0.5) ** 2).sum() / 120
    assert r["pmse"] == pytest.approx(direct)


def test_table_pmse_unequal_sizes_uses_synthpop_general_form():
    # a synthetic table twice the original with identical proportions has VW = 0
    assert table_pmse([10, 20, 30], [20, 40, 60])["vw"] == pytest.approx(0.0)
    assert table_pmse([10, 20, 30], [40, 40, 40])["vw"] > 0


def test_table_utility_from_records_matches_counts():
    original = pd.DataFrame({"a": ["x"] * 30 + ["y"] * 20 + ["z"] * 10})
    synthetic = pd.DataFrame({"a": ["x"] * 25 + ["y"] * 25 + ["z"] * 8 + ["w"] * 2})
    assert table_utility(original, synthetic, ["a"])["u"] == pytest.approx(2.154882, abs=1e-6)


def test_utility_tables_mean_and_worst():
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({c: rng.integers(0, 3, 500) for c in "abc"})
    same = utility_tables(frame, frame, way=2)
    assert same["mean"] == 0 and len(same["tables"]) == 3
    broken = frame.copy()
    broken["c"] = broken["a"]  # c now copies a: the a × c table is far off
    r = utility_tables(frame, broken, way=2)
    assert r["worst_table"] == "a × c" and r["worst"] > 30
    assert utility_tables(frame, broken, way=3)["mean"] > 10


def test_null_pmse_worked_case_t13():
    assert null_pmse(55, 0.5, 6712) == pytest.approx(0.0010243, abs=1e-7)
    assert null_pmse(55, 0.5, 6712, null="two-sample") == pytest.approx(0.0020486, abs=1e-7)
    assert null_pmse(285, 0.5, 10_000, null="two-sample") == pytest.approx(0.007125)
    with pytest.raises(ValueError, match="one-sample"):
        null_pmse(3, 0.5, 10, null="other")


def test_propensity_pmse_features_and_ratio_under_the_null():
    rng = np.random.default_rng(1)
    a = pd.DataFrame(rng.normal(size=(2000, 5)), columns=list("abcde"))
    b = pd.DataFrame(rng.normal(size=(2000, 5)), columns=list("abcde"))
    r = propensity_pmse(a, b, degree=3, null="two-sample")
    assert r["features"] == 55  # worked case T13: 5 variables at degree 3
    assert 0.6 < r["ratio"] < 1.5
    shifted = b + 0.3
    assert propensity_pmse(a, shifted)["ratio"] > 20


def test_propensity_pmse_cart_permutation_null():
    rng = np.random.default_rng(2)
    a = pd.DataFrame({"x": rng.normal(size=600), "g": rng.choice(list("pq"), 600)})
    b = pd.DataFrame({"x": rng.normal(size=600), "g": rng.choice(list("pq"), 600)})
    same = propensity_pmse(a, b, model="cart", rng=np.random.default_rng(3))
    assert same["null"] == "permutation" and 0.5 < same["ratio"] < 1.5
    b["x"] = b["x"] * 3
    assert propensity_pmse(a, b, model="cart", rng=np.random.default_rng(3))["ratio"] > 2


def test_interval_overlap_worked_case_t1():
    assert interval_overlap((1, 3), (2, 5)) == pytest.approx(0.416667, abs=1e-6)
    assert interval_overlap((1, 3), (1, 3)) == 1.0
    assert interval_overlap((1, 3), (4, 5)) == 0.0
    assert interval_overlap((1, 3), (4, 5), clip=False) == pytest.approx(-0.75)
    assert interval_overlap((1, 3), (0, 4)) == pytest.approx(0.75)
    assert interval_overlap((1, 3), (1.5, 2.5)) == pytest.approx(0.75)


def test_regression_overlap_identical_and_different_data():
    rng = np.random.default_rng(4)
    x = rng.normal(size=400)
    frame = pd.DataFrame({"y": 2 * x + rng.normal(size=400), "x": x,
                          "g": rng.choice(["a", "b"], 400)})  # fmt: skip
    same = regression_overlap(frame, frame, "y", ["x", "g"])
    assert set(same) == {"(intercept)", "x", "g_b"}
    assert all(v["io"] == pytest.approx(1.0) and v["sd"] == 0 for v in same.values())
    other = frame.assign(y=-2 * frame["x"] + rng.normal(size=400))
    r = regression_overlap(frame, other, "y", ["x", "g"])
    assert r["x"]["io"] == 0.0 and r["x"]["sd"] > 50


def test_ratio_of_counts():
    assert ratio_of_counts([2, 2, 0], [1, 3, 0]) == pytest.approx(0.583333, abs=1e-6)
    assert ratio_of_counts([1, 2], [2, 4]) == 1.0
    assert ratio_of_counts([1, 0], [0, 1]) == 0.0


def test_marginal_distances_and_quality_score():
    rng = np.random.default_rng(5)
    frame = pd.DataFrame({"x": rng.normal(size=500), "y": rng.normal(size=500),
                          "g": rng.choice(["a", "b", None], 500)})  # fmt: skip
    d = marginal_distances(frame, frame)
    assert d["x"]["ks"] == 0 and d["g"]["tvd"] == 0 and d["g"]["hellinger"] == 0
    perfect = quality_score(frame, frame)
    assert perfect["score"] == pytest.approx(1.0)
    assert len(perfect["pairs"]) == 3
    flipped = frame.assign(g=frame["g"].map({"a": "b", "b": "a"}))
    # the shares of a and b are swapped: TV complement 1 − |pa − pb|, pairs affected too
    pa, pb = (frame["g"] == "a").mean(), (frame["g"] == "b").mean()
    assert quality_score(frame, flipped)["columns"]["g"] == pytest.approx(1 - abs(pa - pb))
    anti = frame.assign(y=-frame["x"])  # correlation −1 against ≈ 0
    r = quality_score(frame, anti)
    assert r["pairs"]["x × y"] == pytest.approx(
        1 - abs(np.corrcoef(frame.x, frame.y)[0, 1] + 1) / 2
    )


def test_quality_score_counts_only_associated_pairs_as_sdmetrics():
    """SDMetrics 0.32: pair trends average the pairs with |r| > 0.5 (numeric) or Cramér's
    V > 0.3 (otherwise) in the original; thresholds 0 count every pair."""
    rng = np.random.default_rng(7)
    x = rng.normal(size=2000)
    frame = pd.DataFrame({
        "x": x,
        "y": x + rng.normal(scale=0.3, size=2000),  # r ≈ 0.96
        "z": rng.normal(size=2000),  # independent of everything
        "g": np.where(x > 0, "pos", "neg"),  # V of g × binned x is 1
        "h": rng.choice(["a", "b"], 2000),  # independent
    })  # fmt: skip
    synthetic = frame.sample(frac=1, random_state=1).reset_index(drop=True)
    synthetic["y"] = rng.normal(size=2000)  # breaks every pair with y
    r = quality_score(frame, synthetic)
    assert sorted(r["pairs_counted"]) == ["x × g", "x × y", "y × g"]
    assert r["column_pair_trends"] == pytest.approx(
        np.mean([r["pairs"][n] for n in ("x × y", "x × g", "y × g")])
    )
    every = quality_score(frame, synthetic, correlation_threshold=0, association_threshold=0)
    assert len(every["pairs_counted"]) == 10
    assert every["column_pair_trends"] == pytest.approx(np.mean(list(every["pairs"].values())))
    alone = quality_score(frame[["z", "h"]], synthetic[["z", "h"]])
    assert alone["column_pair_trends"] is None and alone["score"] == alone["column_shapes"]
