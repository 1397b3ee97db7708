"""True denominators, constant aggregates and scale (issue 16, classes 2 and 9; must-have 3, 5).

Every released number must be a function of protected aggregates only: AVG is the protected sum
over the protected count, an aggregate of a constant is the protected COUNT times the constant,
and constants around a measure are applied after protection, so no ratio of two aggregates
cancels the noise.
"""

from __future__ import annotations

import math

import pytest

import sqlsdc

BY_REGION = " FROM persons GROUP BY region ORDER BY region"


def _column(con, select: str) -> list:
    return [row[1] for row in con.execute(f"SELECT region, {select}{BY_REGION}").fetchall()]


def _one_person_cells(raw):
    """(municipality, age, sex, occupation) cells of exactly one person with an income."""
    return raw.execute(
        "SELECT municipality, age, sex, occupation, any_value(income) FROM persons "
        "GROUP BY ALL HAVING count(*) = 1 AND count(income) = 1 LIMIT 200"
    ).fetchall()


@pytest.mark.parametrize(
    "ratio",
    [
        "AVG(income * 0.001) / (0.001 * AVG(income * 0 + 1))",
        "SUM(income * 0.001) / (0.001 * SUM(income * 0 + 1))",
        "SUM(income / 1000) * 1000 / SUM(CASE WHEN income IS NOT NULL THEN 1 END)",
        "AVG(income * 0.0001) * 10000 / AVG(CAST(age AS DOUBLE) - CAST(age AS DOUBLE) + 1)",
        "SUM(income) / COUNT(income)",
    ],
)
def test_ratios_do_not_give_the_income_of_one_person_cells(ckm, raw_ckm, ratio):
    """The attack of class 2: one query, the ratio of a scaled sum to a constant's sum."""
    cells = _one_person_cells(raw_ckm)
    got = dict(
        ((m, a, s, o), v)
        for m, a, s, o, v in ckm.execute(
            f"SELECT municipality, age, sex, occupation, {ratio} FROM persons GROUP BY ALL"
        ).fetchall()
    )
    exact = [
        1
        for m, a, s, o, income in cells
        if got.get((m, a, s, o)) is not None and abs(got[(m, a, s, o)] - income) < 0.5
    ]
    assert len(cells) >= 100
    assert len(exact) <= 0.05 * len(cells)


def test_constant_aggregates_are_the_protected_count(ckm):
    count = _column(ckm, "COUNT(*)")
    assert _column(ckm, "SUM(1)") == count
    assert _column(ckm, "SUM(income * 0 + 1)") == _column(ckm, "COUNT(income)")
    assert _column(ckm, "SUM(2)") == [2 * n for n in count]
    assert _column(ckm, "SUM(CAST(1 AS DOUBLE) + 1)") == [2 * n for n in count]
    assert _column(ckm, "AVG(1)") == [1] * len(count)
    assert _column(ckm, "AVG(CAST(age AS DOUBLE) - age)") == [0] * len(count)
    assert _column(ckm, "SUM(CAST(NULL AS INTEGER))") == [None] * len(count)
    filtered = _column(ckm, "COUNT(CASE WHEN age > 30 THEN 1 END)")
    assert _column(ckm, "SUM(CASE WHEN age > 30 THEN 1 END)") == filtered
    assert _column(ckm, "SUM(IF(age > 30, 3, NULL))") == [3 * n for n in filtered]


def test_small_counts_are_not_exact_from_constant_averages(ckm, raw_ckm):
    """COUNT next to SUM/AVG of constants gives nothing but the protected count."""
    truth = dict(
        raw_ckm.execute(
            "SELECT municipality, count(*) FROM persons WHERE age = 37 GROUP BY 1"
        ).fetchall()
    )
    rows = ckm.execute(
        "SELECT municipality, COUNT(*), SUM(1), AVG(1), SUM(CAST(age AS DOUBLE) * 0 + 1) "
        "FROM persons WHERE age = 37 GROUP BY 1"
    ).fetchall()
    for _m, count, total, mean, ones in rows:
        assert total == ones == count and mean in (1, None)
    small = [m for m in truth if truth[m] < 10]
    exact = [m for m, count, *_ in rows if m in small and count == truth[m]]
    assert len(exact) < 0.5 * len(small)


