"""What a dashboard's and a notebook's PostgreSQL clients send to a real ``sqlsdc serve``
(new user s40h): SQLAlchemy's ``.limit().offset()``, bound as ``LIMIT $1::INTEGER``, is
answered; server-side cursors (psycopg's and psycopg2's named cursors, SQLAlchemy's
``stream_results``, ``DECLARE``/``FETCH``/``MOVE``/``CLOSE``) hand out the guard's answer in
batches; scrolling is refused as not supported (0A000), and audited."""

from __future__ import annotations

from fractions import Fraction

import pytest

from sqlsdc.engines.duckdb import open_database
from tests.server.conftest import PASSWORD

psycopg = pytest.importorskip("psycopg")

GROUPS = "SELECT region, COUNT(*) AS n FROM persons GROUP BY region ORDER BY region"


def _engine(server, driver: str = "psycopg"):
    sqlalchemy = pytest.importorskip("sqlalchemy")
    pytest.importorskip(driver)
    url = sqlalchemy.engine.URL.create(
        f"postgresql+{driver}", username="analyst", password=PASSWORD, host=server.host,
        port=server.port, database="demo",
        query={"sslmode": "disable"} if driver == "psycopg" else {},
    )  # fmt: skip
    return sqlalchemy.create_engine(url)


@pytest.mark.parametrize("driver", ["psycopg", "pg8000"])
def test_sqlalchemy_limit_and_offset_are_answered(server, driver):
    """pg8000 describes the statement before binding it: planned with NULL parameters,
    ``LIMIT CAST(NULL AS INT)`` was refused as a computed limit, so every ``.limit()`` failed
    on it (red team s49e; fails on main)."""
    sqlalchemy = pytest.importorskip("sqlalchemy")
    engine = _engine(server, driver)
    try:
        persons = sqlalchemy.Table("persons", sqlalchemy.MetaData(), autoload_with=engine)
        query = (
            sqlalchemy.select(persons.c.region, sqlalchemy.func.count().label("n"))
            .group_by(persons.c.region)
            .order_by(persons.c.region)
            .limit(2)
            .offset(1)
        )
        assert "::INTEGER OFFSET" in str(query.compile(engine))  # LIMIT %(param_1)s::INTEGER
        with engine.connect() as con:
            page = con.execute(query).fetchall()
            every = con.execute(sqlalchemy.text(GROUPS)).fetchall()
    finally:
        engine.dispose()
    assert [(region, int(n)) for region, n in page] == [tuple(r) for r in every[1:3]]


def _rows(con, sql: str, params=None) -> list[tuple]:
    with con.cursor() as cur:
        return cur.execute(sql, params).fetchall()


def test_a_named_cursor_fetches_the_guards_answer_in_batches(server):
    sql = "SELECT age, COUNT(*) AS n FROM persons GROUP BY age ORDER BY age"
    with psycopg.connect(server.dsn()) as con:  # not autocommit: DECLARE in a transaction
        expected = _rows(con, sql)
        with con.cursor(name="by_age") as cur:
            cur.execute(sql + " -- named cursor s40h")
            assert [d.name for d in cur.description] == ["age", "n"]
            first = cur.fetchmany(3)
            rows = first + [cur.fetchone()] + cur.fetchall()
        with con.cursor(name="binary", binary=True) as cur:  # FETCH asks for binary rows
            cur.execute("SELECT sex, COUNT(*) AS n FROM persons WHERE age >= %s GROUP BY sex "
                        "ORDER BY sex", [18])  # fmt: skip
            parameterised = cur.fetchall()
        assert parameterised == _rows(
            con, "SELECT sex, COUNT(*) AS n FROM persons WHERE age >= 18 GROUP BY sex ORDER BY sex"
        )
    assert len(first) == 3 and rows == expected and len(expected) > 3
    audit = open_database(server.db, writes_data=False)
    try:
        logged = audit.execute(
            "SELECT user_name, decision FROM sqlsdc.audit WHERE sql_text LIKE '%named cursor s40h'"
        ).fetchall()
    finally:
        audit.close()
    assert logged == [("analyst", "accepted")]  # its query, run once through the guard


