"""Row multiplication: joins that could repeat a confidential row are refused.

CKM noise depends on which units are in a cell, not on how many rows each contributes, so a
join that repeats every row k times turns ``round(count / k)`` into the exact count. Every
phrasing of a repeating join must be refused; joins that add attributes on a unique key must
keep working and give the same cells as the query without the join.
"""

from __future__ import annotations

import duckdb
import pytest

import sqlsdc


@pytest.fixture
def analyst(module_analyst):
    """One connection for the module (conftest's ``module_analyst``): the tests that take
    ``analyst`` only read and are refused."""
    return module_analyst


REPEATING = {
    "join on true": "SELECT p.region, COUNT(*) FROM persons p JOIN regions r ON TRUE "
    "GROUP BY p.region",
    "two joins on true": "SELECT p.region, COUNT(*) FROM persons p JOIN regions r1 ON TRUE "
    "JOIN regions r2 ON 1 = 1 GROUP BY p.region",
    "comma join": "SELECT p.region, COUNT(*) FROM persons p, regions r GROUP BY p.region",
    "cross join": "SELECT p.region, COUNT(*) FROM persons p CROSS JOIN regions r GROUP BY 1",
    "inequality": "SELECT p.region, COUNT(*) FROM persons p JOIN regions r "
    "ON p.region <> r.region GROUP BY p.region",
    "non-key column": "SELECT p.region, COUNT(*) FROM persons p JOIN regions r "
    "ON r.population > 0 GROUP BY p.region",
    "key OR true": "SELECT p.region, COUNT(*) FROM persons p JOIN regions r "
    "ON p.region = r.region OR TRUE GROUP BY p.region",
    "self join on household": "SELECT p.region, COUNT(*) FROM persons p JOIN persons q "
    "ON p.household_id = q.household_id GROUP BY p.region",
    "self join in a derived table": "SELECT region, COUNT(*) FROM (SELECT p.region FROM "
    "persons p JOIN persons q ON p.household_id = q.household_id) AS x GROUP BY region",
    "self join in a CTE": "WITH x AS (SELECT p.region, p.income FROM persons p JOIN persons q "
    "ON p.household_id = q.household_id) SELECT region, AVG(income) FROM x GROUP BY region",
    "households onto persons the wrong way": "SELECT h.tenure, COUNT(*) FROM households h "
    "JOIN persons p ON p.household_id = h.household_id JOIN persons q "
    "ON q.household_id = h.household_id GROUP BY h.tenure",
    "right join": "SELECT r.name, COUNT(*) FROM persons p RIGHT JOIN regions r "
    "ON p.region = r.region GROUP BY r.name",
    "full join": "SELECT r.name, COUNT(*) FROM persons p FULL JOIN regions r "
    "ON p.region = r.region GROUP BY r.name",
    "left join preserving the public table": "SELECT r.name, COUNT(*) FROM regions r "
    "LEFT JOIN persons p ON p.region = r.region GROUP BY r.name",
    "join to a derived table with repeated keys": "SELECT p.region, COUNT(*) FROM persons p "
    "JOIN (SELECT region FROM regions UNION ALL SELECT region FROM regions) x "
    "ON p.region = x.region GROUP BY p.region",
    "join to a rollup of protected cells": "SELECT p.region, COUNT(*) FROM persons p JOIN "
    "(SELECT region, COUNT(*) n FROM persons GROUP BY ROLLUP (region, sex)) x "
    "ON p.region = x.region GROUP BY p.region",
    "DP table repeated": "SELECT b.region, COUNT(*) FROM benefits b JOIN regions r ON TRUE "
    "GROUP BY b.region",
}


@pytest.mark.parametrize("sql", REPEATING.values(), ids=REPEATING.keys())
def test_joins_that_can_repeat_rows_are_refused(analyst, sql):
    with pytest.raises(sqlsdc.PolicyViolation, match="JOIN|repeat rows|adds rows"):
        analyst.execute(sql)


REPEATED_MEASURES = [
    # a household's size once per member
    "SELECT p.region, SUM(h.size) FROM persons p JOIN households h "
    "ON p.household_id = h.household_id GROUP BY p.region",
    "SELECT h.tenure, AVG(h.size) FROM households h JOIN persons p "
    "ON p.household_id = h.household_id GROUP BY h.tenure",
    "SELECT tenure, SUM(size) FROM (SELECT h.tenure, h.size FROM persons p JOIN households h "
    "ON p.household_id = h.household_id) x GROUP BY tenure",
]


@pytest.mark.parametrize("sql", REPEATED_MEASURES)
def test_measures_of_repeated_rows_cannot_be_summed(analyst, sql):
    with pytest.raises(sqlsdc.PolicyViolation, match="repeat once per matching row"):
        analyst.execute(sql)


def _cells(rows) -> dict:
    return {r[0]: r[1:] for r in rows}


def test_joins_on_unique_keys_keep_working_and_do_not_change_cells(demo_db, analyst):
    """Adding a public table's attributes on its key leaves every cell as it was."""
    alone = _cells(analyst.execute("SELECT region, COUNT(*), SUM(income) FROM persons GROUP BY 1"))
    joined = _cells(
        analyst.execute(
            "SELECT p.region, COUNT(*), SUM(p.income) FROM persons p "
            "JOIN regions r ON p.region = r.region GROUP BY p.region"
        )
    )
    assert joined == alone
    flipped = _cells(
        analyst.execute(
            "SELECT p.region, COUNT(*), SUM(p.income) FROM regions r "
            "JOIN persons p ON r.region = p.region GROUP BY p.region"
        )
    )
    assert flipped == alone
    left = _cells(
        analyst.execute(
            "SELECT p.region, COUNT(*), SUM(p.income) FROM persons p "
            "LEFT JOIN regions r ON r.region = p.region GROUP BY p.region"
        )
    )
    assert left == alone


