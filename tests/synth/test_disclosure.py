"""Disclosure measures against the worked cases of the digest (seed_synth_papers.md T5,
T10, T11, T12) and hand-computed cases."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from sqlsdc.synth.disclosure import (
    attribute_disclosure_ratio,
    decoys_needed,
    disco,
    distance_criteria,
    expected_ims,
    holdout_tests,
    identical_share,
    replicated_uniques,
    replicated_uniques_counts,
    tcap,
)


def test_replicated_uniques_worked_case_t5():
    r = replicated_uniques_counts([1, 1, 2, 3, 0], [1, 0, 1, 2, 3])
    assert r["p1"] == pytest.approx(100 * 2 / 7)
    assert r["ru"] == pytest.approx(100 / 7)
    assert r["ru_of_p1"] == pytest.approx(50.0)
    assert r["p0"] == pytest.approx(20.0)


def test_replicated_uniques_from_records():
    # cells (a,x) unique, (a,y) unique, (b,x) twice; synthetic repeats (a,x) once
    original = pd.DataFrame({"v": ["a", "a", "b", "b"], "w": ["x", "y", "x", "x"]})
    synthetic = pd.DataFrame({"v": ["a", "a", "b", "a"], "w": ["x", "y", "y", "y"]})
    r = replicated_uniques(original, synthetic)
    assert r["uniques"] == 2 and r["replicated"] == 1  # (a,y) appears twice: not unique there
    assert r["p1"] == 50.0 and r["ru"] == 25.0 and r["ru_of_p1"] == 50.0
    assert r["p0"] == 25.0  # k = 2 × 2 cells, (b,y) empty


def test_identical_share_counts_nan_as_equal():
    original = pd.DataFrame({"x": [1.0, np.nan], "g": ["a", None]})
    synthetic = pd.DataFrame({"x": [np.nan, 1.0, 2.0], "g": [None, "b", "a"]})
    assert identical_share(original, synthetic) == pytest.approx(1 / 3)


def test_tcap_and_disco_hand_computed():
    o = pd.DataFrame({"k": [1, 1, 2, 3], "t": ["a", "a", "b", "a"]})
    s = pd.DataFrame({"k": [1, 2, 2, 3], "t": ["a", "b", "a", "b"]})
    # key 1: synthetic says a (correct, twice); key 2: synthetic ambiguous; key 3: says b (wrong)
    assert tcap(o, s, ["k"], "t") == {"tcap": 2 / 3, "baseline": 0.625, "matched": 3}
    assert disco(o, s, ["k"], "t") == {"disco": 50.0, "disdio": 50.0}
    assert tcap(o, s.assign(k=9), ["k"], "t")["tcap"] is None


def test_distance_criteria_worked_case_t10():
    r = distance_criteria(np.arange(6.0)[:, None], np.array([[0.0], [2.5], [10.0]]))
    assert r["ims"] == pytest.approx(1 / 3)
    assert r["dcr_p5"] == pytest.approx(0.05)
    assert r["nndr_p5"] == pytest.approx(0.02)


def test_holdout_tests_copy_fails_fresh_sample_passes():
    rng = np.random.default_rng(0)
    make = lambda: pd.DataFrame(rng.normal(size=(800, 3)), columns=list("abc"))  # noqa: E731
    original, holdout = make(), make()
    copied = holdout_tests(original, holdout, original.sample(800, random_state=1))
    assert copied["synthetic"]["ims"] == 1.0 and not any(copied["passed"].values())
    fresh = holdout_tests(original, holdout, make(), delta=0.05)
    assert abs(fresh["synthetic"]["dcr_p5"] - fresh["holdout"]["dcr_p5"]) < 0.05


def test_expected_ims_worked_case_t12():
    assert expected_ims(1 / 1000, 500) == pytest.approx(0.393621, abs=1e-6)


def test_attribute_disclosure_ratio_worked_case_t11():
    prior = 152 / 9583
    # a target with a neighbourhood of 3 synthetic records, 2 of them deceased
    original = pd.DataFrame({"lat": [0.0], "age": ["60s"], "state": ["deceased"]})
    synthetic = pd.DataFrame(
        {
            "lat": [0.0, 0.0, 0.0, 5.0],
            "age": ["60s"] * 3 + ["20s"],
            "state": ["deceased", "deceased", "recovered", "deceased"],
        }
    )
    r = attribute_disclosure_ratio(original, synthetic, target="state", continuous=["lat"],
                                   categorical=["age"], delta=0.5,
                                   prior={"deceased": prior, "recovered": 1 - prior})  # fmt: skip
    assert r["max_ratio"] == pytest.approx(42.0307, abs=1e-4)
    assert decoys_needed(2, 3, prior, 10) == 10
    assert (2 / 13) / prior == pytest.approx(9.6994, abs=1e-4)
    assert (2 / 12) / prior == pytest.approx(10.5077, abs=1e-4)  # 9 decoys are not enough


def test_attribute_disclosure_empty_neighbourhood_is_one():
    original = pd.DataFrame({"age": ["x"], "s": [1]})
    synthetic = pd.DataFrame({"age": ["y"], "s": [1]})
    r = attribute_disclosure_ratio(original, synthetic, target="s", categorical=["age"])
    assert r["max_ratio"] == 1.0
