"""The server at the byte level: negotiation, limits, timeouts, TLS, cancel keys, and a
hypothesis fuzz test throwing malformed and truncated messages at a running server, which must
answer or close each hostile connection promptly and go on serving others."""

from __future__ import annotations

import os
import re
import socket
import struct
import time

import cli_fork
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sqlsdc.server import codec
from tests.server.conftest import PASSWORD, SLOW_SQL, start_server, stop_server

scramp = pytest.importorskip("scramp")


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data


def read(sock: socket.socket) -> tuple[bytes, bytes]:
    kind, length = struct.unpack("!ci", _recv_exactly(sock, 5))
    return kind, _recv_exactly(sock, length - 4)


def read_until(sock: socket.socket, kinds: bytes = b"Z") -> list[tuple[bytes, bytes]]:
    messages = []
    while True:
        messages.append(read(sock))
        if messages[-1][0] in [bytes([k]) for k in kinds]:
            return messages


def startup(user: str = "analyst") -> bytes:
    body = struct.pack("!i", codec.PROTOCOL_3_0) + b"user\0" + user.encode() + b"\0\0"
    return struct.pack("!i", len(body) + 4) + body


def login(server, password: str = PASSWORD) -> tuple[socket.socket, int, int]:
    """A raw authenticated connection: (socket, backend pid, secret key)."""
    sock = socket.create_connection((server.host, server.port), timeout=10)
    sock.sendall(startup())
    kind, body = read(sock)
    assert kind == b"R" and struct.unpack("!i", body[:4])[0] == codec.AUTH_SASL
    client = scramp.ScramClient(["SCRAM-SHA-256"], "analyst", password)
    first = client.get_client_first().encode()
    sock.sendall(codec.message(b"p", b"SCRAM-SHA-256\0" + struct.pack("!i", len(first)) + first))
    kind, body = read(sock)
    assert kind == b"R", body
    client.set_server_first(body[4:].decode())
    sock.sendall(codec.message(b"p", client.get_client_final().encode()))
    kind, body = read(sock)
    if kind == b"E":
        raise PermissionError(body.decode(errors="replace"))
    client.set_server_final(body[4:].decode())  # the server proves it knows the keys too
    pid = secret = None
    for kind, body in read_until(sock):
        if kind == b"K":
            pid, secret = struct.unpack("!ii", body)
    return sock, pid, secret


def query(sock: socket.socket, sql: str) -> list[tuple[bytes, bytes]]:
    sock.sendall(codec.message(b"Q", sql.encode() + b"\0"))
    return read_until(sock)


def error_code(body: bytes) -> str:
    fields = {f[:1]: f[1:].decode() for f in body.rstrip(b"\0").split(b"\0") if f}
    return fields[b"C"]


def test_scram_server_proof_and_wrong_password(server):
    sock, pid, secret = login(server)
    assert pid > 0 and secret is not None
    sock.close()
    with pytest.raises(PermissionError, match="28P01"):
        login(server, password="wrong password")


def test_unknown_user_fails_like_a_wrong_password(server):
    sock = socket.create_connection((server.host, server.port), timeout=10)
    sock.sendall(startup("nobody"))
    kind, body = read(sock)
    assert kind == b"R"  # the exchange starts as for a real user
    client = scramp.ScramClient(["SCRAM-SHA-256"], "nobody", PASSWORD)
    first = client.get_client_first().encode()
    sock.sendall(codec.message(b"p", b"SCRAM-SHA-256\0" + struct.pack("!i", len(first)) + first))
    kind, body = read(sock)
    client.set_server_first(body[4:].decode())
    sock.sendall(codec.message(b"p", client.get_client_final().encode()))
    kind, body = read(sock)
    assert kind == b"E" and error_code(body) == "28P01"
    assert b'password authentication failed for user "nobody"' in body


def test_ssl_and_gssenc_requests_are_declined_without_tls(server):
    sock = socket.create_connection((server.host, server.port), timeout=10)
    sock.sendall(struct.pack("!ii", 8, codec.GSSENC_REQUEST))
    assert sock.recv(1) == b"N"
    sock.sendall(struct.pack("!ii", 8, codec.SSL_REQUEST))
    assert sock.recv(1) == b"N"
    sock.sendall(startup())
    assert read(sock)[0] == b"R"
    sock.close()


