"""s46a: red team on noised class breaks (s45m), the query path, as the analyst, on the
20,000-person demo (persons' income and weight, enterprises' turnover and employees carry unit
noise, a 1.05, b 1.15).

Found (fixed here): **a parenthesized table compared the stored x.** ``FROM (persons) WHERE
income >= 20000`` (also ``FROM (persons AS p)``, ``FROM (enterprises)``, a CTE or derived table
whose own FROM is parenthesized) is the table persons to the planner and the engine, but the
conversion of :mod:`sqlsdc.rewrite.noised_conditions` found no table among the select's sources
(sqlglot parses it as a ``Subquery`` whose body is a table, not a query) and left the
condition on x while the sums add x·m: s45l's finding again. Scored with y = x·m exact (the
limit of s44j's padded averages, 3 statements per target) and the class of x at the breaks
(``FROM (persons)``, one statement per break): the branch of m is told for 2,454 of the 15,118
incomes of 20,000 or more (16 %), the centred estimate within 2.5 % of x on average, 1,034
within 2 %, where the method promises no closer than 5 %.
On the demo ``COUNT(*) FROM (persons) WHERE income >= 100000`` kept the 2,725 persons of
x ≥ 100,000 (published 2,727) where ``FROM persons`` keeps the 2,710 of x·m ≥ 100,000
(published 2,712); the two classes differ for 441 persons at 100,000 and 440 at 20,000 (one
build; the record keys are random per build); 1 statement per class. ``WITH t AS (SELECT *
FROM (persons)) ... WHERE income >= b`` compared x too (the star through the parentheses was
not followed): now refused as every condition through a derived table's output is. A
parenthesized table is now the table itself, named by its outermost alias.

Held (the tests below, the rewritten SQL read, or one line each):
- about 340 statements tried, the rewritten SQL of every answered one read for a comparison
  left on the stored value (none but the parenthesized table), and the row-level sets of the
  spellings of one class (15 kept below) equal to the Python reference's x·m class:
  NOT, <, >, =, <>, IS [NOT] DISTINCT FROM, BETWEEN (the measure as low or high bound), IN
  with 0, IS TRUE, a CASE WHEN in WHERE, IF/NULLIF/CASE in COUNT and SUM, ROLLUP, GROUPING
  SETS, HAVING on the protected count, quoted and upper-case names, parameters (``?``, ``$1``,
  ``= ANY(?)``), a CTE read by two UNION ALL branches, CTE chains, joins to households
  (ON and WHERE, COUNT(DISTINCT household_id)), per-household counts by tenure;
- ``income >= b``, ``income < b`` and ``income IS NULL`` partition the persons at 0, 20,000,
  50,000, 100,000 and 1,000,000 (no unit counted twice or lost);
- refused: GROUP BY a band of the measure (CASE, comparison, through a derived table's
  output), QUALIFY, ORDER BY/LIMIT over rows, windows, IN/EXISTS subqueries, EXCEPT/INTERSECT/
  UNION of rows, SEMI/ANTI/ASOF/POSITIONAL/LATERAL, COALESCE/NULLIF/GREATEST/ABS/SIGN/CAST/
  unary minus in a condition, a comparison with another measure or with a cast or string or
  subquery, ``(income >= b) = TRUE``, XOR, ``USING (income)``/NATURAL JOIN with a derived
  table, TRY_CAST/CAST to a narrow type in a SUM (error oracle), 1/(x − b), FILTER, COUNT(
  DISTINCT income), a qualified ``main.persons``, a join of persons to benefits (DP);
- comparisons through a derived table's or CTE's output: refused (s45m), with or without
  parentheses around the table they read; column lists renaming a derived table's outputs
  (``t(age, i)`` over ``SELECT income, age``) are followed (refused);
- Spark (``run_protected``) gives the DuckDB cells for the parenthesized table, ``((persons))``
  in a CASE, ``(enterprises)``, a CTE's WHERE, ``IN (0, 20000)``, ``IS NOT DISTINCT FROM 0``
  and a ROLLUP of ``NOT (income < b)`` (8 statements);
- the server (psycopg, 9 statements: ``(persons)``, ``(public.persons)``, a bound ``%s``,
  ``= ANY(%s)`` and ``ANY(ARRAY[...])``, ``IS TRUE``) answers the x·m class as the
  connection does; ``100000::numeric`` and ``FROM ONLY`` are refused;
- the secret mix, the ledger, table functions and qualified names stay refused in
  parentheses (``FROM (sqlsdc.ckm_mix)``); DP on ``(benefits)`` is charged as on ``benefits``.
"""

from __future__ import annotations

import pytest
import sqlglot

