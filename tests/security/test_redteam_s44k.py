"""Red team s44k: the Spark engine path (``engines/spark*.py``, ``guard/spark.py``).

Attacked as the analyst of the demo (5,000 and 20,000 persons, the demo's CKM policy), with
``run_protected`` on a local Spark session (JDK 17, Spark 4.3, ``local[1]``) beside the DuckDB
path over the same file, and through the translation alone (no JVM needed).

Every attack tried, one line each (W: worked, fixed here; H: held):

- W  nested rewrites multiply: Spark's ``a / b`` reads ``b`` three times and ``a`` twice
     (IEEE division), ``ROUND(x, n)`` of a DOUBLE reads ``x`` three times, ``FLOOR``/``CEIL``
     twice, so each nesting level tripled the tree. A 200-character condition the guard
     accepts (``age`` over ten nested divisions, in 0.04 s) became 7 MB of Spark SQL after
     63 s of CPU, 12 levels ~10 min, 14 levels ~1.5 h, holding the connection and the GIL
     before anything ran (a left-deep ``x / 2 / 2 / ...`` doubles per level). Fixed: the
     rewrites count the nodes they create and refuse past 8 times the tree (+20,000 nodes):
     any nesting is refused in under 1 s of CPU.
- H  error oracles on Spark only, through the portable functions on the demo's dimensions
     (age, region, sex, occupation): SQRT, IEEE division by 0 and -0.0, ``%`` and ``//`` by
     constants, FLOOR/CEIL, ROUND(x, n), CAST to VARCHAR/DOUBLE, BETWEEN on text, IN lists
     mixing INTEGER, DECIMAL and DOUBLE literals: 29 queries, every one refused by the guard
     on both engines (functions of measures in conditions, non-total casts) or the same
     cells on both (CKM cell keys included); VARCHAR = number refused on Spark only (static).
- H  comments carried into the protected SQL: sqlglot writes ``*/`` as ``* /`` and ``/*`` as
     ``/ *``, so a ``-- /*`` comment does not open a nested comment on Spark (or DuckDB, which
     nests them too) and swallows no part of the protection (3 queries).
- H  backslashes in text literals (``'\\R01'``): written ``'\\\\R01'`` for Spark, whose
     literals unescape, so the same text is compared on both engines.
"""

from __future__ import annotations

import shutil
import time

import duckdb
import pytest

import sqlsdc
from sqlsdc.engines.spark_translate import to_spark_sql
from sqlsdc.errors import NotSupportedError


@pytest.fixture(scope="module")
def demo(pristine_demo_db, tmp_path_factory):
    """A guarded analyst connection to a copy of the demo, and the Spark schema of the views
    a protected tree reads (what SparkEngine.load_duckdb registers)."""
    path = tmp_path_factory.mktemp("s44k") / "demo.duckdb"
    shutil.copy(pristine_demo_db, path)
    raw = duckdb.connect(str(path), read_only=True)
    try:
        schema = {
            view: {c.lower(): str(t).lower() for c, t in zip(rel.columns, rel.types, strict=True)}
            for view, rel in (
                ("persons", raw.table("persons")),
                ("sqlsdc__ptable_entries", raw.table("sqlsdc.ptable_entries")),
            )
        }
    finally:
        raw.close()
    with sqlsdc.connect(path, "analyst") as con:
        yield con, schema


def nested(levels: int, make) -> str:
    value = "CAST(age AS DOUBLE)"
    for _ in range(levels):
        value = make(value)
    return f"SELECT sex, COUNT(*) AS n FROM persons WHERE {value} > 0.5 GROUP BY sex"


NESTINGS = {
    "divisor": lambda v: f"(CAST(age AS DOUBLE) / {v})",
    "round": lambda v: f"ROUND({v}, 1)",
    "floor": lambda v: f"FLOOR({v})",
    "chain": lambda v: f"{v} / 2",
}


@pytest.mark.parametrize("shape", sorted(NESTINGS))
def test_nested_rewrites_do_not_blow_up_the_spark_translation(demo, shape):
    """(Red team s44k.) Fails on main: eight nested divisions (or ROUNDs) were translated, in
    6.8 s of CPU, into 780 KB of Spark SQL (three times the size per level: ten levels 63 s and
    7 MB, twelve ~10 min); a left-deep chain of divisions doubled per level. Now refused before
    the tree grows past 8 times its size, in well under a second per shape."""
    con, schema = demo
    levels = 12 if shape == "chain" else 8
    tree = con.explain(nested(levels, NESTINGS[shape])).tree  # the guard accepts it
    start = time.process_time()
    with pytest.raises(NotSupportedError, match="nest fewer"):
        to_spark_sql(tree, schema)
    assert time.process_time() - start < 3.0


@pytest.mark.parametrize("shape", sorted(NESTINGS))
def test_a_few_nested_rewrites_still_translate(demo, shape):
    """Two or three levels (what a query writes) still run on Spark, within the bound."""
    con, schema = demo
    query = con.explain(nested(3, NESTINGS[shape]))
    spark_sql = to_spark_sql(query.tree, schema)
    assert len(spark_sql) < 8 * len(query.sql) + 20_000  # spark_semantics.GROWTH, SLACK