def test_extended_protocol_row_limit_suspends_the_portal(server):
    sock, _, _ = login(server)
    sql = b"SELECT name FROM regions ORDER BY name\0"
    sock.sendall(codec.message(b"P", b"s1\0" + sql + b"\0\0")
                 + codec.message(b"B", b"p1\0s1\0\0\0\0\0\0\0")
                 + codec.message(b"E", b"p1\0" + struct.pack("!i", 3))
                 + codec.message(b"E", b"p1\0" + struct.pack("!i", 0))
                 + codec.message(b"S"))  # fmt: skip
    kinds = [k for k, _ in read_until(sock)]
    assert kinds == [b"1", b"2", *[b"D"] * 3, b"s", *[b"D"] * 5, b"C", b"Z"]
    sock.close()


def test_error_in_extended_protocol_skips_to_sync(server):
    sock, _, _ = login(server)
    sock.sendall(codec.message(b"P", b"\0SELECT * FROM persons\0\0\0")
                 + codec.message(b"B", b"\0\0\0\0\0\0\0\0")
                 + codec.message(b"E", b"\0\0\0\0\0")
                 + codec.message(b"S"))  # fmt: skip
    messages = read_until(sock)
    assert [k for k, _ in messages] == [b"1", b"2", b"E", b"Z"]
    assert error_code(messages[2][1]) == "42501"
    assert [k for k, _ in query(sock, "SELECT COUNT(*) AS n FROM regions")][-2:] == [b"C", b"Z"]
    sock.close()


@pytest.mark.parametrize(
    "formats",
    [
        struct.pack("!hh", 1, 5) + struct.pack("!h", 0) + struct.pack("!h", 0),  # a param code
        struct.pack("!h", 0) + struct.pack("!h", 0) + struct.pack("!hh", 1, 7),  # a result code
    ],
    ids=["parameter format 5", "result format 7"],
)
def test_an_unsupported_format_code_fails_the_statement_not_the_session(server, formats):
    """PostgreSQL answers a Bind's format code other than 0 or 1 with an ERROR and the session
    goes on; it ended the session (FATAL 08P01, red team s47g)."""
    sock, _, _ = login(server)
    sock.sendall(codec.message(b"P", b"\0SELECT COUNT(*) AS n FROM regions\0\0\0")
                 + codec.message(b"B", b"\0\0" + formats)
                 + codec.message(b"E", b"\0\0\0\0\0")
                 + codec.message(b"S"))  # fmt: skip
    messages = read_until(sock)
    assert [k for k, _ in messages] == [b"1", b"E", b"Z"]
    assert error_code(messages[1][1]) == "08P01" and b"SERROR\0" in messages[1][1]
    assert b"unsupported format code" in messages[1][1]
    assert [k for k, _ in query(sock, "SELECT COUNT(*) AS n FROM regions")][-2:] == [b"C", b"Z"]
    sock.close()


def test_invalid_utf8_fails_the_statement_not_the_session(server):
    """PostgreSQL answers a string of invalid UTF-8 with ERROR 22021 (invalid byte sequence
    for encoding "UTF8") and the session goes on; a Query of it ended the session with FATAL
    08P01 (red team s49e). Fails on int49."""
    sock, _, _ = login(server)
    sock.sendall(codec.message(b"Q", b"SELECT '\xff\xfe' AS x\0"))
    messages = read_until(sock)
    assert [k for k, _ in messages] == [b"E", b"Z"] and messages[1][1] == b"I"
    assert error_code(messages[0][1]) == "22021" and b"SERROR\0" in messages[0][1]
    assert b'invalid byte sequence for encoding "UTF8": 0xff' in messages[0][1]
    sock.sendall(codec.message(b"P", b"\0SELECT '\xc3(' AS x\0\0\0")  # extended: until Sync
                 + codec.message(b"B", b"\0\0\0\0\0\0\0\0")
                 + codec.message(b"S"))  # fmt: skip
    messages = read_until(sock)
    assert [k for k, _ in messages] == [b"E", b"Z"] and error_code(messages[0][1]) == "22021"
    assert [k for k, _ in query(sock, "BEGIN")] == [b"C", b"Z"]
    sock.sendall(codec.message(b"Q", b"SELECT '\x80' AS x\0"))
    messages = read_until(sock)
    assert error_code(messages[0][1]) == "22021" and messages[-1] == (b"Z", b"E")  # aborted
    assert query(sock, "ROLLBACK")[-1] == (b"Z", b"I")
    assert [k for k, _ in query(sock, "SELECT COUNT(*) AS n FROM regions")][-2:] == [b"C", b"Z"]
    sock.close()


