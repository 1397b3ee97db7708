"""The final validator proves, from the emitted SQL alone, that every output column is protected.

It is independent of the passes before it: a tree that a buggy pass could have produced is
refused even if it carries the ``__cells`` name the rewrite uses.
"""

from __future__ import annotations

import pytest
import sqlglot

import sqlsdc
from sqlsdc.guard.validate import validate_release

FORGED = {
    "rows named as cells": "SELECT * FROM (SELECT region, income FROM persons) AS __cells",
    "rows read by name": "SELECT __cells.__y0 FROM (SELECT income AS __y0 FROM persons) AS __cells",
    "star of cells": "SELECT __cells.* FROM (SELECT region AS __g0, COUNT(*) AS __y0 "
    "FROM persons GROUP BY region) AS __cells",
    "true count released": "SELECT __cells.__g0, __cells.__a0 FROM (SELECT region AS __g0, "
    "COUNT(*) AS __a0 FROM persons GROUP BY region) AS __cells",
    "true count in an expression": "SELECT __cells.__g0, __cells.__a0 * 1 AS n FROM (SELECT "
    "region AS __g0, COUNT(*) AS __a0 FROM persons GROUP BY region) AS __cells",
    "threshold below the policy's": "SELECT CASE WHEN __cells.__n0 >= 1 THEN __cells.__a0 END "
    "FROM (SELECT COUNT(*) AS __a0, COUNT(*) AS __n0 FROM persons GROUP BY region) AS __cells",
    "threshold guard of another cell": "SELECT CASE WHEN __cells.__n1 >= 10 THEN __cells.__a0 "
    "END FROM (SELECT COUNT(*) AS __a0, COUNT(*) AS __n1 FROM persons GROUP BY region) AS __cells",
    "threshold with an ELSE": "SELECT CASE WHEN __cells.__n0 >= 10 THEN 0 ELSE __cells.__a0 "
    "END FROM (SELECT COUNT(*) AS __a0, COUNT(*) AS __n0 FROM persons GROUP BY region) AS __cells",
    "true unit count released": "SELECT __cells.__n FROM (SELECT COUNT(*) AS __n FROM persons "
    "GROUP BY region) AS __cells",
    "true count in the filter": "SELECT __cells.__g0 FROM (SELECT region AS __g0, COUNT(*) AS __a0"
    " FROM persons GROUP BY region) AS __cells WHERE __cells.__a0 = 1",
    "cell key": "SELECT __cells.__k0 FROM (SELECT SUM(__rkey) AS __k0 FROM persons "
    "GROUP BY region) AS __cells",
    "unqualified internal column": "SELECT __a0 FROM (SELECT COUNT(*) AS __a0 FROM persons "
    "GROUP BY region) AS __cells",
    "group guard with a noise of the record key": "SELECT __cells.__g0 FROM (SELECT region AS "
    "__g0, COUNT(*) AS __n, SUM(__rkey) % 4294967296 AS __kg FROM persons GROUP BY region) AS "
    "__cells WHERE __cells.__n + (__cells.__kg % 9 - 4) >= 10",
    "group guard below the policy's": "SELECT __cells.__g0 FROM (SELECT region AS __g0, COUNT(*) "
    "AS __n FROM persons GROUP BY region) AS __cells WHERE __cells.__n >= 2",
    "rows through a CTE": "WITH r AS (SELECT region, income FROM persons) "
    "SELECT __cells.__y0 FROM (SELECT income AS __y0 FROM r) AS __cells",
}


@pytest.mark.parametrize("sql", FORGED.values(), ids=FORGED.keys())
def test_forged_protection_is_refused(ckm, sql):
    policy = ckm._context.policy
    tree = sqlglot.parse_one(sql, read="duckdb")
    with pytest.raises(sqlsdc.InternalError):
        validate_release(tree, policy)


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT region, COUNT(*), SUM(income), AVG(income) FROM persons GROUP BY ROLLUP (region)",
        "SELECT p.region, COUNT(*) FROM persons p JOIN households h "
        "ON p.household_id = h.household_id GROUP BY p.region HAVING COUNT(*) > 10",
        "SELECT municipality FROM persons WHERE age > 80 GROUP BY municipality",
        "SELECT region, COUNT(*) FROM benefits GROUP BY region",
        "SELECT nace, SUM(turnover) FROM enterprises GROUP BY nace ORDER BY 2 DESC LIMIT 3",
    ],
)
def test_every_emitted_query_passes_the_validator(ckm, sql):
    """The validator accepts what the planner emits (it runs inside explain as well)."""
    query = ckm.explain(sql)
    validate_release(sqlglot.parse_one(query.sql, read="duckdb"), ckm._context.policy)


def test_the_threshold_guard_is_accepted(analyst):
    """The threshold mechanism's own shape: CASE WHEN __n >= k THEN __a END."""
    query = analyst.explain("SELECT region, COUNT(*), SUM(income) FROM persons GROUP BY region")
    assert "__cells.__n0 >= 10" in query.sql
    validate_release(sqlglot.parse_one(query.sql, read="duckdb"), analyst._context.policy)
