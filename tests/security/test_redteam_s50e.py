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
from sqlsdc.demo.build import build_demo_database, demo_policy
from sqlsdc.policy import load_policy

LEAK = "(SELECT MAX(income) FROM persons) AS leak, r"


@pytest.mark.parametrize(
    "sql",
    [
        f'SELECT * FROM regions "{LEAK}", regions r',
        f'SELECT * FROM regions AS "{LEAK}" CROSS JOIN regions AS r',
    ],
)
def test_a_quoted_alias_expanded_by_star_is_a_name_not_sql(analyst, raw, sql):
    cursor = analyst.execute(sql)
    rows = cursor.fetchall()
    names = [d[0] for d in cursor.description]
    assert "leak" not in names
    assert names == ["region", "name", "population"] * 2
    (truth,) = raw.execute("SELECT MAX(income) FROM persons").fetchone()
    assert not any(value == truth for row in rows for value in row)
    assert len(rows) == 64  # 8 regions × 8: the public rows, nothing else


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


@pytest.fixture(scope="module")
def dp_limited_db(tmp_path_factory):
    """A 2,000-person demo under the shipped policy (benefits under DP) with a cell limit."""
    document = demo_policy().document_dict()
    document["cell_limits"] = [{"user": "*", "table": "*", "cells": 50000, "per": "week"}]
    path = tmp_path_factory.mktemp("s50e") / "demo.duckdb"
    build_demo_database(path, persons=2000, seed=50, policy=load_policy(document, name="s50e"))
    return path


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
