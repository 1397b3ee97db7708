"""Guarded results have DuckDB's own types where their values are not protected.

A public table's aggregates, group keys and DP keys come back as a raw DuckDB connection gives
them: the same Python values and types from ``fetchall`` (a SUM of integers is an ``int``, not
the ``Decimal`` that Arrow makes of DuckDB's HUGEINT), the same Arrow types from ``arrow()`` and
the same pandas dtypes from ``df()``.
"""

from __future__ import annotations

import shutil

import pytest

import sqlsdc
from sqlsdc.catalog import store
from sqlsdc.engines.duckdb import open_database
from sqlsdc.policy import load_policy

COLUMNS = {"i32": "INTEGER", "i64": "BIGINT", "dec": "DECIMAL(12, 2)", "dbl": "DOUBLE"}


@pytest.fixture(scope="module")
def typed_db(pristine_demo_db, tmp_path_factory):
    """The demo database with a public table ``facts`` of integer, bigint, decimal and double
    measures (NULLs included), declared in the policy."""
    path = tmp_path_factory.mktemp("types") / "types.duckdb"
    shutil.copy(pristine_demo_db, path)
    con = open_database(path)
    try:
        con.execute(
            "CREATE TABLE facts AS SELECT (i % 3)::VARCHAR AS grp, i::INTEGER AS i32, "
            "(i * 1000000000)::BIGINT AS i64, (i * 1.25)::DECIMAL(12, 2) AS dec, "
            "i * 0.5 AS dbl FROM range(1, 21) t(i) "
            "UNION ALL SELECT '0', NULL, NULL, NULL, NULL"
        )
        document = store.current_policy(con)[1]
    finally:
        con.close()
    columns = {"grp": {"role": "dimension"}} | {c: {"role": "measure"} for c in COLUMNS}
    document["tables"]["facts"] = {"kind": "public", "columns": columns}
    sqlsdc.admin.apply(path, load_policy(document), user="admin")
    return path


def _both(path, sql):
    """(guarded cursor, raw DuckDB result relation) for one query."""
    with sqlsdc.connect(path, user="analyst") as con:
        cursor = con.execute(sql)
        guarded = (cursor.fetchall(), cursor.arrow(), cursor.df())
    raw = open_database(path)
    try:
        relation = raw.sql(sql)
        expected = (relation.fetchall(), relation.to_arrow_table(), relation.df())
    finally:
        raw.close()
    return guarded, expected


def _python_types(rows):
    return [[type(v) for v in row] for row in rows]


@pytest.mark.parametrize("aggregate", ["SUM", "AVG", "COUNT", "MIN", "MAX"])
def test_aggregates_of_a_public_table_have_duckdbs_types(typed_db, aggregate):
    items = ", ".join(f"{aggregate}({c}) AS {c}_{aggregate.lower()}" for c in COLUMNS)
    for sql in (
        f"SELECT {items}, COUNT(*) AS n FROM facts",
        f"SELECT grp, {items} FROM facts GROUP BY grp ORDER BY grp",
    ):
        (rows, arrow, frame), (raw_rows, raw_arrow, raw_frame) = _both(typed_db, sql)
        assert rows == raw_rows
        assert _python_types(rows) == _python_types(raw_rows)
        assert arrow.schema == raw_arrow.schema  # types and names, no sqlsdc metadata
        assert not any(field.metadata for field in arrow.schema)
        assert list(frame.dtypes) == list(raw_frame.dtypes)


def test_a_sum_of_integers_is_an_int_like_duckdbs(typed_db):
    (rows, _, _), _ = _both(typed_db, "SELECT SUM(i32), SUM(i64) FROM facts")
    assert rows == [(210, 210_000_000_000)]
    assert all(type(v) is int for v in rows[0])


def test_public_values_next_to_protected_ones_keep_their_types(typed_db):
    sql = (
        "SELECT r.population, COUNT(*) AS n FROM persons p JOIN regions r "
        "ON p.region = r.region GROUP BY r.population ORDER BY 1"
    )
    (rows, arrow, _), (raw_rows, raw_arrow, _) = _both(typed_db, sql)
    assert [r[0] for r in rows] == [r[0] for r in raw_rows]
    assert arrow.schema == raw_arrow.schema
    assert _python_types(rows) == _python_types(raw_rows)


def test_dp_group_keys_keep_the_columns_type(ckm_db, ckm, raw_ckm):
    sql = "SELECT month, COUNT(*) AS n FROM benefits GROUP BY month ORDER BY month"
    guarded = ckm.execute(sql).arrow()
    expected = raw_ckm.sql(sql).to_arrow_table()
    assert guarded.schema.field("month").type == expected.schema.field("month").type
    assert guarded.column("month").to_pylist() == expected.column("month").to_pylist()
    # the count itself is protected: noisy, so not DuckDB's exact value
    assert guarded.column("n").to_pylist() != expected.column("n").to_pylist()


@pytest.mark.parametrize("aggregate", ["SUM", "AVG", "COUNT", "MIN", "MAX"])
def test_description_is_duckdbs_own(typed_db, aggregate):
    """PEP 249 ``description``: DuckDB's type names (HUGEINT for a SUM of integers, DECIMAL with
    precision and scale) and the sizes DuckDB gives (none), equal to the type objects."""
    items = ", ".join(f"{aggregate}({c}) AS {c}_{aggregate.lower()}" for c in COLUMNS)
    sql = f"SELECT grp, {items}, COUNT(*) AS n FROM facts GROUP BY grp"
    with sqlsdc.connect(typed_db, user="analyst") as con:
        description = con.execute(sql).description
    raw = open_database(typed_db)
    try:
        result = raw.execute(sql)
        expected = [(d[0], str(d[1]), *d[2:]) for d in result.description]
        result.fetchall()
    finally:
        raw.close()
    assert description == expected
    assert description[0][1] == "VARCHAR" == sqlsdc.STRING
    assert all(d[1] == sqlsdc.NUMBER and d[1] != sqlsdc.STRING for d in description[1:])
    if aggregate == "SUM":
        kinds = ["HUGEINT", "HUGEINT", "DECIMAL(38,2)", "DECIMAL(38,1)"]  # dbl is i * 0.5
        assert [d[1] for d in description[1:5]] == kinds


def test_constants_of_every_kind_have_duckdbs_python_values(typed_db):
    """An INTERVAL came back as Arrow's MonthDayNano where DuckDB gives a timedelta (and df()
    as a pandas DateOffset where DuckDB's has timedelta64)."""
    sql = (
        "SELECT DATE '2020-01-01' AS d, INTERVAL 3 DAY AS i, INTERVAL 14 MONTH + INTERVAL 3 HOUR "
        "AS j, 12345678901234567890::HUGEINT AS h, 1.5::DECIMAL(4, 2) AS dec, TIME '10:00' AS t"
    )
    (rows, _, frame), (raw_rows, _, raw_frame) = _both(typed_db, sql)
    assert rows == raw_rows and _python_types(rows) == _python_types(raw_rows)
    assert frame["i"].dtype == raw_frame["i"].dtype and frame["j"][0] == raw_frame["j"][0]
