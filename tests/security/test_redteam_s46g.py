"""Red team s46g: the server and the audit log under many users (issue 18, must-have 5).

Findings (each test fails on the code before its fix):

- The statement rate (:mod:`sqlsdc.guard.statement_rate`) counted only statements longer
  than 4,096 characters: one process sent the same statement of 4,096 characters (a comment
  of 4,060) at 427,000 characters a CPU second, 25 MB of audit log a minute from one core
  where the rate allows 4 MiB, and as much again from every other process or server
  session. Now every statement counts (with its parameters); a process reads the log's
  minute once per 64 KiB of its own statements.
- The audit log kept a parameterised statement's text with its placeholders and no value:
  ``SELECT COUNT(*) FROM persons WHERE region = ? AND age = ?`` was logged the same for
  every cell it asked, through the Python API and the server's extended protocol alike. Now
  the values follow on a line of their own, as the guard bound them, at most 4,096
  characters (then a SHA-256), and count against the statement rate.
- ``sqlsdc serve`` bounded failed logins per user name and address only: one client tried
  10 passwords for each of 100 names in a minute (1,000 proofs checked). Now an address (an
  IPv6 one's /64) has 30 unsuccessful logins a minute whatever the names
  (``--max-failed-logins-per-address``).
"""

from __future__ import annotations

import datetime as dt
import decimal
import re

import pytest

import sqlsdc
from sqlsdc.guard import statement_rate
from tests.security.test_redteam_s44e import _rows
from tests.security.test_redteam_s45h import _in_one_minute

# --- the statement rate counts short statements too -------------------------------------------


def test_statements_of_4096_characters_count_against_the_minute(fresh_demo_db, monkeypatch):
    """Before: statements of at most 4,096 characters were never counted: 12 of 1,000
    characters went through a minute of 8,000. Now every statement counts: the 9th is
    refused, a new process's count (emptied) still reads the minute from the audit log, and
    a statement of 28 characters is refused too once the minute is taken."""
    monkeypatch.setattr(statement_rate, "_taken", {})

    def statement(i: int) -> str:
        sql = f"SELECT COUNT(*) FROM persons /* {i:04d} "
        return sql + "c" * (997 - len(sql)) + " */"

    def attempt():
        minute = dt.datetime.now(dt.UTC).replace(tzinfo=None, second=0, microsecond=0)
        ((before,),) = _rows(fresh_demo_db, "SELECT coalesce(sum(length(sql_text)), 0) FROM "
                             "sqlsdc.audit WHERE user_name = 'analyst' AND logged_at >= ?",
                             [minute])  # fmt: skip
        monkeypatch.setattr(statement_rate, "CHARACTERS_PER_MINUTE", before + 8_000)
        accepted, refusal = 0, None
        with sqlsdc.connect(fresh_demo_db, user="analyst") as con:
            for i in range(12):
                if i == 6:
                    monkeypatch.setattr(statement_rate, "_taken", {})  # another process
                try:
                    con.execute(statement(i)).fetchall()
                    accepted += 1
                except sqlsdc.PolicyViolation as e:
                    refusal = str(e)
                    break
            monkeypatch.setattr(statement_rate, "_taken", {})
            with pytest.raises(sqlsdc.PolicyViolation, match="this minute"):
                con.execute("SELECT COUNT(*) FROM regions").fetchall()
        return accepted, refusal

    accepted, refusal = _in_one_minute(attempt)
    assert len(statement(0)) == 1_000
    assert accepted == 8 and refusal is not None and "this minute" in refusal


def test_a_process_reads_the_log_once_per_slack_of_its_own_statements(monkeypatch):
    """Short statements do not each pay the log's scan: a process counts on from its last
    reading until its own statements add up to SLACK characters (or the minute changes)."""
    reads = []
    monkeypatch.setattr(statement_rate, "_taken", {})
    monkeypatch.setattr(statement_rate, "one", lambda con, sql, params: reads.append(1) or (0,))
    monkeypatch.setattr(statement_rate.time, "time", lambda: 60.0 * 1_000_000 + 1)
    for _ in range(1_000):
        statement_rate.check(None, "/tmp/db", "analyst", "s" * 200)  # 200,000 characters
    assert len(reads) == 200_000 // statement_rate.SLACK + 1  # 4 readings, not 1,000


# --- parameters in the audit log --------------------------------------------------------------


def _logged(db, like: str) -> list[str]:
    rows = _rows(db, "SELECT sql_text FROM sqlsdc.audit WHERE sql_text LIKE ? ORDER BY query_id",
                 [like])  # fmt: skip
    return [text for (text,) in rows]


