"""Red-team attacks on ``sqlsdc serve`` with only an analyst's login: the catalog's shadow,
session isolation, SCRAM, error texts and denial of service for other users. Each test runs
against a real server subprocess (tests/server/conftest.py); a hole still open is marked
``xfail(strict=True, reason="OPEN: ...")``."""

from __future__ import annotations

import socket
import struct
import threading
import time

import pytest

from sqlsdc.server import codec
from tests.server.conftest import PASSWORD, add_server_user, start_server, stop_server

psycopg = pytest.importorskip("psycopg")
scramp = pytest.importorskip("scramp")


@pytest.fixture(scope="module")
def server_db(pristine_demo_db, tmp_path_factory, copy_database):

    db = copy_database(pristine_demo_db, tmp_path_factory.mktemp("attacks"))
    add_server_user(db)
    return db


def connect(server):
    return psycopg.connect(server.dsn(), autocommit=True)


def refusal(server, sql: str) -> psycopg.Error:
    with connect(server) as con, pytest.raises(psycopg.Error) as caught:
        con.execute(sql).fetchall()
    return caught.value


# --- the catalog's shadow: never data, never the engine, never the server's memory ------------


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT relname FROM pg_class; SELECT * FROM persons",
        "SELECT 1 FROM pg_class UNION SELECT income FROM persons",
        "WITH p AS (SELECT * FROM persons) SELECT * FROM pg_class, p",
        "WITH pg_class AS (SELECT * FROM persons) SELECT * FROM pg_class",
        "SELECT pg_catalog.getenv('HOME') FROM pg_class",
        "SELECT system.main.current_setting('threads') FROM pg_class",
        "SELECT \"read_text\"('/etc/passwd') FROM pg_catalog.pg_type",
        'SELECT * FROM pg_catalog."/etc/passwd"',
        "SELECT * FROM sqlsdc.server_users",
        "SELECT * FROM pg_class, sqlsdc.server_users",
        "COPY (SELECT 1) TO '/tmp/sqlsdc-attack.csv'",
        "ATTACH '/tmp/sqlsdc-attack.duckdb' AS x",
    ],
)
def test_catalog_and_data_statements_cannot_mix_or_reach_files(server, sql):
    error = refusal(server, sql)
    assert error.sqlstate == "42501", (error.sqlstate, str(error))


def test_a_set_setting_is_a_string_never_an_engine_setting(server):
    with connect(server) as con:
        con.execute("SET enable_external_access = true")
        assert con.execute("SHOW enable_external_access").fetchall() == [("true",)]
        with pytest.raises(psycopg.Error) as caught:
            con.execute("SELECT * FROM read_csv('/etc/passwd')").fetchall()
        assert caught.value.sqlstate == "42501"
        engine = con.execute("SELECT current_setting('memory_limit')").fetchall()
        assert engine == [(None,)]


def test_an_engine_error_in_a_catalog_query_is_withheld(server):
    error = refusal(server, "SELECT 'not a number'::integer AS n FROM pg_catalog.pg_type")
    assert "Conversion" not in str(error) and "not a number" not in str(error).split("HINT")[0]
    assert "withheld" in str(error)


def test_a_huge_catalog_answer_is_refused_before_it_fills_memory(server):
    started = time.monotonic()
    error = refusal(server, "SELECT a.x FROM generate_series(1, 3000) a(x), "
                            "generate_series(1, 3000) b(y)")  # fmt: skip
    assert error.sqlstate == "42501" and "at most" in str(error)
    assert time.monotonic() - started < 5


def test_a_catalog_aggregate_cannot_take_the_servers_memory(server):
    """A 3.4 GB string_agg in the shadow stops at the shadow's memory limit."""
    error = refusal(server, "SELECT length(string_agg('xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx', ''))"
                            " FROM generate_series(1, 100000000)")  # fmt: skip
    assert error.sqlstate == "08P01" and "withheld" in str(error)
    with connect(server) as con:
        assert con.execute("SELECT 1").fetchall() == [(1,)]


# --- sessions: isolation ---------------------------------------------------------------------


def test_one_sessions_settings_and_statements_are_not_anothers(server):
    with connect(server) as a, connect(server) as b:
        a.execute("SET application_name = 'secret-of-a'")
        a.execute("SET search_path = attacker")
        assert b.execute("SHOW application_name").fetchall() == [("",)]
        assert b.execute("SHOW search_path").fetchall() == [('"$user", public',)]
        sql = b"SELECT region, COUNT(*) AS n FROM persons GROUP BY region"
        assert a.pgconn.prepare(b"stolen", sql).error_field(ord("C")) is None
        assert a.pgconn.describe_prepared(b"stolen").error_field(ord("C")) is None
        assert b.pgconn.describe_prepared(b"stolen").error_field(ord("C")) == b"26000"


