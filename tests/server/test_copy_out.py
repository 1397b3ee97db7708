"""``COPY (query) TO STDOUT`` through ``sqlsdc serve`` (red team s49e: psql's ``\\copy (SELECT
...) TO 'file.csv' CSV HEADER`` and psycopg's ``cursor.copy()`` were refused, "COPY statements
are not allowed"): the query's protected answer in the text or CSV format, the query judged
by the guard as any statement."""

from __future__ import annotations

import subprocess

import pyarrow as pa
import pytest

import sqlsdc
from sqlsdc.errors import NotSupportedError
from sqlsdc.server.copy_out import CopyOut, copy_messages, copy_out
from tests.server.conftest import PASSWORD

psycopg = pytest.importorskip("psycopg")

GROUPS = "SELECT region, COUNT(*) AS n FROM persons GROUP BY region ORDER BY region"


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        ("COPY (SELECT 1) TO STDOUT", CopyOut("SELECT 1")),
        ("copy ( SELECT 1 ) to stdout csv header;", CopyOut(" SELECT 1 ", True, True, ",", "")),
        ("COPY (SELECT 1) TO STDOUT WITH (FORMAT csv, HEADER true, DELIMITER ';')",
         CopyOut("SELECT 1", True, True, ";", "")),
        ("COPY (SELECT ')') TO STDOUT (FORMAT text, NULL 'none')",
         CopyOut("SELECT ')'", False, False, "\t", "none")),
        ("COPY persons TO STDOUT", None),  # the table form: the guard's to refuse
        ("COPY (SELECT 1) TO '/tmp/x.csv'", None),  # a server file: the guard's to refuse
    ],
)  # fmt: skip
def test_copy_to_stdout_is_read_with_its_options(sql, expected):
    assert copy_out(sql) == expected


@pytest.mark.parametrize(
    "options", ["BINARY", "(FORMAT binary)", "(QUOTE '''')", "(HEADER maybe)", "(DELIMITER '::')"]
)
def test_options_this_server_does_not_write_are_refused(options):
    with pytest.raises(NotSupportedError):
        copy_out(f"COPY (SELECT 1) TO STDOUT {options}")


def _data(messages: bytes) -> bytes:
    """The CopyData payloads of ``messages``, joined."""
    out, at = [], 0
    while at < len(messages):
        kind, length = messages[at : at + 1], int.from_bytes(messages[at + 1 : at + 5], "big")
        if kind == b"d":
            out.append(messages[at + 5 : at + 1 + length])
        at += 1 + length
    return b"".join(out)


def test_text_and_csv_values_are_escaped_as_postgresql_writes_them():
    table = pa.table({"a": ["x\ty", "b\\c", None, "p,q", 'say "hi"', ""], "n": [1, 2, 3, 4, 5, 6]})
    text = _data(copy_messages(CopyOut("q"), table))
    assert text == b'x\\ty\t1\nb\\\\c\t2\n\\N\t3\np,q\t4\nsay "hi"\t5\n\t6\n'
    csv = _data(copy_messages(CopyOut("q", True, True, ",", ""), table))
    assert csv == b'a,n\nx\ty,1\nb\\c,2\n,3\n"p,q",4\n"say ""hi""",5\n"",6\n'


def test_psycopg_copies_the_protected_answer(server):
    """The rows of ``COPY (query) TO STDOUT`` are the query's protected cells, as an embedded
    connection answers them (fails on main: COPY was refused)."""
    with psycopg.connect(server.dsn(), autocommit=True) as con, con.cursor() as cur:
        with cur.copy(f"COPY ({GROUPS}) TO STDOUT (FORMAT csv, HEADER)") as copy:
            data = b"".join(bytes(block) for block in copy).decode()
        assert con.execute("SELECT 1").fetchall() == [(1,)]  # the session goes on
    with sqlsdc.connect(server.db, user="analyst") as embedded:
        expected = embedded.execute(GROUPS).fetchall()
    assert data.splitlines() == ["region,n", *(f"{r},{n}" for r, n in expected)]


@pytest.mark.parametrize(
    ("sql", "sqlstate"),
    [
        ("COPY (SELECT * FROM persons) TO STDOUT", "42501"),  # row-level: the guard refuses
        ("COPY persons TO STDOUT", "42501"),
        ("COPY regions FROM STDIN", "42501"),
        (f"COPY ({GROUPS}) TO STDOUT BINARY", "0A000"),
    ],
)
def test_copy_of_what_the_guard_refuses_is_refused(server, sql, sqlstate):
    with psycopg.connect(server.dsn(), autocommit=True) as con, con.cursor() as cur:
        with pytest.raises(psycopg.Error) as caught, cur.copy(sql) as copy:
            list(copy)
        assert caught.value.sqlstate == sqlstate
        assert con.execute("SELECT 1").fetchall() == [(1,)]


