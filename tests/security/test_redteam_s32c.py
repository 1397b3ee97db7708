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
* one analyst could still fill the server's memory with answers: a session keeps at most 64 MB
  of answers in suspended portals (red team s30), but each of a user's sessions kept its own
  64 MB. Two portals of a cross join of the public ``regions`` table (262,144 rows, 18
  columns) held about 140 MB of the server per session, and 50 sessions (or 100, before the
  share above) held 7 GB (14 GB) of a server shared by every user. The bound is now on what
  all of a user's sessions keep together
  (``test_a_users_sessions_together_keep_at_most_the_bound_of_one``).
"""

from __future__ import annotations

import datetime as dt
import shutil
import struct
import uuid

import pytest

from sqlsdc.server import codec
from tests.server.conftest import PASSWORD, add_server_user, start_server, stop_server
from tests.server.test_protocol import error_code, login, query, read_until

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


CROSS_JOIN = (
    "SELECT "
    + ", ".join(
        f"r{i}.name AS n{i}, r{i}.region AS g{i}, r{i}.population AS p{i}" for i in range(6)
    )
    + " FROM "
    + ", ".join(f"regions r{i}" for i in range(6))
)
"""A row-level read of the public table: 262,144 rows of about 35 MB in Arrow."""


def _suspend(sock, portals: list[str]) -> list[str]:
    """In an open transaction block: a portal per name over :data:`CROSS_JOIN`, each executed
    for one row (suspended: its answer stays in the server); the SQLSTATEs of the errors."""
    messages = codec.message(b"P", b"\0" + CROSS_JOIN.encode() + b"\0\0\0")
    for name in portals:
        messages += codec.message(b"B", name.encode() + b"\0\0" + b"\0" * 6)
        messages += codec.message(b"E", name.encode() + b"\0" + struct.pack("!i", 1))
    sock.sendall(messages + codec.message(b"S"))
    return [error_code(body) for kind, body in read_until(sock) if kind == b"E"]


def test_a_users_sessions_together_keep_at_most_the_bound_of_one(server):
    first, _, _ = login(server)
    second, _, _ = login(server)
    try:
        for sock in (first, second):
            assert [k for k, _ in query(sock, "BEGIN")][-1] == b"Z"
        assert _suspend(first, ["a", "b", "c"]) == ["53400"]  # two kept: 64 MB and more
        assert _suspend(second, ["a"]) == ["53400"]
        first.sendall(codec.message(b"X"))  # the first session ends: its answers are freed
        assert first.recv(1) == b""
        assert _suspend(second, ["z"]) == []
    finally:
        first.close()
        second.close()
