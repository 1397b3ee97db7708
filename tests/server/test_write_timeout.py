"""A client that stops reading is disconnected after ``--write-timeout`` (red team s35b left it
waiting for ever to write, holding its place and what it keeps), while other users are served;
what it was answered stays charged and audited."""

from __future__ import annotations

import errno
import socket
import time

import pytest

import sqlsdc
from sqlsdc.server import codec
from tests.server.conftest import PASSWORD, add_server_user, start_server, stop_server, wait_until
from tests.server.test_protocol import login, query

psycopg = pytest.importorskip("psycopg")

ADMIN_PASSWORD = PASSWORD + " admin"
BIG_ANSWER = (
    "SELECT "
    + ", ".join(f"r{i}.name AS n{i}, r{i}.population AS p{i}" for i in range(6))
    + " FROM "
    + ", ".join(f"regions r{i}" for i in range(6))
)
"""A row-level read of the public table: 262,144 rows, far more than the sockets buffer."""


@pytest.fixture(scope="module")
def server_db(pristine_demo_db, tmp_path_factory, copy_database):
    db = copy_database(pristine_demo_db, tmp_path_factory.mktemp("write_timeout"))
    add_server_user(db)
    add_server_user(db, "admin", ADMIN_PASSWORD)
    return db


def test_a_client_that_stops_reading_is_disconnected_and_others_are_served(server_db):
    # one session per user: the analyst logs in again only once the stuck session let go
    running = start_server(server_db, "--insecure", "--write-timeout", "1",
                           "--max-connections-per-user", "1")  # fmt: skip
    try:
        stuck, _, _ = login(running)
        stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stuck.sendall(codec.message(b"Q", BIG_ANSWER.encode() + b"\0"))
        sent = time.monotonic()
        with psycopg.connect(running.dsn("admin", ADMIN_PASSWORD), autocommit=True) as other:
            assert other.execute("SELECT COUNT(*) AS n FROM regions").fetchone() == (8,)
        # the server resets the connection: an error is pending on the socket, nothing read
        assert wait_until(
            lambda: stuck.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == errno.ECONNRESET, 60
        )
        waited = time.monotonic() - sent
        stuck.close()
        again, _, _ = login(running)  # its place is free
        assert query(again, "SELECT COUNT(*) AS n FROM regions")[-1][0] == b"Z"
        again.close()
    finally:
        stop_server(running)
    assert waited < 30  # the answer's computation, then one second of no reading
    entries = sqlsdc.admin.audit(server_db, "admin", who="analyst", limit=20)
    answered = entries[entries["sql_text"] == BIG_ANSWER]
    assert list(answered["decision"]) == ["accepted"]


def test_a_tls_client_that_stops_reading_lets_go_of_its_place(server_db, tls_files):
    """Over TLS too: the reset reaches the socket beneath the TLS layer."""
    cert, key = tls_files
    running = start_server(server_db, "--tls-cert", str(cert), "--tls-key", str(key),
                           "--write-timeout", "1", "--max-connections-per-user", "1")  # fmt: skip
    dsn = running.dsn(sslmode="require")
    try:
        stuck = psycopg.connect(dsn, autocommit=True)
        stuck.pgconn.send_query(BIG_ANSWER.encode())  # and never reads the answer

        def logged_in_again() -> bool:
            try:
                with psycopg.connect(dsn, autocommit=True) as again:
                    return again.execute("SELECT COUNT(*) AS n FROM regions").fetchone() == (8,)
            except psycopg.OperationalError as e:
                assert "too many connections" in str(e)
                return False

        assert wait_until(logged_in_again, 60)
        stuck.close()
    finally:
        stop_server(running)
