"""The Spark engine: the same protected tree on PySpark gives DuckDB's cells (ARCHITECTURE.md §7).

One local SparkSession for the module: local[1], two shuffle partitions, no UI, no progress bar,
and the JVM's quick (C1) compiler only and its one-thread garbage collector, because these queries
are small and a fast start matters more than peak speed (the JVM's CPU time for this module: about
26 s with the default collector, 23 s with the serial one).
"""

from __future__ import annotations

import importlib.util
import math
import re
import shutil
import sys
from decimal import Decimal
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest
import sqlglot
from spark_session import local_session, skip_without_jdk
from sqlglot import exp

import sqlsdc
from sqlsdc.engines.duckdb import harden, open_database
from sqlsdc.engines.duckdb_sql import to_sql
from sqlsdc.engines.spark import ANSI, SparkEngine, normalise_types
from sqlsdc.engines.spark_portable import PORTABLE_FUNCTIONS
from sqlsdc.engines.spark_translate import (
    check_portable,
    read_as_duckdb,
    tables_read,
    to_spark_sql,
    view_name,
)
from sqlsdc.errors import Error, NotSupportedError, OperationalError, ProgrammingError
from sqlsdc.guard.spark import run_protected
from sqlsdc.written import remember_names, written_name

SparkError = pytest.importorskip(
    "pyspark.errors", reason="the Spark tests need the spark extra: pip install -e '.[spark]'"
).PySparkException
skip_without_jdk()

pytestmark = [
    pytest.mark.filterwarnings(
        "ignore:PySpark does not yet fully support pandas:FutureWarning"  # no pandas used here
    ),
    pytest.mark.slow,  # a JVM: ~50 s of CPU idle, the longest file of the suite; CI runs it
]


# Guarded queries whose protected trees must give the same cells on both engines, on the demo
# database under threshold protection. Append to it: the tables a tree reads, `sqlsdc.*`
# included, are copied to Spark.
CROSS_ENGINE_QUERIES = [
    "SELECT region, COUNT(*) AS n FROM persons GROUP BY region",
    # checked as age IN (...) AND NOT region IN (...) (planner/connectors.fold_comparisons)
    "SELECT region, COUNT(*) AS n FROM persons WHERE ("
    + " OR ".join(f"age = {i}" for i in range(20, 40))
    + ") AND "
    + " AND ".join(f"region <> 'R{i:02d}'" for i in range(3, 20))
    + " GROUP BY region",
    "SELECT region, sex, COUNT(*) AS n, SUM(income) AS income, AVG(age) AS mean_age "
    "FROM persons GROUP BY ROLLUP (region, sex)",
    "SELECT nace, size_class, COUNT(*) AS n, SUM(turnover) AS turnover "
    "FROM enterprises GROUP BY CUBE (nace, size_class)",
    "SELECT region, education, COUNT(*) AS n "
    "FROM persons GROUP BY GROUPING SETS ((region), (education), ())",
    "SELECT sex, education, COUNT(*) AS n, AVG(income) AS income FROM persons "
    "WHERE age BETWEEN 18 AND 65 AND region IN ('R01', 'R02') AND NOT occupation IS NULL "
    "GROUP BY sex, education",
    "WITH adults AS (SELECT region, income, age FROM persons WHERE age >= 18) "
    "SELECT region, SUM(income) AS income, COUNT(*) AS n FROM adults GROUP BY region",
    "SELECT h.tenure, p.sex, COUNT(*) AS n, AVG(p.income) AS income, "
    "COUNT(DISTINCT h.household_id) AS hh "
    "FROM persons p JOIN households h ON p.household_id = h.household_id GROUP BY h.tenure, p.sex",
    "SELECT p.region, h.tenure, COUNT(DISTINCT p.household_id) AS households "
    "FROM persons p JOIN households h ON p.household_id = h.household_id "
    "GROUP BY p.region, h.tenure",
    # keyed by the households' record keys, looked up through the reference
    "SELECT region, COUNT(DISTINCT household_id) AS households FROM persons GROUP BY region",
    "SELECT r.name, r.population, COUNT(*) AS n "
    "FROM persons p JOIN regions r ON p.region = r.region GROUP BY r.name, r.population",
    "SELECT municipality, COUNT(*) AS n FROM persons GROUP BY municipality "
    "HAVING COUNT(*) > 30 ORDER BY n DESC, municipality LIMIT 5",
    # most cells are suppressed (NULL): DuckDB sorts NULLs last, Spark first unless told
    "SELECT municipality, COUNT(*) AS n FROM persons WHERE age > 90 GROUP BY municipality "
    "ORDER BY n, municipality LIMIT 10 OFFSET 2",
    "SELECT municipality, COUNT(*) AS n, RANK() OVER (ORDER BY COUNT(*)) AS rk "
    "FROM persons WHERE age > 85 GROUP BY municipality",
    "SELECT occupation, SUM(income) / COUNT(*) AS mean, COUNT(*) % 7 AS r, "
    "ROUND(AVG(income), 2) AS rounded, FLOOR(AVG(age) / 10) * 10 AS band, "
    "COALESCE(SUM(income), 0) AS s, GREATEST(COUNT(*), 100) AS g, LEAST(COUNT(*), 100) AS l, "
    "CASE WHEN COUNT(*) > 2000 THEN 'big' ELSE 'small' END AS size "
    "FROM persons GROUP BY occupation",
    "SELECT FLOOR(age / 10) * 10 AS band, COUNT(*) AS n FROM persons GROUP BY 1 ORDER BY 1",
    "SELECT region, SUM(size) AS s, SUM(size) / COUNT(*) AS mean_size "
    "FROM households GROUP BY region",
    "SELECT region, COUNT(*) AS n FROM persons GROUP BY region "
    "UNION ALL SELECT 'all', COUNT(*) FROM persons",
]

# The same on the demo policy as shipped (cell key method). Its trees join a ptable per
# aggregate, and Spark takes seconds to analyse each, so this list covers the shapes only:
# counts (exact cell keys), magnitudes (the flex function), a join, ORDER BY + LIMIT.
CKM_CROSS_ENGINE_QUERIES = [
    "SELECT region, COUNT(*) AS n FROM persons GROUP BY region",
    # checked as age IN (...) AND NOT region IN (...) (planner/connectors.fold_comparisons)
    "SELECT region, COUNT(*) AS n FROM persons WHERE ("
    + " OR ".join(f"age = {i}" for i in range(20, 40))
    + ") AND "
    + " AND ".join(f"region <> 'R{i:02d}'" for i in range(3, 20))
    + " GROUP BY region",
    "SELECT region, sex, COUNT(*) AS n, SUM(income) AS income, AVG(age) AS mean_age "
    "FROM persons GROUP BY ROLLUP (region, sex)",
    "SELECT r.name, COUNT(*) AS n FROM persons p JOIN regions r ON p.region = r.region "
    "GROUP BY r.name",
    "SELECT municipality, COUNT(*) AS n FROM persons GROUP BY municipality "
    "HAVING COUNT(*) > 30 ORDER BY n DESC, municipality LIMIT 5",
    "SELECT nace, SUM(turnover) AS turnover FROM enterprises GROUP BY ROLLUP (nace)",
    # a class of a unit-noised measure (classes_of): the class of x·m (s47d)
    "SELECT size_class, COUNT(*) AS n FROM enterprises WHERE employees < 50 GROUP BY size_class",
    # a LIMIT over doubles in a derived table: its rows in one spelling (rewrite/spelling.py)
    "SELECT x FROM (SELECT region, AVG(income) AS x FROM persons GROUP BY region ORDER BY x "
    "LIMIT 3) AS t",
    # a window frame over the cells (tests/security/test_window_frames.py)
    "SELECT age, COUNT(*) AS n, AVG(COUNT(*)) OVER (ORDER BY age ROWS BETWEEN 2 PRECEDING "
    "AND CURRENT ROW) AS ma FROM persons WHERE age < 30 GROUP BY age",
    # two outputs of one name, each returned (tests/security/test_redteam_s30b.py)
    "SELECT a.region, a.n, b.n FROM (SELECT region, COUNT(*) AS n FROM persons GROUP BY region) "
    "AS a JOIN (SELECT region, SUM(income) AS n FROM persons GROUP BY region) AS b "
    "ON a.region = b.region",
    # red team s30c: the households' keys looked up through persons.household_id (a LEFT JOIN
    # of the lookup) over rows of a multi-column filter checked as one AND with an IN list
    "SELECT region, COUNT(DISTINCT household_id) AS households FROM persons WHERE "
    + " OR ".join(f"(age = {i} AND sex = 'F')" for i in range(20, 40))
    + " GROUP BY ROLLUP (region)",
    # s43j: persons counted as a sum over households (window functions per cell and household)
    "SELECT p.region, h.size, COUNT(*) AS adults FROM persons p JOIN households h "
    "ON p.household_id = h.household_id WHERE p.age >= 18 GROUP BY p.region, h.size",
]


# --- fixtures ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def spark():
    session = local_session("sqlsdc-tests")
    yield session
    session.stop()


@pytest.fixture(scope="module")
def engine(spark):
    with SparkEngine(spark) as engine:
        yield engine


