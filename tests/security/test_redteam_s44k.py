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
- W  a Spark answer had no row cap: the DuckDB path abandons an answer past 1,000,000 rows
     or 64 MiB (the memory of a process a server shares), Spark's was collected whole into the
     driver (four copies of the 95 age cells cross-joined: 8e7 rows; the guard accepts cross
     joins of released cells). Fixed: run_exact collects at most the cap plus one row and
     refuses past it or past the bytes (AnswerTooLarge, audited refused as on DuckDB since s44q).
- H  error oracles on Spark only, through the portable functions on the demo's dimensions
     (age, region, sex, occupation): SQRT, IEEE division by 0 and -0.0, ``%`` and ``//`` by
     constants, FLOOR/CEIL, ROUND(x, n), CAST to VARCHAR/DOUBLE, BETWEEN on text, IN lists
     mixing INTEGER, DECIMAL and DOUBLE literals: 29 queries, every one refused by the guard
     on both engines (functions of measures in conditions, non-total casts) or the same
     cells on both (CKM cell keys included); VARCHAR = number refused on Spark only (static).
- H  one DP cell identity, two exact values (the noise is the same on both engines): 6 DP
     queries over ``benefits`` (counts, SUM and AVG of amount, COUNT(DISTINCT), conditions
     ``month // 3``, ``CAST(month AS DOUBLE) / 7``, ``CAST(month AS VARCHAR) > '5'``, text
     BETWEEN) asked on DuckDB over one copy and on Spark over another (same secret): equal
     noisy cells; 3 computed group keys (``month % 5``, ``/ 3``, ``ROUND(.., 1)``) refused
     alike by both for want of a public domain.
- H  comments carried into the protected SQL: sqlglot writes ``*/`` as ``* /`` and ``/*`` as
     ``/ *``, so a ``-- /*`` comment does not open a nested comment on Spark (or DuckDB, which
     nests them too) and swallows no part of the protection (3 queries).
- H  backslashes in text literals (``'\\R01'``): written ``'\\\\R01'`` for Spark, whose
     literals unescape, so the same text is compared on both engines.
"""

from __future__ import annotations

import os
import shutil
import sys
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


def _spark_or_skip():
    """A local Spark session (one JVM, as tests/test_spark.py starts), or the test is skipped
    cleanly without PySpark or a JDK."""
    pytest.importorskip("pyspark", reason="the Spark tests need the spark extra")
    java_home = os.environ.get("JAVA_HOME", "/nonexistent")
    if not (shutil.which("java") or os.path.exists(os.path.join(java_home, "bin", "java"))):
        pytest.skip("the Spark tests need a JDK (java on PATH or JAVA_HOME)")
    sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))
    from spark_session import local_session

    return local_session("sqlsdc-s44k")


@pytest.mark.slow  # a JVM
@pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas:FutureWarning")
def test_a_spark_answer_has_the_row_cap_of_a_duckdb_answer(pristine_demo_db, tmp_path, monkeypatch):
    """(Red team s44k.) Fails on main: a cross join of released cells was collected whole into
    Spark's driver (the DuckDB path abandons an answer past MAX_ANSWER_ROWS, 1,000,000: four
    copies of the 95 age cells are 8e7 rows, in the memory of a process a server shares).
    With the cap lowered to 1,000, two copies (95 x 95 = 9,025 rows) are refused, audited, and
    one copy still answers."""
    import sqlsdc.guard.spark as guarded_spark
    from sqlsdc.engines.spark import SparkEngine
    from sqlsdc.engines.spark_translate import tables_read
    from sqlsdc.errors import AnswerTooLarge

    cells = "(SELECT age, COUNT(*) AS n FROM persons GROUP BY age)"
    crossed = f"SELECT a.age, b.age AS age2, a.n FROM {cells} AS a CROSS JOIN {cells} AS b"
    path = tmp_path / "demo.duckdb"
    shutil.copy(pristine_demo_db, path)
    with sqlsdc.connect(path, "analyst") as con:
        read = tables_read(con.explain(crossed).tree)
        assert len(con.execute(cells[1:-1]).fetchall()) < 1_000  # one copy fits the cap
    session = _spark_or_skip()
    monkeypatch.setattr(guarded_spark, "MAX_ANSWER_ROWS", 1_000, raising=False)
    try:
        engine = SparkEngine(session)
        engine.load_duckdb(path, sorted(read))
        with sqlsdc.connect(path, "analyst") as con:
            assert run_protected_rows(con, engine, cells[1:-1]) < 1_000
            with pytest.raises(AnswerTooLarge, match="1,000 rows"):
                run_protected_rows(con, engine, crossed)
        engine.close()
    finally:
        session.stop()
    raw = duckdb.connect(str(path), read_only=True)
    try:
        decision = raw.execute(
            "SELECT decision FROM sqlsdc.audit ORDER BY query_id DESC LIMIT 1"
        ).fetchone()
    finally:
        raw.close()
    assert decision == ("refused",)  # as on DuckDB (s44q; it was "failed")


def run_protected_rows(con, engine, sql: str) -> int:
    from sqlsdc.guard.spark import run_protected

    return run_protected(con, engine, sql).num_rows
