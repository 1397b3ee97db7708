"""Real PostgreSQL clients against ``sqlsdc serve``: psql, psycopg 3, psycopg2, asyncpg, pg8000
and pgjdbc. Every statement passes the guard: aggregates come back protected, row-level reads
are refused with the guard's message as SQLSTATE 42501, each session runs as its user (audit).
Each client is skipped, not failed, when it is not installed."""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest

import sqlsdc
from tests.server.conftest import PASSWORD, SLOW_SQL

AGGREGATE = "SELECT region, COUNT(*) AS n, AVG(income) AS mean FROM persons GROUP BY region"
ROWS = "SELECT * FROM persons"


@pytest.fixture(scope="module")
def expected(server_db, server):
    """The embedded guarded connection's answer (the server must return the same cells)."""
    with sqlsdc.connect(server_db, user="analyst") as con:
        return sorted(con.execute(AGGREGATE + " ORDER BY region").fetchall())


def _same(rows, expected):
    assert [(r[0], r[1]) for r in sorted(rows)] == [(e[0], e[1]) for e in expected]
    for r, e in zip(sorted(rows), expected, strict=True):
        assert float(r[2]) == pytest.approx(e[2], rel=1e-12)


# --- psql ---------------------------------------------------------------------------------------


def _psql(server, *sql: str, password: str = PASSWORD):
    if shutil.which("psql") is None:
        pytest.skip("psql is not installed")
    command = ["psql", "-X", "-A", "-t", f"host={server.host} port={server.port} user=analyst "
               "dbname=demo sslmode=disable"]  # fmt: skip
    for statement in sql:
        command += ["-c", statement]
    env = {**os.environ, "PGPASSWORD": password, "PGCONNECT_TIMEOUT": "10"}
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=60)


def test_psql_aggregate_and_version(server, expected):
    done = _psql(server, AGGREGATE + " ORDER BY region", "SELECT version()")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    rows = [line.split("|") for line in lines[:-1]]
    _same([(r, int(n), float(m)) for r, n, m in rows], expected)
    assert lines[-1].startswith("PostgreSQL 15.0 (sqlsdc")


def test_psql_refusal_arrives_as_error_with_the_guards_message(server):
    done = _psql(server, ROWS)
    assert done.returncode == 1
    assert "ERROR:  row-level output of confidential tables is not allowed" in done.stderr
    assert "HINT:  aggregate it" in done.stderr
    assert done.stdout == ""


def test_psql_wrong_password(server):
    done = _psql(server, "SELECT 1", password="not the password")
    assert done.returncode == 2
    assert 'FATAL:  password authentication failed for user "analyst"' in done.stderr


# --- psycopg 3 ----------------------------------------------------------------------------------


def test_psycopg3_text_binary_and_parameters(server, expected):
    psycopg = pytest.importorskip("psycopg")
    with psycopg.connect(server.dsn(), autocommit=True) as con:
        _same(con.execute(AGGREGATE).fetchall(), expected)
        binary = con.cursor(binary=True).execute(AGGREGATE).fetchall()
        _same(binary, expected)
        one = con.execute("SELECT region, COUNT(*) AS n FROM persons WHERE region = %s "
                          "GROUP BY region", ("R01",)).fetchall()  # fmt: skip
        assert one == [(e[0], e[1]) for e in expected if e[0] == "R01"]
        typed = con.execute("SELECT %s::int AS i, %s::date AS d, %s::float AS f, %s::bool AS b",
                            (7, dt.date(2024, 2, 29), 0.5, True)).fetchone()  # fmt: skip
        assert typed == (7, dt.date(2024, 2, 29), 0.5, True)


def test_psycopg3_refusal_is_42501_and_syntax_42601(server):
    psycopg = pytest.importorskip("psycopg")
    with psycopg.connect(server.dsn(), autocommit=True) as con:
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="row-level output"):
            con.execute(ROWS)
        with pytest.raises(psycopg.errors.SyntaxError, match="could not be parsed"):
            con.execute("SELECT COUNT(* FROM persons")
        assert con.execute("SELECT COUNT(*) AS n FROM regions").fetchone() == (8,)  # still fine


def test_psycopg3_transaction_block_and_failed_state(server):
    psycopg = pytest.importorskip("psycopg")
    with psycopg.connect(server.dsn()) as con:  # not autocommit: psycopg sends BEGIN
        assert con.execute("SELECT COUNT(*) AS n FROM regions").fetchone() == (8,)
        assert con.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            con.execute(ROWS)
        with pytest.raises(psycopg.errors.InFailedSqlTransaction):
            con.execute("SELECT COUNT(*) AS n FROM regions")
        con.rollback()
        assert con.execute("SELECT COUNT(*) AS n FROM regions").fetchone() == (8,)


