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
* parameters kept without bound: a portal keeps the values of its Bind, and only answers were
  counted, so one session binding a 4 MB text parameter to 100 portals (no Sync: nothing
  closes them) grew the server by 450 MB in a second; the 1,000 portals a session may keep
  would hold 4 GB, and 50 sessions 200 GB. The values a user's portals keep now count with
  the answers against the same 64 MB
  (``test_bound_parameters_count_against_what_a_user_keeps``).
* answers a client does not read: the answer of a simple Query stays in the server while it
  is written, and a client that reads nothing keeps it there for ever (no timeout applies to
  writing); four sessions sending the cross join above and reading nothing held 330 MB, 50
  sessions of one analyst would hold 3 GB. That answer now counts with what the user keeps,
  and no further statement runs (53400) while the user's sessions keep 64 MB
  (``test_answers_a_client_does_not_read_count_against_what_a_user_keeps``).
* plaintext taken for TLS (PostgreSQL's CVE-2021-23214): bytes a client sent after its
  SSLRequest, before the server's ``S``, stayed in the server's read buffer and were read
  after the TLS handshake as if they had come through it, so a man in the middle could put
  a startup message (or, in PostgreSQL, statements) into a TLS session. Such bytes now end the
  connection before TLS starts ("received unencrypted data after SSL request", as PostgreSQL
  says) (``test_plaintext_sent_with_the_ssl_request_is_not_read_as_tls``).

What held (tried against a running server as ``analyst``, or with no login):

* the catalog's shadow: ``pg_settings`` and ``current_setting`` show the session's strings
  only; ``pg_user.passwd``, ``pg_roles.rolpassword``, ``pg_shadow``, ``pg_authid``,
  ``pg_stat_activity``, ``pg_stats``, ``pg_statistic``, ``pg_stat_user_tables``,
  ``pg_file_settings``, ``pg_hba_file_rules``, ``prosrc`` are refused; ``reltuples`` is -1 and
  relation sizes 0; ``pg_database_size``, ``inet_server_addr``, ``pg_current_logfile``,
  ``set_config`` are refused; answers of odd types (interval, uuid, bytea, arrays, hugeint)
  are sent, an infinite timestamp is 22008, an overflow is withheld (08P01).
* session statements: ``SET ROLE``, ``SET SESSION AUTHORIZATION`` and ``session_authorization``
  are refused; two statements in one Query, ``COPY ... TO STDOUT``, ``EXPLAIN [ANALYZE]``,
  ``LOAD``, ``INSTALL``, ``PRAGMA``, ``CALL``, ``DESCRIBE``, ``SUMMARIZE``, ``CHECKPOINT`` are
  refused; ``SET search_path`` and ``SET statement_timeout`` stay strings.
* parameters: a quoted-SQL string is a value; text against a measure is refused as an error
  oracle; NaN and infinity are values; ``$1::regclass`` is refused.
* budget: 12 sessions racing 200 distinct DP queries against 1 epsilon spent exactly 1.
* sessions of the server do not wait for another's minute-long statement (0.17 s).
* no login: 16 threads of startups (574 user lookups in a second) slowed an analyst's query
  from 0.12 to 0.4 s; 3,000 startups sent and abandoned left no backlog.
* the CLI: a user is a name given on the command line (``--user``/``--as``), not
  authenticated: whoever can open the file is trusted with all of it (DuckDB's file holds the
  data), so another user's CLI identity is no boundary; an analyst's ``audit`` is refused
  (exit 5), and refusals are one line on stderr in every ``--format``.

Left open:

* the database file is one process's at a time: a statement holds it, and the server process
  holds it while any of its sessions runs one, so an analyst running overlapping slow
  statements in several sessions keeps it from every other process (three statements of about
  25 s, started 25 s apart, made an admin's ``sqlsdc audit`` wait 47 s; more of them make it
  fail after its 60 s wait). The turn-taking of guarded connections works per connection, not
  per process; a fix needs a gate in the server that starts no statement while another
  process waits after a turn.
* COMMIT or ROLLBACK sent as a simple Query leaves the portals of the block open until the
  next Sync (PostgreSQL closes them); they count against the user's 64 MB. (Closed in red
  team s35b.)
