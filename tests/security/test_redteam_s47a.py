"""s47a: red team on the CKM query path as changed in sessions 45-46 (unit noise s45a/s45l,
conditions compared on x·m s45m, the resolver's memo s46h, parenthesized tables s46a), as the
analyst, on the 20,000-person demo.

Found (fixed here): **a large constant added inside SUM failed in the engine.** The normal form
(:mod:`sqlsdc.planner.normal_form`) writes ``SUM(x + b)`` as ``SUM(x) + b·COUNT(x)`` and
``SUM(b)`` as ``b·COUNT(*)``, with ``b`` an exact fraction printed as an integer literal when it
is one: ``SUM(income + 1e18)`` (a DOUBLE sum for DuckDB, 1e18 is a DOUBLE literal) became
``1000000000000000000 * COUNT(income)``, a BIGINT product, and R01's protected count of 1,510
overflowed it ("Overflow in multiplication of INT64"): 4 of 4 such statements failed on CKM
(SUM(1e18), SUM(income + 1e17), SUM(income + 1e18), SUM(age + 1e18)), and on DP
(``SUM(amount + 1e18) FROM benefits``) each was charged ε 0.4 and never answered. The error is a
function of the protected count only (which ``COUNT(income)`` publishes), so it is no oracle on
a confidential value (as s29b noted for ``SUM(9223372036854775807)``), but a valid statement
failed and a DP user paid for nothing. An integer offset of 2³¹ or more now multiplies the
count as a DOUBLE (exponent notation: ``2147483648.0`` would be a DECIMAL for DuckDB).

Observed, not a leak (fixed by the lead): the DONE mark of a CTE's converted body was seen by
another context. With counts by threshold beside CKM magnitudes (s45m's fixture), ``WITH t AS
(... WHERE income >= 20000) SELECT region, SUM(weight) ... UNION ALL SELECT region, COUNT(*)
...`` was answered, while the same branches in the other order, or ``SELECT COUNT(*) FROM t``
alone, were refused: the CKM frame converted t's body in place first, and the threshold frame's
probe skipped a body marked done. The count was that of the x·m class (the body the engine
runs), as ``SELECT SUM(income), COUNT(*) FROM persons WHERE income >= 20000`` already publishes
on that policy, so nothing of x was told; the refusal merely depended on the order of the
branches. A body marked done now says whether it was converted: refused in every order.

Held (no comparison left on the stored x in the rewritten SQL, or refused; about 230 statements):
- the resolver's memo (s46h): a CTE read twice, once under a condition and once not (scalar
  subquery beside the main aggregation, UNION ALL of two aggregations, a self-join of the CTE on
  person_id, the CTE joined back to persons with a condition on persons' own income), CTE
  chains, a CTE of ``e.*`` and a renamed measure; every comparison in the output is on x·m; a
  condition through a CTE's output is refused, a CTE that shadows a table name is refused;
- spellings of one class (``>=``, ``20000 <=``, ``NOT BETWEEN``, ``NOT (... BETWEEN ...)``,
  ``BETWEEN SYMMETRIC``, ``IN``, ``NOT IN``, ``= ANY([..])``, ``IS NOT DISTINCT FROM``, ``2e4``,
  ``+20000``, ``(20000)``, upper-case and quoted names): the same x·m class; ``20000::DOUBLE``,
  ``20000 - 0``, ``>= ALL (SELECT ..)``, row values ``(income, age) >= (..)``, a table's column
  list ``persons AS p(a1, ...)`` refused;
- correlated subqueries reading the outer measure unqualified through a public table (IN,
  EXISTS, scalar, inside a CASE): refused before the conversion could miss them;
- HAVING and ORDER BY ... LIMIT on SUM/AVG compare the published cells (a suppressed AVG sorts
  last, NULL); GROUP BY ALL, ROLLUP, CUBE, GROUPING SETS with conditions on x·m;
  FILTER, COUNT(DISTINCT income), SUM/AVG(DISTINCT), approx_count_distinct, MEDIAN,
  quantile_cont, string_agg refused;
- per-household counts (households ⋈ persons, COUNT(CASE WHEN p.income >= b ..)), conditions on
  weight inside SUM(income), ``SUM(income * weight) WHERE weight >= b``: converted with each
  column's own factor; persons ⋈ enterprises has no declared key (refused);
- error oracles: exact integer arithmetic that can overflow (``employees * 21474``, ``+
  2147383647``) refused by type, whatever the bounds; ``SUM(income * 1e20)`` (DOUBLE) answers;
- CKM keys: nine spellings of one population for SUM(income) (CASE inside the sum, ``NOT age <
  18``, ``BETWEEN 18 AND 200``, ``AND income IS NOT NULL``, ``AND income > 0``, ``AVG * COUNT``,
  ``SUM(income * 1) + SUM(0 * income)``) give the one published value: no second draw;
- nested aggregations (a CTE or derived table of CKM cells read by an outer COUNT/SUM/HAVING/
  ORDER BY/self-join) read the published cells only (inner cells under the minimum frequency
  are left out); CTE chains of 12+ self-joins are refused by size before any CPU is spent;
- a sum through a derived table, a CTE, a rename (``income AS weight``), a parenthesized table,
  or households ⋈ persons carries persons.income's salt and the person's record key.

Usability, not leaks (fail closed, reported): ``FROM (persons) q WHERE q.income >= b`` (alias
outside the parentheses) and ``SUM(CASE WHEN income >= b THEN income + 5 END)`` are refused.
"""