import sqlsdc
from sqlsdc.demo.build import demo_policy
from sqlsdc.errors import PolicyViolation
from sqlsdc.mechanisms.ckm import MixKeys
from sqlsdc.mechanisms.unit_noise import unit_factor
from sqlsdc.policy import AggregateKind
from sqlsdc.rewrite.noised_conditions import noise_conditions, policy_lookup
from tests.security.test_redteam_s45m import (
    _kept,
    _noised,
    threshold_counts_db,  # noqa: F401 - the fixture
)

PARENTHESIZED = [  # (the analyst's SQL, the class as a test of a value; None: women only)
    ("SELECT COUNT(*) FROM (persons) WHERE income >= 20000", lambda v: v >= 20000),
    (
        "SELECT COUNT(*) FROM (persons AS p) WHERE p.income BETWEEN 20000 AND 50000",
        lambda v: 20000 <= v <= 50000,
    ),
    (
        "SELECT SUM(CASE WHEN income < 10000 THEN income END) FROM ((persons))",
        lambda v: v < 10000,
    ),
    (
        "SELECT COUNT(*) FROM (persons AS p) JOIN households h "
        "ON p.household_id = h.household_id AND p.income >= 50000",
        lambda v: v >= 50000,
    ),
    (
        "WITH t AS (SELECT sex FROM (persons) WHERE income >= 100000) "
        "SELECT COUNT(*) FROM t WHERE sex = 'F'",
        None,
    ),
    (
        "SELECT COUNT(*) FROM (SELECT sex FROM (persons) WHERE income >= 100000) t WHERE sex = 'F'",
        None,
    ),
]


def _expected(raw_ckm, values, within):
    """(the x·m class, the x class) of ``within``; None: women with income >= 100,000."""
    if within is not None:
        return (
            {k for k, (_, y) in values.items() if within(y)},
            {k for k, (x, _) in values.items() if within(x)},
        )
    women = {k for (k,) in raw_ckm.execute("SELECT __rkey FROM persons WHERE sex = 'F'").fetchall()}
    return (
        {k for k, (_, y) in values.items() if y >= 100000} & women,
        {k for k, (x, _) in values.items() if x >= 100000} & women,
    )


@pytest.mark.parametrize("sql, within", PARENTHESIZED, ids=range(len(PARENTHESIZED)))
def test_a_parenthesized_table_compares_the_noised_value(ckm, raw_ckm, sql, within):
    """A table in parentheses is the table: its conditions keep the persons whose x·m is in
    the class (main: those whose x is, 15 more persons of 100,000 or more)."""
    by_y, by_x = _expected(raw_ckm, _noised(raw_ckm), within)
    assert by_y != by_x  # the classes differ: the test tells x·m from x
    assert _kept(ckm, raw_ckm, sql) == by_y


def test_a_parenthesized_enterprises_count_is_of_the_noised_employees(ckm, raw_ckm):
    """The published count of ``(enterprises)`` by an employees class is the protected count
    of the units whose x·m passes it, the same answer as without the parentheses."""
    noise = demo_policy().table("enterprises").rule(AggregateKind.MAGNITUDES).magnitude.unit_noise
    keys = MixKeys(*raw_ckm.execute("SELECT * FROM sqlsdc.ckm_mix").fetchall()[0])
    rows = raw_ckm.execute("SELECT __rkey, employees FROM enterprises").fetchall()
    by_y = {
        k
        for k, x in rows
        if x is not None and x * unit_factor(k, "enterprises.employees", noise, keys) >= 10
    }
    by_x = {k for k, x in rows if x is not None and x >= 10}
    assert by_x != by_y
    sql = "SELECT COUNT(*) FROM (enterprises) WHERE employees >= 10"
    assert _kept(ckm, raw_ckm, sql) == by_y
    plain = "SELECT COUNT(*) FROM enterprises WHERE employees >= 10"
    assert ckm.execute(sql).fetchall() == ckm.execute(plain).fetchall()


@pytest.mark.parametrize(
    "sql",
    [
        "WITH t AS (SELECT * FROM (persons)) SELECT COUNT(*) FROM t WHERE income >= 20000",
        "SELECT COUNT(*) FROM (SELECT * FROM (persons)) t WHERE income >= 20000",
        "SELECT COUNT(*) FROM (SELECT income AS i FROM (persons AS p)) t WHERE i >= 20000",
    ],
)
def test_a_condition_through_a_derived_table_of_a_parenthesized_table_is_refused(ckm, sql):
    """Compared outside the select that reads persons, through a star or alias over the
    parenthesized table: refused as without the parentheses (main answered the first two with
    the class of x)."""
    with pytest.raises(PolicyViolation, match="x·m"):
        ckm.execute(sql).fetchall()