def test_the_audit_log_keeps_the_values_of_a_parameterised_statement(fresh_demo_db):
    """Before: each of these was logged as its text with ``?`` (``$r``), the same entry for
    every value. Now the values follow on one line, as the literals the guard bound."""
    sql = "SELECT COUNT(*) FROM persons WHERE sex = ? AND age BETWEEN ? AND ?"
    with sqlsdc.connect(fresh_demo_db, user="analyst") as con:
        con.execute(sql, ["F", 30, 40]).fetchall()
        con.execute(sql, ("M", 30, 40)).fetchall()
        con.execute("SELECT COUNT(*) FROM persons WHERE region = $r", {"r": "R01"}).fetchall()
        con.execute("SELECT COUNT(*) FROM persons WHERE region = ANY(?)",
                    [["R01", "R02"]]).fetchall()  # fmt: skip
        with pytest.raises(sqlsdc.Error):  # refused: audited with its value too
            con.execute("SELECT COUNT(*) FROM persons WHERE age > ?", [object()]).fetchall()
    assert _logged(fresh_demo_db, "SELECT COUNT(*) FROM persons WHERE sex = ?%") == [
        f"{sql}\n-- parameters: 'F', 30, 40",
        f"{sql}\n-- parameters: 'M', 30, 40",
    ]
    assert _logged(fresh_demo_db, "%region = $r%") == [
        "SELECT COUNT(*) FROM persons WHERE region = $r\n-- parameters: $r = 'R01'"
    ]
    assert _logged(fresh_demo_db, "%ANY(?)%")[-1].endswith("-- parameters: ['R01', 'R02']")
    assert _logged(fresh_demo_db, "%age > ?%")[-1].endswith("-- parameters: <object value>")


def test_audited_parameters_are_typed_one_line_and_bounded():
    """The line's spelling: each type as the guard binds it; a value cannot break the line
    (a newline, a backslash: JSON escapes); a megabyte value is kept as 4,096 characters and
    the SHA-256 of the whole; a sequence read once, as bound."""
    from sqlsdc.guard.audited_parameters import audited_text, snapshot

    values = [None, True, 7, 1.5, decimal.Decimal("2.50"), dt.date(2020, 1, 2), b"\x00\xff"]
    assert audited_text("q", values) == (
        "q\n-- parameters: NULL, TRUE, 7, 1.5, 2.50, CAST('2020-01-02' AS DATE), "
        "CAST('\\\\x00\\\\xFF' AS BLOB)"
    )
    text = audited_text("q", {"b": "x\n-- forged\u2028line", "a": "\\"})
    assert text == "q\n-- parameters: $a = '\\\\', $b = 'x\\n-- forged\\u2028line'"
    assert text.count("\n") == 1
    assert audited_text("q", []) == audited_text("q", None) == "q"
    # a statement without parameters cannot end its entry with a forged values line
    forged = "SELECT 1\n-- parameters: 'R02'"
    assert audited_text(forged, None) == forged + "\n-- parameters: (none)"
    huge = audited_text("q", ["v" * 1_000_000])
    assert len(huge) < 4_300 and re.search(r"1,000,00\d characters in all; SHA-256", huge)
    # a long list keeps its share, the value after it is written whole (s46j)
    listed = audited_text("q", [["R01"] * 1_000, 42])
    assert len(listed) < 4_300 and listed.endswith("], 42")

    class Shifting(list):  # answers another value each time it is read
        reads = 0

        def __getitem__(self, i):
            Shifting.reads += 1
            return Shifting.reads

        def __len__(self):
            return 1

    assert snapshot(Shifting([0])) == (1,) and Shifting.reads == 1


def test_audited_plain_values_are_spelled_as_the_guard_binds_them():
    """The plain types are written without sqlglot (a list of 1,000 values took 14 ms, now
    0.3): each spelling is literal()'s own, which the guard binds."""
    from sqlsdc.guard.audited_parameters import _value
    from sqlsdc.guard.parse import literal

    values = ["a", "it's", "back\\slash", "", "\u00fc\u20ac", 0, -5, 10**30, 1.5, -0.0, 1e308,
              1e-7, 2.0, float("nan"), float("-inf"), True, False, None]  # fmt: skip
    for value in values:
        assert _value(value) == literal(value).sql(dialect="duckdb"), value
    assert _value("\udcff") == "<str value>"  # refused by the guard: not UTF-8


def test_the_servers_extended_protocol_audits_the_bound_values(fresh_demo_db):
    """Through ``sqlsdc serve``: psycopg binds the values in Bind messages (the extended
    protocol), binary and text; before, the audit log had ``$1`` and ``$2`` only."""
    psycopg = pytest.importorskip("psycopg")
    from tests.server.conftest import add_server_user, start_server, stop_server

    add_server_user(fresh_demo_db)
    running = start_server(fresh_demo_db, "--insecure")
    try:
        with psycopg.connect(running.dsn()) as con:
            sql = "SELECT COUNT(*) FROM persons WHERE region = %s AND age > %s"
            con.execute(sql, ["R03", 44]).fetchall()
            con.execute(sql, ["R04", 45], binary=True).fetchall()
    finally:
        stop_server(running)
    logged = _logged(fresh_demo_db, "%region = $1 AND age > $2%")
    assert len(logged) == 2
    assert logged[0].endswith("\n-- parameters: 'R03', 44"), logged
    assert logged[1].endswith("\n-- parameters: 'R04', 45"), logged


