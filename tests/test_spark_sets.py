"""DuckDB's grand totals of grouping sets over no rows, as Spark SQL (s46d,
:mod:`sqlsdc.engines.spark_sets`): the translation alone, no JVM. The engines' answers are
compared in ``tests/security/test_redteam_s45i.py``."""

from __future__ import annotations

import pytest
import sqlglot

from sqlsdc.engines.spark_sets import MAX_EMPTY_SETS, empty_sets, spark_missing_totals
from sqlsdc.engines.spark_translate import to_spark_sql
from sqlsdc.errors import NotSupportedError

SCHEMA = {"t": {"r": "VARCHAR", "g": "VARCHAR", "v": "INTEGER"}}


def group_of(clause: str):
    return sqlglot.parse_one(f"SELECT COUNT(*) FROM t GROUP BY {clause}", read="duckdb").args[
        "group"
    ]


def nested(levels: int) -> str:
    """Grand totals of grand totals: each SELECT expands to the most empty sets allowed."""
    sets = ", ".join(["()"] * MAX_EMPTY_SETS)
    sql = f"SELECT COUNT(*) AS n FROM t GROUP BY GROUPING SETS ({sets})"
    for _ in range(levels - 1):
        sql = f"SELECT COUNT(*) AS n FROM ({sql}) AS d GROUP BY GROUPING SETS ({sets})"
    return sql


def spark(sql: str) -> str:
    return to_spark_sql(sqlglot.parse_one(sql, read="duckdb"), SCHEMA)


@pytest.mark.parametrize(
    ("clause", "duckdb_rows", "spark_rows"),
    [  # grand totals over no rows; each counted on both engines (DuckDB 2.0, Spark 4.3)
        ("r", 0, 0),
        ("r, ROLLUP (g)", 0, 0),
        ("()", 1, 1),
        ("GROUPING SETS (())", 1, 1),
        ("(), GROUPING SETS (())", 1, 1),
        ("ROLLUP (r, g)", 1, 0),
        ("CUBE (r, r)", 1, 0),
        ("ROLLUP (r), CUBE (g)", 1, 0),
        ("GROUPING SETS ((r), ())", 1, 0),
        ("GROUPING SETS ((), ())", 2, 0),
        ("GROUPING SETS ((r), (), ())", 2, 0),
        ("GROUPING SETS ((), ()), ROLLUP (g)", 2, 0),
        ("GROUPING SETS ((), ROLLUP (g), CUBE (g))", 3, 0),
        ("GROUPING SETS ((), GROUPING SETS ((), (g)))", 2, 0),
    ],
)
def test_empty_sets_are_counted_as_each_engine_answers_them(clause, duckdb_rows, spark_rows):
    group = group_of(clause)
    assert empty_sets(group) == duckdb_rows
    assert spark_missing_totals(group) == duckdb_rows - spark_rows


def test_a_rollup_runs_with_its_grand_total_over_no_rows():
    """Fails on main (the ROLLUP ran alone: no row over no rows on Spark). The grand total is
    a global aggregate over the same rows, there only when they are none: keys NULL,
    GROUPING all ones, the HAVING kept, ORDER BY and LIMIT over the union by position."""
    sql = spark(
        "SELECT r, g, GROUPING(r, g) AS gg, COUNT(*) AS n FROM t WHERE v > 9 "
        "GROUP BY ROLLUP (r, g) HAVING COUNT(*) >= 0 ORDER BY n DESC, r LIMIT 3"
    )
    grouped, total = sql.split(" UNION ALL ")
    assert grouped.endswith("GROUP BY ROLLUP (r, g) HAVING COUNT(*) >= 0")
    assert total == (
        "SELECT NULL, NULL, CAST(3 AS BIGINT) AS gg, COUNT(*) AS n FROM t WHERE v > 9 "
        "GROUP BY GROUPING SETS (()) HAVING COUNT(*) = 0 AND (COUNT(*) >= 0) "
        "ORDER BY 4 DESC, 1 NULLS LAST LIMIT 3"
    )


def test_each_empty_set_is_a_grand_total_and_inner_selects_are_translated_once():
    sql = spark(
        "SELECT x, SUM(n) AS s FROM (SELECT r AS x, COUNT(*) AS n FROM t "
        "GROUP BY GROUPING SETS ((r), (), ())) AS c GROUP BY CUBE (x)"
    )
    assert sql.count("HAVING COUNT(*) = 0") == 2 * 2 + 1  # the inner two, in both outer branches
    inner = "SELECT NULL AS x, COUNT(*) AS n FROM t GROUP BY GROUPING SETS (()) HAVING COUNT(*) = 0"
    assert sql.count(inner) == 4


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT r, COUNT(*) FROM t GROUP BY r",
        "SELECT r, g, COUNT(*) FROM t GROUP BY r, ROLLUP (g)",
        "SELECT COUNT(*) FROM t GROUP BY ()",
        "SELECT COUNT(*) FROM t",
    ],
)
def test_sets_without_a_missing_grand_total_are_left_alone(sql):
    assert "UNION" not in spark(sql)


@pytest.mark.parametrize(
    ("sql", "why"),
    [
        ("SELECT v // 2 AS h, COUNT(*) FROM t GROUP BY ROLLUP (h)", "v reads a column"),
        ("SELECT r, COUNT(*) FROM t GROUP BY ROLLUP (r) ORDER BY g", "ORDER BY term g"),
        (
            "SELECT COUNT(*) FROM t GROUP BY GROUPING SETS ("
            + ", ".join(["()"] * (MAX_EMPTY_SETS + 1))
            + ")",
            f"{MAX_EMPTY_SETS + 1} empty sets",
        ),
        (nested(6), "would pass 8 times"),  # 9^6 copies of the innermost, were they made
    ],
)
def test_a_grand_total_spark_cannot_build_alike_is_refused(sql, why):
    with pytest.raises(NotSupportedError, match=why):
        spark(sql)