def test_psycopg2_named_cursor_and_sqlalchemy_stream_results(server):
    psycopg2 = pytest.importorskip("psycopg2")
    sqlalchemy = pytest.importorskip("sqlalchemy")
    pd = pytest.importorskip("pandas")
    with psycopg.connect(server.dsn(), autocommit=True) as con:
        expected = _rows(con, GROUPS)
    old = psycopg2.connect(server.dsn())
    try:
        cur = old.cursor(name="regions_cursor")
        cur.itersize = 3  # FETCH FORWARD 3 FROM "regions_cursor", over and over
        cur.execute(GROUPS)
        assert list(cur) == expected
        cur.close()
        old.commit()
    finally:
        old.close()
    engine = _engine(server)
    try:
        with engine.connect() as con:
            streamed = con.execution_options(stream_results=True, max_row_buffer=3)
            assert [tuple(r) for r in streamed.execute(sqlalchemy.text(GROUPS))] == expected
            chunks = list(pd.read_sql(GROUPS, streamed, chunksize=3))
    finally:
        engine.dispose()
    assert [len(c) for c in chunks][:1] == [3] and sum(len(c) for c in chunks) == len(expected)


def test_cursor_statements_as_postgresql_answers_them(server):
    with psycopg.connect(server.dsn(), autocommit=True) as con:
        with pytest.raises(psycopg.errors.NoActiveSqlTransaction, match="transaction blocks"):
            con.execute(f"DECLARE c CURSOR FOR {GROUPS}")  # WITHOUT HOLD needs a block
        con.execute(f"DECLARE c CURSOR WITH HOLD FOR {GROUPS}")  # kept after the statement
        with pytest.raises(psycopg.errors.DuplicateCursor):
            con.execute(f"DECLARE c CURSOR WITH HOLD FOR {GROUPS}")
        expected = _rows(con, GROUPS)
        assert con.execute("MOVE 1 IN c").statusmessage == "MOVE 1"
        cur = con.execute("FETCH 2 FROM c")
        assert cur.statusmessage == "FETCH 2" and cur.fetchall() == expected[1:3]
        assert con.execute("FETCH ALL FROM c").fetchall() == expected[3:]
        assert con.execute("FETCH NEXT FROM c").fetchall() == []
        assert con.execute("CLOSE c").statusmessage == "CLOSE CURSOR"
        with pytest.raises(psycopg.errors.InvalidCursorName):
            con.execute("FETCH 1 FROM c")
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="row-level output"):
            con.execute("DECLARE r CURSOR WITH HOLD FOR SELECT * FROM persons")
    with psycopg.connect(server.dsn()) as con:  # a cursor WITHOUT HOLD ends with its block
        con.execute(f"DECLARE d CURSOR FOR {GROUPS}")
        con.commit()
        with pytest.raises(psycopg.errors.InvalidCursorName):
            con.execute("FETCH 1 FROM d")


@pytest.mark.parametrize(
    "sql",
    [
        "DECLARE s SCROLL CURSOR WITH HOLD FOR SELECT 1",
        "DECLARE b BINARY CURSOR WITH HOLD FOR SELECT 1",
        "FETCH BACKWARD 1 FROM c",
        "FETCH ABSOLUTE 3 FROM c",
    ],
)
def test_scrolling_is_refused_as_not_supported_and_audited(server, sql):
    marker = f" -- scrolling s40h {sql.split()[2]}"
    with psycopg.connect(server.dsn(), autocommit=True) as con:
        with pytest.raises(psycopg.errors.FeatureNotSupported, match="not supported"):
            con.execute(sql.replace(" FOR SELECT 1", f" FOR SELECT 1{marker}")
                        if "DECLARE" in sql else sql)  # fmt: skip
    if "DECLARE" in sql:
        audit = open_database(server.db, writes_data=False)
        try:
            logged = audit.execute(
                "SELECT decision FROM sqlsdc.audit WHERE sql_text LIKE ?", [f"%{marker}"]
            ).fetchall()
        finally:
            audit.close()
        assert logged == [("refused",)]


