"""A confidential table joined with public tables on their keys keeps its rows, one per unit
(s41g): the protected SQL counts rows, ``COUNT(*)``, as on the table alone, instead of
``COUNT(DISTINCT unit)`` (the count's frequency rule under the threshold rule, a sum's
contributors under both), and releases the same cells as the query without the join.
CPU before and after: ``benchmarks/README.md`` (bench_public_join.py)."""

from __future__ import annotations

import pytest

import sqlsdc

JOINED = (
    "SELECT r.region, COUNT(*) AS n, SUM(p.income) AS s, AVG(p.age) AS a FROM persons p "
    "{} regions r ON p.region = r.region WHERE p.age >= 60 GROUP BY r.region ORDER BY 1"
)
ALONE = (
    "SELECT region, COUNT(*) AS n, SUM(income) AS s, AVG(age) AS a FROM persons "
    "WHERE age >= 60 GROUP BY region ORDER BY 1"
)


@pytest.mark.parametrize("join", ["JOIN", "LEFT JOIN"])
@pytest.mark.parametrize("database", ["analyst", "ckm"])
def test_a_join_with_a_public_table_counts_rows_and_releases_the_same_cells(
    request, database, join
):
    con = request.getfixturevalue(database)
    joined = con.execute(JOINED.format(join))
    cells, status = joined.fetchall(), joined.cell_status()
    alone = con.execute(ALONE)
    assert cells == alone.fetchall()
    assert status.equals(alone.cell_status())
    assert len(cells) > 0
    assert "DISTINCT" not in con.explain(JOINED.format(join)).sql


def test_a_chain_of_public_tables_and_a_derived_table_keep_the_rows_too(analyst):
    sql = (
        "SELECT r.name, COUNT(*) AS n, SUM(p.income) AS s FROM persons p "
        "JOIN regions r ON p.region = r.region "
        "JOIN (SELECT region FROM regions GROUP BY region) q ON q.region = r.region "
        "GROUP BY r.name"
    )
    assert "DISTINCT" not in analyst.explain(sql).sql
    assert len(analyst.execute(sql).fetchall()) > 0


@pytest.mark.parametrize(
    ("sql", "match"),
    [  # the shortcut rests on the multiplicity proof: a join that could repeat or add rows
        ("SELECT r.name, COUNT(*) FROM persons p JOIN regions r ON p.region <> r.region "
         "GROUP BY r.name", "regions"),
        ("SELECT r.name, COUNT(*) FROM regions r LEFT JOIN persons p ON p.region = r.region "
         "GROUP BY r.name", "LEFT JOIN that preserves a public table"),
        ("SELECT r.name, COUNT(*) FROM persons p RIGHT JOIN regions r ON p.region = r.region "
         "GROUP BY r.name", "RIGHT JOIN of confidential rows"),
        ("SELECT a.name, COUNT(*) FROM persons p JOIN regions a ON p.region = a.region "
         "JOIN regions b ON a.population = b.population GROUP BY a.name", "regions"),
    ],
)  # fmt: skip
def test_joins_that_could_repeat_or_add_rows_stay_refused(analyst, sql, match):
    with pytest.raises(sqlsdc.PolicyViolation, match=match):
        analyst.execute(sql)


def test_two_confidential_tables_still_count_distinct_units(analyst):
    sql = (
        "SELECT h.tenure, COUNT(DISTINCT h.household_id) AS households, COUNT(*) AS persons "
        "FROM persons p JOIN households h ON p.household_id = h.household_id GROUP BY h.tenure"
    )
    assert "COUNT(DISTINCT" in analyst.explain(sql).sql


@pytest.mark.parametrize("database", ["analyst", "ckm"])
def test_distinct_counts_over_the_join_are_those_of_the_table_alone(request, database):
    """Units, references and dimensions counted over the join are keyed as on the table."""
    con = request.getfixturevalue(database)
    counts = ("COUNT(DISTINCT {p}person_id) AS n, COUNT(DISTINCT {p}household_id) AS h, "
              "COUNT(DISTINCT {p}municipality) AS m")  # fmt: skip
    joined = (
        f"SELECT r.region, {counts.format(p='p.')} FROM persons p "
        "JOIN regions r ON p.region = r.region GROUP BY r.region ORDER BY 1"
    )
    alone = f"SELECT region, {counts.format(p='')} FROM persons GROUP BY region ORDER BY 1"
    answered = con.execute(joined).fetchall()
    assert answered == con.execute(alone).fetchall()
    assert len(answered) > 0