# --- failed logins per address ----------------------------------------------------------------


def test_a_guesser_rotating_user_names_is_refused_per_address(fresh_demo_db):
    """Before: 10 failed logins a minute per user name and address, so a client rotating
    names had every guess checked. Now (``--max-failed-logins-per-address 5``) the 6th failed
    login from the address is refused unread whatever the name, a right password too;
    the refusal says why."""
    psycopg = pytest.importorskip("psycopg")
    from tests.server.conftest import add_server_user, start_server, stop_server

    add_server_user(fresh_demo_db)
    running = start_server(fresh_demo_db, "--insecure", "--max-failed-logins-per-address", "5")
    try:
        with psycopg.connect(running.dsn()) as con:  # successes are not counted
            con.execute("SELECT 1").fetchall()
        said = []
        for i in range(12):
            try:
                psycopg.connect(running.dsn(f"user{i}", "guess")).close()
                said.append("ok")
            except psycopg.OperationalError as e:
                said.append("wrong" if "password authentication failed" in str(e) else str(e))
        assert said[:5] == ["wrong"] * 5
        assert all("too many failed logins from this address" in s for s in said[5:]), said
        with pytest.raises(psycopg.OperationalError, match="from this address"):
            psycopg.connect(running.dsn()).close()
    finally:
        stop_server(running)


def test_login_attempts_per_address_count_every_name_and_ipv6_blocks(monkeypatch):
    """The bound itself: 30 names' failures from one address, the 31st refused; another
    address apart; IPv6 addresses of one /64 are one address; successes forgotten."""
    from sqlsdc.server import login_rate
    from sqlsdc.server.sqlstate import Fatal

    clock = [5000.0]
    monkeypatch.setattr(login_rate.time, "monotonic", lambda: clock[0])
    attempts = login_rate.LoginAttempts()
    for _ in range(100):
        attempts.succeeded(attempts.begin("analyst", "10.0.0.1"))
    for i in range(30):
        attempts.begin(f"n{i}", "10.0.0.1")
    with pytest.raises(Fatal, match="from this address"):
        attempts.begin("n99", "10.0.0.1")
    attempts.begin("n99", "10.0.0.2")
    for i in range(30):
        attempts.begin(f"n{i}", f"2001:db8::{i + 1:x}")
    with pytest.raises(Fatal, match="from this address"):
        attempts.begin("x", "2001:db8::ffff:1")
    attempts.begin("x", "2001:db8:0:1::1")  # another /64
    assert login_rate.peer("::ffff:10.0.0.1") == "10.0.0.1"
    clock[0] += 60.5
    attempts.begin("n99", "10.0.0.1")


# Attacks that held (s46g, through a real ``sqlsdc serve`` as the analyst):
# - several statements in one simple Query ("SELECT 1; SELECT person_id ...") refused whole
#   (42601-style "exactly one is allowed"), nothing run; COPY ... TO STDOUT / FROM STDIN,
#   EXPLAIN [ANALYZE], PREPARE/EXECUTE, DO, LISTEN refused; FETCH BACKWARD unsupported.
# - Bind of many parameter types (psycopg text and binary: Decimal NaN, timestamptz, 1e308,
#   NaN, regclass, uuid text, lists outside ANY, NUL in text): each bound as its built-in
#   literal or refused with a type-only message (no value echoed); interval, uuid and bytea
#   in binary are refused at Bind ("binary parameters of type OID n are not supported").
# - error texts: an engine failure (1/(income-12345)) is refused by the check before running,
#   naming the column's class breaks (public policy), never a value; unknown columns name
#   declared ones only.
# - messages longer than 4 MiB (startup 10,000 bytes) are refused from their length field,
#   before any body is read; pipelined messages wait for the client to read (s35b's drain).
# - CancelRequest: 32-bit secret compared in constant time; a cancel only stops a statement
#   (no data), guessing it takes ~2^31 connections.
# - pg_stat_activity, pg_read_file, current_setting('sqlsdc.secret') refused or NULL;
#   pg_settings shows no sqlsdc setting; SHOW ALL lists the session's own settings only.
# - hidden cells through an engine failure: CAST(COUNT(*) - k AS UTINYINT) by municipality for
#   age > 88 (142 true groups, 31 dropped on a protected count of 0) fails from k = 4 exactly
#   where the shown minimum is 3: the cast sees protected values of shown cells only.
# - the server's shared text cache (server/textcache.py: the catalog's decision, shared by
#   users) saves 0.39 ms of a statement already sent by anyone; each candidate text can be
#   timed once (then it is cached for the prober too) against a check of tens of ms: not a
#   usable signal of another user's statement.
# - sqlsdc.audit, "sqlsdc"."audit", SQLSDC.AUDIT, p.sqlsdc.audit, a CTE over it,
#   duckdb_tables(), information_schema.tables: refused to the analyst (parameters now in the
#   log stay the admins').