def test_psycopg3_server_side_cursor_fetches_in_batches(server):
    psycopg = pytest.importorskip("psycopg")
    with psycopg.connect(server.dsn(), autocommit=True) as con:
        # a portal with Execute row limits (PortalSuspended between batches)
        with con.cursor() as cur:
            rows = list(cur.stream("SELECT name, population FROM regions ORDER BY name"))
        assert len(rows) == 8


def test_cancel_interrupts_a_running_statement(server):
    psycopg = pytest.importorskip("psycopg")
    with psycopg.connect(server.dsn(), autocommit=True) as con:
        timer = threading.Timer(1.0, con.cancel_safe)
        timer.start()
        started = time.monotonic()
        with pytest.raises(psycopg.errors.QueryCanceled, match="user request"):
            con.execute(SLOW_SQL)
        assert time.monotonic() - started < 15
        assert con.execute("SELECT COUNT(*) AS n FROM regions").fetchone() == (8,)


def test_each_session_runs_as_its_user_in_the_audit_log(server, server_db):
    psycopg = pytest.importorskip("psycopg")
    marker = "SELECT COUNT(*) AS audited FROM regions WHERE population > 12345"
    with psycopg.connect(server.dsn(), autocommit=True) as con:
        con.execute(marker)
    entries = sqlsdc.admin.audit(server_db, "admin", who="analyst", limit=20)
    assert marker in set(entries["sql_text"])


# --- psycopg2, asyncpg, pg8000 ---------------------------------------------------------------


def test_psycopg2(server, expected):
    psycopg2 = pytest.importorskip("psycopg2")
    errors = pytest.importorskip("psycopg2.errors")

    con = psycopg2.connect(server.dsn())
    try:
        cur = con.cursor()
        cur.execute(AGGREGATE)
        _same(cur.fetchall(), expected)
        cur.execute("SELECT COUNT(*) AS n FROM persons WHERE region = %s", ("R02",))
        assert cur.fetchone()[0] == next(e[1] for e in expected if e[0] == "R02")
        with pytest.raises(errors.InsufficientPrivilege):
            cur.execute(ROWS)
        con.rollback()
    finally:
        con.close()


def test_asyncpg(server, expected):
    asyncpg = pytest.importorskip("asyncpg")

    async def main():
        con = await asyncpg.connect(host=server.host, port=server.port, user="analyst",
                                    password=PASSWORD, database="demo", ssl=False)  # fmt: skip
        try:
            rows = await con.fetch(AGGREGATE)
            typed = await con.fetchrow("SELECT COUNT(*) AS n FROM regions WHERE population "
                                       "> $1::int", 0)  # fmt: skip
            with pytest.raises(asyncpg.exceptions.InsufficientPrivilegeError):
                await con.fetch(ROWS)
            return [tuple(r.values()) for r in rows], typed
        finally:
            await con.close()

    rows, typed = asyncio.run(main())
    _same(rows, expected)
    assert isinstance(rows[0][2], float) and isinstance(rows[0][1], int)
    # described before its parameters were bound: typed from binding the protected SQL
    assert typed["n"] == 8


def test_pg8000(server, expected):
    pg8000 = pytest.importorskip("pg8000.native")
    con = pg8000.Connection("analyst", host=server.host, port=server.port, database="demo",
                            password=PASSWORD)  # fmt: skip
    try:
        _same(con.run(AGGREGATE), expected)
        with pytest.raises(pg8000.DatabaseError, match="42501"):
            con.run(ROWS)
    finally:
        con.close()


# --- pgjdbc -------------------------------------------------------------------------------------