def _spent(con) -> Fraction:
    """The analyst's own ε spent, as ``SHOW sqlsdc.budget`` gives it."""
    cur = con.execute("SHOW sqlsdc.budget")
    names = [d.name for d in cur.description]
    rows = [dict(zip(names, r, strict=True)) for r in cur.fetchall()]
    (row,) = [r for r in rows if (r["user"], r["table"]) == ("analyst", "*")]
    return Fraction(row["epsilon_spent"])


def test_a_cursor_over_a_dp_query_is_charged_once_when_declared(dp_server):
    """A cursor's query is checked and charged once, when it is declared: FETCH and MOVE page
    through that answer (nothing charged, no fresh noise), the same query asked again gets the
    same cells from the DP cache, and a refused declaration charges nothing (lead, session 40:
    the budget side of s40h's cursors, which red team s40i could not observe)."""
    sql = (
        "SELECT month, COUNT(*) AS n FROM benefits WHERE amount > 200 GROUP BY month ORDER BY month"
    )
    with psycopg.connect(dp_server.dsn(), autocommit=True) as con:
        before = _spent(con)
        con.execute(f"DECLARE c CURSOR WITH HOLD FOR {sql}")
        declared = _spent(con)
        assert declared > before
        con.execute("MOVE 0 IN c")
        fetched = (
            con.execute("FETCH 3 FROM c").fetchall() + con.execute("FETCH ALL FROM c").fetchall()
        )
        assert fetched and _spent(con) == declared
        assert _rows(con, sql) == fetched and _spent(con) == declared
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            con.execute("DECLARE r CURSOR WITH HOLD FOR SELECT amount FROM benefits")
        assert _spent(con) == declared


@pytest.mark.parametrize(
    ("sql", "params", "written"),
    [  # psycopg sends a list of str untyped (text), of int as int2[]/int8[], %b in binary
        ("region = ANY(%s)", [["R01", "R03"]], "region IN ('R01', 'R03')"),
        ("age = ANY(%s) AND sex = %s", [[30, 31, None], "F"],
         "age IN (30, 31, NULL) AND sex = 'F'"),
        ("age = ANY(%b)", [[30, 31]], "age IN (30, 31)"),
        ("region = ANY(%b)", [["R01", 'a "b", {c}']], "region IN ('R01', 'a \"b\", {c}')"),
        # an untyped list typed by its cast: read as an array of the cast's element type
        ("region = ANY(%s::text[])", [["R01", None, "R03"]], "region IN ('R01', NULL, 'R03')"),
        ("age = ANY(CAST(%s AS INT[]))", [["30", "31"]], "age IN (30, 31)"),
    ],
)  # fmt: skip
def test_psycopg_any_of_a_list_is_answered_as_the_in_list(server, sql, params, written):
    query = "SELECT region, COUNT(*) AS n FROM persons WHERE {} GROUP BY region ORDER BY region"
    with psycopg.connect(server.dsn(), autocommit=True) as con:
        answered = _rows(con, query.format(sql), params)
        assert answered == _rows(con, query.format(written))
    assert len(answered) > 0


@pytest.mark.parametrize(
    ("sql", "params", "error"),
    [
        ("age = ANY(%s::int[])", [["30", "x"]], "InvalidTextRepresentation"),  # not an int
        ("region = ANY(%s::text[])", [[["R01"], ["R02"]]], "InvalidTextRepresentation"),
        ("region = ANY(%s::text[][])", [["R01"]], "one-dimensional array of a plain type"),
        ("age = ANY(%s::text[])", [["30"]], "could raise an error"),  # text against an int
    ],
)
def test_psycopg_any_of_a_cast_list_is_refused_where_its_in_list_would_be(
    server, sql, params, error
):
    query = "SELECT region, COUNT(*) AS n FROM persons WHERE {} GROUP BY region"
    with psycopg.connect(server.dsn(), autocommit=True) as con:
        with pytest.raises(psycopg.Error) as refused:
            _rows(con, query.format(sql), params)
    assert error in type(refused.value).__name__ or error in str(refused.value)


