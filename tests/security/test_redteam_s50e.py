"""Red team s50e: what BI tools send before and around an analyst's query (issue 18).

Findings (each test below fails on the base):

1. **An alias printed as SQL.** sqlglot's ``qualify`` expands ``*`` into columns whose table
   is the alias *unquoted*, so the alias of ``SELECT * FROM regions "<text>", regions r`` was
   printed as SQL into the protected statement: with ``<text>`` = ``(SELECT MAX(income) FROM
   persons) AS leak, r`` the answer held the largest income of the confidential table (one
   person's exact value, 1 query), and any scalar subquery of raw rows read the same way
   (``WHERE person_id = ...``: a named person's income). Tableau writes every custom SQL source
   as ``SELECT * FROM (...) "Custom SQL Query"``, which failed on the same unquoted alias.
   Fixed where the names are resolved (an identifier that is not a plain name is quoted) and in
   DuckDB's generator; the engine check now also refuses a confidential table that DuckDB
   reads and the protected tree does not.
2. **A DP query in a derived table failed after its charge.** Under a cell limit, the count
   of the cells a derived table, LIMIT or HAVING hides ran over the noisy cells' relation,
   which is not registered when the few cells go as list parameters: ``SELECT * FROM (SELECT
   region, COUNT(*) FROM benefits GROUP BY region) t LIMIT 0`` (the schema probe of Tableau,
   Power BI and JDBC tools) charged ε and failed in the engine, every time.
"""

from __future__ import annotations

import pytest
import sqlglot

import sqlsdc
from sqlsdc.catalog.cell_limits import CellLimitReached
from sqlsdc.demo.build import build_demo_database, demo_policy
from sqlsdc.policy import load_policy

LEAK = "(SELECT MAX(income) FROM persons) AS leak, r"


@pytest.mark.parametrize(
    "sql",
    [
        f'SELECT * FROM regions "{LEAK}", regions r',
        f'SELECT * FROM regions AS "{LEAK}" CROSS JOIN regions AS r',
        f'SELECT * FROM regions r JOIN regions "{LEAK}" USING (region)',
    ],
)
def test_a_quoted_alias_expanded_by_star_is_a_name_not_sql(analyst, raw, sql):
    cursor = analyst.execute(sql)
    rows = cursor.fetchall()
    names = [d[0] for d in cursor.description]
    assert "leak" not in names
    assert names[:3] == ["region", "name", "population"]
    assert set(names) == {"region", "name", "population"}
    (truth,) = raw.execute("SELECT MAX(income) FROM persons").fetchone()
    assert not any(value == truth for row in rows for value in row)
    assert len(rows) == (8 if "USING" in sql else 64)  # the public rows, nothing else


def test_tableaus_quoted_alias_of_a_custom_sql_source_is_answered(analyst):
    inner = "SELECT region, COUNT(*) AS n FROM persons GROUP BY region"
    plain = analyst.execute(inner + " ORDER BY region").fetchall()
    wrapped = analyst.execute(f'SELECT * FROM ({inner}) "Custom SQL Query" ORDER BY 1').fetchall()
    assert wrapped == plain and len(plain) == 8


def test_the_engine_check_refuses_a_confidential_table_the_tree_does_not_read(analyst):
    """Defence in depth: DuckDB's reading of the text names ``persons``; the protected tree
    reads ``regions`` only (text that was no table of the tree reached the engine)."""
    from sqlsdc.guard.validate import check_engine_tables

    tree = sqlglot.parse_one("SELECT * FROM regions", read="duckdb")
    check_engine_tables({"regions"}, tree, analyst.policy, ("regions",))
    with pytest.raises(sqlsdc.InternalError, match="read table persons"):
        check_engine_tables({"regions", "persons"}, tree, analyst.policy, ("regions",))


def _demo(folder, limits: list[dict]):
    """A 2,000-person demo under the shipped policy (benefits under DP) with ``limits``."""
    document = demo_policy().document_dict()
    document["cell_limits"] = limits
    path = folder / "demo.duckdb"
    build_demo_database(path, persons=2000, seed=50, policy=load_policy(document, name="s50e"))
    return path


@pytest.fixture(scope="module")
def dp_limited_db(tmp_path_factory):
    return _demo(tmp_path_factory.mktemp("s50e"), [{"user": "*", "table": "*", "cells": 50000,
                                                    "per": "week"}])  # fmt: skip


@pytest.mark.parametrize(
    ("sql", "rows"),
    [
        ("SELECT * FROM (SELECT region, COUNT(*) AS n FROM benefits GROUP BY region) t LIMIT 0", 0),
        ("SELECT * FROM (SELECT region, COUNT(*) AS n FROM benefits GROUP BY region) t LIMIT 2", 2),
        ("SELECT scheme, COUNT(*) AS n FROM benefits GROUP BY scheme HAVING 1 = 0", 0),
    ],
)
def test_a_dp_query_in_a_derived_table_under_a_cell_limit_is_answered(dp_limited_db, sql, rows):
    with sqlsdc.connect(dp_limited_db, user="analyst") as con:
        cursor = con.execute(sql)
        assert len(cursor.fetchall()) == rows
        assert [d[1] for d in cursor.description] == ["VARCHAR", "BIGINT"]


