"""PEP 249 completeness of the guarded connection: type objects, constructors, context managers,
parameter counts, and DuckDB-style fetchers (ISSUE18 must-have 7)."""

from __future__ import annotations

import datetime as dt

import pandas as pd
import pyarrow as pa
import pytest

import sqlsdc

SQL = "SELECT region, COUNT(*) AS n FROM persons WHERE sex = ? GROUP BY region"


def test_type_objects_compare_with_description_type_codes(analyst):
    with analyst.cursor() as cursor:
        cursor.execute(SQL, ["F"])
        (region, n) = cursor.description
        assert region[1] == sqlsdc.STRING and region[1] != sqlsdc.NUMBER
        assert n[1] == sqlsdc.NUMBER and n[1] != sqlsdc.DATETIME
    assert cursor.description is None  # closed by the with block
    assert (region[1], n[1]) == ("VARCHAR", "BIGINT")  # DuckDB's names, as its cursor gives
    assert sqlsdc.BINARY == "BLOB" and sqlsdc.DATETIME == "TIMESTAMP WITH TIME ZONE"
    assert sqlsdc.NUMBER == "DECIMAL(18,3)" and sqlsdc.DATETIME != "INTERVAL"
    assert sqlsdc.ROWID != "BIGINT" and sqlsdc.STRING != 1


def test_constructors():
    assert sqlsdc.Date(2024, 1, 2) == dt.date(2024, 1, 2)
    assert sqlsdc.Time(3, 4, 5) == dt.time(3, 4, 5)
    assert sqlsdc.Timestamp(2024, 1, 2, 3, 4, 5) == dt.datetime(2024, 1, 2, 3, 4, 5)
    assert sqlsdc.Binary(b"x") == b"x"
    ticks = dt.datetime(2024, 1, 2, 3, 4, 5).timestamp()
    assert sqlsdc.TimestampFromTicks(ticks) == dt.datetime(2024, 1, 2, 3, 4, 5)
    assert sqlsdc.DateFromTicks(ticks) == dt.date(2024, 1, 2)
    assert sqlsdc.TimeFromTicks(ticks) == dt.time(3, 4, 5)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        (["F", "M"], r"the query has 1 parameter\(s\) but 2 were given"),
        ({"sex": "F"}, "parameters given but not in the query: sex"),
    ],
)
def test_extra_parameters_are_refused(analyst, params, message):
    with pytest.raises(sqlsdc.ProgrammingError, match=message):
        analyst.execute(SQL, params)
    with pytest.raises(sqlsdc.ProgrammingError, match=r"has 0 parameter\(s\) but 1 were given"):
        analyst.execute("SELECT COUNT(*) FROM persons", [1])


def test_duckdb_style_fetchers(analyst):
    cursor = analyst.execute(SQL, ["F"])
    assert isinstance(cursor.fetchdf(), pd.DataFrame)
    assert isinstance(cursor.fetch_arrow_table(), pa.Table)
    assert cursor.fetchdf().equals(cursor.df())
    try:
        import polars  # noqa: F401
    except ImportError:
        with pytest.raises(sqlsdc.NotSupportedError, match="pl\\(\\) needs polars"):
            cursor.pl()
    else:
        assert cursor.pl().shape == cursor.df().shape


@pytest.mark.parametrize("statement", [123, None, b"SELECT 1", ["SELECT 1"]])
def test_a_statement_that_is_not_text_is_the_callers_error(analyst, statement):
    """PEP 249's ProgrammingError that says what to pass, from every entry point."""
    entries = (
        analyst.execute,
        analyst.explain,
        analyst.verify,
        lambda sql: analyst.cursor().executemany(sql, [None]),
    )
    for entry in entries:
        with pytest.raises(sqlsdc.ProgrammingError, match="a statement must be a str"):
            entry(statement)