def test_psql_copies_a_protected_answer_to_a_csv_file(server, tmp_path):
    psql = pytest.importorskip("shutil").which("psql")
    if psql is None:
        pytest.skip("psql is not installed")
    target = tmp_path / "sexes.csv"
    sql = "SELECT sex, COUNT(*) AS n FROM persons GROUP BY sex ORDER BY sex"
    subprocess.run(
        [psql, server.dsn().replace("sslmode='disable'", "sslmode=disable"), "-c",
         f"\\copy ({sql}) TO '{target}' CSV HEADER"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    with sqlsdc.connect(server.db, user="analyst") as embedded:
        expected = embedded.execute(sql).fetchall()
    assert target.read_text().splitlines() == ["sex,n", *(f"{s},{n}" for s, n in expected)]


# --- COPY in the extended protocol (pg8000) and asyncpg's copy_from_query with arguments --------

AGES = "SELECT region, COUNT(*) AS n FROM persons WHERE age > {} GROUP BY region ORDER BY region"


def _expected(server, sql: str) -> list[str]:
    with sqlsdc.connect(server.db, user="analyst") as embedded:
        return [f"{r},{n}" for r, n in embedded.execute(sql).fetchall()]


def test_pg8000_copies_through_parse_bind_and_execute(server):
    """pg8000 sends every statement through Parse, Bind and Execute: a COPY there was refused
    ("COPY statements are not allowed"; red team s50e, fails on main); its parameters are the
    query's."""
    pg8000 = pytest.importorskip("pg8000.native")
    import io

    con = pg8000.Connection("analyst", host=server.host, port=server.port, database="demo",
                            password=PASSWORD)  # fmt: skip
    try:
        plain, aged = io.BytesIO(), io.BytesIO()
        con.run(f"COPY ({GROUPS}) TO STDOUT (FORMAT csv)", stream=plain)
        assert con.row_count == 8
        con.run(f"COPY ({AGES.format(':a')}) TO STDOUT (FORMAT csv)", stream=aged, a=40)
        for sql in ("COPY (SELECT * FROM persons) TO STDOUT", "COPY persons TO STDOUT"):
            with pytest.raises(pg8000.DatabaseError, match="42501"):
                con.run(sql, stream=io.BytesIO())
        assert con.run("SELECT 1") == [[1]]  # the session goes on
    finally:
        con.close()
    assert plain.getvalue().decode().splitlines() == _expected(server, GROUPS)
    assert aged.getvalue().decode().splitlines() == _expected(server, AGES.format(40))


def test_asyncpg_copy_from_query_with_arguments(server):
    """asyncpg inlines the arguments of ``copy_from_query`` by asking the server ``SELECT
    quote_literal($1::"pg_catalog"."int4"::text)``, which the guard refused ("type
    'pg_catalog.int4' is not a built-in type"; red team s50e, fails on main)."""
    asyncpg = pytest.importorskip("asyncpg")
    import asyncio
    import io

    async def main():
        con = await asyncpg.connect(host=server.host, port=server.port, user="analyst",
                                    password=PASSWORD, database="demo", ssl=False)  # fmt: skip
        try:
            out = io.BytesIO()
            status = await con.copy_from_query(AGES.format("$1"), 40, output=out, format="csv")
            named = io.BytesIO()
            await con.copy_from_query("SELECT region, COUNT(*) AS n FROM persons WHERE "
                                      "region = $1 GROUP BY region", "R01'\\", output=named,
                                      format="csv")  # fmt: skip
            return status, out.getvalue().decode(), named.getvalue()
        finally:
            await con.close()

    status, data, named = asyncio.run(main())
    assert status == "COPY 8"
    assert data.splitlines() == _expected(server, AGES.format(40))
    assert named == b""  # no region of that name: no row (its quotes reached the guard intact)


@pytest.mark.parametrize(
    ("text", "literal"),
    [("40", "'40'"), ("O'Brien", "'O''Brien'"), ("a\\b", "'a\\b'"), ("", "''")],
)
def test_quote_literal_quotes_as_postgresql(text, literal):
    from sqlsdc.server.quoted_literals import quote_literal

    assert quote_literal(text) == literal


@pytest.mark.parametrize(
    "sql",
    [
        'SELECT quote_literal($1::"pg_catalog"."int4"::text) FROM persons',
        "SELECT quote_literal(income::text)",
        'SELECT quote_literal($1::"pg_catalog"."int4"::text), income',
        "SELECT quote_literal($1::text) UNION SELECT region FROM persons",
    ],
)
def test_only_asyncpgs_exact_quoting_statement_is_answered_beside_the_guard(sql):
    from sqlsdc.server.quoted_literals import quoted_literals

    assert quoted_literals(sql, (1,)) is None
