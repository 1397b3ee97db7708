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
"""

from __future__ import annotations

import duckdb

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
