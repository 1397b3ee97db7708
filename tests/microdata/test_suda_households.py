"""SUDA special uniques, household risk, interval disclosure and targeted household swapping."""

from __future__ import annotations

from itertools import combinations

import numpy as np
import pandas as pd
import pytest

from sqlsdc.errors import MicrodataError
from sqlsdc.microdata.risk import household_risk, interval_disclosure, risk_summary
from sqlsdc.microdata.steps import apply_steps, parse_step
from sqlsdc.microdata.suda import suda
from sqlsdc.microdata.swapping import swap_households

SMALL = pd.DataFrame({"a": [2, 1, 1], "b": [0, 3, 0], "c": [0, 6, 0]})


def test_suda_worked_case():
    """Records (2,0,0), (1,3,6), (1,0,0): MSUs {a}; {b},{c}; {a,b},{a,c}. With M = 3 and
    MSUs up to size 2 a size-1 MSU scores (3−1)(3−2) = 2 and a size-2 one 1; the variable
    contributions are 4/8, 3/8, 3/8 (sdcMicro's suda2 reports 50, 37.5, 37.5)."""
    result = suda(SMALL)
    assert result.scores.tolist() == [2.0, 4.0, 2.0]
    assert result.contributions == {"a": 50.0, "b": 37.5, "c": 37.5}
    assert result.msu_counts.to_numpy().tolist() == [[1, 0], [2, 0], [0, 2]]


def _brute_msus(df: pd.DataFrame, top: int) -> list[set]:
    """Every record's MSUs by definition: unique on S, not unique on any proper subset."""
    cols = list(df.columns)

    def unique(row, subset):
        return (df[list(subset)] == df.loc[row, list(subset)]).all(axis=1).sum() == 1

    found = []
    for row in df.index:
        msus = set()
        for size in range(1, top + 1):
            for subset in combinations(cols, size):
                if unique(row, subset) and not any(
                    unique(row, smaller)
                    for r in range(1, size)
                    for smaller in combinations(subset, r)
                ):
                    msus.add(subset)
        found.append(msus)
    return found


def test_suda_finds_exactly_the_minimal_sample_uniques():
    rng = np.random.default_rng(3)
    df = pd.DataFrame(
        {c: rng.integers(0, k, 40) for c, k in zip("wxyz", [3, 2, 4, 3], strict=True)}
    )
    result = suda(df)
    brute = _brute_msus(df, 3)
    for i, msus in enumerate(brute):
        sizes = [sum(len(s) == k for s in msus) for k in (1, 2, 3)]
        assert result.msu_counts.iloc[i].tolist() == sizes
        assert result.scores.iloc[i] == sum({1: 6, 2: 2, 3: 1}[len(s)] for s in msus)


def test_suda_bounds_and_errors():
    assert suda(SMALL, max_size=1).scores.tolist() == [2.0, 4.0, 0.0]  # (3−1)·… only size 1
    with pytest.raises(MicrodataError, match="max_size"):
        suda(SMALL, max_size=3)
    with pytest.raises(MicrodataError, match="not in the data"):
        suda(SMALL, ["a", "nope"])
    with pytest.raises(MicrodataError, match="at most 16"):
        suda(pd.DataFrame({f"c{i}": [1] for i in range(17)}))


def test_household_risk_is_one_minus_product_of_member_safety():
    r = household_risk([0.5, 0.2, 0.1, 0.0], ["h1", "h1", "h2", "h3"])
    assert r.tolist() == pytest.approx([0.6, 0.6, 0.1, 0.0])
    with pytest.raises(MicrodataError, match="missing"):
        household_risk([0.1, 0.2], ["h1", None])


def test_risk_summary_with_households():
    df = pd.DataFrame({"hh": [1, 1, 2, 2, 3], "sex": [1, 2, 1, 2, 1], "age": [30, 30, 30, 30, 70]})
    summary = risk_summary(df, ["sex", "age"], household="hh")
    # persons: (1,30)×2 → r = 1/2 each, (2,30)×2 → 1/2, (1,70)×1 → 1; households 1 and 2 have
    # two members of risk 1/2: 1 − ¼ = ¾; household 3: 1.
    assert summary.households == {
        "households": 3,
        "expected_reidentifications": 2.5,
        "global_risk": pytest.approx(2.5 / 3),
        "above_threshold": 3,
        # sdcMicro's hier_risk_ER and hier_risk (measure_risk: 1 - prod(1 - r) per household,
        # summed and averaged over records): 4 × ¾ + 1 = 4, 4/5. Missing before session 49.
        "records_expected_reidentified": 4.0,
        "records_global_risk": pytest.approx(0.8),
    }