VALUES = """
CREATE TABLE vals AS SELECT * FROM (VALUES
 (1, 'a', 7,    2.50::DECIMAL(10,2),    2.5::DOUBLE,     'x',  4611686018427387904, 4294967295),
 (2, 'a', -7,  -2.50::DECIMAL(10,2),   -2.5::DOUBLE,     'y',  4611686018427387904, 0),
 (3, 'a', 0,    0.00::DECIMAL(10,2),    0.285::DOUBLE,   NULL, 5,                   17),
 (4, 'b', NULL, NULL,                   NULL,            'x',  NULL,                NULL),
 (5, 'b', 2147483646, 1234.55::DECIMAL(10,2), 3.5::DOUBLE, 'z', -4611686018427387904, 1),
 (6, 'b', -3,  -0.05::DECIMAL(10,2),   -0.0::DOUBLE,     'x',  -1,                  2),
 (7, 'c', 3,    1.05::DECIMAL(10,2),    1.005::DOUBLE,   'w',  2,                   3),
 (8, 'c', 10,   0.15::DECIMAL(10,2),    1e20::DOUBLE,    NULL, 3,                   4),
 (9, 'c', -2147483647, -0.15::DECIMAL(10,2), 'NaN'::DOUBLE, 'x', 9223372036854775807, 5),
 (10, 'd', 25,  12.35::DECIMAL(10,2),   2.675::DOUBLE,   'y',  -9223372036854775807, 6),
 (11, 'd', -15, -12.25::DECIMAL(10,2), -24.999999999999996::DOUBLE, 'y', 0, 7),
 (12, 'd', 1,   99.99::DECIMAL(10,2),   0.49999999999999994::DOUBLE, 'w', 1, 8)
) t(id, g, i, d, f, s, b, u);
ALTER TABLE vals ALTER u TYPE UINTEGER;
CREATE SCHEMA sqlsdc;
CREATE TABLE sqlsdc.ptable AS SELECT * FROM (VALUES
 (1, 0::UBIGINT, 2147483648::UBIGINT, -1), (1, 2147483648, 4294967296, 1),
 (2, 0, 1431655765, -1), (2, 1431655765, 2863311530, 0), (2, 2863311530, 4294967296, 2),
 (3, 0, 2147483648, -1), (3, 2147483648, 4294967296, 2)
) t(i, lo, hi, v);
CREATE TABLE keys AS SELECT range % 5 AS g, (4294967295 - range % 1000)::UINTEGER AS __rkey
FROM range(1000000);
CREATE TABLE huge AS SELECT 85070591730234615865843651857942052864::HUGEINT AS h;
"""


@pytest.fixture(scope="module")
def duck(engine):
    """A plain in-memory DuckDB with test tables, copied to Spark."""
    con = duckdb.connect()
    con.execute(VALUES)
    engine.load_duckdb(con, ["vals", "sqlsdc.ptable", "keys", "huge"])
    yield con
    con.close()


def parse(sql: str) -> exp.Expr:
    return sqlglot.parse_one(sql, read="duckdb")


def on_duckdb(con, tree: exp.Expr) -> pa.Table:
    return normalise_types(con.sql(to_sql(tree)).to_arrow_table())


def rows(table: pa.Table, ordered: bool) -> list[tuple]:
    result = list(zip(*[c.to_pylist() for c in table.columns], strict=True))
    if ordered:
        return result

    def key(row):
        return tuple(
            (v is None, isinstance(v, float) and math.isnan(v), 0 if v is None or v != v else v)
            for v in row
        )

    return sorted(result, key=key)


def same(a, b, rel_tol: float) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=rel_tol)
    return a == b


def assert_same(duck_result: pa.Table, spark_result: pa.Table, *, ordered: bool, rel_tol=0.0):
    """Same names, types and rows; floats equal (or within ``rel_tol`` where the order of
    additions may differ); NaN equals NaN."""
    assert spark_result.schema == duck_result.schema
    expected, got = rows(duck_result, ordered), rows(spark_result, ordered)
    assert len(got) == len(expected)
    names = duck_result.column_names
    for want, have in zip(expected, got, strict=True):
        bad = [n for n, a, b in zip(names, want, have, strict=True) if not same(a, b, rel_tol)]
        assert not bad, f"columns {bad} differ: DuckDB {want}, Spark {have}"


# --- (a) every portable function, on both engines ------------------------------------------------

SCALAR_CASES = [
    "ABS(i)", "ABS(d)", "ABS(f)", "-i", "-d", "-f",
    "LEAST(i, 3)", "LEAST(d, f)", "LEAST(i, NULL)", "GREATEST(i, d)", "GREATEST(f, 0)",
    "COALESCE(i, -1)", "COALESCE(s, 'none')", "COALESCE(d, f)", "NULLIF(i, 7)", "NULLIF(s, 'x')",
    "CASE WHEN i > 0 THEN 'pos' WHEN i < 0 THEN 'neg' END", "CASE g WHEN 'a' THEN d ELSE f END",
    "IF(i > 0, i, -i)",
    "CAST(i AS BIGINT)", "CAST(i AS DOUBLE)", "CAST(d AS DOUBLE)", "CAST(u AS DOUBLE)",
    "CAST(d AS INT)", "CAST(d AS BIGINT)", "CAST(CASE WHEN ABS(f) < 1e9 THEN f END AS INT)",
    "CAST(CASE WHEN ABS(f) < 1e9 THEN f / 2 END AS BIGINT)", "CAST(d AS DECIMAL(10, 1))",
    "CAST(i AS DECIMAL(12, 2))",
    "CAST(b AS DECIMAL(38, 0))", "CAST(i AS VARCHAR)", "CAST(d AS VARCHAR)", "CAST(s AS VARCHAR)",
    "CAST(i AS HUGEINT)", "CAST(d AS HUGEINT)", "CAST(NULL AS HUGEINT)",
    "CAST(CASE WHEN ABS(f) < 1e9 THEN f END AS HUGEINT)",
    "CAST(i > 0 AS VARCHAR)", "CAST(NULL AS VARCHAR)",
    "ROUND(f)", "ROUND(f, 2)", "ROUND(f, 1)", "ROUND(f, -1)", "ROUND(d)", "ROUND(d, 1)",
    "ROUND(d, -1)", "ROUND(CAST(i AS BIGINT), -1)", "ROUND(i, 2)",
    "FLOOR(f)", "CEIL(f)", "FLOOR(d)", "CEIL(d)", "FLOOR(i)", "CEIL(i / 2)", "SQRT(ABS(f))",
    "SQRT(i)", "ISNAN(f)", "ISNAN(f / 0)", "-f + CAST(0 AS DOUBLE)",
    "i + 1", "d - f", "i * d", "b - 1", "CAST(i AS BIGINT) * 2", "d * d",
    "i / 3", "i / 0", "d / i", "f / 0", "d / 0.5", "1 / f", "i / NULL", "b / 3",
    "i % 3", "i % -3", "d % 2", "f % 2", "b % 4294967296", "d % 0.2",
    "CAST(i AS BIGINT) // CAST(3 AS BIGINT)", "i // 3", "b // -2", "i IS NOT DISTINCT FROM 7",
    "i = 7", "i <> 7", "d > f", "d >= 0", "f < 1", "f <= f", "s <= 'x'", "f = f",
    "i > 0 AND d > 0", "i > 0 OR s = 'x'", "NOT i > 0", "i IS NULL", "NOT s IS NULL",
    "i IN (7, 0, NULL)", "s IN ('x', 'w')", "d IN (2.5, 0)", "i BETWEEN -3 AND 7",
    "f BETWEEN 0 AND 3",
]  # fmt: skip

AGGREGATE_CASES = [
    "COUNT(*)", "COUNT(i)", "COUNT(DISTINCT s)", "SUM(i)", "SUM(d)", "SUM(u)",
    "SUM(b) % 4294967296", "SUM(DISTINCT i)", "AVG(i)", "AVG(d)", "AVG(u)", "AVG(DISTINCT d)",
    "MIN(i)", "MAX(d)", "MIN(s)", "MAX(f)", "MIN(f)", "SUM(i) / COUNT(*)", "SUM(f)", "AVG(f)",
    "MAX(ABS(d), 2)[2]", "MAX(i, 3)[1]", "MAX(f, 6)[6]",
    "LIST_MAX(MIN(i, 2))", "LIST_MAX(MIN(d, 20))", "LIST_MAX(MIN(s, 1))", "LIST_MAX(MIN(f, 3))",
    # DP's COUNT(DISTINCT column): each unit's 2 smallest values, their distinct count; NULL
    # over no rows (where Spark's COLLECT_LIST is empty)
    "(SELECT LEN(LIST_DISTINCT(FLATTEN(ARRAY_AGG(k)))) FROM (SELECT LIST_SLICE(LIST_SORT("
    "LIST_DISTINCT(ARRAY_AGG(s))), 1, 2) AS k FROM vals GROUP BY i > 0))",
    "(SELECT LEN(LIST_DISTINCT(FLATTEN(ARRAY_AGG(k)))) FROM (SELECT LIST_SLICE(LIST_SORT("
    "LIST_DISTINCT(ARRAY_AGG(d))), 1, 1) AS k FROM vals WHERE i > 1000000000 GROUP BY g))",
]  # fmt: skip

