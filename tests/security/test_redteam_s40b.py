"""Red team s40b: the threshold and suppression policies' primary rules, attacked with an
analyst's guarded connection on the 20,000-person demo: the dominance rule of session 39
(``rewrite/dominance.py``), the frequency rule on non-zero contributors, and the suppression
universe of the query path.

What broke (fixed here):

- **A repeated grouping set switched the p%-rule off for units with several rows.** Where a
  unit has several rows (benefits: a person's monthly payments), the rule reads each unit's
  total per cell from a second aggregation, ``GROUP BY unit, <the query's GROUP BY>``, joined
  to the query's cells on their keys and ``GROUPING()``. ``GROUPING SETS ((k), (k))`` or ``k,
  ROLLUP (k)`` repeat a grouping set: DuckDB returns a row per copy, so each unit's total came
  once per copy, added to T that many times and was its own second largest contribution. Two
  copies halved the rule (published when x2 + rest ≥ 5 % of x1), three switched it off
  (T − x1 − x2 = 3·T − 2·x1 ≥ x1). On the demo, one person's benefits (pinned by municipality,
  age and sex through persons) padded with the ten payments under 200 of one region, month and
  sex: the 11 recipients whose padded cell the p%-rule hid were published, each less the
  padding's own published sum their yearly total to the cent (error < 1e-11), at no cost. Each
  unit's totals are now taken once per cell (``dominance._once``).

Left open (strict xfail):

- **The suppression universe's frequency rule counts zero values as contributors.** Session 39
  made the frequency rule of a threshold, rounded or CKM magnitude count its non-zero
  contributors (GaussSuppression's ``NContributorsRule``, ``remove0 = TRUE``); the query path's
  suppression universe (``tabular.universe.inner_cells_sql``: ``COUNT(x)`` of the units'
  totals) still counts a unit of income 0. On the suppression demo (persons, geography x sex,
  ``p:10, freq:5``) two cells of fewer than five incomes are published: R01-M011 men, three
  incomes and two zeros, published 49,646.79 (its two largest earners know the third,
  7,972.95, exactly; the p%-rule passes, 7,972.95 >= 10 % of 22,863.51), and R08-M024 men,
  four and two zeros. No padding is needed (the cell is as the policy tabulates it). The same
  ``n`` is the divisor of the universe's AVG (units with a value) and a cell of zeros only
  would be published as 0 if it merely counted non-zero values, so the fix needs a count of
  its own for the rule (and a zero-only cell suppressed), not a change of ``n``.
"""

from __future__ import annotations

import shutil

import duckdb
import pytest

import sqlsdc

FROM = "FROM benefits b JOIN persons p ON b.person_id = p.person_id"
# ten persons' payments under 200 in one region and month, per sex (the demo: 1,569.12 and
# 1,536.14): a known total published by the threshold rule on its own
PADDING = {
    "M": "b.amount < 200 AND b.region = 'R03' AND b.month = 9 AND p.sex = 'M'",
    "F": "b.amount < 200 AND b.region = 'R06' AND b.month = 8 AND p.sex = 'F'",
}


def _dominated_targets(db) -> list[tuple[str, tuple, float]]:
    """Benefit recipients alone in their municipality x age x sex, whose yearly total the
    p%-rule hides beside the padding of their sex: (pin, its keys, total)."""
    raw = duckdb.connect(str(db), read_only=True)
    try:
        pads = {
            sex: [x for (x,) in raw.execute(
                f"SELECT SUM(b.amount) {FROM} WHERE {where} GROUP BY b.person_id"
            ).fetchall()]
            for sex, where in PADDING.items()
        }  # fmt: skip
        rows = raw.execute(
            "WITH alone AS (SELECT municipality, age, sex FROM persons GROUP BY ALL "
            f"HAVING COUNT(*) = 1) SELECT p.municipality, p.age, p.sex, SUM(b.amount) {FROM} "
            "JOIN alone a ON (a.municipality, a.age, a.sex) = (p.municipality, p.age, p.sex) "
            "GROUP BY ALL"
        ).fetchall()
    finally:
        raw.close()
    targets = []
    for municipality, age, sex, total in rows:
        x = sorted([total, *pads[sex]], reverse=True)
        if sum(x) - x[0] - x[1] < 0.1 * x[0]:  # the p%-rule (p = 10) fires
            pin = f"p.municipality = '{municipality}' AND p.age = {age} AND p.sex = '{sex}'"
            targets.append((pin, sex, total))
    return targets


def test_a_repeated_grouping_set_keeps_the_p_percent_rule(demo_db):
    """Three copies of one grouping set made T three times a unit's total and x1 = x2: the
    rule never fired. The padded cell is now hidden in every copy, as it is alone."""
    targets = _dominated_targets(demo_db)
    assert len(targets) >= 8
    told = []
    with sqlsdc.connect(demo_db, user="analyst") as con:
        padding = {
            sex: con.execute(f"SELECT SUM(b.amount) {FROM} WHERE {where}").fetchone()[0]
            for sex, where in PADDING.items()
        }
        assert None not in padding.values()
        for pin, sex, total in targets:
            cell = f"({pin}) OR ({PADDING[sex]})"
            (alone,) = con.execute(f"SELECT SUM(b.amount) {FROM} WHERE {cell}").fetchone()
            assert alone is None
            for group in ("GROUPING SETS ((p.sex), (p.sex), (p.sex))", "p.sex, ROLLUP (p.sex)"):
                rows = con.execute(
                    f"SELECT p.sex, SUM(b.amount) {FROM} WHERE {cell} GROUP BY {group}"
                ).fetchall()
                for _sex, shown in rows:
                    if shown is not None and abs(shown - padding[sex] - total) < 0.01:
                        told.append((pin, group, total))
    assert not told, told


@pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="open: the suppression universe's frequency rule counts units of value 0 "
    "(COUNT(x) of the units' totals, tabular.universe.inner_cells_sql), where threshold, "
    "round and CKM count non-zero contributors: R01-M011 men (3 incomes, 2 zeros) and "
    "R08-M024 men (4 incomes, 2 zeros) are published under freq:5; the fix needs a count of "
    "its own for the rule (the universe's n is also AVG's divisor) and zero-only cells hidden",
)
def test_the_suppression_universe_counts_non_zero_contributors(suppress_template, tmp_path):
    db = tmp_path / "demo.duckdb"
    shutil.copy(suppress_template, db)
    raw = duckdb.connect(str(db), read_only=True)
    try:
        few = dict(
            ((m, s), n)
            for m, s, n in raw.execute(
                "SELECT municipality, sex, COUNT(NULLIF(income, 0)) AS n FROM persons "
                "GROUP BY ALL HAVING n BETWEEN 1 AND 4"
            ).fetchall()
        )
    finally:
        raw.close()
    assert len(few) >= 20
    with sqlsdc.connect(db, user="analyst") as con:
        rows = con.execute(
            "SELECT municipality, sex, SUM(income) FROM persons GROUP BY municipality, sex"
        ).fetchall()
    shown = [(m, s, few[m, s], v) for m, s, v in rows if (m, s) in few and v is not None]
    assert not shown, shown
