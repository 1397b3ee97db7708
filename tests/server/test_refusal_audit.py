"""Every refusal an analyst provokes through the server is audited, as a refused Query is: the
catalog's refusals (a statement mixing ``pg_catalog`` and data tables, ``SET ROLE``) and the
guard's refusal of a parameterised statement at Describe, once each (red team s35b found them
unrecorded)."""

from __future__ import annotations

import struct

import pytest

from sqlsdc.engines.duckdb import open_database
from sqlsdc.server import codec
from tests.server.conftest import start_server, stop_server
from tests.server.test_protocol import error_code, login, query, read_until


@pytest.fixture(scope="module")
def server(server_db):
    running = start_server(server_db, "--insecure")
    yield running
    stop_server(running)


def _audited(db, marker: str) -> list[tuple[str, str]]:
    """The user and decision of the audit entries of statements that end with ``marker``."""
    con = open_database(db, writes_data=False)
    try:
        return con.execute(
            "SELECT user_name, decision FROM sqlsdc.audit WHERE sql_text LIKE ? ORDER BY 1",
            [f"%{marker}"],
        ).fetchall()
    finally:
        con.close()


def _error(messages) -> str:
    errors = [body for kind, body in messages if kind == b"E"]
    assert len(errors) == 1, messages
    return error_code(errors[0])


@pytest.mark.parametrize(
    ("sql", "code"),
    [
        ("SELECT c.relname, p.income FROM pg_catalog.pg_class c, persons p", "42501"),
        ("SET ROLE admin", "42501"),
        ("LISTEN anything", "0A000"),
    ],
)
def test_a_catalog_refusal_is_audited(server, sql, code):
    marker = f"-- catalog refusal {code} {len(sql)}"
    sock, _, _ = login(server)
    assert _error(query(sock, f"{sql} {marker}")) == code
    sock.close()
    assert _audited(server.db, marker) == [("analyst", "refused")]


def _extended(sock, sql: str, *, execute: bool) -> list[tuple[bytes, bytes]]:
    """Parse (one text parameter), Describe the statement, then (``execute``) Bind and
    Execute it with a value, and Sync: what the server answers up to ReadyForQuery."""
    messages = codec.message(b"P", b"s\0" + sql.encode() + b"\0" + struct.pack("!hi", 1, 0))
    messages += codec.message(b"D", b"Ss\0")
    if execute:
        value = b"1000"
        bind = b"\0s\0" + struct.pack("!hhi", 0, 1, len(value)) + value + struct.pack("!h", 0)
        messages += codec.message(b"B", bind) + codec.message(b"E", b"\0\0\0\0\0")
    sock.sendall(messages + codec.message(b"S"))
    return read_until(sock)


@pytest.mark.parametrize("execute", [False, True])
@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM persons WHERE income > $1",  # the guard's plan refuses it
        "SELECT c.relname FROM pg_class c, persons p WHERE p.income > $1",  # the catalog does
    ],
)
def test_a_refusal_at_describe_is_audited_once(server, sql, execute):
    marker = f"-- describe {execute} {len(sql)}"
    sock, _, _ = login(server)
    messages = _extended(sock, f"{sql} {marker}", execute=execute)
    assert _error(messages) == "42501"
    assert [kind for kind, _ in messages][:2] == [b"1", b"t"]  # parsed, parameters described
    sock.close()
    # Describe's refusal ends the batch: the Execute after it is skipped, nothing audited twice
    assert _audited(server.db, marker) == [("analyst", "refused")]