def test_statement_timeout_is_57014(server_db):
    running = start_server(server_db, "--insecure", "--statement-timeout", "1")
    try:
        sock, _, _ = login(running)
        messages = query(sock, SLOW_SQL)
        assert messages[0][0] == b"E" and error_code(messages[0][1]) == "57014"
        assert b"statement timeout" in messages[0][1]
    finally:
        stop_server(running)


def test_cancel_needs_the_secret_key(server):
    sock, pid, secret = login(server)
    wrong = socket.create_connection((server.host, server.port), timeout=10)
    wrong.sendall(struct.pack("!iiii", 16, codec.CANCEL_REQUEST, pid, secret ^ 1))
    assert wrong.recv(1) == b""  # closed, nothing said
    sock.sendall(codec.message(b"Q", SLOW_SQL.encode() + b"\0"))
    time.sleep(1.0)
    right = socket.create_connection((server.host, server.port), timeout=10)
    right.sendall(struct.pack("!iiii", 16, codec.CANCEL_REQUEST, pid, secret))
    right.close()
    messages = read_until(sock)
    assert messages[0][0] == b"E" and error_code(messages[0][1]) == "57014"
    assert b"user request" in messages[0][1]
    sock.close()


def test_idle_timeout_closes_the_session(server_db):
    running = start_server(server_db, "--insecure", "--idle-timeout", "0.5")
    try:
        sock, _, _ = login(running)
        kind, body = read(sock)  # nothing sent: the server ends the session
        assert kind == b"E" and error_code(body) == "57P05"
        assert sock.recv(1) == b""
    finally:
        stop_server(running)


def test_tls_is_required_unless_insecure(server_db, tls_files):
    psycopg = pytest.importorskip("psycopg")
    cert, key = tls_files
    running = start_server(server_db, "--tls-cert", str(cert), "--tls-key", str(key))
    try:
        with psycopg.connect(running.dsn(sslmode="require"), autocommit=True) as con:
            assert con.pgconn.ssl_in_use
            assert con.execute("SELECT COUNT(*) AS n FROM regions").fetchone() == (8,)
        with pytest.raises(psycopg.OperationalError, match="accepts only TLS"):
            psycopg.connect(running.dsn(sslmode="disable"))
    finally:
        stop_server(running)


def test_serve_refuses_to_start_without_tls_or_insecure(server_db):
    done = cli_fork.run(["serve", server_db], timeout=60)
    assert done.returncode == 1
    assert "no TLS certificate: give --tls-cert and --tls-key, or pass --insecure" in done.stderr


def test_oversized_message_is_refused_and_the_connection_closed(server):
    sock, _, _ = login(server)
    sock.sendall(b"Q" + struct.pack("!i", 64 * 1024 * 1024))
    kind, body = read(sock)
    assert kind == b"E" and error_code(body) == "08P01"
    assert sock.recv(1) == b""


# --- fuzz -----------------------------------------------------------------------------------------

KINDS = st.sampled_from([b"Q", b"P", b"B", b"D", b"E", b"C", b"S", b"H", b"X", b"F", b"p", b"?"])


@st.composite
def hostile_messages(draw):
    """Messages with wrong lengths, truncated bodies, random fields, or a valid prefix."""
    kind = draw(KINDS)
    body = draw(st.binary(max_size=64))
    declared = draw(st.one_of(st.just(len(body) + 4), st.integers(-(2**31), 2**31 - 1)))
    cut = draw(st.integers(0, len(body)))
    return kind + struct.pack("!i", declared) + body[:cut]