* the bound is checked before a statement runs: a user's statements running at once (half the
  workers) may each add one answer past it.
"""

from __future__ import annotations

import datetime as dt
import socket
import ssl
import struct
import uuid

import pytest

from sqlsdc.server import codec
from tests.server.conftest import (
    PASSWORD,
    add_server_user,
    start_server,
    stop_server,
    tls_files,  # noqa: F401 - the fixture
    wait_until,
)
from tests.server.test_protocol import error_code, login, query, read, read_until, startup

psycopg = pytest.importorskip("psycopg")

AGGREGATE = "SELECT region, COUNT(*) AS n FROM persons WHERE region = %s GROUP BY region"


@pytest.fixture(scope="module")
def server_db(pristine_demo_db, tmp_path_factory, copy_database):
    db = copy_database(pristine_demo_db, tmp_path_factory.mktemp("s32c"))
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


def test_bound_parameters_count_against_what_a_user_keeps(server):
    value = b"x" * (4 * 2**20 - 100)  # within the 4 MiB bound of one message

    def bind(name: str) -> bytes:
        body = codec.cstr(name) + codec.cstr("s") + struct.pack("!hh", 0, 1)
        body += struct.pack("!i", len(value)) + value + struct.pack("!h", 0)
        return codec.message(b"B", body)

    sock, _, _ = login(server)
    try:
        sock.sendall(codec.message(b"P", b"s\0SELECT $1 AS x\0\0\0"))
        sock.sendall(b"".join(bind(f"p{i}") for i in range(20)) + codec.message(b"S"))
        messages = read_until(sock)
        errors = [error_code(body) for kind, body in messages if kind == b"E"]
        assert errors == ["53400"]  # the Bind of a portal past 64 MB; the rest skipped
        assert 10 <= [kind for kind, _ in messages].count(b"2") < 17
        sock.sendall(bind("again") + codec.message(b"S"))  # Sync closed the portals
        assert [kind for kind, _ in read_until(sock)] == [b"2", b"Z"]
    finally:
        sock.close()


def test_plaintext_sent_with_the_ssl_request_is_not_read_as_tls(server_db, tls_files):  # noqa: F811
    cert, key = tls_files
    running = start_server(server_db, "--tls-cert", str(cert), "--tls-key", str(key))
    try:
        raw = socket.create_connection((running.host, running.port), timeout=10)
        raw.sendall(struct.pack("!ii", 8, codec.SSL_REQUEST) + startup())  # injected in clear
        answer = raw.recv(1)
        if answer == b"S":  # the server went on to TLS: nothing may come from the clear bytes
            context = ssl.create_default_context()
            context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
            with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
                with pytest.raises((ConnectionError, ssl.SSLError, OSError)):
                    kind, _ = read(tls)
                    pytest.fail(f"the clear startup was answered through TLS with {kind!r}")
        else:
            assert answer in (b"", b"E")
            raw.close()
    finally:
        stop_server(running)


def test_answers_a_client_does_not_read_count_against_what_a_user_keeps(server):
    readers = []
    try:
        for _ in range(2):
            sock, _, _ = login(server)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.sendall(codec.message(b"Q", codec.cstr(CROSS_JOIN)))  # and read nothing
            readers.append(sock)
        with connect(server) as con:

            def refused() -> bool:
                try:
                    con.execute("SELECT 1 AS one").fetchall()
                except psycopg.Error as e:
                    assert e.sqlstate == "53400", str(e)
                    return True
                return False

            assert wait_until(refused, timeout=30)
            for sock in readers:
                sock.close()
            assert wait_until(lambda: not refused(), timeout=30)
    finally:
        for sock in readers:
            sock.close()