@pytest.fixture(scope="module")
def small_limit_template(tmp_path_factory):
    """A limit of 4 cells of persons a week for the analyst."""
    return _demo(tmp_path_factory.mktemp("s50e_limit"), [{"user": "analyst", "table": "persons",
                                                          "cells": 4, "per": "week"}])  # fmt: skip


@pytest.fixture
def small_limit_db(small_limit_template, tmp_path, copy_database):
    """A fresh copy: a refusal ends the week's period of the limit."""
    return copy_database(small_limit_template, tmp_path)


PROBED = "SELECT region, COUNT(*) AS n, AVG(income) AS m FROM persons GROUP BY region"


@pytest.mark.parametrize(
    "probe",
    [
        f'SELECT * FROM ({PROBED}) "Custom SQL Query" LIMIT 0',
        f"SELECT * FROM ({PROBED}) AS t WHERE 1 = 0",
        f"SELECT * FROM ({PROBED}) AS t LIMIT 0 OFFSET 3",
    ],
)
def test_a_schema_probe_counts_no_cell_and_runs_nothing(small_limit_db, probe):
    """Three BI probes of a query of 8 groups × 2 aggregates, under a limit of 4 cells: each
    is answered with the query's names and types and no row, counted as no cell (on the base
    the probe's 16 hidden cells exceeded the limit: refused, and the period ended)."""
    with sqlsdc.connect(small_limit_db, user="analyst") as con:
        for _ in range(3):
            cursor = con.execute(probe)
            assert cursor.fetchall() == []
            assert [(d[0], d[1]) for d in cursor.description] == [
                ("region", "VARCHAR"), ("n", "BIGINT"), ("m", "DOUBLE")
            ]  # fmt: skip
        # the limit is untouched: a total of one cell is answered
        assert con.execute("SELECT COUNT(*) FROM persons").fetchone()[0] > 1000


@pytest.mark.parametrize(
    "sql",
    [
        f"SELECT * FROM ({PROBED}) AS t WHERE n = 0",  # a condition on data: a query
        f"SELECT * FROM ({PROBED}) AS t WHERE 1 = 0 OR n > 0",
        f"SELECT * FROM ({PROBED}) AS t LIMIT 1",
    ],
)
def test_a_condition_on_data_is_no_probe(small_limit_db, sql):
    """Not probes: run and counted as any query (here 16 cells, over the limit of 4)."""
    with sqlsdc.connect(small_limit_db, user="analyst") as con:
        with pytest.raises(CellLimitReached):
            con.execute(sql)


@pytest.mark.parametrize(
    ("sql", "probe"),
    [
        ("SELECT * FROM t LIMIT 0", True),
        ("SELECT * FROM t LIMIT 0 OFFSET 7", True),
        ("SELECT a FROM t UNION ALL SELECT a FROM u LIMIT 0", True),
        ("SELECT * FROM t WHERE 1 = 0", True),
        ("SELECT * FROM t WHERE FALSE", True),
        ("SELECT * FROM t WHERE 1 <> 1 AND 2 = 2", True),
        ("SELECT * FROM t LIMIT 1", False),
        ("SELECT * FROM t WHERE n = 0", False),
        ("SELECT * FROM t WHERE 1 = 0 OR n > 0", False),
        ("SELECT * FROM t WHERE 1 = 0 OR 2 = 2", False),
        ("SELECT COUNT(*) FROM t WHERE 1 = 0", False),  # one row over none
        ("SELECT a FROM t WHERE 1 = 0 GROUP BY a", False),
        ("SELECT * FROM t WHERE 1 = (SELECT 0)", False),
        ("SELECT * FROM t WHERE 1 = ABS(0)", False),
    ],
)
def test_a_probe_is_known_by_its_form(sql, probe):
    from sqlsdc.guard.probes import answers_no_row

    assert answers_no_row(sqlglot.parse_one(sql, read="duckdb")) is probe


def test_a_probe_of_a_refused_query_is_refused(small_limit_db):
    with sqlsdc.connect(small_limit_db, user="analyst") as con:
        for sql in ("SELECT * FROM persons LIMIT 0", "SELECT * FROM persons WHERE 1 = 0",
                    "SELECT * FROM (SELECT income FROM persons) t LIMIT 0"):  # fmt: skip
            with pytest.raises(sqlsdc.PolicyViolation, match="row-level"):
                con.execute(sql)


@pytest.mark.parametrize(
    "sql",
    [
        'SELECT * FROM (SELECT COUNT(*) AS n FROM persons) "Custom SQL Query" LIMIT 0',
        "SELECT * FROM (SELECT COUNT(*) AS n FROM persons) AS t",
    ],
)
def test_a_star_over_one_column_is_named_as_that_column(analyst, sql):
    """A * expanded into one column kept the name "*" (the names were taken from the
    expansion only when their number changed): a BI tool's probe of a total saw a column "*"
    where its query then returned ``n`` (fails on main)."""
    cursor = analyst.execute(sql)
    assert [d[0] for d in cursor.description] == ["n"]