@pytest.mark.parametrize(
    ("scaled", "factor", "shift"),
    [
        ("SUM(income * 1000)", 1000, 0),
        ("SUM(1000 * income)", 1000, 0),
        ("SUM(-income)", -1, 0),
        ("SUM(income / 7)", 1 / 7, 0),
        ("SUM(CAST(income AS DOUBLE) * 0.001)", 0.001, 0),
        ("SUM((income + 5) * 2)", 2, 10),
        ("SUM(income + 5)", 1, 5),
        ("SUM(income - 5)", 1, -5),
    ],
)
def test_scale_and_shift_are_applied_after_protection(ckm, scaled, factor, shift):
    """a·SUM(x) + b·COUNT(x): the noise is the noise of SUM(income), scaled."""
    base = _column(ckm, "SUM(income)")
    count = _column(ckm, "COUNT(income)")
    for got, s, n in zip(_column(ckm, scaled), base, count, strict=True):
        assert math.isclose(got, factor * s + shift * n, rel_tol=1e-12)


@pytest.mark.parametrize(
    ("scaled", "factor", "shift"),
    [("AVG(income / 7)", 1 / 7, 0), ("AVG(income * 1000 + 3)", 1000, 3), ("AVG(-income)", -1, 0)],
)
def test_averages_are_scaled_protected_averages(ckm, scaled, factor, shift):
    for got, mean in zip(_column(ckm, scaled), _column(ckm, "AVG(income)"), strict=True):
        assert math.isclose(got, factor * mean + shift, rel_tol=1e-12)


def test_shifted_sums_differ_by_the_protected_count_not_the_true_one(ckm, raw_ckm):
    truth = dict(
        raw_ckm.execute("SELECT municipality, count(income) FROM persons GROUP BY 1").fetchall()
    )
    rows = ckm.execute(
        "SELECT municipality, SUM(income + 1) - SUM(income), COUNT(income) FROM persons GROUP BY 1"
    ).fetchall()
    for _m, difference, count in rows:
        assert round(difference) == count
    exact = [m for m, difference, _c in rows if round(difference) == truth[m]]
    assert len(exact) < 0.5 * len(rows)


def test_average_is_the_protected_sum_over_the_protected_count(ckm):
    for _r, total, count, mean in ckm.execute(
        "SELECT region, SUM(income), COUNT(income), AVG(income)" + BY_REGION
    ).fetchall():
        assert math.isclose(mean * count, total, rel_tol=1e-9)


@pytest.mark.parametrize(
    ("sql", "message"),
    [
        ("SELECT region, SUM(income + age) FROM persons GROUP BY region", "several columns"),
        ("SELECT region, SUM(income + age - age) FROM persons GROUP BY region", "cancel"),
        ("SELECT region, SUM(income * income) FROM persons GROUP BY region", "product"),
        ("SELECT region, SUM(income / age) FROM persons GROUP BY region", "division"),
        ("SELECT region, SUM(x) FROM (SELECT region, income * 0.001 AS x FROM persons) s "
         "GROUP BY region", "may be compared with one of its class breaks.*or aggregated"),
        ("WITH s AS (SELECT region, CAST(age AS DOUBLE) * 0 + 1 AS one FROM persons) "
         "SELECT region, SUM(one) FROM s GROUP BY region", "derived table"),
        ("SELECT p.region, SUM(r.population) FROM persons p JOIN regions r "
         "ON p.region = r.region GROUP BY p.region", "does not depend on a confidential"),
        ("SELECT region, SUM(income * weight * weight) FROM persons GROUP BY region",
         "several weights"),
        ("SELECT region, SUM(income * CAST('0.001' AS DOUBLE)) FROM persons GROUP BY region",
         "not a plain number"),
    ],
)  # fmt: skip
def test_other_transformations_are_refused(ckm, sql, message):
    with pytest.raises(sqlsdc.PolicyViolation, match=message):
        ckm.execute(sql)


def test_average_over_a_join_divides_by_the_rows_summed(ckm, raw_ckm):
    """Class 9: AVG(income) over persons ⋈ households divided by the households. (By the
    households' tenure it is refused since s43i: a count of persons in cells of household
    columns, :mod:`sqlsdc.planner.coarser_units`.)"""
    sql = (
        "SELECT p.region, AVG(p.income), SUM(p.income), COUNT(p.income) FROM persons p "
        "JOIN households h ON p.household_id = h.household_id GROUP BY p.region ORDER BY 1"
    )
    truth = {t: a for t, a, *_ in raw_ckm.execute(sql).fetchall()}
    for tenure, mean, total, count in ckm.execute(sql).fetchall():
        assert mean == pytest.approx(truth[tenure], rel=0.02)
        assert mean * count == pytest.approx(total, rel=1e-9)
