"""Primary rules: worked numbers, τ-ARGUS boundaries, weights, holdings and published results."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from sqlsdc.errors import TabularError
from sqlsdc.tabular.model import build_table
from sqlsdc.tabular.rules import (
    CellStats,
    DominanceRule,
    FrequencyRule,
    ManualRule,
    PPercentRule,
    PQRule,
    ZeroRule,
    apply_rules,
    default_rules,
    required_top_k,
)


def stats(n, value, top, top_weight=None, weight=None):
    value = np.asarray(value, dtype=float)
    return CellStats(
        n=np.asarray(n),
        value=value,
        total=value,
        top=np.asarray(top, dtype=float),
        top_weight=None if top_weight is None else np.asarray(top_weight, dtype=float),
        weight=None if weight is None else np.asarray(weight, dtype=float),
    )


# --- worked numbers --------------------------------------------------------------------------


def test_frequency_rule_levels_and_boundaries():
    s = stats([0, 1, 2, 3], [0.0, 50.0, 80.0, 90.0], [[0, 0]] * 4)
    r = FrequencyRule(min_freq=3, safety_range=30).evaluate(s)
    assert r.sensitive.tolist() == [False, True, True, False]  # empty and n = min_freq are safe
    assert r.upl.tolist() == [0.0, 15.0, 24.0, 0.0]
    assert r.lpl.tolist() == r.upl.tolist()


def test_frequency_rule_levels_of_counts_reach_the_threshold():
    """Failed on main (UPL was 30 % of the count, at least 1). A count's cell (value = n) under
    ``freq:5``: UPL = 5 - n, so the attacker's upper bound reaches 5, at least the 30 % safety
    range; LPL stays the safety range. Published numbers it must meet: τ-ARGUS's levels
    (libtauargus ``Table.cpp`` ``SetProtectionLevelCell``: ``|value| · CellFreqSafetyPerc /
    100``, at least ``MinLPL`` = 1), given by ``reach_threshold=False``, and GaussSuppression's
    interval requirements for small counts (``PrimaryDefault(protectionIntervals = TRUE)``:
    ``upmin = freq + 1``, ``rlim = 2``)."""
    n = np.array([0, 1, 2, 3, 4, 5, 20])
    counts = CellStats(n=n, value=n.astype(float), total=n.astype(float))
    r = apply_rules(counts, [FrequencyRule(min_freq=5, safety_range=30)])
    assert r.primary.tolist() == [False, True, True, True, True, False, False]
    assert r.upl.tolist() == pytest.approx([0, 4, 3, 2, 1.2, 0, 0])
    assert r.lpl.tolist() == pytest.approx([0, 1, 1, 1, 1.2, 0, 0])
    tau = apply_rules(counts, [FrequencyRule(min_freq=5, safety_range=30, reach_threshold=False)])
    assert tau.upl.tolist() == pytest.approx([0, 1, 1, 1, 1.2, 0, 0])  # max(0.3 n, 1)
    assert tau.lpl.tolist() == tau.upl.tolist()
    hit = r.primary
    assert np.all(n[hit] + r.upl[hit] >= 5)  # the threshold
    assert np.all(n[hit] + r.upl[hit] >= n[hit] + 1)  # GaussSuppression: upmin = freq + 1
    assert np.all(r.upl[hit] + r.lpl[hit] >= 2)  # GaussSuppression: rlim = 2
    assert not np.all(n[hit] + tau.upl[hit] >= 5)  # τ-ARGUS's levels stop short of it
    # weighted: the weighted frequency is the count (value = sum of weights)
    weighted = CellStats(n=np.array([2]), value=np.array([2.5]), total=np.array([2.5]),
                         weight=np.array([2.5]))  # fmt: skip
    assert FrequencyRule(min_freq=5).evaluate(weighted).upl.tolist() == [2.5]


def test_dominance_rule_worked_example():
    # T = 100, x1 + x2 = 95 > 85: UPL = 100/85 * 95 - 100
    s = stats([3, 3, 4], [100.0, 100.0, 100.0], [[80, 15], [80, 5], [50, 35]])
    r = DominanceRule(n=2, k=85).evaluate(s)
    assert r.sensitive.tolist() == [True, False, False]  # 85 % exactly is safe (strict >)
    assert r.upl[0] == pytest.approx(100 / 85 * 95 - 100) == pytest.approx(11.764706)
    assert r.lpl[0] == r.upl[0] and r.upl[1] == 0.0
    one = DominanceRule(n=1, k=60).evaluate(s)
    assert one.sensitive.tolist() == [True, True, False]
    assert one.upl[:2] == pytest.approx([100 / 60 * 80 - 100] * 2)


def test_p_percent_rule_worked_example():
    # T - x1 - x2 = 5 < 10 % of 60: UPL = 6 - 5 = 1
    s = stats([3, 3, 3], [100.0, 100.0, 100.0], [[60, 35], [50, 40], [60, 34]])
    r = PPercentRule(p=10).evaluate(s)
    assert r.sensitive.tolist() == [True, False, False]  # remainder 6 = 10 % of 60 is safe
    assert r.upl.tolist() == pytest.approx([1.0, 0.0, 0.0])


def test_p_percent_rule_with_a_coalition():
    s = stats([4], [100.0], [[60, 30, 8]])
    assert not PPercentRule(p=10, n=1).evaluate(s).sensitive[0]  # remainder 10
    r = PPercentRule(p=10, n=2).evaluate(s)  # 2nd and 3rd largest collude: remainder 2
    assert r.sensitive[0] and r.upl[0] == pytest.approx(6 - 2)


def test_pq_rule_worked_example():
    # q/100 * (T - x1 - x2) = 0.5 * 5 < p/100 * x1 = 0.25 * 60: UPL = p/q x1 - 5 = 25
    s = stats([3, 3], [100.0, 100.0], [[60, 35], [40, 20]])
    r = PQRule(p=25, q=50).evaluate(s)
    assert r.sensitive.tolist() == [True, False]  # 0.5 * 40 = 20 > 0.25 * 40
    assert r.upl.tolist() == pytest.approx([25.0, 0.0])
    assert PQRule(p=25, q=100).evaluate(s).upl[0] == pytest.approx(
        PPercentRule(p=25).evaluate(s).upl[0]
    )


def test_zero_and_manual_rules():
    s = stats([2, 0, 3], [0.0, 0.0, 40.0], [[0, 0]] * 3)
    z = ZeroRule(safety_range=2.5).evaluate(s)
    assert z.sensitive.tolist() == [True, False, False]
    assert (z.upl.tolist(), z.lpl.tolist()) == ([2.5, 0, 0], [0, 0, 0])
    m = ManualRule(np.array([False, False, True]), safety_range=10).evaluate(s)
    assert m.sensitive.tolist() == [False, False, True] and m.upl.tolist() == [0, 0, 4.0]
    with pytest.raises(TabularError, match="a primary mask must be 3 booleans"):
        ManualRule([1, 0, 1]).evaluate(s)


def test_apply_rules_combines_names_and_takes_the_largest_levels():
    s = stats([1, 5, 4, 2], [50.0, 100.0, 100.0, 0.0], [[50, 0], [90, 5], [30, 30], [0, 0]])
    r = apply_rules(s, [FrequencyRule(), PPercentRule(), DominanceRule(n=1, k=80)])
    assert r.primary.tolist() == [True, True, False, True]
    assert r.rule.tolist() == ["freq; p(10); nk(1,80)", "p(10); nk(1,80)", "", "freq"]
    # cell 0: max(15 freq, 5 p%, 100/80*50-50 = 12.5); cell 1: max(4, 12.5)
    assert r.upl.tolist() == pytest.approx([15.0, 12.5, 0.0, 1.0])
    # a zero cell gets the minimum upper level and no lower level
    assert r.lpl.tolist() == pytest.approx([15.0, 12.5, 0.0, 0.0])
    none = apply_rules(s, [FrequencyRule(safety_range=0)], min_level=0.0)
    assert none.upl.tolist() == [0.0, 0.0, 0.0, 0.0]
    with pytest.raises(TabularError, match="is not a rule"):
        apply_rules(s, ["freq"])


def test_rule_parameter_errors():
    s = stats([3], [100.0], [[60, 35]])
    with pytest.raises(TabularError, match="needs n >= 1 and 0 < k <= 100"):
        DominanceRule(n=2, k=120).evaluate(s)
    with pytest.raises(TabularError, match="pq-rule needs 0 < p <= q <= 100; got p=85, q=80"):
        PQRule(p=85, q=80).evaluate(s)
    with pytest.raises(TabularError, match="needs the 3 largest contributions"):
        DominanceRule(n=3, k=90).evaluate(s)
    with pytest.raises(TabularError, match="safety_range must be a percentage"):
        FrequencyRule(safety_range=-1).evaluate(s)


def test_defaults():
    assert default_rules(count=True) == [FrequencyRule()]
    assert default_rules(count=False) == [FrequencyRule(), PPercentRule()]
    assert FrequencyRule().min_freq == 3 and (DominanceRule().n, DominanceRule().k) == (2, 85)
    assert (PQRule().p, PQRule().q) == (25, 50)  # sdcTable's defaults
    assert required_top_k([DominanceRule(n=3), PQRule(n=2), FrequencyRule()]) == 3


# --- tables: count tables, negatives, holdings ------------------------------------------------


def test_dominance_rules_need_a_magnitude_table():
    t = build_table(pd.DataFrame({"g": ["a", "b", "b", "c", "c", "c"]}), ["g"])
    with pytest.raises(TabularError, match="needs the largest contributions of a magnitude"):
        apply_rules(t, [PPercentRule()])
    r = apply_rules(t, [FrequencyRule()])
    assert r.primary.tolist() == [False, True, True, False]
    # a count's upper level reaches min_freq = 3 (1 + 2); 30 % of 2, at least 1
    assert r.upl.tolist() == [0.0, 2.0, 1.0, 0.0]
    assert r.lpl.tolist() == [0.0, 1.0, 1.0, 0.0]


def test_negative_contributions_are_refused_unless_a_shadow_is_given():
    df = pd.DataFrame({"g": ["a", "a", "a"], "v": [-5.0, 90.0, 10.0]})
    with pytest.raises(TabularError, match="undefined for negative contributions"):
        apply_rules(build_table(df, ["g"], "v"), [PPercentRule()])
    df["s"] = df["v"].abs()
    t = build_table(df, ["g"], "v", shadow="s")
    r = apply_rules(t, [PPercentRule(p=10)])
    # shadow T = 105, x1 = 90, x2 = 10: distance 9 - 5 = 4, scaled to the value 95: 4 * 95/105
    assert r.primary.tolist() == [True, True]
    assert r.upl[0] == pytest.approx(4 * 95 / 105)


def test_holding_level_rules():
    df = pd.DataFrame(
        {"nace": ["x"] * 3, "firm": [1, 2, 3], "group": ["g", "g", None], "v": [50.0, 30, 20]}
    )
    t = build_table(df, ["nace"], "v", unit="firm", holding="group")
    assert not apply_rules(t, [DominanceRule(n=1, k=75)]).primary.any()
    r = apply_rules(t, [DominanceRule(n=1, k=75, level="holding")])
    assert r.primary.tolist() == [True, True]
    assert r.rule.tolist() == ["nk(1,75)[holding]"] * 2
    assert r.upl[0] == pytest.approx(100 / 75 * 80 - 100)
    f = apply_rules(t, [FrequencyRule(min_freq=3, level="holding")])
    assert f.primary.tolist() == [True, True]  # 3 firms but 2 holdings
    plain = build_table(df, ["nace"], "v")
    with pytest.raises(TabularError, match="has no holdings; pass `holding=`"):
        apply_rules(plain, [FrequencyRule(level="holding")])


# --- sampling weights (τ-ARGUS) ----------------------------------------------------------------


def test_weighted_largest_contributions_and_levels():
    # unit (100, w 1.5) stands for 1.5 population units; second unit (40, w 1)
    s = stats([2], [190.0], [[100, 40]], top_weight=[[1.5, 1]], weight=[2.5])
    nk = DominanceRule(n=2, k=85).evaluate(s)  # x1 + x2 = 100 + 0.5*100 + 0.5*40 = 170 > 161.5
    assert nk.sensitive[0] and nk.upl[0] == pytest.approx(100 / 85 * 170 - 190)
    p = PPercentRule(p=25).evaluate(s)  # remainder 190 - 170 = 20 < 25 % of 100
    assert p.sensitive[0] and p.upl[0] == pytest.approx(25 - 20)
    assert FrequencyRule(min_freq=3).evaluate(s).sensitive[0]  # weighted frequency 2.5 < 3
    s3 = stats([2], [190.0], [[100, 40]], top_weight=[[2, 1]], weight=[3.0])
    assert not FrequencyRule(min_freq=3).evaluate(s3).sensitive[0]


def gauss_dominance_data():
    """GaussSuppression tests/testthat/test-DominanceRule.R (Statistics Norway, MIT)."""
    num = [100, 90, 10, 80, 20, 70, 30, 80, 10, 10, 70, 10, 10, 10, 60, 20, 10, 10]
    v1 = ["v1"] + ["v2"] * 2 + ["v3"] * 2 + ["v4"] * 2 + ["v5"] * 3 + ["v6"] * 4 + ["v7"] * 4
    sw2 = [1, 2, 1, 2, 1, 2, 1, 2, 1, 1, 2, 1, 1, 1, 2, 1, 1, 1]
    return pd.DataFrame({"v1": v1, "num": np.array(num, float), "sw1": 1.0, "sw2": sw2})


def test_published_tauargus_weighted_dominance():
    """GaussSuppression's "tauargus dominance" test: n = 2, k = 90 with weights sw2."""
    t = build_table(gauss_dominance_data(), ["v1"], "num", weight="sw2")
    r = apply_rules(t, [DominanceRule(n=2, k=90)])
    inner = t.cells["v1"] != "Total"
    assert r.primary[inner].tolist() == [True, True, False, False, False, False, False]
    # v2: contributions 90 (w 2) and 10 (w 1): T = 190, x1 + x2 = 90 + 90 (its 2nd copy)
    v2 = t.cells["v1"] == "v2"
    assert t.cells.loc[v2, ["value", "top1", "top1_w"]].values.tolist() == [[190.0, 90.0, 2.0]]
    assert r.upl[v2][0] == pytest.approx(100 / 90 * 180 - 190)


