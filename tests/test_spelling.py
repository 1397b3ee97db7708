"""Values SQL holds equal come out of a protected query in one spelling (rewrite.spelling).

-0.0 and 0.0, NaN and -NaN, ``INTERVAL 1 MONTH`` and ``INTERVAL 30 DAY`` are equal to the
engine, so where it keeps one of them (a group's key, a DISTINCT row, a set operation's row,
the rows a LIMIT keeps, MIN) it keeps the first it reads, in an order hidden groups move. Each
test below builds values of one spelling only (-0.0, -NaN, 30 days), which the engine kept
as they were, and checks the canonical one comes out: 0.0 (``1 / x`` is inf, not -inf), NaN,
1 month.
"""

from __future__ import annotations

import math
from decimal import Decimal

import pytest
import sqlglot
from sqlglot.optimizer.annotate_types import annotate_types

from sqlsdc.rewrite.spelling import released_in_one_spelling

INNER = "SELECT municipality AS k, COUNT(*) AS n FROM persons WHERE region = 'R08' GROUP BY k"
NEGATIVE_ZERO = "-(CAST(n AS DOUBLE) * 0)"  # not a constant: DuckDB folds -0.0 into 0.0


@pytest.mark.parametrize(
    "sql",
    [
        # a GROUP BY's key, read by the query that groups
        f"SELECT 1 / x FROM (SELECT {NEGATIVE_ZERO} AS x FROM ({INNER}) t) u GROUP BY x",
        f"SELECT 1 / ({NEGATIVE_ZERO}) FROM ({INNER}) t GROUP BY {NEGATIVE_ZERO}",
        f"SELECT 1 / x FROM (SELECT x FROM (SELECT {NEGATIVE_ZERO} AS x FROM ({INNER}) t) u "
        "GROUP BY ALL) v",
        f"SELECT 1 / x FROM (SELECT x FROM (SELECT {NEGATIVE_ZERO} AS x FROM ({INNER}) t) u "
        "GROUP BY 1) v",
        f"SELECT 1 / x FROM (SELECT {NEGATIVE_ZERO} AS x, k FROM ({INNER}) t) u "
        "GROUP BY ROLLUP (x, k) HAVING GROUPING(k) = 1 AND GROUPING(x) = 0",
        f"SELECT 1 / x FROM (SELECT {NEGATIVE_ZERO} AS x FROM ({INNER}) t) u GROUP BY x "
        "HAVING 1 / x > 0",
        f"WITH c AS (SELECT {NEGATIVE_ZERO} AS x FROM ({INNER}) t) SELECT 1 / x FROM c GROUP BY x",
        # the rows DISTINCT, a set operation or a LIMIT keeps
        f"SELECT 1 / x FROM (SELECT DISTINCT {NEGATIVE_ZERO} AS x FROM ({INNER}) t) u",
        f"SELECT 1 / x FROM (SELECT DISTINCT {NEGATIVE_ZERO} AS x FROM ({INNER}) t ORDER BY x) u",
        f"SELECT 1 / x FROM (SELECT {NEGATIVE_ZERO} AS x FROM ({INNER}) t UNION "
        f"SELECT {NEGATIVE_ZERO} FROM ({INNER}) t) u",
        f"SELECT 1 / x FROM (SELECT {NEGATIVE_ZERO} AS x FROM ({INNER}) t INTERSECT "
        f"SELECT {NEGATIVE_ZERO} FROM ({INNER}) t) u",
        f"SELECT 1 / x FROM (SELECT {NEGATIVE_ZERO} AS x FROM ({INNER}) t ORDER BY x LIMIT 1) u",
        # types sqlglot gets wrong: a DECIMAL divided, or times a DOUBLE, is a DOUBLE
        f"SELECT 1 / x FROM (SELECT DISTINCT CAST(n AS DECIMAL(10, 2)) * 0 / -1 AS x "
        f"FROM ({INNER}) t) u",
        f"SELECT 1 / x FROM (SELECT DISTINCT CAST(1 AS DECIMAL(3, 0)) * {NEGATIVE_ZERO} AS x "
        f"FROM ({INNER}) t) u",
        f"SELECT 1 / MIN(CAST(n AS DECIMAL(10, 2)) * 0 / -1) FROM ({INNER}) t",
        # MIN and MAX
        f"SELECT 1 / MIN({NEGATIVE_ZERO}) FROM ({INNER}) t",
        # a cell frame's key, grouped over the persons' rows
        "SELECT 1 / (-(CAST(age AS DOUBLE) * 0)) FROM persons GROUP BY -(CAST(age AS DOUBLE) * 0)",
    ],
)
def test_a_kept_negative_zero_is_zero(ckm, sql):
    assert {row[0] for row in ckm.execute(sql).fetchall()} == {math.inf}