GROUPING_CASES = ["GROUPING(g)", "GROUPING(g, s)", "GROUPING(s, g) * 10", "COUNT(*)"]

WINDOW_CASES = [
    "ROW_NUMBER() OVER (PARTITION BY g ORDER BY id)", "RANK() OVER (ORDER BY i)",
    "DENSE_RANK() OVER (ORDER BY s DESC)", "RANK() OVER (PARTITION BY g ORDER BY d DESC)",
    "SUM(i) OVER (PARTITION BY g)",
    "COUNT(*) OVER (ORDER BY i ROWS BETWEEN 1 PRECEDING AND CURRENT ROW)",
]  # fmt: skip


def select(expressions: list[str], tail: str, keys: str = "id") -> exp.Expr:
    columns = ", ".join(f"{e} AS c{n}" for n, e in enumerate(expressions))
    return parse(f"SELECT {keys}, {columns} FROM vals {tail}")


def test_every_portable_function_has_a_case():
    used = set()
    for case in SCALAR_CASES + AGGREGATE_CASES + WINDOW_CASES + GROUPING_CASES:
        used |= {type(n) for n in parse(f"SELECT {case} FROM vals GROUP BY CUBE (g, s)").walk()}
    assert PORTABLE_FUNCTIONS <= used, PORTABLE_FUNCTIONS - used


def with_names(table: pa.Table, cases: list[str]) -> pa.Table:
    keys = table.column_names[: table.num_columns - len(cases)]
    return table.rename_columns(keys + cases)  # failures name the expression


def test_scalar_functions_agree_exactly(engine, duck):
    tree = select(SCALAR_CASES, "ORDER BY id")
    assert_same(
        with_names(on_duckdb(duck, tree), SCALAR_CASES),
        with_names(engine.run(tree), SCALAR_CASES),
        ordered=True,
    )


def test_aggregates_agree(engine, duck):
    tree = select(AGGREGATE_CASES, "GROUP BY g", keys="g")
    assert_same(
        with_names(on_duckdb(duck, tree), AGGREGATE_CASES),
        with_names(engine.run(tree), AGGREGATE_CASES),
        ordered=False,
        rel_tol=1e-12,
    )


def test_window_functions_and_null_ordering_agree(engine, duck):
    tree = select(WINDOW_CASES, "ORDER BY i, id")  # NULL i: last in DuckDB, first in Spark
    assert_same(on_duckdb(duck, tree), engine.run(tree), ordered=True)
    for order in ("ORDER BY s DESC, id", "ORDER BY f, id", "ORDER BY d DESC NULLS FIRST, id"):
        tree = parse(f"SELECT id, s, f, d FROM vals {order}")
        assert_same(on_duckdb(duck, tree), engine.run(tree), ordered=True)
    qualified = parse("SELECT id, g FROM vals QUALIFY ROW_NUMBER() OVER (PARTITION BY g "
                      "ORDER BY i DESC, id) <= 2")  # fmt: skip
    assert_same(on_duckdb(duck, qualified), engine.run(qualified), ordered=False)


def test_grouping_with_several_arguments_is_a_bit_mask(engine, duck):
    tree = select(GROUPING_CASES, "GROUP BY CUBE (g, s)", keys="g, s")
    assert "GROUPING(g, s)" not in engine.sql(tree)  # Spark's GROUPING takes one argument
    assert_same(
        with_names(on_duckdb(duck, tree), GROUPING_CASES),
        with_names(engine.run(tree), GROUPING_CASES),
        ordered=False,
    )
    plain = select(GROUPING_CASES, "GROUP BY g, s", keys="g, s")  # 0 in DuckDB, Spark raises
    assert_same(on_duckdb(duck, plain), engine.run(plain), ordered=False)


def test_set_operations_agree(engine, duck):
    for sql in (
        "SELECT i FROM vals UNION SELECT 7",
        "SELECT g, COUNT(*) AS n FROM vals GROUP BY g UNION ALL SELECT 'all', COUNT(*) FROM vals",
    ):
        assert_same(on_duckdb(duck, parse(sql)), engine.run(parse(sql)), ordered=False)


def test_joins_agree(engine, duck):
    joins = {
        "inner": "JOIN vals AS b ON a.id = b.id + 3",
        "left": "LEFT JOIN vals AS b ON a.id = b.id + 3",
        "right": "RIGHT JOIN vals AS b ON a.id = b.id + 3",
        "full": "FULL JOIN vals AS b ON a.id = b.id + 3 AND a.g = b.g",
        "cross": "CROSS JOIN vals AS b",
    }
    sql = " UNION ALL ".join(
        f"SELECT '{kind}' AS kind, a.id AS a, b.id AS b FROM vals AS a {join}"
        for kind, join in joins.items()
    )
    sql += (" UNION ALL SELECT 'using', id, h FROM vals AS a "
            "JOIN (SELECT id, id * 2 AS h FROM vals WHERE id > 3) AS b USING (id)")  # fmt: skip
    assert_same(on_duckdb(duck, parse(sql)), engine.run(parse(sql)), ordered=False)


def test_division_follows_duckdb(engine, duck):
    """DuckDB divides as DOUBLE, with ±inf and NaN for zero divisors; Spark would raise."""
    tree = parse("SELECT id, i / 0 AS a, 1 / f AS b, d / 3 AS c FROM vals ORDER BY id")
    result = on_duckdb(duck, tree).to_pydict()
    assert result["a"][:2] == [math.inf, -math.inf] and math.isnan(result["a"][2])
    assert result["b"][5] == -math.inf  # 1 / -0.0
    assert_same(on_duckdb(duck, tree), engine.run(tree), ordered=True)
    with pytest.raises(SparkError, match="DIVIDE_BY_ZERO"):
        engine.session.sql("SELECT i / 0 FROM vals").collect()


def test_generator_semantics_are_read_from_duckdb_sql(engine, duck):
    """A LEAST built by a rewrite is NULL-propagating in DuckDB SQL (sqlglot writes a CASE) but
    not in Spark SQL; a safe division is NULLIF in DuckDB SQL only. The Spark SQL is derived from
    the DuckDB SQL, so both keep DuckDB's meaning."""
    least = exp.Least(this=exp.column("i"), expressions=[exp.Literal.number(3)])
    tree = exp.select(exp.column("id"), least.as_("l")).from_("vals").order_by("id")
    assert on_duckdb(duck, tree)["l"][3].as_py() is None  # id 4: i is NULL
    assert engine.session.sql(tree.sql("spark")).collect()[3].l == 3  # plain transpiling
    assert_same(on_duckdb(duck, tree), engine.run(tree), ordered=True)
    safe = exp.Div(this=exp.column("i"), expression=exp.column("i"), safe=True)
    tree = exp.select(exp.column("id"), safe.as_("q")).from_("vals").order_by("id")
    assert on_duckdb(duck, tree)["q"][2].as_py() is None  # id 3: 0 / NULLIF(0, 0)
    assert_same(on_duckdb(duck, tree), engine.run(tree), ordered=True)


def test_power_exp_and_ln_differ_in_the_last_bit(engine, duck):
    """Why POWER, EXP and LN are refused: DuckDB calls the C library, Spark Java's StrictMath, and
    a good share of results differ in the last bit (SQRT is exactly rounded in both)."""
    differ = {}
    for function in ("POWER(x, 3)", "EXP(x)", "LN(x)", "SQRT(x)"):
        duck_values = duck.sql(
            f"SELECT {function.replace('x', '(1 + range / 997)')} AS v FROM range(2000) "
            "ORDER BY range"
        ).fetchnumpy()["v"]
        spark_rows = engine.session.sql(
            f"SELECT {function.replace('x', '(1 + id / 997)')} AS v FROM range(2000) ORDER BY id"
        ).collect()
        differ[function] = sum(a != b.v for a, b in zip(duck_values, spark_rows, strict=True))
    assert differ["SQRT(x)"] == 0
    assert min(differ[f] for f in ("POWER(x, 3)", "EXP(x)", "LN(x)")) > 0, differ


# --- cell keys: exact integer sums --------------------------------------------------------------


def test_cell_keys_are_exact_on_a_million_32_bit_keys(engine, duck):
    """SUM(__rkey) % 2^32 over 200,000 keys near 2^32 per cell, the CKM cell key, then the
    ptable join in the `sqlsdc` schema: identical on both engines and equal to Python's sum."""
    tree = parse(
        "SELECT c.g, c.n, c.ckey, c.total, GREATEST(c.n + COALESCE(p.v, 0), 0) AS noisy "
        "FROM (SELECT g, COUNT(*) AS n, SUM(__rkey) % 4294967296 AS ckey, SUM(__rkey) AS total "
        "FROM keys GROUP BY g) AS c "
        "LEFT JOIN sqlsdc.ptable AS p ON LEAST(c.n, 3) = p.i AND c.ckey >= p.lo AND c.ckey < p.hi"
    )
    assert tables_read(tree) == {"keys", "sqlsdc.ptable"}
    duck_result, spark_result = on_duckdb(duck, tree), engine.run(tree)
    assert_same(duck_result, spark_result, ordered=False)
    exact = {g: sum(4294967295 - r % 1000 for r in range(g, 1_000_000, 5)) for g in range(5)}
    columns = [spark_result[c].to_pylist() for c in ("g", "ckey", "total")]
    for g, key, total in zip(*columns, strict=True):
        assert (key, total) == (exact[g] % 4294967296, exact[g])