@pytest.mark.parametrize(
    "sql",
    [
        # persons with their household's attributes
        "SELECT h.tenure, COUNT(*), AVG(p.income) FROM persons p JOIN households h "
        "ON p.household_id = h.household_id GROUP BY h.tenure",
        # households counted with their members
        "SELECT h.tenure, COUNT(DISTINCT h.household_id) FROM households h JOIN persons p "
        "ON p.household_id = h.household_id GROUP BY h.tenure",
        # an extra condition in ON
        "SELECT h.tenure, COUNT(*) FROM persons p JOIN households h "
        "ON p.household_id = h.household_id AND h.size > 2 GROUP BY h.tenure",
        # a public table's attributes on its key, in a derived table
        "SELECT name, COUNT(*) FROM (SELECT r.name FROM persons p JOIN regions r "
        "ON p.region = r.region) x GROUP BY name",
        # protected cells of another aggregation on its only group key
        "SELECT p.sex, COUNT(*) FROM persons p JOIN (SELECT region, COUNT(*) AS n FROM persons "
        "GROUP BY region) c ON p.region = c.region WHERE c.n > 100 GROUP BY p.sex",
        # a single-row aggregation needs no key
        "SELECT p.region, COUNT(*) FROM persons p JOIN (SELECT COUNT(*) AS n FROM regions) t "
        "ON TRUE GROUP BY p.region",
    ],
)
def test_joins_analysts_need_are_accepted(analyst, sql):
    assert analyst.execute(sql).fetchall()


def _people_and_towns(path, towns_sql: str, key: str | None) -> dict:
    """A database of 20 people in town 'a' and a public ``towns`` table; its policy."""
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE people AS SELECT range AS id, 'a' AS town FROM range(20)")
    con.execute(f"CREATE TABLE towns AS {towns_sql}")
    con.close()
    towns = {"kind": "public", "columns": {"town": {"role": "dimension"}, "n": {"role": "measure"}}}
    if key is not None:
        towns["key"] = key
    people = {"id": {"role": "identifier"}, "town": {"role": "dimension"}}
    return {
        "tables": {"people": {"privacy_unit": "id", "columns": people}, "towns": towns},
        "users": {"root": {"role": "admin"}, "ana": {"role": "analyst"}},
    }


JOIN_TOWNS = "SELECT t.n, COUNT(*) FROM people p JOIN towns t ON p.town = t.town GROUP BY t.n"


def test_a_public_key_must_be_unique_when_the_policy_is_applied(tmp_path):
    path = tmp_path / "dupes.duckdb"
    policy = _people_and_towns(path, "SELECT * FROM (VALUES ('a', 1), ('a', 2)) t(town, n)", "town")
    with pytest.raises(sqlsdc.PolicyError, match="tables.towns.key: town is not unique"):
        sqlsdc.init(path, policy)
    con = duckdb.connect(str(path))
    con.execute("DELETE FROM towns WHERE n = 2")
    con.close()
    sqlsdc.init(path, policy)
    con = duckdb.connect(str(path))
    with pytest.raises(duckdb.ConstraintException):  # the engine now keeps the key unique
        con.execute("INSERT INTO towns VALUES ('a', 3)")
    con.close()
    with sqlsdc.connect(path, "ana") as ana:
        assert ana.execute(JOIN_TOWNS).fetchall()


def test_a_public_table_without_a_key_cannot_be_joined(tmp_path):
    path = tmp_path / "nokey.duckdb"
    sqlsdc.init(path, _people_and_towns(path, "SELECT 'a' AS town, 1 AS n", None))
    with sqlsdc.connect(path, "ana") as ana:
        with pytest.raises(sqlsdc.PolicyViolation, match="can repeat rows of p"):
            ana.execute(JOIN_TOWNS)


@pytest.mark.parametrize(
    ("constraint", "unique"),
    [("PRIMARY KEY (town)", True), ("UNIQUE (town)", True), ("UNIQUE (town, n)", False)],
)
def test_a_constraint_of_the_engine_makes_a_key_of_one_column_only(tmp_path, constraint, unique):
    """A public table without a declared key joins on a column the engine keeps unique by a
    constraint (read from ``duckdb_constraints()`` only when ``DESCRIBE`` shows a key), never
    on one column of a constraint over several."""
    path = tmp_path / "constrained.duckdb"
    policy = _people_and_towns(path, "SELECT 'a' AS town, 1 AS n", None)
    with duckdb.connect(str(path)) as con:
        con.execute(f"CREATE TABLE keyed (town VARCHAR, n INTEGER, {constraint})")
        con.execute("INSERT INTO keyed FROM towns")
        con.execute("DROP TABLE towns")
        con.execute("ALTER TABLE keyed RENAME TO towns")
    sqlsdc.init(path, policy)
    with sqlsdc.connect(path, "ana") as ana:
        if unique:
            assert ana.execute(JOIN_TOWNS).fetchall()
        else:
            with pytest.raises(sqlsdc.PolicyViolation, match="can repeat rows of p"):
                ana.execute(JOIN_TOWNS)


def test_only_public_tables_declare_a_key():
    policy = {
        "tables": {
            "people": {"privacy_unit": "id", "key": "id", "columns": {"id": {"role": "identifier"}}}
        },  # fmt: skip
        "users": {"root": {"role": "admin"}},
    }
    with pytest.raises(sqlsdc.PolicyError, match="only public tables declare a key"):
        sqlsdc.policy.load_policy(policy)