def _closed_by_server(sock: socket.socket) -> bool:
    """After our end of the stream, the server answers what it could read and closes the
    connection within seconds (True), whatever the bytes were; False if it hangs."""
    sock.shutdown(socket.SHUT_WR)
    sock.settimeout(5.0)
    try:
        while sock.recv(65536):
            pass
    except TimeoutError:
        return False
    except ConnectionError:
        pass
    return True


@pytest.mark.slow  # about 15 s: 40 examples of three connections each
@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts descriptors in /proc")
@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(startup_bytes=st.binary(max_size=40), messages=st.lists(hostile_messages(), max_size=4))
def test_fuzz_malformed_messages_never_break_the_server(server, startup_bytes, messages):
    # a hostile startup packet
    raw = socket.create_connection((server.host, server.port), timeout=5)
    raw.sendall(startup_bytes)
    assert _closed_by_server(raw)
    raw.close()
    # hostile messages after a real login
    sock, _, _ = login(server)
    sock.sendall(b"".join(messages))
    assert _closed_by_server(sock)
    sock.close()
    # the server still serves a good client
    good, _, _ = login(server)
    assert [k for k, _ in query(good, "SELECT COUNT(*) AS n FROM regions")][-2:] == [b"C", b"Z"]
    good.close()
    assert server.process.poll() is None
    assert len(os.listdir(f"/proc/{server.process.pid}/fd")) < 64  # no sockets left behind


def test_timing_lines_only_when_asked_and_only_durations(server_db, monkeypatch):
    """``SQLSDC_SERVER_TIMING=1`` (for the benchmark) logs two durations per statement: the
    guard's share and the server's total; never the statement, the user or a value."""
    monkeypatch.setenv("SQLSDC_SERVER_TIMING", "1")
    running = start_server(server_db, "--insecure")
    try:
        sock, _, _ = login(running)
        assert (
            query(sock, "SELECT region, COUNT(*) AS n FROM persons GROUP BY region")[-1][0] == b"Z"
        )
        assert query(sock, "SHOW server_version")[-1][0] == b"Z"
        sock.close()
        time.sleep(0.5)  # the line is written just after the last byte to the client
    finally:
        stop_server(running)
    lines = [line for line in running.process.stderr.read().splitlines() if "timing" in line]
    assert len(lines) == 2, lines
    guard, total = (float(v) for v in re.findall(r"[0-9.]+", lines[0].split("timing", 1)[1]))
    assert 0 < guard <= total
    assert re.fullmatch(r"sqlsdc serve: timing guard_ms=0\.000 total_ms=[0-9.]+", lines[1])
    assert not any(word in line for line in lines for word in ("persons", "analyst", "region"))

    monkeypatch.delenv("SQLSDC_SERVER_TIMING")
    running = start_server(server_db, "--insecure")
    try:
        sock, _, _ = login(running)
        query(sock, "SELECT region, COUNT(*) AS n FROM persons GROUP BY region")
        sock.close()
    finally:
        stop_server(running)
    assert "timing" not in running.process.stderr.read()


def test_a_stop_ends_every_session_cleanly(server_db):
    """SIGTERM (or Ctrl-C) with a session running a statement: asyncio printed tracebacks of
    the sessions it cancelled. Each session is now told why (FATAL 57P01, as PostgreSQL at a
    shutdown), its statement is interrupted, and the server exits 0 with only its banner."""
    import signal
    import threading

    psycopg = pytest.importorskip("psycopg")
    running = start_server(server_db, "--insecure")
    try:
        con = psycopg.connect(running.dsn(), autocommit=True)
        ended = []

        def slow() -> None:
            try:
                con.execute(SLOW_SQL).fetchall()
            except psycopg.Error as error:
                ended.append(error)

        statement = threading.Thread(target=slow)
        statement.start()
        time.sleep(1.0)
        started = time.monotonic()
        running.process.send_signal(signal.SIGTERM)
        assert running.process.wait(30) == 0
        statement.join(30)
        assert time.monotonic() - started < 15  # the minute-long statement was interrupted
        stderr = running.process.stderr.read()
        assert "Traceback" not in stderr and "Error" not in stderr, stderr
        assert ended and ended[0].sqlstate == "57P01", ended
    finally:
        if running.process.poll() is None:
            stop_server(running)