def test_sums_beyond_two_to_the_63_stay_exact(engine, duck):
    """DuckDB sums BIGINT into HUGEINT; Spark into BIGINT, which overflows at 2^63: an error in
    ANSI mode, a silent wrap (and a negative cell key) without it. Summing DECIMAL(38, 0), as the
    engine does, is exact on both."""
    tree = parse("SELECT SUM(b) % 4294967296 AS k FROM vals WHERE g = 'a'")  # 2^63 + 5
    assert on_duckdb(duck, tree)["k"].to_pylist() == [5.0]
    assert engine.run(tree)["k"].to_pylist() == [5.0]
    assert "SUM(CAST(b AS DECIMAL(38, 0)))" in engine.sql(tree)
    raw = "SELECT SUM(b) % 4294967296 AS k FROM vals WHERE g = 'a'"
    with pytest.raises(SparkError, match="ARITHMETIC_OVERFLOW"):
        engine.session.sql(raw).collect()
    engine.session.conf.set(ANSI, "false")
    try:
        assert engine.session.sql(raw).collect()[0].k == -4294967291  # wrapped
        with pytest.raises(NotSupportedError, match="ansi.enabled was changed from true"):
            engine.run(tree)
    finally:
        engine.session.conf.set(ANSI, "true")


def test_decimal_products_keep_duckdbs_digits_and_legacy_settings_are_refused(engine, duck):
    """DuckDB multiplies DECIMAL(20, 10)s into DECIMAL(38, 20) (or raises); Spark, by default,
    rounds the product to 17 digits. The engine turns that off, and refuses a session that
    turns it back on or sets any spark.sql.legacy.* it does not pin."""
    tree = parse("SELECT CAST(1.0000000001 AS DECIMAL(20, 10)) * CAST(1.0000000001 AS "
                 "DECIMAL(20, 10)) AS p FROM vals WHERE id = 5")  # fmt: skip
    exact = [Decimal("1.00000000020000000001")]
    assert [row[0] for row in duck.sql(to_sql(tree)).fetchall()] == exact
    assert engine.run_exact(tree)["p"].to_pylist() == exact
    lossy = "spark.sql.decimalOperations.allowPrecisionLoss"
    engine.session.conf.set(lossy, "true")
    try:
        with pytest.raises(NotSupportedError, match=f"{lossy} was changed from false"):
            engine.run(tree)
    finally:
        engine.session.conf.set(lossy, "false")
    legacy = "spark.sql.legacy.timeParserPolicy"
    engine.session.conf.set(legacy, "LEGACY")
    try:
        with pytest.raises(NotSupportedError, match=f"sets {legacy}: a legacy meaning"):
            engine.run(tree)
    finally:
        engine.session.conf.unset(legacy)


@pytest.mark.parametrize("expression", ["b + b", "i + 2", "ROUND(i, -1)", "ABS(-2147483648)"])
def test_overflow_raises_on_both_engines(engine, duck, expression):
    tree = parse(f"SELECT {expression} AS x FROM vals")
    with pytest.raises(duckdb.OutOfRangeException):
        on_duckdb(duck, tree)
    with pytest.raises(OperationalError, match="failed on Spark; the engine's message is withheld"
                       ) as failure:  # fmt: skip
        engine.run(tree)
    assert "ARITHMETIC_OVERFLOW" in failure.value.detail  # for the audit log, never shown
    assert "ARITHMETIC_OVERFLOW" not in str(failure.value) and failure.value.__cause__ is None


def test_load_keeps_hidden_columns_and_exact_types(engine, duck):
    assert engine.schemas["vals"]["u"] == "bigint"  # UINTEGER
    assert engine.schemas["sqlsdc__ptable"]["hi"] == "decimal(20,0)"  # UBIGINT
    assert engine.schemas["keys"]["__rkey"] == "bigint"
    tree = parse("SELECT h, h % 1000 AS r FROM huge")
    assert engine.schemas["huge"]["h"] == "decimal(38,0)"  # HUGEINT, written exactly
    text = engine.session.sql("SELECT CAST(h AS STRING) AS t FROM huge").collect()[0].t
    assert text == str(2**126)
    assert_same(on_duckdb(duck, tree), engine.run(tree), ordered=False)


def test_hash_is_duckdbs_bit_for_bit(engine):
    """DuckDB's ``hash`` on Spark (the Arrow UDF of :mod:`sqlsdc.engines.duckdb_hash`), exact:
    every supported type alone and all together, with NULLs and edge values (the table of
    tests/test_duckdb_hash.py, copied by load_duckdb), over aggregates and computed values."""
    from test_duckdb_hash import make_table

    con = duckdb.connect()
    kinds = make_table(con, "hashed")
    engine.load_duckdb(con, ["hashed"])
    names = list(kinds)
    cases = [
        *(f"hash({n})" for n in names),
        f"hash({', '.join(names)})",
        f"hash({', '.join(reversed(names))})",
        "hash(c_uinteger, c_varchar, c_decimal1, c_varchar)",
        "hash(c_double - 1, c_integer > 0, CASE WHEN c_integer > 0 THEN c_varchar ELSE 'n' END)",
        "hash(NULL, c_bigint)",
    ]
    tree = parse(f"SELECT i, {', '.join(f'{c} AS h{j}' for j, c in enumerate(cases))} "
                 "FROM hashed ORDER BY i")  # fmt: skip
    grouped = parse("SELECT c_boolean, hash(MIN(c_uinteger), c_boolean, MAX(c_varchar)) AS h "
                    "FROM hashed GROUP BY c_boolean ORDER BY c_boolean")  # fmt: skip
    try:
        for query in (tree, grouped):
            want = con.execute(to_sql(query)).to_arrow_table()
            got = engine.session.sql(engine.sql(query)).toArrow()  # DECIMAL(20, 0): exact
            assert got.num_rows == want.num_rows > 0
            for j, name in enumerate(want.column_names[1:], start=1):
                assert got.schema.field(j).type == pa.decimal128(20, 0)
                expected = want.column(j).to_pylist()
                assert [int(v) for v in got.column(j).to_pylist()] == expected, name
    finally:
        con.close()


@pytest.mark.parametrize(
    ("column", "kind"),
    [("e", "ENUM('a', 'b')"), ("m", "TIMESTAMP_MS"), ("t", "TIMESTAMP_S"), ("b", "BLOB")],
)
def test_hash_of_a_type_copied_otherwise_is_refused(engine, column, kind):
    """A column whose copy on Spark hashes otherwise (an ENUM hashes its index in DuckDB and
    becomes a string; a TIMESTAMP_S counts seconds; ...) is refused, before Spark runs."""
    con = duckdb.connect()
    con.execute(f"CREATE TABLE odd AS SELECT 1 AS k, CAST(NULL AS {kind}) AS {column}")
    engine.load_duckdb(con, ["odd"])
    con.close()
    with pytest.raises(NotSupportedError, match=rf"not portable .*: hash of an? {re.escape(kind)}"):
        engine.sql(parse(f"SELECT hash(k, {column}) FROM odd"))
    assert engine.sql(parse("SELECT hash(k) FROM odd"))  # the INTEGER alone is hashed


def test_hash_arguments_are_typed_by_duckdb():
    """The hash of a value depends on its DuckDB type; computed values are hashed only when it
    is pinned and Spark computes the same bits (not through a DOUBLE conversion of more than 15
    digits, which DuckDB rounds twice)."""
    duckdb_types = {"t": {"a": "DECIMAL(20,2)", "b": "DECIMAL(8,2)", "h": "HUGEINT",
                          "i": "INTEGER", "s": "VARCHAR"}}  # fmt: skip
    schema = {"t": {"a": "decimal(20,2)", "b": "decimal(8,2)", "h": "decimal(38,0)",
                    "i": "int", "s": "string"}}  # fmt: skip
    hashed = "SELECT SQLSDC_DUCKDB_HASH(NAMED_STRUCT('a0', s, 'a1', h, 'a2', a)) FROM t"
    assert to_spark_sql(parse("SELECT hash(s, h, a) FROM t"), schema, duckdb_types) == hashed
    assert "HASH(NAMED_STRUCT('a0', CAST(b AS DOUBLE) - 1" in to_spark_sql(
        parse("SELECT hash(CAST(b AS DOUBLE) - 1) FROM t"), schema, duckdb_types
    )
    for argument, why in [
        ("CAST(a AS DOUBLE) - 1", "computed from a, of type DECIMAL"),
        ("CAST(h AS DOUBLE)", "computed from h, of type HUGEINT"),
        ("i * 2", "computed INTEGER"),
        ("s", "not copied with load_duckdb"),
    ]:
        known = duckdb_types if argument != "s" else None
        with pytest.raises(NotSupportedError, match=f"not portable to Spark: hash of .*{why}"):
            to_spark_sql(parse(f"SELECT hash({argument}) FROM t"), schema, known)


