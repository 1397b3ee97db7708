"""Clients that describe a statement before binding its parameters (asyncpg, psycopg's
prepared statements, pgjdbc's server-side prepare, Npgsql) get the answer's column types from
binding the protected SQL (issue 18, red team s50e): numbers arrive as numbers, the types
described equal the types of the rows sent, and describing runs nothing. DP answers stay
text (their cells exist once charged). BI tools' schema probes (``SELECT * FROM (...)
"Custom SQL Query" LIMIT 0``) are answered with the names and types of the query."""

from __future__ import annotations

import asyncio

import pytest

from sqlsdc.engines.duckdb import open_database
from tests.server.conftest import PASSWORD

asyncpg = pytest.importorskip("asyncpg")
psycopg = pytest.importorskip("psycopg")

AGES = "SELECT sex, COUNT(*) AS n, AVG(income) AS mean FROM persons WHERE age > $1 GROUP BY sex"


@pytest.fixture(scope="module")
def ckm_server(dp_server):
    """The demo as shipped: persons under the cell key method, benefits under DP."""
    return dp_server


def _asyncpg(server, work):
    async def main():
        con = await asyncpg.connect(host=server.host, port=server.port, user="analyst",
                                    password=PASSWORD, database="demo", ssl=False)  # fmt: skip
        try:
            return await work(con)
        finally:
            await con.close()

    return asyncio.run(main())


def _audited(db, sql: str) -> int:
    con = open_database(db)
    try:
        return con.execute("SELECT COUNT(*) FROM sqlsdc.audit WHERE sql_text = ?",
                           [sql]).fetchone()[0]  # fmt: skip
    finally:
        con.close()


def test_asyncpg_gets_numbers_of_a_described_ckm_statement(ckm_server):
    async def work(con):
        statement = await con.prepare(AGES + " ORDER BY sex")
        described = [(a.name, a.type.name) for a in statement.get_attributes()]
        return described, [tuple(r.values()) for r in await statement.fetch(40)]

    described, rows = _asyncpg(ckm_server, work)
    assert described == [("sex", "text"), ("n", "int8"), ("mean", "float8")]
    assert [r[0] for r in rows] == ["F", "M"]
    assert all(isinstance(r[1], int) and isinstance(r[2], float) for r in rows)


def test_describing_runs_nothing_and_the_types_equal_the_rows(ckm_server):
    """psycopg's prepared statement: Describe's types are those of the rows; a statement only
    prepared and described is never run (no audit entry: nothing was answered)."""
    only_described = AGES.replace("$1", "$1 + 0") + " ORDER BY sex"

    async def work(con):
        statement = await con.prepare(only_described)
        return [a.type.name for a in statement.get_attributes()]

    assert _asyncpg(ckm_server, work) == ["text", "int8", "float8"]
    assert _audited(ckm_server.db, only_described) == 0
    dsn = (f"host={ckm_server.host} port={ckm_server.port} user=analyst password='{PASSWORD}' "
           "dbname=demo sslmode=disable")  # fmt: skip
    with psycopg.connect(dsn, autocommit=True) as con:
        cursor = con.execute(AGES.replace("$1", "%s") + " ORDER BY sex", (40,), prepare=True)
        rows = cursor.fetchall()
        assert [d.type_code for d in cursor.description] == [25, 20, 701]  # text, int8, float8
    assert all(isinstance(r[1], int) and isinstance(r[2], float) for r in rows)


def test_a_dp_statement_described_before_its_charge_stays_text(ckm_server):
    sql = "SELECT region, COUNT(*) AS n FROM benefits WHERE month > $1 GROUP BY region"

    async def work(con):
        statement = await con.prepare(sql)
        return [a.type.name for a in statement.get_attributes()]

    assert _asyncpg(ckm_server, work) == ["text", "text"]


def test_a_refused_statement_is_refused_when_described(ckm_server):
    async def work(con):
        with pytest.raises(asyncpg.exceptions.InsufficientPrivilegeError, match="row-level"):
            await con.prepare("SELECT * FROM (SELECT income FROM persons WHERE age > $1) t "
                              "LIMIT 0")  # fmt: skip
        with pytest.raises(asyncpg.exceptions.InsufficientPrivilegeError, match="row-level"):
            await con.prepare("SELECT * FROM persons WHERE 1 = 0 AND age > $1")
        return True

    assert _asyncpg(ckm_server, work)


@pytest.mark.parametrize(
    "probe",
    [
        'SELECT * FROM ({}) "Custom SQL Query" LIMIT 0',  # Tableau
        "SELECT * FROM ({}) AS t WHERE 1 = 0",  # Metabase, Superset, JDBC tools
        "SELECT * FROM ({}) AS t LIMIT 0 OFFSET 5",
    ],
)
def test_a_bi_tools_schema_probe_is_answered_with_the_querys_columns(ckm_server, probe):
    inner = "SELECT region, COUNT(*) AS n FROM persons GROUP BY region"
    dsn = (f"host={ckm_server.host} port={ckm_server.port} user=analyst password='{PASSWORD}' "
           "dbname=demo sslmode=disable")  # fmt: skip
    with psycopg.connect(dsn, autocommit=True) as con:
        cursor = con.execute(probe.format(inner))
        assert cursor.fetchall() == []
        assert [(d.name, d.type_code) for d in cursor.description] == [("region", 25), ("n", 20)]


JDBC_TYPES = """
import java.sql.*;
public class JdbcTypes {
    public static void main(String[] a) throws Exception {
        try (Connection c = DriverManager.getConnection(a[0], "analyst", a[1])) {
            try (PreparedStatement p = c.prepareStatement("SELECT region, COUNT(*) AS n, "
                    + "AVG(income) AS m FROM persons WHERE age > ? GROUP BY region")) {
                ResultSetMetaData d = p.getMetaData();  // Describe before Bind
                System.out.println(d.getColumnTypeName(2) + "|" + d.getColumnTypeName(3));
                p.setInt(1, 40);
                try (ResultSet r = p.executeQuery()) {
                    r.next();
                    System.out.println(r.getObject(2).getClass().getSimpleName() + "|"
                                       + r.getObject(3).getClass().getSimpleName());
                }
            }
            try (ResultSet r = c.createStatement().executeQuery("SELECT * FROM (SELECT "
                    + "region, COUNT(*) AS n FROM persons GROUP BY region) "
                    + "\\"Custom SQL Query\\" LIMIT 0")) {
                ResultSetMetaData e = r.getMetaData();
                System.out.println(e.getColumnName(2) + "|" + e.getColumnTypeName(2) + "|"
                                   + r.next());
            }
        }
    }
}
"""


def test_pgjdbc_prepared_metadata_and_tableaus_probe(dp_server, tmp_path):
    """pgjdbc's PreparedStatement.getMetaData() describes before binding: int8 and float8,
    and the rows are Long and Double; Tableau's probe gives the columns and no row."""
    import shutil
    import subprocess
    from pathlib import Path

    jars = sorted(Path.home().glob(".m2/repository/org/postgresql/postgresql/*/postgresql-*.jar"))
    if shutil.which("java") is None or not jars:
        pytest.skip("no JDK or no pgjdbc jar in ~/.m2")
    source = tmp_path / "JdbcTypes.java"
    source.write_text(JDBC_TYPES)
    url = f"jdbc:postgresql://{dp_server.host}:{dp_server.port}/demo?sslmode=disable"
    done = subprocess.run(["java", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-cp",
                           str(jars[-1]), str(source), url, PASSWORD],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["int8|float8", "Long|Double", "n|int8|false"]