from __future__ import annotations

import shutil

import pytest
import sqlglot
from sqlglot import exp

import sqlsdc
from tests.security.test_redteam_s45m import (
    threshold_counts_db,  # noqa: F401 - the fixture
)

MEASURES = {"income", "weight", "turnover", "employees"}
COMPARED = (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.NullSafeEQ,
            exp.NullSafeNEQ, exp.Between, exp.In)  # fmt: skip


def _stored_comparisons(sql: str) -> list[str]:
    """The comparisons of the rewritten ``sql`` that read a measure not multiplied by its
    unit's factor (the factor's SQL holds SQRT: :func:`sqlsdc.rewrite.unit_noise.noised`)."""
    found = []
    for column in sqlglot.parse_one(sql, read="duckdb").find_all(exp.Column):
        if column.name.lower() not in MEASURES:
            continue
        node, noised = column, False
        while node.parent is not None and not isinstance(node.parent, (exp.Select, exp.AggFunc)):
            parent = node.parent
            noised = noised or (isinstance(parent, exp.Mul) and "SQRT" in parent.sql().upper())
            if isinstance(parent, COMPARED):
                if not noised:
                    found.append(parent.sql("duckdb"))
                break
            node = parent
    return found


def _cell(con, sql: str) -> float:
    rows = con.execute(sql).fetchall()
    assert len(rows) == 1, rows
    return rows[0][0]


def test_a_large_constant_in_a_sum_is_answered(ckm):
    """``SUM(income + 1e18)`` is ``SUM(income) + 1e18·COUNT(income)`` of the published cells;
    main: the engine's INT64 product of the literal and the protected count overflowed."""
    where = "FROM persons WHERE region = 'R01'"
    total = _cell(ckm, f"SELECT SUM(income) {where}")
    count = _cell(ckm, f"SELECT COUNT(income) {where}")
    assert count > 10
    assert _cell(ckm, f"SELECT SUM(income + 1e18) {where}") == pytest.approx(
        total + 1e18 * count, rel=1e-12
    )
    rows = _cell(ckm, f"SELECT COUNT(*) {where}")
    assert _cell(ckm, f"SELECT SUM(1e18) {where}") == pytest.approx(1e18 * rows, rel=1e-12)
    assert _cell(ckm, f"SELECT SUM(income - 1e37) {where}") == pytest.approx(
        total - 1e37 * count, rel=1e-12
    )
    big = _cell(ckm, f"SELECT SUM(9223372036854775807) {where}")  # s29b: failed too
    assert big == pytest.approx(9223372036854775807 * rows, rel=1e-12)
    wide = _cell(ckm, f"SELECT SUM(2147483648) {where}")  # a DOUBLE (not a DECIMAL)
    assert type(wide) is float and wide == 2147483648 * rows
    assert _cell(ckm, f"SELECT SUM(2147483647) {where}") == 2147483647 * rows  # still exact