# --- a large answer must not stall the other sessions ----------------------------------------


@pytest.mark.slow
def test_a_large_answer_does_not_stall_other_sessions(server):
    """8^6 rows of the public table (under the answer cap, tests/security/
    test_resource_limits.py): the rows are encoded in the thread pool, chunk by chunk, so the
    event loop goes on serving another session meanwhile."""
    big = "SELECT r1.region FROM " + ", ".join(f"regions r{i}" for i in range(6))
    done, counted = threading.Event(), []

    def run_big():
        try:
            with connect(server) as con:
                counted.append(con.execute(big).rowcount)
        finally:
            done.set()

    latencies = []
    with connect(server) as victim:
        thread = threading.Thread(target=run_big)
        thread.start()
        while not done.is_set():
            started = time.monotonic()
            victim.execute("SELECT 1").fetchall()
            latencies.append(time.monotonic() - started)
            time.sleep(0.05)
        thread.join()
    assert counted == [8**6]
    assert max(latencies) < 2.0, latencies


# --- authentication --------------------------------------------------------------------------


def _read(sock: socket.socket) -> tuple[bytes, bytes]:
    head = b""
    while len(head) < 5:
        head += sock.recv(5 - len(head))
    kind, length = struct.unpack("!ci", head)
    body = b""
    while len(body) < length - 4:
        body += sock.recv(length - 4 - len(body))
    return kind, body


def _startup(sock: socket.socket, user: str) -> None:
    body = struct.pack("!i", codec.PROTOCOL_3_0) + b"user\0" + user.encode() + b"\0\0"
    sock.sendall(struct.pack("!i", len(body) + 4) + body)
    kind, _ = _read(sock)
    assert kind == b"R"


def _sasl_first(sock: socket.socket, first: str) -> str:
    data = first.encode()
    sock.sendall(codec.message(b"p", b"SCRAM-SHA-256\0" + struct.pack("!i", len(data)) + data))
    kind, body = _read(sock)
    assert kind == b"R", body
    return body[4:].decode()


def test_a_replayed_client_proof_is_refused(server):
    client = scramp.ScramClient(["SCRAM-SHA-256"], "analyst", PASSWORD)
    first = client.get_client_first()
    with socket.create_connection((server.host, server.port), timeout=10) as sock:
        _startup(sock, "analyst")
        client.set_server_first(_sasl_first(sock, first))
        final = client.get_client_final()
        sock.sendall(codec.message(b"p", final.encode()))
        assert _read(sock)[0] == b"R"  # the genuine login succeeds
    with socket.create_connection((server.host, server.port), timeout=10) as sock:
        _startup(sock, "analyst")
        _sasl_first(sock, first)  # same client nonce: the server adds a fresh one
        sock.sendall(codec.message(b"p", final.encode()))
        kind, body = _read(sock)
        assert kind == b"E" and b"28P01" in body


def test_an_unknown_user_gets_a_stable_salt_like_a_known_one(server):
    """The decoy exchange of an unknown user shows the same salt at each attempt (a changing
    salt would tell that the name has no password)."""

    def server_first(user: str) -> dict[str, str]:
        with socket.create_connection((server.host, server.port), timeout=10) as sock:
            _startup(sock, user)
            text = _sasl_first(sock, f"n,,n=,r=clientnonce{user}")
        return dict(part.split("=", 1) for part in text.split(","))

    for user in ("analyst", "nobody-here"):
        one, two = server_first(user), server_first(user)
        assert one["s"] == two["s"] and one["i"] == two["i"] == "4096"
        assert one["r"] != two["r"]


def test_a_wrong_channel_binding_header_fails_like_a_wrong_password(server):
    with socket.create_connection((server.host, server.port), timeout=10) as sock:
        _startup(sock, "analyst")
        data = b"p=tls-server-end-point,,n=,r=abc"
        sock.sendall(codec.message(b"p", b"SCRAM-SHA-256\0" + struct.pack("!i", len(data)) + data))
        kind, body = _read(sock)
        assert kind == b"E" and b"28P01" in body


# --- denial of service before authentication ---------------------------------------------------


def test_idle_unauthenticated_sockets_do_not_lock_users_out(server_db):
    """Handshakes are bounded apart from logged-in sessions and the oldest gives way."""
    running = start_server(server_db, "--insecure", "--max-connections", "3")
    try:
        idle = [socket.create_connection((running.host, running.port)) for _ in range(3)]
        time.sleep(0.3)
        try:
            with psycopg.connect(running.dsn(), autocommit=True, connect_timeout=5) as con:
                assert con.execute("SELECT 1").fetchall() == [(1,)]
        finally:
            for sock in idle:
                sock.close()
    finally:
        stop_server(running)


