"""What BI clients write that the guard refused though its answer is protected (s50j's
leftovers, s50m; each fails on int50):

1. asyncpg and pg8000 describe a statement before they bind it. Planned with NULL for its
   parameters, ``employees > $1`` on a measure with class breaks was refused as a comparison
   with NULL, so those clients could not run it with any value; the parameter is now a value
   not sent yet (:mod:`sqlsdc.guard.unbound`), and the Execute judges the value bound.
2. ``CAST(x AS "pg_catalog"."int4")``: the qualified spelling of PostgreSQL's built-in types
   is the type (:mod:`sqlsdc.guard.pg_types`); any other qualified type is refused as before.
3. An output column named with the NUL character was described cut at it (``a``): refused.
"""

from __future__ import annotations

import asyncio

import pytest

from sqlsdc.errors import PolicyViolation, ProgrammingError
from tests.server.conftest import PASSWORD

ABOVE = "SELECT COUNT(*) AS n FROM enterprises WHERE employees > {}"


def _asyncpg(server, queries: list[tuple]) -> list:
    """Each ``(sql, *arguments)`` fetched as one value by asyncpg over one connection, or the
    exception it raised."""
    asyncpg = pytest.importorskip("asyncpg")

    async def ask():
        con = await asyncpg.connect(user="analyst", password=PASSWORD, host=server.host,
                                    port=server.port, database="demo", ssl=False)  # fmt: skip
        answers = []
        try:
            for sql, *arguments in queries:
                try:
                    answers.append(await con.fetchval(sql, *arguments))
                except asyncpg.PostgresError as e:
                    answers.append(e)
            return answers
        finally:
            await con.close()

    return asyncio.run(ask())


def test_asyncpg_measure_condition_at_a_parameter_is_answered_at_a_break(server):
    """Described with its parameter not sent, then bound: 50 (a break of employees) is
    answered as the written condition; 49 is refused when bound, as written."""
    bound, written, between, off_break, off_written = _asyncpg(server, [
        (ABOVE.format("$1"), 50),
        (ABOVE.format("50"),),
        ("SELECT COUNT(*) AS n FROM enterprises WHERE employees BETWEEN $1 AND $2", 10, 50),
        (ABOVE.format("$1"), 49),
        (ABOVE.format("49"),),
    ])  # fmt: skip
    assert isinstance(written, int) and written > 0
    assert bound == written
    assert isinstance(between, int)
    for refused in (off_break, off_written):
        assert type(refused).__name__ == "InsufficientPrivilegeError"
        assert "class breaks" in str(refused)
    assert "employees > 49" in str(off_break)  # judged at the value bound, not at NULL


def test_a_measure_condition_is_audited_as_the_execute_decides_it(server):
    """Describing no longer refuses (and audits) the statement at NULL: the statement bound
    at a break is audited as answered, the one bound off the breaks once as refused."""
    from tests.server.test_refusal_audit import _audited

    at, off = "-- s50m audit at a break", "-- s50m audit off the breaks"
    _asyncpg(server, [(f"{ABOVE.format('$1')} {at}", 50), (f"{ABOVE.format('$1')} {off}", 49)])
    # the parameters are audited after the text (-- parameters: 50)
    assert _audited(server.db, f"{at}%") == [("analyst", "accepted")]
    assert _audited(server.db, f"{off}%") == [("analyst", "refused")]


def test_asyncpg_measure_in_a_list_parameter_is_answered_at_breaks(server):
    listed, refused = _asyncpg(server, [
        ("SELECT COUNT(*) AS n FROM enterprises WHERE employees = ANY($1)", [10, 50]),
        ("SELECT COUNT(*) AS n FROM enterprises WHERE employees = ANY($1)", [10, 49]),
    ])  # fmt: skip
    assert isinstance(listed, int)
    assert type(refused).__name__ == "InsufficientPrivilegeError"


def test_pg8000_measure_condition_at_a_parameter_is_answered_at_a_break(server):
    pg8000 = pytest.importorskip("pg8000.native")
    con = pg8000.Connection("analyst", password=PASSWORD, host=server.host, port=server.port,
                            database="demo")  # fmt: skip
    try:
        (bound,) = con.run(ABOVE.format(":e"), e=50)
        (written,) = con.run(ABOVE.format("50"))
        with pytest.raises(pg8000.DatabaseError, match="class break"):
            con.run(ABOVE.format(":e"), e=49)
    finally:
        con.close()
    assert bound == written and int(written[0]) > 0


def test_psycopg_prepared_measure_condition_is_answered_at_a_break(server):
    """psycopg's ``prepare=True`` describes the portal, once bound: answered on int50 too,
    kept so that the prepared path judges the bound value as the others do."""
    psycopg = pytest.importorskip("psycopg")
    with psycopg.connect(server.dsn(), autocommit=True) as con:
        bound = con.execute(ABOVE.format("%s"), [50], prepare=True).fetchall()
        written = con.execute(ABOVE.format("50")).fetchall()
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="employees > 49"):
            con.execute(ABOVE.format("%s"), [49], prepare=True)
    assert bound == written and written[0][0] > 0