NEGATIVE_NAN = "-CAST('nan' AS DOUBLE) + CAST(n AS DOUBLE) * 0"


@pytest.mark.parametrize(
    "sql",
    [
        f"SELECT CAST(x AS VARCHAR) FROM (SELECT {NEGATIVE_NAN} AS x FROM ({INNER}) t) u "
        "GROUP BY x",
        f"SELECT CAST(MAX({NEGATIVE_NAN}) AS VARCHAR) FROM ({INNER}) t",
        "SELECT CAST(x AS VARCHAR) FROM (SELECT CASE WHEN n >= 0 THEN INTERVAL 30 DAY END AS x "
        f"FROM ({INNER}) t) u GROUP BY x",
    ],
)
def test_a_kept_nan_or_interval_has_one_spelling(ckm, sql):
    assert ckm.execute(sql).fetchall() in ([("nan",)], [("1 month",)])


def test_released_nan_has_no_sign(ckm):
    """The result itself: -NaN would tell the engine's pick through ``math.copysign``."""
    sql = f"SELECT x FROM (SELECT {NEGATIVE_NAN} AS x FROM ({INNER}) t) u GROUP BY x"
    ((value,),) = ckm.execute(sql).fetchall()
    assert math.isnan(value) and math.copysign(1.0, value) == 1.0


def test_a_grouped_query_reads_its_keys_spelled_and_groups_them_as_written():
    """The rewrite itself: GROUP BY and GROUPING() keep the key as written (the engine binds
    the reading to it), projections, HAVING and ORDER BY read it spelled; a column of a
    derived table gets its type from the projection it names; other types are left alone."""
    tree = sqlglot.parse_one(
        "SELECT u.x AS x, GROUPING(u.x) AS g, u.k AS k FROM (SELECT CAST(1 AS DOUBLE) AS x, "
        "'a' AS k) AS u GROUP BY ROLLUP (u.x), u.k HAVING u.x > 0 ORDER BY u.x",
        read="duckdb",
    )
    released_in_one_spelling(annotate_types(tree, dialect="duckdb"))
    spelled = "(CASE WHEN ISNAN(u.x) THEN ABS(u.x) ELSE u.x + 0 END)"
    assert tree.sql("duckdb") == (
        f"SELECT {spelled} AS x, GROUPING(u.x) AS g, u.k AS k FROM (SELECT CAST(1 AS DOUBLE) AS "
        f"x, 'a' AS k) AS u GROUP BY ROLLUP (u.x), u.k HAVING {spelled} > 0 ORDER BY {spelled}"
    )


def test_an_unnamed_output_keeps_its_name():
    tree = sqlglot.parse_one(
        "SELECT DISTINCT u.x FROM (SELECT CAST(1 AS DOUBLE) AS x) AS u", read="duckdb"
    )
    released_in_one_spelling(annotate_types(tree, dialect="duckdb"))
    assert tree.selects[0].alias == "x"
    assert tree.sql("duckdb").startswith("SELECT DISTINCT (CASE WHEN ISNAN(u.x)")


def test_an_interval_is_normalised():
    tree = sqlglot.parse_one(
        "SELECT u.x AS x FROM (SELECT INTERVAL 30 DAY AS x) AS u GROUP BY u.x", read="duckdb"
    )
    released_in_one_spelling(annotate_types(tree, dialect="duckdb"))
    assert tree.sql("duckdb").startswith("SELECT NORMALIZED_INTERVAL(u.x) AS x")


@pytest.mark.parametrize(
    "sql",
    [
        f"SELECT x FROM (SELECT DISTINCT n * 1.5 AS x FROM ({INNER}) t) u",
        f"SELECT MIN(n * 1.5) FROM ({INNER}) t",
        f"SELECT x FROM (SELECT ROUND(CAST(n AS DECIMAL(10, 2)), 1) AS x FROM ({INNER}) t) u "
        "GROUP BY x",
    ],
)
def test_a_decimal_sqlglot_calls_a_double_stays_a_decimal(ckm, sql):
    """sqlglot types ``n * 1.5`` and ROUND of a DECIMAL as DOUBLE; DuckDB keeps DECIMALs,
    and the spelling (``x + 0``) keeps them too."""
    values = [row[0] for row in ckm.execute(sql).fetchall()]
    assert values and all(isinstance(v, Decimal) for v in values)
