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
* one analyst's login locked every other user out: ``--max-connections`` bounded the logged-in
  sessions of all users together, and nothing bounded one user's share, so an analyst who
  opened 100 idle sessions (no idle timeout by default) left every other analyst and the
  admins with "too many clients" until the server was restarted. A user now holds at most
  half the places (at least one; ``--max-connections-per-user``), as a user holds at most
  half the workers, and is told so with PostgreSQL's message for a role's limit
  (``test_one_user_cannot_take_every_place_on_the_server``).
"""

from __future__ import annotations

import datetime as dt
import shutil
import uuid

import pytest

from tests.server.conftest import PASSWORD, add_server_user, start_server, stop_server

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


def test_one_user_cannot_take_every_place_on_the_server(server_db):
    add_server_user(server_db, "admin", PASSWORD + " admin")
    running = start_server(server_db, "--insecure", "--max-connections", "4")
    held = []
    try:
        with pytest.raises(psycopg.OperationalError) as caught:
            for _ in range(5):
                held.append(psycopg.connect(running.dsn(), autocommit=True, connect_timeout=5))
        assert len(held) == 2 and 'too many connections for role "analyst"' in str(caught.value)
        admin = running.dsn(user="admin", password=PASSWORD + " admin")
        with psycopg.connect(admin, autocommit=True, connect_timeout=5) as con:
            assert con.execute("SELECT 1").fetchall() == [(1,)]
        assert held[0].execute("SELECT 1").fetchall() == [(1,)]
    finally:
        for con in held:
            con.close()
        stop_server(running)