def test_describe_judges_no_value_it_does_not_have_and_execute_judges_the_bound_one(analyst):
    """An unbound parameter is not judged by the class breaks; a NULL given as the value,
    a shape refused whatever the value, and the value bound at execution are."""
    from sqlsdc.guard.unbound import UNBOUND  # new in s50m: imported here for int50's run

    _, schema = analyst.describe(ABOVE.format("?"), [UNBOUND])
    assert schema.names == ["n"]
    for sql, params in [
        (ABOVE.format("?"), [None]),  # NULL is a value: no break
        (ABOVE.format("? + 1"), [UNBOUND]),  # a computed bound, refused bound or not
        ("SELECT COUNT(*) AS n FROM enterprises WHERE CAST(employees AS DOUBLE) > ?", [UNBOUND]),
    ]:
        with pytest.raises(PolicyViolation, match="class break"):
            analyst.describe(sql, params)
    with pytest.raises(PolicyViolation, match="class break"):
        analyst.execute(ABOVE.format("?"), [49])
    for _ in range(2):  # described first: no check kept under the unbound parameter
        with pytest.raises(ProgrammingError, match="no value"):
            analyst.execute(ABOVE.format("?"), [UNBOUND])


def test_a_marked_null_is_a_break_only_while_describing():
    """The mark of a parameter not sent yet counts only inside a describe (an analyst's
    ``sqlglot.meta`` comment could write it: refused at parse, tests/security/
    test_redteam_s50m.py; this is the second line of defence)."""
    from sqlglot import exp

    from sqlsdc.guard.unbound import describing
    from sqlsdc.planner.breaks import UNBOUND_META, _is_break

    marked = exp.Null()
    marked.meta[UNBOUND_META] = True
    assert not _is_break(marked, (0.0, 50.0))
    with describing():
        assert _is_break(marked, (0.0, 50.0))
    assert not _is_break(exp.Null(), (0.0, 50.0))


@pytest.mark.parametrize(
    ("spelling", "expected"),
    [
        ('"pg_catalog"."int4"', "INTEGER"),
        ("pg_catalog.int2", "SMALLINT"),
        ("pg_catalog.int8", "BIGINT"),
        ("pg_catalog.float8", "DOUBLE"),
        ("pg_catalog.numeric(10, 2)", "DECIMAL(10,2)"),
        ("pg_catalog.text", "VARCHAR"),
        ('"pg_catalog".varchar', "VARCHAR"),
        ("pg_catalog.bool", "BOOLEAN"),
    ],
)
def test_pg_catalog_qualified_built_in_types_are_the_types(analyst, spelling, expected):
    cursor = analyst.execute(f"SELECT CAST(LENGTH(region) AS {spelling}) AS r FROM regions")
    assert cursor.description[0][1] == expected
    assert len(cursor.fetchall()) == 8


@pytest.mark.parametrize(
    "spelling", ["public.int4", "pg_catalog.regclass", "pg_catalog.oid", "main.int4"]
)
def test_other_qualified_types_stay_refused(analyst, spelling):
    with pytest.raises(PolicyViolation, match="not a built-in type"):
        analyst.execute(f"SELECT CAST(LENGTH(region) AS {spelling}) AS r FROM regions")


def test_pg_catalog_types_through_the_server(server):
    psycopg = pytest.importorskip("psycopg")
    with psycopg.connect(server.dsn(), autocommit=True) as con:
        rows = con.execute(
            'SELECT CAST(LENGTH(region) AS "pg_catalog"."int4") AS r, '
            "CAST(%s AS pg_catalog.date) AS d FROM regions",
            ["2026-01-01"],
        ).fetchall()
    assert len(rows) == 8 and all(isinstance(r, int) for r, _ in rows)


def test_asyncpg_parameter_cast_to_a_quoted_pg_catalog_type_is_that_type(server):
    """``CAST($1 AS "pg_catalog"."int4")``: the quoted names were blanked before the cast
    was read, so $1 was described as text and asyncpg refused 40 ("expected str, got int")."""
    sql = "SELECT COUNT(*) AS n FROM persons WHERE age > {}"
    quoted, qualified, written = _asyncpg(server, [
        (sql.format('CAST($1 AS "pg_catalog"."int4")'), 40),
        (sql.format('$1::"pg_catalog".int8'), 40),
        (sql.format("40"),),
    ])  # fmt: skip
    assert isinstance(written, int) and quoted == qualified == written


@pytest.mark.parametrize(
    ("sql", "oid"),
    [
        ('SELECT CAST($1 AS "pg_catalog"."int4")', 23),
        ('SELECT $1::"pg_catalog".int8', 20),
        ('SELECT $1::pg_catalog."float8"', 701),
        ('SELECT $1::"pg_catalog"."int4"[]', 1007),
        ('SELECT \'"pg_catalog"."int4"\', $1', 25),  # in a literal: no cast
    ],
)
def test_parameter_types_read_quoted_pg_catalog_types(sql, oid):
    from sqlsdc.server.statement_text import typed_parameters

    assert typed_parameters(sql, ()) == ((oid,), set())


@pytest.mark.parametrize(
    "sql",
    [
        'SELECT 1 AS "a\x00b"',
        "SELECT 'a\x00b'",
        'SELECT * FROM (SELECT 1 AS "a\x00b") t',
        'SELECT sex AS "s\x00x", COUNT(*) AS n FROM persons GROUP BY 1',
    ],
)
def test_an_output_name_with_nul_is_refused_not_cut(analyst, sql):
    with pytest.raises(PolicyViolation, match="NUL character"):
        analyst.execute(sql)


def test_a_value_with_nul_under_a_plain_name_is_answered(analyst):
    cursor = analyst.execute("SELECT 'a\x00b' AS x")
    assert cursor.fetchall() == [("a\x00b",)] and cursor.description[0][0] == "x"