def test_unit_weights_equal_unweighted_and_boundary_is_strict():
    data = gauss_dominance_data()
    plain = apply_rules(build_table(data, ["v1"], "num"), [DominanceRule(n=2, k=90)])
    ones = apply_rules(build_table(data, ["v1"], "num", weight="sw1"), [DominanceRule(n=2, k=90)])
    assert plain.primary.tolist() == ones.primary.tolist()
    # v5 = 80 + 10 of 100 is exactly 90 %: safe under τ-ARGUS's strict ">" (GaussSuppression's
    # MagnitudeRule uses ">=" and would flag it)
    assert plain.primary[1:].tolist() == [True, True, True, True, False, False, False]


# --- sdcTable microdata1 ---------------------------------------------------------------------


def microdata1() -> pd.DataFrame:
    """sdcTable data-raw/microdata1.R (synthetic, 100 rows)."""
    region = (
        "CCAACDD" "AACABBBCDABCA" "BDACDDABDCCBB" "BBDCDBCBADBBD" "BCCBACDBCBBAC"
        "DBADDAADDDACB" "BDDBDDABBCABB" "BCACCCDBDBBDB" "AB"
    )  # fmt: skip
    gender = """m m m m m / f f f m m f f / m m f f m m m m / m m m f f m m f / m m f m f f f /
        m f m f m m m f / f f m f m f f / m f f f m m f / m f m m m f f / m m f f m m f /
        m f f f f f m / m f f f m m m / m m m m f m m f / f f m m f m m""".replace("/", "")
    val = [
        9, 11, 10, 11, 18, 10, 6, 9, 5, 12, 11, 10, 11, 5, 10, 11, 7, 7, 10, 13, 12, 280, 15,
        12, 16, 9, 13, 16, 9, 6, 11, 14, 12, 8, 18, 8, 7, 7, 11, 11, 15, 6, 14, 8, 12, 9, 14, 6,
        12, 13, 9, 9, 9, 7, 6, 9, 9, 7, 9, 8, 10, 9, 7, 6, 8, 9, 14, 10, 7, 10, 19, 10, 14, 11,
        9, 5, 11, 8, 10, 13, 8, 9, 18, 7, 10, 8, 11, 6, 6, 8, 12, 11, 10, 18, 9, 8, 10, 7, 12,
        14,
    ]  # fmt: skip
    sex = ["male" if g == "m" else "female" for g in gender.split()]
    return pd.DataFrame({"region": list(region), "gender": sex, "val": np.array(val, float)})