def test_a_handshake_that_gives_way_is_told_why(server_db):
    """The oldest handshake gives way to a newcomer: it was closed without a word, and a client
    that was logging in reported "server closed the connection unexpectedly"."""
    running = start_server(server_db, "--insecure", "--max-connections", "1")
    try:
        oldest = socket.create_connection((running.host, running.port))
        time.sleep(0.3)
        with psycopg.connect(running.dsn(), autocommit=True, connect_timeout=5) as con:
            assert con.execute("SELECT 1").fetchall() == [(1,)]
        oldest.settimeout(5)
        said = b""
        while chunk := oldest.recv(4096):
            said += chunk
        oldest.close()
        assert said[:1] == b"E" and b"C53300\0" in said and b"logging in at once" in said, said
    finally:
        stop_server(running)


def test_a_flood_of_connects_from_one_address_drops_its_own_handshakes(server_db):
    """A user from 127.0.0.1 is logging in when another address opens sockets without logging
    in: the flood's own oldest handshake gives way, not the user's (red team s47g: the oldest
    of all gave way, 1 of 12 logins dropped at 500 connects a second, each counted as a
    failed login of the user)."""
    running = start_server(server_db, "--insecure", "--max-connections", "2")
    flood = []
    try:
        with socket.create_connection((running.host, running.port), timeout=10) as user:
            _startup(user, "analyst")  # oldest handshake, SCRAM under way
            for _ in range(2):
                flood.append(socket.create_connection(
                    (running.host, running.port), timeout=10, source_address=("127.0.0.2", 0)
                ))  # fmt: skip
                time.sleep(0.3)
            assert _sasl_first(user, "n,,n=,r=floodednonce").startswith("r=floodednonce")
            flood[0].settimeout(5)
            assert b"C53300\0" in flood[0].recv(4096)  # the flood's oldest gave way
    finally:
        for sock in flood:
            sock.close()
        stop_server(running)


def test_logged_in_sessions_are_still_bounded_by_max_connections(server_db):
    running = start_server(server_db, "--insecure", "--max-connections", "2",
                           "--max-connections-per-user", "2")  # fmt: skip
    try:
        first = psycopg.connect(running.dsn(), autocommit=True, connect_timeout=5)
        second = psycopg.connect(running.dsn(), autocommit=True, connect_timeout=5)
        try:
            with pytest.raises(psycopg.OperationalError, match="too many clients"):
                psycopg.connect(running.dsn(), autocommit=True, connect_timeout=5)
            assert first.execute("SELECT 1").fetchall() == [(1,)]
        finally:
            first.close()
            second.close()
        deadline = time.monotonic() + 10  # the server frees the places as the sessions end
        while True:
            try:
                with psycopg.connect(running.dsn(), autocommit=True, connect_timeout=5) as con:
                    assert con.execute("SELECT 1").fetchall() == [(1,)]
                break
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
    finally:
        stop_server(running)


# --- malformed but well-framed statements end one statement, never the session ----------------


def test_tens_of_thousands_of_parameters_do_not_end_the_session(server):
    with connect(server) as con:
        too_many = con.pgconn.prepare(b"too_many", b"SELECT $99999::int AS x")
        assert too_many.error_field(ord("C")) == b"08P01"
        assert con.pgconn.prepare(b"many", b"SELECT $40000::int AS x").error_field(ord("C")) is None
        described = con.pgconn.describe_prepared(b"many")
        assert described.error_field(ord("C")) is None and described.nparams == 40000
        assert con.execute("SELECT 1").fetchall() == [(1,)]


# --- public.table (the catalog's schema, as BI tools write it) reaches no more than table ------


@pytest.mark.parametrize(
    ("sql", "message"),
    [
        ("SELECT * FROM public.persons", "row-level output"),
        (
            "SELECT region, SUM(public.persons.__rkey) AS k FROM public.persons GROUP BY region",
            "name resolution failed",
        ),
        ("SELECT COUNT(*) AS n FROM public.server_users", "not declared"),
        ("SELECT COUNT(*) AS n FROM sqlsdc.public.server_users", "qualified table name"),
        ("SELECT COUNT(*) AS n FROM public.pg_class", "not declared"),
        (
            "WITH p AS (SELECT region FROM persons) SELECT COUNT(*) AS n FROM public.p",
            "qualified table name",
        ),
    ],
)
def test_public_qualified_names_are_refused_like_plain_ones(server, sql, message):
    error = refusal(server, sql)
    assert error.sqlstate == "42501" and message in str(error)