def test_hash_of_a_column_not_copied_from_duckdb_is_refused(engine):
    engine.register("plain", engine.session.createDataFrame([(1, "a")], "k long, s string"))
    with pytest.raises(NotSupportedError, match="not copied with load_duckdb"):
        engine.sql(parse("SELECT hash(k) FROM plain"))


# --- (b) refusals --------------------------------------------------------------------------------

REFUSED = [
    ("SELECT hash(i + 1) FROM vals", r"hash of a computed INTEGER"),
    ("SELECT hash(d * 2) FROM vals", r"hash of a computed DECIMAL"),
    ("SELECT g, hash(SUM(f)) FROM vals GROUP BY g", r"computed by the aggregate SUM"),
    ("SELECT hash() FROM vals", r"hash\(\) needs an argument"),
    ("SELECT md5(s) FROM vals", r"function md5\(\)"),
    ("SELECT random() FROM vals", r"function rand\(\)"),
    ("SELECT my_udf(i) FROM vals", r"function my_udf\(\)"),
    ("SELECT quantile_cont(f, 0.9) FROM vals", r"function (quantile|percentile)"),
    ("SELECT EXP(f) FROM vals", r"function exp\(\)"),
    ("SELECT LN(f) FROM vals", r"function ln\(\)"),
    ("SELECT POWER(f, 2) FROM vals", r"function pow"),
    ("SELECT f // 2 FROM vals", r"// of a DOUBLE"),
    ("SELECT i // -1 FROM vals", r"by an integer constant but 0 and -1"),
    ("SELECT i // i FROM vals", r"by an integer constant but 0 and -1"),
    ("SELECT ARRAY_AGG(s) FROM vals", r"lists are portable only as the distinct values"),
    ("SELECT LEN(s) FROM vals", r"lists are portable only as the distinct values"),
    (
        "SELECT LIST_SLICE(LIST_SORT(LIST_DISTINCT(ARRAY_AGG(f))), 1, 2) FROM vals",
        r"the distinct values of a DOUBLE",
    ),
    ("SELECT s LIKE 'x%' FROM vals", r"LIKE"),
    ("SELECT i % i FROM vals", r"divisor of % must be a non-zero constant"),
    ("SELECT f % 0 FROM vals", r"divisor of % must be a non-zero constant"),
    ("SELECT CAST(f AS DECIMAL(10, 2)) FROM vals", r"0\.285 → 0\.28"),
    ("SELECT CAST(f AS VARCHAR) FROM vals", r"1e\+20, Spark 1\.0E20"),
    ("SELECT CAST(s AS INT) FROM vals", r"accepts '2\.5'"),
    ("SELECT CAST(i AS DATE) FROM vals", r"only casts to INTEGER, BIGINT, HUGEINT, DOUBLE"),
    ("SELECT CAST(u AS UBIGINT) FROM vals", r"only casts to INTEGER, BIGINT, HUGEINT, DOUBLE"),
    ("SELECT CAST(i AS BOOLEAN) FROM vals", r"only casts to INTEGER, BIGINT, HUGEINT, DOUBLE"),
    ("SELECT CAST(f AS INT) FROM vals WHERE s = 1", r"compares a VARCHAR with a number"),
    ("SELECT CAST(s AS DOUBLE) FROM vals", r"a cast of a VARCHAR to DOUBLE is untested"),
    ("SELECT ROUND(f, i) FROM vals", r"integer constant"),
    ("SELECT SUM(s) FROM vals", r"SUM of a VARCHAR"),
    ("SELECT s = 1 FROM vals", r"compares a VARCHAR with a number"),
    ("SELECT i FROM vals GROUP BY ALL", r"GROUP BY ALL"),
    ("SELECT * FROM vals NATURAL JOIN vals AS w", r"joins with ON"),
    ("SELECT * FROM vals ANTI JOIN vals AS w ON vals.i = w.i", r"ANTI joins"),
    ("SELECT * FROM vals LEFT JOIN vals AS w USING (id)", r"only INNER joins .* USING"),
    ("SELECT * FROM vals JOIN vals AS w USING (id)", r"USING join's \* puts the key first"),
    ("SELECT * FROM vals QUALIFY ROW_NUMBER() OVER (ORDER BY id) = 1", r"QUALIFY .*\(no \*\)"),
    ("SELECT id FROM vals QUALIFY ROW_NUMBER() OVER (ORDER BY id) < 3 LIMIT 1", r"QUALIFY .*LIMIT"),
    ("SELECT DISTINCT ON (g) g FROM vals", r"DISTINCT ON"),
    ("SELECT i FROM vals WHERE i IN (SELECT 1)", r"IN with a list"),
    ("SELECT MAX(i, 2)[i] FROM vals", r"element of MAX\(x, n\) at a constant position"),
    ("SELECT MAX(i, 0) FROM vals", r"positive integer constant"),
    ("SELECT MIN(i, 2) FROM vals", r"only LIST_MAX\(MIN\(x, n\)\)"),
    ("SELECT LIST_MAX(MAX(i, 2)) FROM vals", r"only LIST_MAX\(MIN\(x, n\)\)"),
    ("SELECT LIST_MAX(MIN(i, 0)) FROM vals", r"positive integer constant"),
    ("SELECT i FROM other.main.vals", r"tables are named by schema and name only"),
]


@pytest.mark.parametrize(("sql", "message"), REFUSED, ids=[r[0][7:40] for r in REFUSED])
def test_unportable_queries_are_refused_before_spark_runs(engine, duck, sql, message):
    tree = parse(sql)
    with pytest.raises(NotSupportedError, match=message):
        to_spark_sql(tree, engine.schemas)  # pure: no session involved
    with pytest.raises(NotSupportedError, match=message):
        engine.run(tree)


def test_check_portable_names_the_function():
    with pytest.raises(NotSupportedError, match=r"function md5\(\) is not portable to Spark"):
        check_portable(parse("SELECT region, MIN(md5(region)) FROM persons GROUP BY 1"))
    check_portable(parse("SELECT region, COUNT(*) FROM persons GROUP BY region"))


def test_spark_refusals_name_functions_as_the_statement_wrote_them(ckm_db):
    """sqlglot reads ``substr`` as SUBSTRING; the engine re-reads the protected tree from its
    SQL (no meta), and its refusal named ``substring()``, a function the analyst never wrote."""
    sql = "SELECT substr(region, 1, 2) AS a, COUNT(*) FROM persons GROUP BY 1"
    with sqlsdc.connect(ckm_db, "analyst") as con:
        tree = con.explain(sql).tree
    for check in (check_portable, to_spark_sql):
        with pytest.raises(NotSupportedError, match=r"^function substr\(\) is not portable"):
            check(tree)


def test_read_as_duckdb_carries_only_unambiguous_written_names():
    text = "SELECT substr(a, 1, 2), ceiling(b), substring(c, 1, 2), substr(c, 1, 2) FROM t"
    tree = sqlglot.parse_one(text, read="duckdb")
    remember_names(list(tree.walk()), text)
    names = [written_name(n) for n in read_as_duckdb(tree).find_all(exp.Substring, exp.Ceil)]
    # SUBSTRING(c, 1, 2) was written two ways: neither name is carried
    assert sorted(map(str, names)) == ["None", "None", "ceiling", "substr"]


def test_type_dependent_rewrites_need_the_schema():
    with pytest.raises(NotSupportedError, match=r"unknown type \(pass the view schemas\)"):
        to_spark_sql(parse("SELECT CAST(x AS INT) FROM t"))
    assert to_spark_sql(parse("SELECT CAST(x AS INT) FROM t"), {"t": {"x": "double"}}) == (
        "SELECT CAST(BROUND(x) AS INT) FROM t"
    )


def test_view_names():
    assert view_name("persons") == "persons"
    assert view_name("main.persons") == "persons"
    assert view_name("sqlsdc.ptable_entries") == "sqlsdc__ptable_entries"
    sql = to_spark_sql(parse("SELECT p.v FROM sqlsdc.ptable_entries AS p"), {})
    assert sql == "SELECT p.v FROM sqlsdc__ptable_entries AS p"
    unaliased = to_spark_sql(parse("SELECT ptable.v FROM sqlsdc.ptable"), {})
    assert unaliased == "SELECT ptable.v FROM sqlsdc__ptable AS ptable"


def test_collated_text_is_refused(engine):
    """Spark compares and groups a UTF8_LCASE string case-insensitively ('a' = 'A'); DuckDB
    compares bytes: other groups, other cells."""
    frame = engine.session.sql("SELECT 'a' COLLATE UTF8_LCASE AS s")
    with pytest.raises(NotSupportedError, match="string collate UTF8_LCASE: Spark would compare"):
        engine.register("collated", frame)
    assert "collated" not in engine.schemas


def test_unregistered_tables_are_named(engine):
    with pytest.raises(ProgrammingError, match="table nowhere is not registered"):
        engine.run(parse("SELECT COUNT(*) FROM nowhere"))