def test_a_dp_sum_with_a_large_constant_is_answered_for_its_charge(ckm_db, tmp_path):
    """Under DP the statement was charged (ε 0.4) and then failed in the engine on main."""
    db = tmp_path / "demo.duckdb"
    shutil.copy(ckm_db, db)
    with sqlsdc.connect(db, user="analyst") as con:
        value = _cell(con, "SELECT SUM(amount + 1e18) FROM benefits WHERE region = 'R04'")
    assert value > 1e19  # 1e18 times a DP count of R04's rows (hundreds), plus the sum


HELD = [
    # the resolver's memo: one CTE read under a condition and without one
    "WITH t AS (SELECT income, sex FROM persons WHERE income >= 20000) "
    "SELECT (SELECT COUNT(*) FROM t) AS a, COUNT(*) AS b FROM t WHERE sex = 'F'",
    "WITH t AS (SELECT income, sex FROM persons) "
    "SELECT (SELECT SUM(income) FROM t) AS a, SUM(CASE WHEN sex = 'F' THEN income END) AS b "
    "FROM t",
    "WITH t AS (SELECT person_id, sex FROM persons WHERE income >= 20000) "
    "SELECT COUNT(*) FROM t a JOIN t b ON a.person_id = b.person_id",
    "WITH t AS (SELECT * FROM persons WHERE income >= 20000) "
    "SELECT COUNT(*) FROM persons p JOIN t ON p.person_id = t.person_id WHERE p.income >= 50000",
    "WITH t AS (SELECT sex FROM persons WHERE income >= 20000) "
    "SELECT COUNT(*) FROM t UNION ALL SELECT COUNT(*) FROM persons WHERE income >= 20000",
    "WITH t AS (SELECT e.*, e.turnover AS tt FROM enterprises e WHERE employees >= 10) "
    "SELECT SUM(tt) FROM t",
    # spellings, groupings, joins
    "SELECT COUNT(*) FROM persons WHERE income BETWEEN SYMMETRIC 50000 AND 20000",
    "SELECT COUNT(*) FROM persons WHERE income = ANY([0, 20000])",
    "SELECT region, SUM(income), COUNT(*) FROM persons WHERE income BETWEEN 0 AND 20000 "
    "GROUP BY GROUPING SETS ((region), ())",
    "SELECT h.tenure, COUNT(CASE WHEN p.income >= 100000 THEN 1 END) FROM households h "
    "JOIN persons p ON p.household_id = h.household_id GROUP BY h.tenure",
    "SELECT SUM(income * weight) FROM persons WHERE weight >= 100",
    "SELECT COUNT(*) FROM persons p1 JOIN persons p2 ON p1.person_id = p2.person_id "
    "WHERE p2.income >= 100000",
]


@pytest.mark.parametrize("sql", HELD)
def test_answered_shapes_compare_the_noised_value(ckm, sql):
    assert ckm.execute(sql).fetchall()
    assert _stored_comparisons(ckm.explain(sql).sql) == []


def test_the_checker_sees_a_comparison_on_the_stored_value():
    assert _stored_comparisons("SELECT COUNT(*) FROM persons p WHERE p.income >= 20000") == [
        "p.income >= 20000"
    ]


@pytest.mark.parametrize("order", ["sum first", "count first", "count alone"])
def test_another_methods_count_of_a_cte_is_refused_whatever_read_it_first(
    threshold_counts_db,  # noqa: F811 - the fixture of test_redteam_s45m
    order,
):
    """The memo's other context: a CTE whose WHERE compares income, read by a CKM sum and by a
    count by threshold (counts by threshold beside CKM magnitudes with unit noise). The CKM
    frame converted the CTE's body in place and marked it done, and the threshold frame's
    probe skipped a body marked done: the count was answered after the sum (the class of x·m,
    so nothing of x told) and refused before it or alone. A body marked done now tells the
    probe whether it was converted: refused in every order."""
    with_t = "WITH t AS (SELECT * FROM persons WHERE income >= 20000) "
    total = "SELECT region, SUM(weight) AS v, 's' AS k FROM t GROUP BY region"
    count = "SELECT region, COUNT(*) AS v, 'n' AS k FROM t GROUP BY region"
    sql = (
        with_t
        + {
            "sum first": f"{total} UNION ALL {count}",
            "count first": f"{count} UNION ALL {total}",
            "count alone": count,
        }[order]
    )
    with sqlsdc.connect(threshold_counts_db, user="analyst") as con:
        with pytest.raises(sqlsdc.PolicyViolation, match="permanent noise factor"):
            con.execute(sql)
