"""sdcMicro's published test cases, end to end: frequencies, individual risk and SUDA scores.

Sources (sdcTools/sdcMicro): ``tests/testthat/test_freqCalc.R`` (f_k and F̂_k, with missing
values matching any value), ``tests/testthat/test_indivRisk.R`` (``indivRisk``, method "exact",
qual = 1, survey = TRUE) and ``tests/testthat/test_suda2.R`` (the "book example" and the "sdc
guideline" example; commented out in sdcMicro, whose suda2 rescales scores by default, but
their numbers are the original SUDA scores of Elliot et al. 2002 that :func:`suda` computes)
and ``tests/testthat/test_ldiversity.R`` (``ldiversity``: distinct l-diversity per record; the
entropy and recursive measures are checked against their definitions, as sdcMicro's C++ code
computes them).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from sqlsdc.microdata.ldiversity import l_diversity
from sqlsdc.microdata.risk import frequencies, individual_risk
from sqlsdc.microdata.suda import suda

NA = np.nan
WEIGHTS = [18.0, 45.5, 39.0, 17.0, 92.0, 8.0, 123.5, 51]
KEYS = [2, 3, 2, 2, 3, 3, 1, 2, 3, 3, 3, 3, 3, 3, 4, 3, 1, 3, 1, 2, 1, 1, 1, 1]


def _frame(values, shape, weights) -> pd.DataFrame:
    """R's ``array(values, dim = shape)`` (column-major) with a weight column."""
    cols = [chr(ord("A") + i) for i in range(shape[1])]
    df = pd.DataFrame(np.array(values, float).reshape(shape, order="F"), columns=cols)
    df["weight"] = weights
    return df


FREQCALC_CASES = {
    "no missing values": (
        KEYS, (8, 3), WEIGHTS,
        [3, 1, 3, 1, 2, 2, 1, 3], [108.0, 45.5, 108.0, 17.0, 100.0, 100.0, 123.5, 108.0],
    ),
    "missing values": (
        KEYS[:18] + [NA, 2, 1, 1, NA, 1], (8, 3), WEIGHTS,
        [3, 1, 4, 2, 2, 2, 1, 3], [108.0, 45.5, 125.0, 56.0, 100.0, 100.0, 123.5, 108.0],
    ),
    "one column and one row missing": (
        [2, 3, NA, 2, 3, 3, 1, 2, 3, 3, NA, 3, 3, 3, 4, 3] + [NA] * 8, (8, 3), WEIGHTS,
        [4, 4, 8, 4, 4, 4, 2, 4], [125.0, 184.5, 394.0, 125.0, 184.5, 184.5, 162.5, 125.0],
    ),
    "one key with missing values": (
        [2, 3, NA, 2, 1, NA, 1, 2], (8, 1), WEIGHTS,
        [5, 3, 8, 5, 4, 8, 4, 5], [133.0, 92.5, 394.0, 133.0, 262.5, 394.0, 262.5, 133.0],
    ),
    "more keys than records": (
        [2, 3, NA, 2, 3, 3, 1, NA, 3, 3, NA, 3, 3, 2, 2, 3, NA, NA, 1, 2, NA, NA, 4, 4],
        (3, 8), [18.0, 45.5, 122],
        [1, 2, 2], [18.0, 167.5, 167.5],
    ),
}  # fmt: skip
FREQCALC_N1_N2 = {
    "no missing values": (3, 2),
    "missing values": (2, 3),
    "one column and one row missing": (0, 1),
    "one key with missing values": (0, 0),
    "more keys than records": (1, 2),
}


@pytest.mark.parametrize("case", list(FREQCALC_CASES))
def test_freqcalc_cases(case):
    """f_k, F̂_k and the counts of keys seen once (n1) and twice (n2), weighted and not."""
    values, shape, weights, fk, Fk = FREQCALC_CASES[case]
    df = _frame(values, shape, weights)
    keys = [c for c in df.columns if c != "weight"]
    weighted = frequencies(df, keys, "weight")
    assert weighted["fk"].tolist() == fk
    assert weighted["Fk"].tolist() == pytest.approx(Fk)
    plain = frequencies(df, keys)
    assert plain["fk"].tolist() == fk and plain["Fk"].tolist() == fk
    n1, n2 = int((weighted["fk"] == 1).sum()), int((weighted["fk"] == 2).sum())
    assert (n1, n2) == FREQCALC_N1_N2[case]


def test_indivrisk_exact_survey_case():
    """``indivRisk(freqCalc(..., w = 4), method = "exact", qual = 1, survey = TRUE)``: the
    Benedetti-Franconi risk to sdcMicro's 8 printed digits. (Its ``method = "approx"`` gives
    0.01369863 for f = 3, F̂ = 108: an approximation we do not implement.)"""
    fr = frequencies(_frame(KEYS, (8, 3), WEIGHTS), ["A", "B", "C"], "weight")
    risk = individual_risk(fr["fk"], fr["Fk"])
    expected = [0.01355297, 0.08579129, 0.01355297, 0.17707583, 0.01877883, 0.01877883,
                0.03931625, 0.01355297]  # fmt: skip
    assert risk.tolist() == pytest.approx(expected, abs=5e-9)
    # survey = FALSE: the file is the population, r = 1/f_k
    assert individual_risk(fr["fk"], fr["fk"]).round(5).tolist() == [
        0.33333,
        1.0,
        0.33333,
        1.0,
        0.5,
        0.5,
        1.0,
        0.33333,
    ]