def test_another_methods_condition_on_a_parenthesized_table_is_refused(
    threshold_counts_db,  # noqa: F811 - the fixture of test_redteam_s45m
):
    """Counts by threshold beside CKM magnitudes with unit noise: the probe of
    ``refuse_noised_conditions`` now finds the condition behind the parentheses and refuses it
    (main answered it with the class of the stored x)."""
    with sqlsdc.connect(threshold_counts_db, user="analyst") as con:
        with pytest.raises(PolicyViolation, match="x·m"):
            con.execute("SELECT COUNT(*) FROM (persons) WHERE income >= 20000").fetchall()


HELD = [
    "SELECT COUNT(*) FROM persons WHERE NOT (income < 100000)",
    "SELECT COUNT(*) FROM persons WHERE 100000 <= income",
    "SELECT COUNT(*) FROM persons WHERE 100000 BETWEEN 0 AND income",
    "SELECT COUNT(*) FROM persons WHERE (income >= 100000) IS TRUE",
    "SELECT COUNT(*) FROM persons WHERE CASE WHEN income >= 100000 THEN TRUE ELSE FALSE END",
    'SELECT COUNT(*) FROM "PERSONS" WHERE "INCOME" >= 100000',
    "SELECT COUNT(CASE WHEN income >= 100000 THEN 1 END) FROM persons",
    "SELECT COUNT(IF(income >= 100000, 1, NULL)) FROM persons",
    "SELECT COUNT(NULLIF(income >= 100000, FALSE)) FROM persons",
    "SELECT sex, COUNT(*) FROM persons WHERE income >= 100000 GROUP BY ROLLUP(sex)",
    "SELECT region, COUNT(*) FROM persons WHERE income >= 100000 GROUP BY region "
    "HAVING COUNT(*) > 100",
    "WITH t AS (SELECT * FROM persons WHERE income >= 100000) "
    "SELECT COUNT(*) FROM t UNION ALL SELECT COUNT(*) FROM t",
    "WITH a AS (SELECT * FROM persons WHERE income >= 100000), b AS (SELECT * FROM a) "
    "SELECT COUNT(*) FROM b",
    "SELECT COUNT(*) FROM persons p JOIN households h USING (household_id) WHERE income >= 100000",
    "SELECT COUNT(*) FROM persons p JOIN (SELECT person_id FROM persons "
    "WHERE income >= 100000) t ON t.person_id = p.person_id",
]


@pytest.mark.parametrize("sql", HELD, ids=range(len(HELD)))
def test_spellings_of_a_class_keep_the_noised_class(ckm, raw_ckm, sql):
    """Every spelling of ``income >= 100000`` the planner answers keeps the x·m class (each
    branch of a UNION ALL)."""
    by_y, by_x = _expected(raw_ckm, _noised(raw_ckm), lambda v: v >= 100000)
    assert by_y != by_x
    assert _kept(ckm, raw_ckm, sql) == by_y


@pytest.mark.parametrize("cut", [0, 20000, 100000])
def test_a_class_and_its_complement_partition_the_persons(ckm, raw_ckm, cut):
    """``income >= b``, ``income < b`` and ``income IS NULL`` keep disjoint sets whose union is
    every person: no unit is counted twice or lost at the boundary."""
    high = _kept(ckm, raw_ckm, f"SELECT COUNT(*) FROM persons WHERE income >= {cut}")
    low = _kept(ckm, raw_ckm, f"SELECT COUNT(*) FROM persons WHERE income < {cut}")
    null = _kept(ckm, raw_ckm, "SELECT COUNT(*) FROM persons WHERE income IS NULL")
    everyone = {k for (k,) in raw_ckm.execute("SELECT __rkey FROM persons").fetchall()}
    assert not high & low and not (high | low) & null
    assert high | low | null == everyone


def test_a_relation_the_conversion_cannot_follow_is_refused():
    """Defence in depth: a source neither a table nor a query (VALUES here; the planner
    refuses it before the rewrite) is refused by the conversion itself, where main returned
    'nothing to convert' and left whatever it compared on the stored value (as it did for a
    parenthesized table)."""
    sql = "SELECT COUNT(*) FROM (VALUES (5)) AS v(income) WHERE v.income >= 1"
    tree = sqlglot.parse_one(sql, read="duckdb")
    with pytest.raises(PolicyViolation, match="cannot trace column income"):
        noise_conditions(tree, policy_lookup(demo_policy()), lambda: sql)


def test_a_nested_join_the_conversion_cannot_follow_is_refused():
    """``(a JOIN b)`` is a table with joins inside to sqlglot (the planner refuses it before
    the rewrite): the conversion does not take it for the table a, whose columns alone it
    would trace, and refuses it."""
    sql = (
        "SELECT COUNT(*) FROM (regions r JOIN persons p ON p.region = r.region) "
        "WHERE p.income >= 100000"
    )
    tree = sqlglot.parse_one(sql, read="duckdb")
    with pytest.raises(PolicyViolation, match="cannot trace the columns"):
        noise_conditions(tree, policy_lookup(demo_policy()), lambda: sql)
