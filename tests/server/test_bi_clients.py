"""What a dashboard's and a notebook's PostgreSQL clients send to a real ``sqlsdc serve``
(new user s40h): SQLAlchemy's ``.limit().offset()``, bound as ``LIMIT $1::INTEGER``, is
answered; a server-side cursor (psycopg's named cursor, SQLAlchemy's ``stream_results``) is
refused as not supported (0A000), saying to read with a client-side cursor, and audited."""

from __future__ import annotations

import pytest

from sqlsdc.engines.duckdb import open_database
from tests.server.conftest import PASSWORD

psycopg = pytest.importorskip("psycopg")

GROUPS = "SELECT region, COUNT(*) AS n FROM persons GROUP BY region ORDER BY region"


def _engine(server):
    sqlalchemy = pytest.importorskip("sqlalchemy")
    url = sqlalchemy.engine.URL.create(
        "postgresql+psycopg", username="analyst", password=PASSWORD, host=server.host,
        port=server.port, database="demo", query={"sslmode": "disable"},
    )  # fmt: skip
    return sqlalchemy.create_engine(url)


def test_sqlalchemy_limit_and_offset_are_answered(server):
    sqlalchemy = pytest.importorskip("sqlalchemy")
    engine = _engine(server)
    try:
        persons = sqlalchemy.Table("persons", sqlalchemy.MetaData(), autoload_with=engine)
        query = (
            sqlalchemy.select(persons.c.region, sqlalchemy.func.count().label("n"))
            .group_by(persons.c.region)
            .order_by(persons.c.region)
            .limit(2)
            .offset(1)
        )
        assert "LIMIT %(param_1)s::INTEGER" in str(query.compile(engine))
        with engine.connect() as con:
            page = con.execute(query).fetchall()
            every = con.execute(sqlalchemy.text(GROUPS)).fetchall()
    finally:
        engine.dispose()
    assert [tuple(r) for r in page] == [tuple(r) for r in every[1:3]]


def test_a_named_cursor_is_refused_as_not_supported_and_the_session_goes_on(server):
    with psycopg.connect(server.dsn()) as con:  # not autocommit: DECLARE in a transaction
        with pytest.raises(psycopg.errors.FeatureNotSupported) as refused:
            with con.cursor(name="by_region") as cur:
                cur.execute(GROUPS + " -- named cursor s40h")
        assert "server-side cursors" in str(refused.value)
        assert "use a client-side cursor" in str(refused.value)
        con.rollback()
        with con.cursor() as cur:
            rows = list(cur.stream(GROUPS))  # what the message says to do
        assert len(rows) > 0
    audit = open_database(server.db, writes_data=False)
    try:
        logged = audit.execute(
            "SELECT user_name, decision FROM sqlsdc.audit WHERE sql_text LIKE 'DECLARE%' "
            "AND sql_text LIKE '%named cursor s40h'"
        ).fetchall()
    finally:
        audit.close()
    assert logged == [("analyst", "refused")]


def test_sqlalchemy_stream_results_gets_the_same_message(server):
    sqlalchemy = pytest.importorskip("sqlalchemy")
    engine = _engine(server)
    try:
        with engine.connect() as con, pytest.raises(sqlalchemy.exc.NotSupportedError,
                                                    match="server-side cursors"):  # fmt: skip
            con.execution_options(stream_results=True).execute(sqlalchemy.text(GROUPS))
    finally:
        engine.dispose()


@pytest.mark.parametrize("sql", ["FETCH FORWARD 10 FROM c", "MOVE 1 IN c", "CLOSE c"])
def test_cursor_statements_are_refused_as_not_supported(server, sql):
    with psycopg.connect(server.dsn(), autocommit=True) as con:
        with pytest.raises(psycopg.errors.FeatureNotSupported, match=sql.split()[0]):
            con.execute(sql)
