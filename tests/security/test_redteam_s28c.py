"""Red-team round of session 28 (third), on names that could mean one thing to the guard and
another to DuckDB: JOIN ... USING and NATURAL joins, star expansion (``* EXCLUDE/REPLACE/
RENAME``, ``COLUMNS``), quoted and case-variant names, CTEs shadowing CTEs, lateral column
aliases, output aliases in WHERE, GROUP BY and HAVING, GROUPING SETS and ROLLUP, UNION BY
NAME, struct access, implicit joins, aliases of subqueries shadowing outer aliases, lambdas.

The guard runs a fully qualified rewrite of the query, so only the names DuckDB binds again
in it (outputs of derived tables and CTEs, CTE names, table aliases, ORDER BY outputs) or the
names sqlsdc's own passes look up can disagree. What succeeded, and was closed: two CTEs of
one name (in one WITH DuckDB refuses the statement while sqlglot and the lineage read the last
definition; in nested WITHs the release validation, which looks CTEs up by name, confused the
two); a subquery whose alias shadows an alias of the query around it (the class-break and
GROUP BY checks walked into the subquery and looked its columns up in the outer query:
``FROM persons AS p WHERE p.region IN (SELECT p.code FROM lookup AS p ...)`` read ``p.code``
as a column of persons, an internal error, and a column of both names as the outer one).
Neither released a value: each failed closed, in the engine or as an internal error. The
areas that held are pinned below, one test each.
"""

from __future__ import annotations

from contextlib import closing

import duckdb
import pytest
import test_redteam_s28b
from test_redteam_s28 import _scope

import sqlsdc
from sqlsdc.engines.duckdb import open_database


@pytest.fixture
def analyst(module_analyst):
    """One connection for the module (conftest's ``module_analyst``): the tests that take
    ``analyst`` only read and are refused."""
    return module_analyst


dp_db, ana = test_redteam_s28b.dp_db, test_redteam_s28b.ana  # DP counts, a public lookup


@pytest.fixture
def raw(demo_db, analyst):
    with closing(open_database(demo_db)) as con:  # sqlsdc's settings: one instance per file
        yield con


# --- two CTEs of one name ------------------------------------------------------------------------


def test_duckdb_refuses_two_ctes_of_one_name_in_one_with():
    con = duckdb.connect()
    with pytest.raises(duckdb.ParserException, match="Duplicate CTE name"):
        con.execute('WITH c AS (SELECT 1 AS x), "C" AS (SELECT 2 AS x) SELECT x FROM c')


@pytest.mark.parametrize(
    "sql",
    [
        "WITH c AS (SELECT pid AS x FROM persons), c AS (SELECT sex AS x FROM persons) "
        "SELECT c.x, COUNT(*) FROM c GROUP BY c.x",
        'WITH c AS (SELECT sex AS x FROM persons), "C" AS (SELECT pid AS x FROM persons) '
        "SELECT c.x, COUNT(*) FROM c GROUP BY c.x",
        "WITH c AS (SELECT region AS x, sex FROM persons) SELECT q.x, COUNT(*) FROM "
        "(WITH c AS (SELECT sex AS x FROM c) SELECT x FROM c) AS q GROUP BY q.x",
    ],
    ids=["one-with", "case", "nested"],
)
def test_two_ctes_of_one_name_are_refused(ana, sql):
    """One WITH: the guard read the second ``c`` (sex), DuckDB refused the statement; nested:
    the release validation took one ``c`` for the other (an internal error)."""
    with pytest.raises(sqlsdc.PolicyViolation, match="two CTEs are named 'c'"):
        ana.explain(sql)


# --- a subquery alias that shadows an outer alias ---------------------------------------------

SHADOWED = [
    "SELECT sex, COUNT(*) FROM persons AS p WHERE p.region IN "
    "(SELECT {a}.code FROM lookup AS {a} WHERE {a}.label = 'north') GROUP BY sex",
    "SELECT sex, COUNT(*) FROM persons AS p WHERE p.region = "
    "(SELECT MIN({a}.code) FROM lookup AS {a} WHERE {a}.label > 'a') GROUP BY sex",
]


@pytest.mark.parametrize("template", SHADOWED, ids=["in", "scalar"])
def test_a_subquery_alias_is_its_own_not_the_outer_one(ana, template):
    """DuckDB (and sqlglot) read ``p`` inside the subquery as ``lookup``; the class-break and
    GROUP BY checks looked ``p.code`` up among the outer query's sources (persons): an
    internal error, or the outer column when both have one. Shadowed or renamed, one
    question and one population."""
    assert _scope(ana, template.format(a="p")) == _scope(ana, template.format(a="l"))