JDBC_TEST = """
import java.sql.*;
public class JdbcSmoke {
    public static void main(String[] a) throws Exception {
        try (Connection c = DriverManager.getConnection(a[0], "analyst", a[1])) {
            try (ResultSet r = c.createStatement().executeQuery(
                    "SELECT region, COUNT(*) AS n FROM persons GROUP BY region ORDER BY region")) {
                while (r.next()) System.out.println(r.getString(1) + "|" + r.getLong(2));
            }
            try (PreparedStatement p = c.prepareStatement(
                    "SELECT COUNT(*) AS n FROM regions WHERE population > ?")) {
                p.setInt(1, 0);
                try (ResultSet r = p.executeQuery()) {
                    r.next(); System.out.println("n|" + r.getLong(1));
                }
            }
            try { c.createStatement().executeQuery("SELECT * FROM persons"); }
            catch (SQLException e) { System.out.println("refused|" + e.getSQLState()); }
            DatabaseMetaData m = c.getMetaData();  // what JDBC BI tools read to list tables
            try (ResultSet r = m.getTables(null, "public", "%", new String[]{"TABLE"})) {
                while (r.next()) System.out.println("table|" + r.getString("TABLE_NAME"));
            }
            try (ResultSet r = m.getColumns(null, "public", "persons", "%")) {
                while (r.next()) System.out.println("column|" + r.getString("COLUMN_NAME"));
            }
            try (ResultSet r = m.getImportedKeys(null, "public", "persons")) {
                int n = 0; while (r.next()) n++; System.out.println("foreign keys|" + n);
            }
            try (ResultSet r = m.getPrimaryKeys(null, "public", "persons")) {
                int n = 0; while (r.next()) n++; System.out.println("primary keys|" + n);
            }
            try (ResultSet r = m.getIndexInfo(null, "public", "persons", false, true)) {
                int n = 0; while (r.next()) n++; System.out.println("indexes|" + n);
            }
            try (ResultSet r = c.createStatement().executeQuery(
                    "SELECT region, COUNT(*) FROM persons GROUP BY region")) {
                r.next(); System.out.println("label|" + r.getMetaData().getColumnLabel(2));
            }
        }
    }
}
"""


def _jdbc_jar() -> Path | None:
    found = sorted(Path.home().glob(".m2/repository/org/postgresql/postgresql/*/postgresql-*.jar"))
    return found[-1] if found else None


def test_pgjdbc(server, expected, tmp_path):
    jar = _jdbc_jar()
    if shutil.which("java") is None or jar is None:
        pytest.skip("no JDK or no pgjdbc jar in ~/.m2 (mvn dependency:get "
                    "-Dartifact=org.postgresql:postgresql:42.7.4)")  # fmt: skip
    source = tmp_path / "JdbcSmoke.java"
    source.write_text(JDBC_TEST)
    url = f"jdbc:postgresql://{server.host}:{server.port}/demo?sslmode=disable"
    # the JVM's quick compiler and one-thread collector, as tests/test_spark.py's: a short run
    # (compiling the source included) takes ~0.65 s of CPU instead of ~1.05 s
    jvm = ["-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC"]
    done = subprocess.run(["java", *jvm, "-cp", str(jar), str(source), url, PASSWORD],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.strip().splitlines()
    rows = len(expected)
    assert lines[:rows] == [f"{e[0]}|{e[1]}" for e in expected]
    assert lines[rows : rows + 2] == ["n|8", "refused|42501"]
    meta = lines[rows + 2 :]
    assert [x for x in meta if x.startswith("table|")] == [
        f"table|{t}" for t in ("benefits", "enterprises", "households", "persons", "regions")
    ]
    columns = [x.split("|")[1] for x in meta if x.startswith("column|")]
    assert "income" in columns and not any(c.startswith("__") for c in columns)
    assert meta[-4:] == ["foreign keys|0", "primary keys|0", "indexes|0", "label|count"]


# --- SQLAlchemy's PostgreSQL dialect, with pandas -----------------------------------------------


def test_sqlalchemy_postgresql_dialect_and_pandas_read_sql(server, expected):
    """What BI tools built on SQLAlchemy do: connect (version, schema and settings queries),
    reflect the catalog (only what the policy shows) and read an aggregate with pandas."""
    sqlalchemy = pytest.importorskip("sqlalchemy")
    pytest.importorskip("psycopg")
    import pandas as pd

    url = sqlalchemy.engine.URL.create(
        "postgresql+psycopg", username="analyst", password=PASSWORD, host=server.host,
        port=server.port, database="demo", query={"sslmode": "disable"},
    )  # fmt: skip
    engine = sqlalchemy.create_engine(url)
    try:
        frame = pd.read_sql(AGGREGATE, engine)
        _same(list(frame.itertuples(index=False, name=None)), expected)
        inspector = sqlalchemy.inspect(engine)
        assert set(inspector.get_table_names()) == {
            "benefits", "enterprises", "households", "persons", "regions"
        }  # fmt: skip
        columns = {c["name"] for c in inspector.get_columns("persons")}
        assert "income" in columns and not any(c.startswith("__") for c in columns)
        with engine.connect() as con, pytest.raises(sqlalchemy.exc.ProgrammingError,
                                                    match="row-level output"):  # fmt: skip
            con.execute(sqlalchemy.text(ROWS))
    finally:
        engine.dispose()
