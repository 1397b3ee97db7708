"""Red team s36e: DP cells on Spark and on DuckDB must be the same exact cells.

A DP cell's noise is keyed by its identity, and the identity is the same on both engines. If
Spark computed another exact value for an identity than DuckDB, an analyst asking on both (or
reading a cached DuckDB answer next to a Spark one) would learn the exact difference of the two
values, the noise cancelling out.

Found: the hardened DuckDB reads times in UTC, Spark in its session time zone. Under a session
time zone other than UTC, ``WHERE tz >= '2024-01-01'`` over a TIMESTAMP WITH TIME ZONE column
counted other rows on Spark (none of the units at 00:30 UTC, which is 19:30 the day before in
New York) under the same cell identity: the two releases differed by the exact count. The
Spark engine now sets the session time zone to UTC (and the Parquet date rebasing to
CORRECTED: under LEGACY, 1582-10-04 read as 1582-09-24, hashed otherwise, and units kept other
groups) and refuses, before anything is charged, to translate or run a tree once one was changed.

Found: DuckDB computes with a 32-bit FLOAT column in 32 bits (``r > 0.1`` casts 0.1 to FLOAT,
``r / 3`` is a FLOAT), Spark in 64: ``r > 0.1`` kept none of the rows holding 0.1 on DuckDB and
all of them on Spark. A tree reading a FLOAT column is now refused on Spark before the charge.

Tried and found equal on both engines (exact stage cells compared): NULL, empty, trailing-space,
NFC/NFD and case-differing string keys; -0.0, NaN and ±inf keys and filters; dates from 0001 to
9999 (1582 included) and timestamps from 0100 to 2262; DECIMAL and DOUBLE filters, casts and
computed keys; public joins on such strings; quantiles, HAVING, ORDER BY and LIMIT over the cells.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest
from spark_session import local_session, skip_without_jdk

import sqlsdc
from sqlsdc.errors import NotSupportedError

pytest.importorskip("pyspark.errors", reason="the Spark tests need the spark extra")
skip_without_jdk()

from sqlsdc.engines.spark import SparkEngine  # noqa: E402
from sqlsdc.guard.spark import run_protected  # noqa: E402

pytestmark = [
    pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas:FutureWarning"),
    pytest.mark.slow,  # a JVM of its own (~13 s of CPU to start and warm); CI runs it
]


EVENTS = """
CREATE TABLE events AS SELECT
  (i % 60)::BIGINT AS pid,
  (i % 3)::INTEGER AS k,
  ['2024-01-01 00:30:00+00'::TIMESTAMPTZ, '2023-12-31 12:00:00+00'][i % 2 + 1] AS at,
  [0.1, 0.2][i % 2 + 1]::REAL AS r
FROM range(600) r(i)
"""

POLICY = {
    "tables": {
        "events": {
            "privacy_unit": "pid",
            "columns": {
                "pid": {"role": "identifier"},
                "k": {"role": "dimension", "domain": [0, 1, 2]},
                "at": {"role": "dimension"},
                "r": {"role": "dimension"},
            },
            "protection": {"counts": {"method": "dp", "spend": {"epsilon": "1/10"}}},
            "dp": {"max_groups": 3, "max_rows": 10},
        }
    },
    "users": {"admin": {"role": "admin"}, "ana": {"role": "analyst"}, "bob": {"role": "analyst"}},
    "budgets": [{"user": "*", "epsilon": 1000}],
}

TIME_ZONE = "spark.sql.session.timeZone"
AFTER_MIDNIGHT_UTC = "SELECT k, COUNT(*) AS n FROM events WHERE at >= '2024-01-01' GROUP BY k"


@pytest.fixture(scope="module")
def spark():
    session = local_session("sqlsdc-redteam-s36e")
    yield session
    session.stop()


@pytest.fixture(scope="module")
def events(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("s36e") / "events.duckdb"
    raw = duckdb.connect(str(path))
    raw.execute(EVENTS)
    raw.close()
    sqlsdc.init(path, POLICY)
    return path


def spent(path: Path, user: str) -> list[tuple]:
    raw = duckdb.connect(str(path), read_only=True)
    try:
        return raw.execute(
            "SELECT epsilon, rho, cells FROM sqlsdc.budget_spend WHERE user_name = ? ORDER BY seq",
            [user],
        ).fetchall()
    finally:
        raw.close()


def answer(table) -> list[tuple]:
    return sorted(zip(*(c.to_pylist() for c in table.columns), strict=True))


def test_a_session_in_another_time_zone_computes_duckdbs_cells(spark, events):
    """The engine's session reads times in UTC even if it was made in New York."""
    session = spark.newSession()
    session.conf.set(TIME_ZONE, "America/New_York")
    with SparkEngine(session) as engine:
        engine.load_duckdb(events, ["events"])
        with sqlsdc.connect(events, "ana") as con:
            on_duckdb = sorted(con.execute(AFTER_MIDNIGHT_UTC).fetchall())
        with sqlsdc.connect(events, "bob") as con:
            on_spark = answer(run_protected(con, engine, AFTER_MIDNIGHT_UTC))
    assert on_spark == on_duckdb and on_duckdb
    assert spent(events, "bob")[-1] == spent(events, "ana")[-1]


@pytest.mark.parametrize(
    "setting, value",
    [(TIME_ZONE, "America/New_York"), ("spark.sql.parquet.datetimeRebaseModeInRead", "LEGACY")],
)
def test_a_session_setting_changed_after_the_engine_set_it_is_refused_unpaid(
    spark, events, setting, value
):
    """A LEGACY rebase read the copy's 1582-10-04 as 1582-09-24: another hash, other groups
    kept by the units, other exact cells under the same identities."""
    session = spark.newSession()
    with SparkEngine(session) as engine:
        engine.load_duckdb(events, ["events"])
        session.conf.set(setting, value)
        before = spent(events, "bob")
        with sqlsdc.connect(events, "bob") as con:
            with pytest.raises(NotSupportedError, match=f"{setting} was changed from"):
                sql = AFTER_MIDNIGHT_UTC.replace("2024-01-01", "2023-12-31 13:00")
                run_protected(con, engine, sql)
        assert spent(events, "bob") == before


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT k, COUNT(*) AS n FROM events WHERE r > 0.1 GROUP BY k",  # 0.1 cast to FLOAT
        "SELECT k, COUNT(*) AS n FROM events WHERE r / 3 > 0.03 GROUP BY k",  # a FLOAT quotient
        "SELECT k, COUNT(*) AS n FROM (SELECT * FROM events) AS e WHERE r = 0.1 GROUP BY k",
    ],
)
def test_a_32_bit_float_column_is_refused_on_spark_before_the_charge(spark, events, sql):
    """DuckDB compares a FLOAT column with 0.1 in 32 bits (0.1 is cast to FLOAT), Spark in 64
    bits: ``r > 0.1`` kept none of the 0.1 rows on DuckDB and all of them on Spark, one cell
    identity (one noise) for two exact counts."""
    with sqlsdc.connect(events, "ana") as con:
        assert con.execute(sql).fetchall() is not None  # DuckDB answers
    with SparkEngine(spark.newSession()) as engine:
        engine.load_duckdb(events, ["events"])
        before = spent(events, "bob")
        with sqlsdc.connect(events, "bob") as con:
            with pytest.raises(NotSupportedError, match="32-bit FLOAT"):
                run_protected(con, engine, sql)
        assert spent(events, "bob") == before