def test_suda_book_example():
    """test_suda2.R "book example": records 5-8 score 4, 2, 6, 8 (records 1-4 have no MSU)."""
    tab = pd.DataFrame(
        {
            "age": ["20s"] * 7 + ["60s"],
            "gender": ["male"] * 4 + ["female"] * 3 + ["male"],
            "income": ["50k+"] * 2 + ["50k-"] * 6,
            "education": ["highschool"] * 4
            + ["university", "highschool", "middleschool", "university"],
        }
    )
    assert suda(tab).scores.tolist() == [0, 0, 0, 0, 4, 2, 6, 8]


def test_suda_sdc_guideline_example():
    """test_suda2.R "sdc guideline" (Benschop et al., the SDC practice guide's SUDA table)."""
    urban, f, m = "Urban", "Female", "Male"
    si, sc = "Secondary incomplete", "Secondary complete"
    data = pd.DataFrame(
        {
            "Residence": [urban] * 4 + ["Rural"] + [urban] * 5,
            "Gender": [f, f, f, m, f, m, f, m, f, f],
            "Education": [
                si,
                si,
                "Primary incomplete",
                sc,
                sc,
                sc,
                "Primary complete",
                "Post-secondary",
                si,
                si,
            ],  # fmt: skip
            "Labor": [
                "Employed",
                "Employed",
                "Non-LF",
                "Employed",
                "Unemployed",
                "Employed",
                "Non-LF",
                "Unemployed",
                "Non-LF",
                "Non-LF",
            ],  # fmt: skip
        }
    )
    assert suda(data).scores.tolist() == [0, 0, 6, 0, 12, 0, 6, 10, 0, 0]


# --- ldiversity (tests/testthat/test_ldiversity.R) ----------------------------------------------


def test_ldiversity_groups_missing_keys_together():
    """Rows 1-3 (female, NA, other) form one class with sensitive 1, 0, 2: distinct 3; rows
    4-5 and 6-7 hold 1, 0 and 0, 1: distinct 2."""
    data = pd.DataFrame(
        {
            "sex": ["female", "female", "female", "male", "male", "female", "female"],
            "occupation": [None, None, None, "teacher", "teacher", "nurse", "nurse"],
            "ethnicity": ["other"] * 5 + ["majority"] * 2,
            "sensitive": [1, 0, 2, 1, 0, 0, 1],
        }
    )
    res = l_diversity(data, ["sex", "occupation", "ethnicity"], ["sensitive"])
    assert res["sensitive_distinct"].tolist() == [3, 3, 3, 2, 2, 2, 2]


def test_ldiversity_keeps_row_order_and_several_sensitive_variables():
    unordered = pd.DataFrame({"id": [3, 1, 2], "sens": [10, 20, 10]})
    assert l_diversity(unordered, ["id"], ["sens"])["sens_distinct"].tolist() == [1, 1, 1]
    multi = pd.DataFrame({"key": [1, 1, 1], "sens1": list("ABA"), "sens2": list("XYZ")})
    res = l_diversity(multi, ["key"], ["sens1", "sens2"])
    assert res.loc[0, ["sens1_distinct", "sens2_distinct"]].tolist() == [2, 3]


def test_ldiversity_entropy_and_recursive_definitions():
    """Machanavajjhala et al. (2007), Definitions 4.1-4.2, with sdcMicro's missing-value rule:
    counts 5, 3, 2 (c = 2): 5 < 2·(3 + 2) and 5 < 2·2 fails, so recursive 2; a missing value
    is one more value for distinct and entropy, none for recursive."""
    frame = pd.DataFrame({"k": [1] * 10, "s": list("aaaaabbbcc")})
    res = l_diversity(frame, ["k"], ["s"]).iloc[0]
    p = np.array([5, 3, 2]) / 10
    assert res["s_distinct"] == 3 and res["s_recursive"] == 2
    assert res["s_entropy"] == pytest.approx(np.exp(-(p * np.log(p)).sum()))
    assert l_diversity(frame, ["k"], ["s"], c=3)["s_recursive"][0] == 3  # 5 < 3·2
    with_na = frame.assign(s=[*"aaaaabbbc", None])
    res = l_diversity(with_na, ["k"], ["s"]).iloc[0]
    assert res["s_distinct"] == 4 and res["s_recursive"] == 2  # counts 5, 3, 1 (+ 1 missing)
    q = np.array([5, 3, 1, 1]) / 10
    assert res["s_entropy"] == pytest.approx(np.exp(-(q * np.log(q)).sum()))
