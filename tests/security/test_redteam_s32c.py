"""Red-team round s32c: the ways into sqlsdc other than the Python API — ``sqlsdc serve`` with
an analyst's login or none, and several sessions on one database file. Each test runs against
a real server subprocess (tests/server/conftest.py).

What succeeded, and was closed:

* a Bind parameter the server cannot read ended the session as an internal error: a binary
  ``bytea``, ``uuid`` or ``interval`` parameter (psycopg sends them for ``bytes``,
  ``uuid.UUID`` and ``timedelta``), or a numeric of 31 digits, raised ``ParameterError`` in
  the Bind handler outside the mapping to SQLSTATEs, so the client got ``FATAL XX000
  internal error in sqlsdc`` and lost its session (prepared statements, transaction block),
  and the server log filled with "ended by an internal error" lines an analyst could write at
  will. It is now ``22P02`` for that statement, and the session goes on
  (``test_an_unreadable_parameter_ends_the_statement_not_the_session``).
"""

from __future__ import annotations

import datetime as dt
import shutil
import uuid

import pytest

from tests.server.conftest import add_server_user, start_server, stop_server

psycopg = pytest.importorskip("psycopg")

AGGREGATE = "SELECT region, COUNT(*) AS n FROM persons WHERE region = %s GROUP BY region"


@pytest.fixture(scope="module")
def server_db(pristine_demo_db, tmp_path_factory):
    db = tmp_path_factory.mktemp("s32c") / "demo.duckdb"
    shutil.copy(pristine_demo_db, db)
    add_server_user(db)
    return db


@pytest.fixture(scope="module")
def server(server_db):
    running = start_server(server_db, "--insecure")
    yield running
    stop_server(running)


def connect(server):
    return psycopg.connect(server.dsn(), autocommit=True)


@pytest.mark.parametrize("binary", [False, True])
@pytest.mark.parametrize("value", [b"\x00\xff", uuid.UUID(int=7), dt.timedelta(days=3), 10**30])
def test_an_unreadable_parameter_ends_the_statement_not_the_session(server, value, binary):
    with connect(server) as con:
        assert con.pgconn.prepare(b"kept", b"SELECT 1 AS one").error_field(ord("C")) is None
        with pytest.raises(psycopg.Error) as caught:
            con.cursor(binary=binary).execute(AGGREGATE, (value,)).fetchall()
        assert caught.value.sqlstate == "22P02", (caught.value.sqlstate, str(caught.value))
        assert "internal error" not in str(caught.value)
        assert con.pgconn.describe_prepared(b"kept").error_field(ord("C")) is None
        assert con.execute("SELECT 1 AS one").fetchall() == [(1,)]
