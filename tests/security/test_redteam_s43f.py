"""Red team s43f: many users on one database, the server, the release database, faults.

The attacker is an analyst with a server login (or an embedded connection); a finding is
something one analyst takes from the others (memory, turns) or learns beyond the protection.
The attacks that held are listed at the end of the module, one line each, with their numbers.
"""

from __future__ import annotations

import asyncio

import pytest

from sqlsdc.server import codec
from sqlsdc.server.declared_cursors import DeclaredCursors
from sqlsdc.server.limits import MAX_NAME, MAX_SETTINGS, MAX_SETTINGS_CHARACTERS
from sqlsdc.server.sqlstate import StatementError

psycopg = pytest.importorskip("psycopg")


@pytest.fixture(scope="module")
def server_db(pristine_demo_db, tmp_path_factory, copy_database):
    from tests.server.conftest import add_server_user

    db = copy_database(pristine_demo_db, tmp_path_factory.mktemp("s43f"))
    add_server_user(db)
    return db


# --- session settings: what one session keeps in the shared server is bounded ----------------


def test_set_of_ever_new_names_cannot_take_the_servers_memory(server):
    """A session's SET values were kept without bound (a dict echoed by SHOW and copied into
    the session's pg_settings on every SET): one analyst's 250 SETs of 2 MB values (new names
    x0, x1, ...) grew the server by 590 MB in 172 s, all accepted, and any number of sessions
    could do it at once. Now a session keeps at most MAX_SETTINGS names and
    MAX_SETTINGS_CHARACTERS characters: the SET beyond is refused (53400), keeps nothing, and
    the session goes on with the settings it had."""
    with psycopg.connect(server.dsn(), autocommit=True) as con:
        big = "a" * (MAX_SETTINGS_CHARACTERS // 4)
        for i in range(3):
            con.execute(f"SET x{i} = '{big}'")
        with pytest.raises(psycopg.Error) as caught:
            con.execute(f"SET x3 = '{big}'")
        assert caught.value.sqlstate == "53400"
        assert "at most" in str(caught.value)
        with pytest.raises(psycopg.Error):  # the refused SET kept nothing
            con.execute("SHOW x3")
        assert con.execute("SHOW x0").fetchone()[0] == big
        con.execute("RESET x0")  # what a session frees it may use again
        con.execute(f"SET x3 = '{big}'")
        assert con.execute("SELECT region, COUNT(*) FROM persons GROUP BY region").fetchall()


def test_a_single_set_of_four_megabytes_is_refused(server):
    """One Query message carries up to 4 MB: a single SET of that size is refused too, and
    the session answers the next statement."""
    with psycopg.connect(server.dsn(), autocommit=True) as con:
        with pytest.raises(psycopg.Error) as caught:
            con.execute("SET application_name = '" + "a" * 4_000_000 + "'")
        assert caught.value.sqlstate == "53400"
        assert con.execute("SHOW application_name").fetchone()[0] == ""


def test_the_number_of_settings_a_session_keeps_is_bounded(session_catalog):
    """Short names count too: each SET copied every setting into pg_settings, so tens of
    thousands of names also made every SET slower for the pool every user shares."""
    kept = len(session_catalog.answer("SHOW ALL").table)
    for i in range(MAX_SETTINGS - kept):
        session_catalog.answer(f"SET s{i} = 1")
    with pytest.raises(StatementError) as caught:
        session_catalog.answer("SET one_more = 1")
    assert caught.value.code == "53400"
    session_catalog.answer("SET s0 = 2")  # a name it keeps may change
    assert session_catalog.answer("SHOW s0").table.to_pylist() == [{"s0": "2"}]
    session_catalog.answer("DISCARD ALL")
    session_catalog.answer("SET one_more = 1")


# --- names of statements, portals and cursors: kept by the thousand, so bounded -------------


def _errors(messages) -> list[str]:
    from tests.server.test_protocol import error_code

    return [error_code(body) for kind, body in messages if kind == b"E"]


def test_a_statement_or_portal_named_with_megabytes_is_refused(server):
    """A session keeps 1,000 prepared statements and 1,000 portals by name, and the 32 MB
    bound on statements counted their text, not their names: 200 Parse messages of an empty
    statement named with 3 MB each grew the server by 600 MB in 9 s (3 GB a session, and a
    user holds many sessions). A name longer than MAX_NAME is refused (42622), keeps nothing,
    and the session goes on."""
    pytest.importorskip("scramp")
    from tests.server.test_protocol import login, query, read_until

    sock, _, _ = login(server)
    try:
        long_name = b"s" * (MAX_NAME + 1)
        sock.sendall(codec.message(b"P", long_name + b"\0\0\0\0") + codec.message(b"S"))
        assert _errors(read_until(sock)) == ["42622"]
        sock.sendall(codec.message(b"P", b"s\0SELECT 1\0\0\0") + codec.message(b"S"))
        assert _errors(read_until(sock)) == []  # a short name is kept as before
        bind = codec.message(b"B", long_name + b"\0s\0" + b"\0" * 6)
        assert _errors(query(sock, "BEGIN")) == []
        sock.sendall(bind + codec.message(b"S"))
        assert _errors(read_until(sock)) == ["42622"]
        assert _errors(query(sock, "ROLLBACK")) == []
        sock.sendall(codec.message(b"P", b"s" * MAX_NAME + b"\0\0\0\0") + codec.message(b"S"))
        assert _errors(read_until(sock)) == []  # MAX_NAME itself is allowed
    finally:
        sock.close()


def test_a_cursor_named_with_megabytes_is_refused(server):
    """DECLARE kept a cursor under any name: 200 cursors of `SELECT 1` named with 3 MB each
    grew the server by 614 MB, uncounted by the user's 64 MB bound."""
    with psycopg.connect(server.dsn(), autocommit=True) as con:
        with pytest.raises(psycopg.Error) as caught:
            con.execute(f'DECLARE "{"c" * (MAX_NAME + 1)}" CURSOR WITH HOLD FOR SELECT 1')
        assert caught.value.sqlstate == "42622"
        con.execute('DECLARE "c" CURSOR WITH HOLD FOR SELECT 1')
        assert con.execute("FETCH ALL FROM c").fetchall() == [(1,)]


class _Server:
    async def in_pool(self, function, *args, user=None):
        return function(*args)


class _Session(DeclaredCursors):
    """The state DeclaredCursors reads of a server session, and the bytes it counts."""

    def __init__(self, catalog):
        self.cursors, self.portals, self.status = {}, {}, "I"
        self.server, self.catalog, self.user = _Server(), catalog, "analyst"
        self.connection = catalog._connection
        self.guard_seconds, self.counted = 0.0, {}

    def _recount(self, kind, name):
        self.counted[name] = self.cursors[name].nbytes if name in self.cursors else 0

    def _check_held(self, more=0):
        pass


def test_a_cursors_query_text_counts_against_its_users_bound(session_catalog):
    """A cursor keeps its query's text (as a prepared statement does), which counted for
    nothing: a thousand cursors of a query padded to a megabyte held a gigabyte while the
    user's 64 MB bound saw only their small answers. Now the text counts with the answer."""
    session = _Session(session_catalog)
    padding = "x" * 60_000  # a catalog query (the guard takes texts above 65,536)
    text = f"SELECT relname FROM pg_class /* {padding} */"
    asyncio.run(session._cursor(f"DECLARE c CURSOR WITH HOLD FOR {text}", ()))
    assert session.counted["c"] >= len(padding)


# --- the audit log: an analyst's refusals cannot fill the disk ------------------------------


def test_refused_statements_of_megabytes_are_not_logged_whole(fresh_demo_db):
    """Every refused statement was logged whole, for a few milliseconds of CPU each: 40
    refused statements of 990,000 random characters grew the database file by 53 MB in 2.3 s
    (0.83 s CPU), 10 of 3.9 million characters, refused for their length alone, by 48 MB. A
    refused statement is now logged up to AUDITED_REFUSAL_CHARACTERS, then its length and
    SHA-256 (the same 40: 1 MB); a short one whole. Still open: refusals of 16,000 characters
    add 2.6 MB/s, which only a bound on the rate would stop."""
    import hashlib
    import random
    import string

    import duckdb

    import sqlsdc
    from sqlsdc.catalog.store import AUDITED_REFUSAL_CHARACTERS

    rng = random.Random(43)
    long = "SELECT * FROM persons WHERE region = '{}'".format(
        "".join(rng.choices(string.ascii_letters, k=300_000))
    )
    short = "SELECT income FROM persons"
    with sqlsdc.connect(fresh_demo_db, user="analyst") as con:
        for sql in (long, short):
            with pytest.raises(sqlsdc.PolicyViolation):
                con.execute(sql)
    with duckdb.connect(str(fresh_demo_db), read_only=True) as raw:
        logged = [t for (t,) in raw.execute(
            "SELECT sql_text FROM sqlsdc.audit WHERE decision = 'refused' ORDER BY query_id"
        ).fetchall()]  # fmt: skip
    assert logged[-1] == short
    kept = logged[-2]
    assert len(kept) < AUDITED_REFUSAL_CHARACTERS + 300
    assert kept.startswith(long[:AUDITED_REFUSAL_CHARACTERS])
    assert f"{len(long):,} characters" in kept
    assert hashlib.sha256(long.encode()).hexdigest() in kept


# Attacks that held (red team s43f; the numbers are of one run on a 20,000-person demo):
# - budgets under concurrency: 8 asyncpg sessions x 12 new DP counts through `sqlsdc serve`
#   spent exactly 96 x 0.1 (+0.3 before); then 24 more at 0.1 left: 1 answered, 23 refused
#   (53S01); 6 processes of two users against a shared (*, benefits) budget of 1: 7 answered,
#   53 refused, spent exactly 1.
# - 6 analyst processes (CKM + DP) x 40 queries while an admin loop ran rekey --yes, budget
#   set/reset/grant, protect --replace, publish --replace, policy apply and audit (21 runs, 5
#   killed with SIGKILL mid-run) and 2 analysts were killed: only sqlsdc errors (budget), no
#   engine error or traceback; ledger = budget spent since the last reset; every charge has
#   its audit entry; none pending.
# - 44 admin commands (rekey, policy apply, publish, protect, synthesize) killed with SIGKILL
#   at 0.3-10 s: no record key lost or duplicated (persons 20,000/20,000 distinct), key events
#   only of completed re-keyings, no aside file left, the analyst's next query answered.
# - sqlsdc serve killed with SIGKILL 4 times (5-20 s into a round) under 4 asyncpg sessions of
#   DP and CKM queries, a budget grant each round: 1,018 answered, 739 refused 53S01, 16
#   sessions lost; ledger 14 = limit 10 + 4 grants; no charge without its audit entry, none
#   pending.
# - one embedded connection shared by 8 threads (CKM, DP, one shared cursor, fetch_df) and
#   closed from the main thread mid-run: 176 InterfaceError "the connection is closed", 1
#   ProgrammingError, no raw exception.
# - 8 threads on 8 connections asking one new DP statistic at once: one charge (0.3), the
#   same answer 8 times.
# - a user removed from the policy while connected: the next statement is AccessDenied.
# - the server: SHOW of engine settings, SET search_path = sqlsdc, current_setting, pg_settings,
#   COPY (3 forms), two statements in one Query, DESCRIBE/SUMMARIZE/PRAGMA/EXPLAIN, PREPARE,
#   SET ROLE / SESSION AUTHORIZATION, pg_read_file, pg_shadow, pg_stat_activity; catalog
#   statements with replacement scans of files ('/x.csv', "x.csv", FROM in a subquery),
#   duckdb_settings()/duckdb_databases()/glob()/query()/query_table(), pgc./isc./memory.
#   schemas; 32 extended-protocol parameter cases (int to text columns, NaN/Infinity/1e400
#   numerics, dates vs integers, uuid/interval/bytea/time binary, arrays with NULL, empty and
#   two-dimensional arrays, ANY over a text column with ints); SQL cursors (FETCH of 2^63-1
#   and 10^23 rows, ABSOLUTE, a cursor named "x; SELECT * FROM persons", DECLARE of two
#   statements or a row-level query): all refused or answered with protected cells only.
# - wrong passwords: 300 attempts, median 7.3 / 6.8 / 5.7 ms for a server user, an unknown
#   name and a policy user without a server password (p10 3.4-3.5 ms): no usable difference.
# - the release database: only the published tables and release_contents (no view, macro,
#   sequence, secret, comment); suppressed cells' values and n NULL; the anonymisation's seed
#   in its definition is harmless (PRAM draws are keyed by the database's secret); no
#   confidential string in the file's bytes (strings(1)).