def test_hardened_connections_cannot_be_copied(engine, tmp_path):
    con = open_database(tmp_path / "h.duckdb")
    con.execute("CREATE TABLE t AS SELECT 1 AS x")
    harden(con)
    try:
        with pytest.raises(Error, match="pass the database path instead"):
            engine.load_duckdb(con, ["t"])
    finally:
        con.close()


def test_core_imports_without_pyspark_and_engine_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "pyspark", None)  # `import pyspark` now fails
    spec = importlib.util.find_spec("sqlsdc.engines.spark")
    fresh = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fresh)  # a private copy of the module loads without PySpark
    with pytest.raises(NotSupportedError, match=r'pip install "sqlsdc\[spark\]"'):
        fresh.SparkEngine(object())


# --- (c) end to end: guarded queries on the demo database -----------------------------------------


def open_demo(source: Path, sqls: list[str], spark, folder: Path):
    """A private copy of a demo database, its protected trees, and a Spark engine of its own
    (temporary views belong to a session) holding the tables the trees read. Trees are taken
    and tables copied before the guarded connection stays open: DuckDB refuses a plain
    connection to a file that a hardened one holds."""
    path = folder / "demo.duckdb"
    shutil.copy(source, path)
    with sqlsdc.connect(path, "analyst") as con:
        queries = {sql: con.explain(sql) for sql in sqls}
    engine = SparkEngine(spark.newSession())
    engine.load_duckdb(path, sorted(set().union(*(tables_read(q.tree) for q in queries.values()))))
    return sqlsdc.connect(path, "analyst"), queries, engine


@pytest.fixture(scope="module")
def threshold_demo(spark, pristine_demo_db, tmp_path_factory):
    con, queries, engine = open_demo(
        pristine_demo_db, CROSS_ENGINE_QUERIES, spark, tmp_path_factory.mktemp("spark-threshold")
    )
    yield con, queries, engine
    con.close()
    engine.close()


@pytest.fixture(scope="module")
def ckm_demo(spark, ckm_db, tmp_path_factory):
    con, queries, engine = open_demo(
        ckm_db, CKM_CROSS_ENGINE_QUERIES, spark, tmp_path_factory.mktemp("spark-ckm")
    )
    yield con, queries, engine
    con.close()
    engine.close()


def assert_same_cells(demo, sql: str) -> None:
    con, queries, engine = demo
    query = queries[sql]
    ordered = query.tree.args.get("order") is not None and query.tree.args.get("limit") is not None
    spark_result = run_protected(con, engine, sql)
    duck_result = con.execute(sql).arrow()  # DuckDB's own types: Spark's answer has them
    assert spark_result.column_names == [c.name for c in query.columns]
    assert_same(duck_result, spark_result, ordered=ordered, rel_tol=1e-12)


ORPHAN_QUERIES = [
    "SELECT g, COUNT(DISTINCT hid) AS units FROM persons GROUP BY ROLLUP (g)",
    "SELECT g, COUNT(*) AS n, COUNT(DISTINCT hid) AS units FROM visits WHERE kind = 'o' GROUP BY g",
    "SELECT p.g, COUNT(DISTINCT p.h) AS units FROM (SELECT g, kind, hid AS h FROM persons) AS p "
    "WHERE p.kind <> 'a' GROUP BY p.g",
    "WITH v AS (SELECT g, hid FROM visits) SELECT g, COUNT(DISTINCT hid) AS units FROM v "
    "GROUP BY ROLLUP (g)",
]


def test_orphan_references_are_keyed_alike_on_spark(spark, tmp_path):
    """(Red team s30c, closed in session 38.) An orphan reference is keyed by the mix of
    DuckDB's ``hash`` of its value: Spark's hash UDF and the mix's integer arithmetic give
    DuckDB's keys, hence its cells (households, orphans and NULL references)."""
    from tests.security.test_redteam_s30c import CKM, named_db

    source = named_db(tmp_path / "named.duckdb", CKM)
    (tmp_path / "spark").mkdir()
    demo = open_demo(source, ORPHAN_QUERIES, spark, tmp_path / "spark")
    try:
        for sql in ORPHAN_QUERIES:
            assert_same_cells(demo, sql)
    finally:
        demo[0].close()
        demo[2].close()


@pytest.mark.parametrize("sql", CROSS_ENGINE_QUERIES, ids=lambda s: s[:60])
def test_guarded_queries_give_the_same_cells(threshold_demo, sql):
    assert_same_cells(threshold_demo, sql)


@pytest.mark.parametrize("sql", CKM_CROSS_ENGINE_QUERIES, ids=lambda s: s[:60])
def test_cell_key_method_gives_the_same_cells(ckm_demo, sql):
    assert_same_cells(ckm_demo, sql)


def test_sums_of_both_signs_are_taken_to_zero_alike(spark, tmp_path):
    """(s42j.) A CKM sum of both signs that its noise would leave under |x_delta|/2 is published
    as 0 (``mechanisms.ckm.REMAINDER_FLOOR``): the frame's CASE gives DuckDB's cells, bit for
    bit, on Spark (240 pinned cells below |x_delta|, a quarter of them 0)."""
    from tests.security.test_ckm_mixed_signs import build_ledger

    source = build_ledger(tmp_path / "ledger.duckdb")
    (tmp_path / "spark").mkdir()
    sql = (
        "SELECT cell, COUNT(*) AS n, SUM(amount) AS total FROM ledger WHERE tier <= 24 "
        "GROUP BY cell"
    )
    con, _queries, engine = open_demo(source, [sql], spark, tmp_path / "spark")
    try:
        duck_result = con.execute(sql).arrow()
        assert_same(duck_result, run_protected(con, engine, sql), ordered=False)
        assert sum(t == 0 for t in duck_result["total"].to_pylist()) >= 30
    finally:
        con.close()
        engine.close()


# Rounding (counts to 5, unbiased; magnitudes to 100, conventional, mean before sum): the
# rounded contributor counts, the DOUBLE quotient S·n̂/n and its HUGEINT multiple on both engines
ROUND_CROSS_ENGINE_QUERIES = [
    "SELECT municipality, COUNT(*) AS n, SUM(age) AS total FROM persons WHERE age = 94 "
    "GROUP BY municipality",
    "SELECT region, sex, COUNT(income) AS n, SUM(income) AS total, AVG(income) AS mean "
    "FROM persons GROUP BY ROLLUP (region, sex)",
]


@pytest.fixture(scope="module")
def round_demo(spark, rounded_template, tmp_path_factory):
    folder = tmp_path_factory.mktemp("spark-round")
    source = folder / "source.duckdb"
    shutil.copy(rounded_template, source)
    con, queries, engine = open_demo(source, ROUND_CROSS_ENGINE_QUERIES, spark, folder)
    yield con, queries, engine
    con.close()
    engine.close()


@pytest.mark.parametrize("sql", ROUND_CROSS_ENGINE_QUERIES, ids=lambda s: s[:60])
def test_rounding_gives_the_same_cells(round_demo, sql):
    assert_same_cells(round_demo, sql)


def test_suppressed_cells_are_null_on_spark_too(threshold_demo):
    con, queries, engine = threshold_demo
    sql = next(q for q in CROSS_ENGINE_QUERIES if "RANK()" in q)  # mostly suppressed counts
    spark_result = run_protected(con, engine, sql)
    assert spark_result["n"].null_count > 50
    assert spark_result["n"].null_count == con.execute(sql).arrow()["n"].null_count


# --- (d) every Spark release is recorded: audit log and ledger, as on DuckDB ----------------------

RECORDED = "SELECT region, sex, COUNT(*) AS n, SUM(income) AS income FROM persons GROUP BY ALL"


@pytest.fixture()
def recorded_demo(spark, ckm_db, tmp_path):
    """A private copy of the CKM demo with its tables on Spark; returns the path and a runner
    that opens a guarded connection, runs one statement on Spark and closes it again (the
    audit log and ledger are then read with a plain DuckDB connection)."""
    path = tmp_path / "demo.duckdb"
    shutil.copy(ckm_db, path)
    engine = SparkEngine(spark.newSession())
    engine.load_duckdb(path, ["persons", "regions", "sqlsdc.ptable_entries", "sqlsdc.ckm_mix"])

    def run(sql: str, user: str = "analyst"):
        with sqlsdc.connect(path, user) as con:
            return run_protected(con, engine, sql)

    yield path, run
    engine.close()


def catalog(path: Path, sql: str) -> list[tuple]:
    con = duckdb.connect(str(path), read_only=True)
    try:
        return con.sql(sql).fetchall()
    finally:
        con.close()


def last_audit(path: Path) -> tuple:
    return catalog(
        path,
        "SELECT query_id, user_name, decision, reason, fingerprint, sql_text, rows_returned "
        "FROM sqlsdc.audit ORDER BY query_id DESC LIMIT 1",
    )[0]


def ledger(path: Path, query_id: int) -> list[tuple]:
    return catalog(
        path,
        "SELECT user_name, fingerprint, cell, column_name, mechanism, status FROM sqlsdc.ledger "
        f"WHERE query_id = {query_id} ORDER BY cell, column_name",
    )