def test_a_shadowing_alias_reads_the_inner_table_in_duckdb(analyst, raw):
    sql = (
        "SELECT p.sex, COUNT(*) FROM persons AS p WHERE p.region IN (SELECT p.region FROM "
        "regions AS p WHERE p.name = 'Capital') GROUP BY p.sex"
    )
    capital = raw.execute("SELECT region FROM regions WHERE name = 'Capital'").fetchone()[0]
    exact = raw.execute(
        f"SELECT sex, COUNT(*) FROM persons WHERE region = '{capital}' GROUP BY sex"
    ).fetchall()
    assert sorted(raw.execute(sql).fetchall()) == sorted(exact)
    assert "regions AS p WHERE p.name = 'Capital'" in analyst.explain(sql).sql


def test_a_group_by_subquery_alias_is_its_own(analyst):
    """The GROUP BY check looked ``p.name`` up in persons (an internal error)."""
    sql = (
        "SELECT p.sex, COUNT(*) FROM persons AS p "
        "GROUP BY p.sex, (SELECT MIN(p.name) FROM regions AS p)"
    )
    assert "MIN(p.name) AS _col_0 FROM regions AS p)" in analyst.explain(sql).sql


# --- what held ---------------------------------------------------------------------------------


def test_having_reads_a_grouped_column_before_an_output_alias(analyst, raw):
    """DuckDB reads ``sex`` in HAVING as the grouped column, not the output ``region AS
    sex``; the guard filters the cells alike (by sex, one row per region)."""
    sql = "SELECT region AS sex, COUNT(*) FROM persons GROUP BY region, sex HAVING sex = 'M'"
    assert len(raw.execute(sql).fetchall()) == len(analyst.execute(sql).fetchall()) == 8


def test_a_lateral_alias_does_not_hide_a_column_of_its_name(analyst, raw):
    """``region AS sex, sex || '' AS z``: DuckDB reads the column sex, not the alias."""
    sql = (
        "SELECT q.z, COUNT(*) FROM (SELECT region AS sex, sex || '' AS z FROM persons) AS q "
        "GROUP BY q.z"
    )
    keys = {row[0] for row in raw.execute(sql).fetchall()}
    assert keys == {row[0] for row in analyst.execute(sql).fetchall()} == {"F", "M"}


def test_a_natural_join_reads_declared_columns_only(analyst):
    """DuckDB's NATURAL JOIN would also match the record keys ``__rkey``: the guard runs it
    as an explicit join on the declared common columns."""
    sql = "SELECT sex, COUNT(*) FROM persons NATURAL JOIN households GROUP BY sex"
    protected = analyst.explain(sql).sql
    assert "ON persons.household_id = households.household_id AND persons.region" in protected
    assert "persons.__rkey = households.__rkey" not in protected


@pytest.mark.parametrize(
    ("sql", "reason"),
    [
        ("SELECT q.sex, COUNT(*) FROM (SELECT sex FROM persons UNION ALL BY NAME SELECT sex "
         "FROM persons) AS q GROUP BY q.sex", "BY NAME"),
        ("SELECT sex, COUNT(*) FROM (SELECT * RENAME (person_id AS sex) FROM persons) AS q "
         "GROUP BY sex", "two outputs of a derived table"),
        ("SELECT q.sex, COUNT(*) FROM (SELECT * EXCLUDE (sex) RENAME (person_id AS sex) "
         "FROM persons) AS q GROUP BY q.sex", "identifier q.sex cannot be grouped by"),
        ('SELECT "P".sex, COUNT(*) FROM persons AS "P" JOIN regions AS p '
         'ON "P".region = p.region GROUP BY "P".sex', "Alias already used"),
        ("SELECT list_transform([person_id], sex -> sex) AS z, COUNT(*) FROM persons "
         "GROUP BY 1", "list_transform"),
    ],
    ids=["union-by-name", "rename", "exclude-rename", "quoted-alias", "lambda"],
)  # fmt: skip
def test_renaming_constructs_are_refused_or_resolved_as_duckdb_does(analyst, sql, reason):
    with pytest.raises(sqlsdc.PolicyViolation, match=reason):
        analyst.explain(sql)