SDCTABLE_DIMS = {"region": dict.fromkeys("ABCD"), "gender": {"male": None, "female": None}}


@pytest.mark.parametrize(
    ("rule", "cells"),
    [
        # ?primarySuppression: maxN = 2 flags one cell, (A, female) with 2 units
        (FrequencyRule(min_freq=3), [6]),
        # ?primarySuppression: "the p-percent rule with parameter p = 30 ... two primary"
        (PPercentRule(p=30), [6, 14]),
        # tests/testthat/test-primarySuppression.r: which(sdcStatus == "u") == c(6, 14)
        (DominanceRule(n=2, k=75), [6, 14]),
        (PPercentRule(p=70), [6, 14]),
        (PQRule(p=60, q=80), [6, 14]),
    ],
)
def test_published_sdctable_microdata1(rule, cells):
    df = microdata1()
    assert len(df) == 100 and df["val"].sum() == 1284
    t = build_table(df, ["region", "gender"], "val", hierarchies=SDCTABLE_DIMS)
    r = apply_rules(t, [rule])
    assert (np.flatnonzero(r.primary) + 1).tolist() == cells  # sdcTable's 1-based cell order
    assert t.cells.iloc[5][["region", "gender", "n"]].tolist() == ["A", "female", 2]
    assert t.cells.iloc[13][["region", "gender", "top1"]].tolist() == ["D", "male", 280.0]


def test_sdctable_microdata1_protection_levels():
    t = build_table(microdata1(), ["region", "gender"], "val", hierarchies=SDCTABLE_DIMS)
    r = apply_rules(t, [PPercentRule(p=30)])
    # (A, female): 11 + 9 = 20, UPL = 0.3 * 11 - 0; (D, male): 366 with 280 and 11
    assert r.upl[r.primary].tolist() == pytest.approx([3.3, 0.3 * 280 - (366 - 280 - 11)])