def test_spark_queries_are_audited_and_their_cells_ledgered_as_on_duckdb(recorded_demo):
    path, run = recorded_demo
    result = run(RECORDED)
    spark_id, user, decision, reason, fingerprint, sql, rows = last_audit(path)
    assert (user, decision, reason, sql) == ("analyst", "accepted", None, RECORDED)
    assert rows == result.num_rows
    with sqlsdc.connect(path, "analyst") as con:
        assert fingerprint == con.explain(RECORDED).fingerprint
        duck_id = con.execute(RECORDED).query_id
    spark_cells, duck_cells = ledger(path, spark_id), ledger(path, duck_id)
    assert len(spark_cells) == 2 * result.num_rows  # one row per released cell
    assert spark_cells == duck_cells  # same identity, column, mechanism and status
    assert {c[4] for c in spark_cells} == {"ckm"}


@pytest.mark.parametrize(
    "sql, error, match",
    [
        ("SELECT person_id, income FROM persons", sqlsdc.PolicyViolation, "row-level"),
        ("SELECT region, COUNT(*) FROM persons WHERE municipality LIKE 'M1%' GROUP BY region",
         NotSupportedError, "not portable to Spark"),
    ],
)  # fmt: skip
def test_spark_refusals_are_audited_and_release_nothing(recorded_demo, sql, error, match):
    path, run = recorded_demo
    with pytest.raises(error, match=match):
        run(sql)
    query_id, user, decision, reason, _fp, logged, rows = last_audit(path)
    assert (user, decision, logged, rows) == ("analyst", "refused", sql, None)
    assert reason and ledger(path, query_id) == []


def test_spark_failures_are_audited_failed_with_sparks_message(recorded_demo):
    path, run = recorded_demo
    sql = "SELECT region, COUNT(*) * 9223372036854775807 AS n FROM persons GROUP BY region"
    with pytest.raises(OperationalError, match="failed on Spark; the engine's message is withheld"):
        run(sql)
    query_id, user, decision, reason, fingerprint, logged, _rows = last_audit(path)
    assert (user, decision, logged) == ("analyst", "failed", sql)
    assert "overflow" in reason.lower() and fingerprint
    assert ledger(path, query_id) == []


# --- differential privacy on Spark -----------------------------------------------------------

DP_CROSS_ENGINE_QUERIES = [
    "SELECT region, COUNT(*) AS n FROM persons GROUP BY region",
    # checked as age IN (...) AND NOT region IN (...) (planner/connectors.fold_comparisons)
    "SELECT region, COUNT(*) AS n FROM persons WHERE ("
    + " OR ".join(f"age = {i}" for i in range(20, 40))
    + ") AND "
    + " AND ".join(f"region <> 'R{i:02d}'" for i in range(3, 20))
    + " GROUP BY region",
    "SELECT sex, SUM(income) AS s, COUNT(income) AS c, AVG(income) AS a FROM persons "
    "WHERE age >= 30 GROUP BY sex",
    "SELECT region, sex, AVG(income) AS a FROM persons WHERE age < 60 GROUP BY region, sex",
    "SELECT sex, STDDEV(income) AS sd FROM persons GROUP BY sex",  # squares summed in HUGEINT
    # several rows per person: private groups, each person's 2 groups of smallest
    # hash(record key, clinic) (DuckDB's hash, computed on Spark), 5 rows' worth per group
    "SELECT clinic, COUNT(*) AS n FROM visits GROUP BY clinic",
    "SELECT clinic, SUM(cost) AS s, AVG(cost) AS a, STDDEV(cost) AS sd FROM visits GROUP BY clinic",
    # a join: bounded per (person, group), the group kept by the smallest hash (public keys)
    "SELECT l.label, COUNT(*) AS n FROM persons p JOIN lookup l ON p.region = l.code "
    "GROUP BY l.label",
    # lists of each person's distinct values (at most max_rows), counted per cell
    "SELECT COUNT(DISTINCT clinic) AS c FROM visits",
    "SELECT region, COUNT(DISTINCT age) AS a FROM persons GROUP BY region",
]

# A table of payments (many rows per person) over public domains, with a cap on each
# person's rows over the whole query (dp.max_rows_per_unit): its rows chosen by
# hash(record key, keys, measures) of INTEGER, VARCHAR and DECIMAL columns.
PAYMENTS = """
CREATE TYPE kind AS ENUM ('x', 'y');
CREATE TABLE payments AS SELECT
  CAST(hash(range) % 400 AS BIGINT) AS pid,
  CAST(hash(range, 1) % 12 + 1 AS INTEGER) AS month,
  ['child', 'housing', 'other'][CAST(hash(range, 2) % 3 + 1 AS INTEGER)] AS scheme,
  CAST(['x', 'y'][CAST(hash(range, 3) % 2 + 1 AS INTEGER)] AS kind) AS kind,
  CAST(CAST(hash(range, 4) % 360000 AS DOUBLE) / 100 - 100 AS DECIMAL(8, 2)) AS amount
FROM range(5000)
"""

PAYMENTS_POLICY = {
    "tables": {
        "payments": {
            "privacy_unit": "pid",
            "columns": {
                "pid": {"role": "identifier"},
                "month": {"role": "dimension", "domain": list(range(1, 13))},
                "scheme": {"role": "dimension", "domain": ["child", "housing", "other"]},
                "kind": {"role": "dimension", "domain": ["x", "y"]},
                "amount": {"role": "measure", "bounds": [0, 3000]},
            },
            "protection": {
                "counts": {"method": "dp", "spend": {"epsilon": "1/10"}},
                "magnitudes": {"method": "dp", "spend": {"epsilon": "1/5"}},
            },
            "dp": {"max_groups": 2, "max_rows": 3, "max_rows_per_unit": 6, "granularity": 1},
        }
    },
    "users": {
        "admin": {"role": "admin"},
        "ana": {"role": "analyst"},
        "bob": {"role": "analyst"},
    },  # fmt: skip
    "budgets": [{"user": "*", "epsilon": 1000}],
}

PAYMENTS_QUERIES = [
    "SELECT month, COUNT(*) AS n, SUM(amount) AS s FROM payments GROUP BY month",
    "SELECT scheme, month, AVG(amount) AS a FROM payments WHERE month <= 6 GROUP BY scheme, month",
    "SELECT COUNT(*) AS n, SUM(amount) AS s FROM payments",
    # hash(record key, scheme) alone: a person's rows of one scheme tie, and the cap numbers
    # them (dp_bounding.numbered_ties) in an order each engine chooses (s45k)
    "SELECT scheme, COUNT(*) AS n FROM payments GROUP BY scheme",
]


@pytest.fixture(scope="module")
def dp_on_spark(spark, tmp_path_factory):
    """The DP test database of test_dp_query (one row per person in ``persons``), on Spark."""
    from test_dp_query import dp_document, make_db

    path = tmp_path_factory.mktemp("dp-spark") / "dp.duckdb"
    make_db(path, dp_document())
    engine = SparkEngine(spark.newSession())
    engine.load_duckdb(path, ["persons", "visits", "lookup"])
    yield path, engine
    engine.close()


def spent(path: Path, user: str) -> list[tuple]:
    return catalog(path, f"SELECT epsilon, rho, cells FROM sqlsdc.budget_spend "
                         f"WHERE user_name = '{user}' ORDER BY seq")  # fmt: skip


@pytest.fixture(scope="module")
def payments_on_spark(spark, tmp_path_factory):
    path = tmp_path_factory.mktemp("dp-payments") / "payments.duckdb"
    raw = duckdb.connect(str(path))
    raw.execute(PAYMENTS)
    raw.close()
    sqlsdc.init(path, PAYMENTS_POLICY)
    engine = SparkEngine(spark.newSession())
    engine.load_duckdb(path, ["payments"])
    yield path, engine
    engine.close()


@pytest.mark.parametrize("sql", DP_CROSS_ENGINE_QUERIES)
def test_dp_cells_on_spark_are_duckdbs_charged_and_recorded_the_same(dp_on_spark, sql):
    assert_same_dp_release(*dp_on_spark, sql)


@pytest.mark.parametrize("sql", PAYMENTS_QUERIES)
def test_dp_cells_of_capped_rows_on_spark_are_duckdbs(payments_on_spark, sql):
    assert_same_dp_release(*payments_on_spark, sql)


def assert_same_dp_release(path: Path, engine: SparkEngine, sql: str) -> None:
    """Another user asks on Spark what ``ana`` asked on DuckDB: the same exact cells, the same
    identities, hence the same noise; each pays for them, and the ledger holds the same cells."""
    with sqlsdc.connect(path, "ana") as con:
        cursor = con.execute(sql)
        on_duckdb, duck_id = sorted(cursor.fetchall()), cursor.query_id
    with sqlsdc.connect(path, "bob") as con:
        result = run_protected(con, engine, sql)
    on_spark = sorted(zip(*(c.to_pylist() for c in result.columns), strict=True))
    assert on_spark == on_duckdb
    spark_id = last_audit(path)[0]
    assert last_audit(path)[1:3] == ("bob", "accepted")
    assert spent(path, "bob")[-1] == spent(path, "ana")[-1]
    strip = [cell[1:] for cell in ledger(path, spark_id)]
    assert strip == [cell[1:] for cell in ledger(path, duck_id)] and strip