def test_interval_disclosure_by_rank_and_by_sd():
    x = pd.DataFrame({"v": np.arange(100.0)})
    assert interval_disclosure(x, x)["overall"] == 100.0
    shifted = interval_disclosure(x, x + 3, p=[1, 3])
    # masked rank i+3: a half-width of 1 % of n (1 rank) misses the original except where the
    # top clips (i ≥ 97 → 2 records... plus the last); 3 ranks reach it everywhere
    assert shifted["mean"] == [2.0, 100.0]
    sd = x["v"].std()
    by_sd = interval_disclosure(x, x + 3, p=[10, 11], method="sd")
    assert by_sd["mean"] == [0.0, 100.0] and 0.10 * sd < 3 <= 0.11 * sd
    with pytest.raises(MicrodataError, match="must match"):
        interval_disclosure(x, x.iloc[:5])


def _population(households=1500, seed=1):
    rng = np.random.default_rng(seed)
    homes = pd.DataFrame({"hid": np.arange(households), "region": rng.integers(0, 6, households),
                          "size": rng.integers(1, 5, households)})  # fmt: skip
    people = homes.loc[homes.index.repeat(homes["size"])].reset_index(drop=True)
    people["age"] = rng.integers(0, 90, len(people))
    people["sex"] = rng.integers(1, 3, len(people))
    return people


def _swap(people, seed=7, **kw):
    options = {"household": "hid", "geography": ["region"], "risk": ["age", "sex"],
               "similar": ["size"], "k": 3, "rate": 0.1} | kw  # fmt: skip
    return swap_households(people, rng=np.random.default_rng(seed), **options)


def test_swapping_moves_whole_households_and_keeps_similar_tables():
    people = _population()
    out, report = _swap(people)
    assert report["swapped_households"] > 0 and report["without_partner"] == 0
    # every household at risk (447 of 1,500) is a target, with a partner: far above the rate
    assert report["targets"] == report["risky_households"] == 447
    assert report["realised_rate"] >= 2 * 447 / 1500 * 0.85
    # only the geography moves, households stay together, in one area each
    pd.testing.assert_frame_equal(out.drop(columns="region"), people.drop(columns="region"))
    assert (out.groupby("hid")["region"].nunique() == 1).all()
    moved = out.groupby("hid")["region"].first() != people.groupby("hid")["region"].first()
    assert moved.sum() == report["swapped_households"]
    # partners agree on size, so region × size is unchanged; region × age is not
    tab = lambda d, cols: d.groupby(cols).size()  # noqa: E731
    pd.testing.assert_series_equal(tab(out, ["region", "size"]), tab(people, ["region", "size"]))
    assert not tab(out, ["region", "age"]).equals(tab(people, ["region", "age"]))


def test_swapping_targets_risky_households_and_is_reproducible():
    people = _population()
    out, report = _swap(people)
    again, _ = _swap(people)
    pd.testing.assert_frame_equal(out, again)
    other, _ = _swap(people, seed=8)
    assert not other.equals(out)
    f = people.groupby(["region", "age", "sex"])["hid"].transform("size")
    risky = set(people.loc[f < 3, "hid"])
    moved = set(out.loc[out["region"] != people["region"], "hid"])
    assert report["risky_households"] == len(risky)
    # ≈ 30 % of the households are at risk, more than the rate (10 %) covers: every one of them
    # is swapped all the same, as sdcMicro's recordSwap does. Before session 49 the targets
    # were the rate's 150 households and 297 risky households stayed where they were.
    assert report["targets"] == len(risky) and report["without_partner"] == 0
    assert risky <= moved


def test_the_swap_rate_counts_both_households_of_a_swap_as_sdcmicro():
    """No household at risk (k = 1): the random swaps reach the rate, counting the target and
    its partner (sdcMicro: "a single swap counts for swapping 2 households"); 75 targets for
    1,500 households at 10 %, of which a few are drawn as partners of earlier targets. Before
    session 49: 150 targets and a realised rate of about 0.2."""
    people = _population()
    out, report = _swap(people, k=1)
    assert report["risky_households"] == 0 and report["targets"] == 75
    assert 0.09 <= report["realised_rate"] <= 0.1
    moved = out.groupby("hid")["region"].first() != people.groupby("hid")["region"].first()
    assert moved.sum() == report["swapped_households"]


def test_swapping_errors_and_step():
    people = _population(200)
    bad = people.copy()
    bad.loc[bad.index[:2], "region"] = [0, 1]
    bad.loc[bad.index[:2], "hid"] = -1
    with pytest.raises(MicrodataError, match="household characteristics"):
        _swap(bad)
    with pytest.raises(MicrodataError, match="swap rate"):
        _swap(people, rate=0)
    step = parse_step("swap:region:household=hid,risk=age/sex,similar=size,k=3,rate=0.1")
    out, log = apply_steps(people, [step], secret=b"k" * 32, seed=1)
    assert log[0]["swapped_households"] == (out["region"] != people["region"]).groupby(
        people["hid"]).any().sum()  # fmt: skip
    with pytest.raises(MicrodataError, match="household"):
        parse_step("swap:region:k=3")