def _asyncpg_values(server, queries: list[tuple]) -> list:
    """Each ``(sql, *arguments)`` of ``queries`` fetched as one value by asyncpg, over one
    connection (asyncpg prepares and describes every statement before it binds it)."""
    asyncpg = pytest.importorskip("asyncpg")
    import asyncio

    async def ask():
        con = await asyncpg.connect(user="analyst", password=PASSWORD, host=server.host,
                                    port=server.port, database="demo", ssl=False)  # fmt: skip
        try:
            return [await con.fetchval(sql, *arguments) for sql, *arguments in queries]
        finally:
            await con.close()

    return asyncio.run(ask())


def test_asyncpg_any_of_a_list_is_answered_as_the_in_list(server):
    """asyncpg describes the statement first: ``= ANY($1)`` is typed text[] and the list
    sent as one, in binary (the answer's columns then typed as text, as for any statement
    described before it is bound)."""
    sql = "SELECT COUNT(*) AS n FROM persons WHERE {}"
    listed, cast, written = _asyncpg_values(server, [
        (sql.format("region = ANY($1)"), ["R01", "R03"]),
        (sql.format("region = ANY($1::text[])"), ["R01", "R03"]),
        (sql.format("region IN ('R01', 'R03')"),),
    ])  # fmt: skip
    assert int(listed) == int(cast) == written > 0  # $1::text[] described as text[]


def test_asyncpg_int_and_text_arrays_under_any_are_answered(server):
    """An ``int[]`` parameter made asyncpg introspect the array type, and its introspection
    failed: ``current_setting('jit')`` with ``set_config('jit', 'off', false)`` went to the
    guard (refused), then its type query's ``$1::oid[]`` could not be parsed, its oid[]
    parameter was read as text[], and its oids came back as text. The catalog now answers
    them as PostgreSQL does (jit is off), and a catalog statement described with parameters
    sends its columns' types. An untyped ``age = ANY($1)`` was described as text[], so asyncpg
    refused a list of integers ("expected str, got int"): it is now an array of the column's
    type, as PostgreSQL infers it."""
    sql = "SELECT COUNT(*) AS n FROM persons WHERE {}"
    ages, untyped, written, regions, cast, jit = _asyncpg_values(server, [
        (sql.format("age = ANY($1::int[])"), [30, 40, 50]),
        (sql.format("age = ANY($1)"), [30, 40, 50]),
        (sql.format("age IN (30, 40, 50)"),),
        (sql.format("region = ANY($1)"), ["R01", "R03"]),
        (sql.format("region = ANY($1::text[])"), ["R01", "R03"]),
        ("SELECT current_setting('jit')",),
    ])  # fmt: skip
    assert int(ages) == int(untyped) == written > 0 and jit == "off"
    assert int(regions) == int(cast) > 0


def test_psycopg2_and_pg8000_any_of_a_list_are_answered_as_the_in_list(server):
    """psycopg2 writes a list into the text (``= ANY(ARRAY['R01','R03'])``); pg8000 sends it
    as an array parameter."""
    sql = "SELECT COUNT(*) AS n FROM persons WHERE region = ANY({})"
    psycopg2 = pytest.importorskip("psycopg2")
    con = psycopg2.connect(server.dsn())
    try:
        with con.cursor() as cur:
            cur.execute(sql.format("%s"), (["R01", "R03"],))
            (listed,) = cur.fetchone()
            cur.execute(sql.format("ARRAY['R01','R03']"))
            assert cur.fetchone() == (listed,)
    finally:
        con.close()
    pg8000 = pytest.importorskip("pg8000.native")
    con = pg8000.Connection("analyst", password=PASSWORD, host=server.host, port=server.port,
                            database="demo")  # fmt: skip
    try:
        (row,) = con.run(sql.format(":regions"), regions=["R01", "R03"])
    finally:
        con.close()
    assert int(row[0]) == listed > 0