def test_dp_stages_spark_cannot_run_are_refused_before_anything_is_charged(dp_on_spark):
    assert_refused_unpaid(*dp_on_spark, "SELECT sex, LN(COUNT(*)) FROM persons GROUP BY sex")


def test_dp_stages_hashing_a_type_spark_copies_otherwise_are_refused_unpaid(payments_on_spark):
    """An ENUM hashes as its index in DuckDB and is a string in Spark's copy."""
    assert_refused_unpaid(*payments_on_spark, "SELECT kind, COUNT(*) FROM payments GROUP BY kind")


def assert_refused_unpaid(path: Path, engine: SparkEngine, sql: str) -> None:
    before = spent(path, "bob")
    with sqlsdc.connect(path, "bob") as con:
        with pytest.raises(NotSupportedError, match="not portable to Spark"):
            run_protected(con, engine, sql)
    assert spent(path, "bob") == before
    assert last_audit(path)[1:3] == ("bob", "refused")


def test_sums_over_spark_data_holding_nan_are_refused_before_anything_is_charged(
    dp_on_spark, spark
):
    """Spark's copy of the data is scanned (sqlsdc.guard.summable), once per registration."""
    path, _engine = dp_on_spark
    engine = SparkEngine(spark.newSession())
    schema = "pid long, region string, income double"
    frame = engine.session.createDataFrame  # its views are the session's
    engine.register("persons", frame([(1, "N", float("nan"))], schema))
    before = spent(path, "bob")
    sql = "SELECT region, SUM(income) FROM persons GROUP BY region"
    with sqlsdc.connect(path, "bob") as con:
        with pytest.raises(sqlsdc.PolicyViolation, match="persons.income holds values that no"):
            run_protected(con, engine, sql)
    assert last_audit(path)[1:3] == ("bob", "refused")
    engine.register("persons", frame([(1, "N", 2.0)], schema))
    with sqlsdc.connect(path, "bob") as con:
        with pytest.raises(NotSupportedError, match="copied with load_duckdb"):  # scanned again
            run_protected(con, engine, sql)
    assert spent(path, "bob") == before
    engine.close()


def test_a_view_replaced_through_the_session_is_read_and_scanned_again(spark, tmp_path):
    """(s41h.) The scans for NaN and infinities were dropped only by ``register()``: a copy's
    view replaced through the session, with a NaN in one person's row, kept the scan of the
    rows before, and the sum showed NaN in exactly the cell holding it (as did a BIGINT column
    replaced by a DOUBLE one: its schema was the one registered). The view's plan and files
    now tell that it changed: its schema is read and its columns scanned again."""
    from tests.security.test_redteam_s28e import ckm_table

    path = tmp_path / "s.duckdb"
    ckm_table(path, "m DOUBLE, k BIGINT", "i / 4, i").close()
    engine = SparkEngine(spark.newSession())
    engine.load_duckdb(path, ["t", "sqlsdc.ckm_mix", "sqlsdc.ptable_entries"])
    nan = "IF(pid = 7, double('NaN'), {0}) AS {0}"
    try:
        with sqlsdc.connect(path, user="analyst") as con:
            for column in ("m", "k"):
                sql = f"SELECT g, SUM({column}) AS s FROM t GROUP BY g"
                assert not any(
                    math.isnan(v) for v in run_protected(con, engine, sql)["s"].to_pylist()
                )
            replaced = f"SELECT pid, g, {nan.format('m')}, k, __rkey FROM t"
            engine.session.sql(replaced).createOrReplaceTempView("t")
            with pytest.raises(sqlsdc.PolicyViolation, match="t.m holds values that no"):
                run_protected(con, engine, "SELECT g, SUM(m) FROM t GROUP BY g")
            replaced = f"SELECT pid, g, m, {nan.format('k')}, __rkey FROM t"
            engine.session.sql(replaced).createOrReplaceTempView("t")
            with pytest.raises(sqlsdc.NotSupportedError, match="t.k is double where"):
                run_protected(con, engine, "SELECT g, SUM(k) FROM t GROUP BY g")
    finally:
        engine.close()


def test_spark_data_typed_other_than_the_database_is_not_summed(spark, tmp_path):
    """(Red team s29.) The guard types queries by the database's schema, so a BIGINT measure
    is not scanned; Spark's registered copy held it as DOUBLE with one NaN, and only the cell
    holding it was NaN. Such a copy is now refused (load_duckdb copies the database's types)."""
    from tests.security.test_redteam_s28e import ckm_table

    path = tmp_path / "s.duckdb"
    ckm_table(path, "m BIGINT", "i").close()
    engine = SparkEngine(spark.newSession())
    engine.load_duckdb(path, ["t", "sqlsdc.ckm_mix", "sqlsdc.ptable_entries"])
    sql = "SELECT g, SUM(m) FROM t GROUP BY g"
    try:
        with sqlsdc.connect(path, user="analyst") as con:
            assert [g for g, _s in zip(*run_protected(con, engine, sql).columns[:2], strict=True)]
            copy = "SELECT pid, g, IF(pid = 7, double('NaN'), double(m)) AS m, __rkey FROM t"
            engine.register("t", engine.session.sql(copy))
            refused = "Spark's copy of t.m is double where the database stores BIGINT"
            with pytest.raises(sqlsdc.NotSupportedError, match=refused):
                run_protected(con, engine, sql)
    finally:
        engine.close()


def test_dp_on_spark_needs_tables_copied_from_duckdb(dp_on_spark, spark):
    path, _engine = dp_on_spark
    engine = SparkEngine(spark.newSession())
    engine.register("persons", spark.createDataFrame([(1, "N")], "pid long, region string"))
    with sqlsdc.connect(path, "bob") as con:
        with pytest.raises(NotSupportedError, match="copied with load_duckdb"):
            run_protected(con, engine, "SELECT region, COUNT(*) FROM persons GROUP BY region")
    engine.close()


def test_a_cached_duckdb_answer_is_sparks_answer(spark, tmp_path):
    """(Red team s27b.) ana asks on DuckDB twice on one connection (the second from the
    cache), then on Spark on that held connection (whose key types are DuckDB's: Spark's path
    computes its cells), then bob on Spark. Safe: one answer on both engines, and Spark's run
    charged nothing new for ana (her cells were paid)."""
    from test_dp_query import dp_document, make_db

    path = tmp_path / "dp.duckdb"
    make_db(path, dp_document())
    sql = "SELECT region, COUNT(*) AS n FROM persons GROUP BY region"
    with SparkEngine(spark.newSession()) as engine:
        engine.load_duckdb(path, ["persons"])
        with sqlsdc.connect(path, "ana") as con:
            first = sorted(con.execute(sql).fetchall())
            assert sorted(con.execute(sql).fetchall()) == first
            on_spark = run_protected(con, engine, sql)
            assert sorted(zip(*(c.to_pylist() for c in on_spark.columns), strict=True)) == first
        assert catalog(path, "SELECT user_name, count(*) FROM sqlsdc.budget_spend "
                             "GROUP BY 1") == [("ana", 1)]  # fmt: skip
        with sqlsdc.connect(path, "bob") as con:
            on_spark = run_protected(con, engine, sql)
    assert sorted(zip(*(c.to_pylist() for c in on_spark.columns), strict=True)) == first


def test_a_copy_registered_under_another_case_is_checked_against_the_database_types(
    spark, tmp_path
):
    """(Red team s29b.) The policy's table ``Tab``, Spark's copy registered as ``TAB`` and
    queried as ``tab`` or ``"Tab"``: one table to the type check, so a DOUBLE copy with a NaN
    of a BIGINT column is refused however the names are written."""
    import duckdb

    from tests.security.test_redteam_s28e import CKM

    path = tmp_path / "s.duckdb"
    raw = duckdb.connect(str(path))
    raw.execute("CREATE TABLE Tab AS SELECT i AS pid, CASE WHEN i % 2 = 0 THEN 'a' ELSE 'b' END "
                "AS g, i::BIGINT AS m FROM range(200) AS r(i)")  # fmt: skip
    raw.close()
    columns = {"pid": {"role": "identifier"}, "m": {"role": "measure"},
               "g": {"role": "dimension", "domain": ["a", "b"]}}  # fmt: skip
    users = {"analyst": {"role": "analyst"}, "admin": {"role": "admin"}}
    table = {"privacy_unit": "pid", "columns": columns, "protection": CKM}
    sqlsdc.init(path, {"tables": {"Tab": table}, "users": users})
    engine = SparkEngine(spark.newSession())
    engine.load_duckdb(path, ["Tab", "sqlsdc.ckm_mix", "sqlsdc.ptable_entries"])
    copy = "SELECT pid, g, IF(pid = 7, double('NaN'), double(m)) AS m, __rkey FROM tab"
    engine.register("TAB", engine.session.sql(copy))
    try:
        with sqlsdc.connect(path, user="analyst") as con:
            for table in ("tab", "Tab", '"Tab"', "TAB"):
                with pytest.raises(sqlsdc.NotSupportedError, match="tab.m is double"):
                    run_protected(con, engine, f"SELECT g, SUM(m) FROM {table} GROUP BY g")
    finally:
        engine.close()
