"""Red-team round of session 30 (first), with an analyst's login only, against what an analyst
or a BI tool reaches outside the embedded guarded connection: ``sqlsdc serve`` (its catalog
shadow, session statements, extended protocol, concurrency), the release database and the
analyst's CLI commands.

What succeeded, and was closed:

* **DoS through the catalog shadow**: a catalog query (one that reads ``pg_catalog`` or no table
  at all) could call ``lpad``/``rpad``/``replace``, which the guard refuses.
  ``SELECT length(lpad('x', 2000000000, 'y'))`` held a worker of the server for 37 s and 2 GB:
  one call runs to its end without looking at the catalog's 10 s timeout, and its string is
  not counted against the shadow's 128 MB memory limit; nested ``replace`` multiplies a string
  (a 1 GB value per catalog row in 4.6 s). Catalog queries now call neither, like the guard.
* **CPU through long catalog statements**: the catalog classified every statement by parsing
  it whole before the guard's length limit applied, and neither sqlglot nor DuckDB's planning
  heed the catalog's timeout: 100,000 ORs over ``pg_class`` (2.2 MB) held a worker for 430 s,
  and a 1.2 MB data statement spent 12 s there before the guard refused its length. A
  statement over 64 KB is now left to the guard. A statement nested 5,000 parentheses deep
  raised RecursionError in the catalog (XX000 "internal error"); it is now "too complex"
  (42601) as on an embedded connection.
* **Memory through catalog answers**: a catalog answer was capped at 100,000 rows only, so
  ``SELECT lpad('x', 200000000, 'y')`` sent one 200 MB value, and 99,000 rows of a
  1,000-character literal (a 1 KB statement) 99 MB, all held in the server's memory while sent
  to a client that may read slowly. A catalog answer now stops at 16 MB as well.
* **Memory through portals**: a portal kept its whole answer (up to the 64 MiB answer cap)
  until the session closed it, and Sync closed none, so one analyst's session binding a wide
  query over a public table to portals suspended after one row each held 20 MB per portal (40
  portals: 780 MB of the server's memory in 2.4 s; the 1,000 portals allowed: about 20 GB).
  Sync now closes the portals outside a transaction block, as PostgreSQL does, and no further
  statement runs while a session keeps 64 MB of answers (53400).
* **Workers through Describe**: describing a parameterised statement has the guard plan it
  (a 714 KB statement: 7 s) outside the user's share of the thread pool, so one analyst
  describing long statements from as many sessions as there are workers made every other user
  wait (``--workers 2``: another user's query waited 4 s). It now takes the user's share.
* **Parameters that were not**: the server counted ``$n`` anywhere in a prepared statement,
  string literals and comments included, so ``WHERE municipality <> '$2'`` prepared by a
  client wanted two parameters and failed (08P01). Literals, quoted names and comments are
  skipped now (an unclosed one runs to the end, so 4 MB of ``/*`` is read in 0.06 s).
* **A session ended by a date**: a date or timestamp outside years 1-9999, or infinite (as
  validity ends often are), raised OverflowError while its row was encoded, and the session
  ended with a FATAL internal error; the statement now fails with 22008 and the session goes on.
* **A failing cancel**: a CancelRequest that raced the release of the session's engine
  connection (closed when idle) got a FATAL "internal error" instead of silence (the server log:
  ``ConnectionException``); interrupting a closed engine connection now does nothing. A cancel
  that lands in the ledger write came back as 58000 "could not record the privacy spend"; it
  is now 57014 like any cancel (the spend is rolled back or kept, never an answer unpaid:
  45 randomly cancelled DP queries charged at least every answer they gave).
* **A role that was not**: ``SET ROLE admin`` and ``SET SESSION AUTHORIZATION admin`` were
  answered SET, and ``SHOW role`` then said ``admin``, while the session still ran as the
  analyst (nothing was gained, but the client was told otherwise). They are now refused (42501).
* **CLI**: a query that is not UTF-8 (a UTF-16 file piped to ``sqlsdc query -``) ended in
  "the query failed in the engine" (exit 9); it is a syntax error (exit 6). On the Python
  connection, such a string (lone surrogates) failed to be audited and ended as an engine
  failure; the guard's parse refuses it as a syntax error, audited with the bytes escaped.
* **Publish**: two publications to one release file at once both wrote ``OUT.partial``; the
  second deleted the first's finished file before it was moved into place, the first then
  failed after its accepted audit entry was committed, and its "failed" entry under the same id
  broke the primary key (exit 70, "internal error ... Duplicate key"; seen with two
  ``sqlsdc publish --force`` started together); a half-written file could be moved into
  place. Each publication now writes its own partial file (named by its audit id), and a
  failure after the release is recorded leaves the accepted entry alone.
* **Silent half-answers**: a session statement followed by another in one message (``SET a =
  1; SELECT ...``, ``START TRANSACTION; SELECT * FROM persons``, ``DISCARD ALL; ...``) was
  answered as the first statement alone and the rest dropped without a word (nothing leaked:
  the rest never ran). It is now refused like two queries are.

What held (one test each below): a parameter whose conversion fails is refused before any
row is read, whatever the data (no error oracle through ``$n``); sessions of one user racing
the ledger over the extended protocol never spend more than the budget, and each refusal is
the budget's SQLSTATE; the server's cells equal the embedded connection's, in text, binary and
prepared form; DuckDB-only statements (``SUMMARIZE``, ``DESCRIBE``, ``PRAGMA``, ``CALL``,
``FROM``-first, ``EXPLAIN ANALYZE``, ``SET GLOBAL``) are refused or kept as strings; a flood of
unauthenticated startups (each looks the user up in the database) leaves logged-in users
served. Probed and holding without a new test: COPY/ATTACH/file functions and
``sqlsdc.server_users`` (tests/security/test_server_attacks.py), password and role views
(``pg_authid``, ``pg_shadow``, ``pg_roles``, ``pg_user``: refused or withheld), recursive CTEs
that double a string in the shadow (stopped by its memory limit), the release database (plain
tables; no ``rule``, no primary/secondary status, contributor counts and values NULL at
suppressed cells, no ``sqlsdc`` schema: tests/test_release.py), ``sqlsdc explain`` (the salt in
its SQL is public by design; the mix constants stay in ``sqlsdc.ckm_mix``).
"""

from __future__ import annotations

import shutil
import socket
import struct
import threading
import time
from collections import Counter
from fractions import Fraction

import duckdb
import pytest

import sqlsdc
from sqlsdc.admin import audit
from sqlsdc.server import codec
from tests.security.test_server_attacks import connect, refusal
from tests.server.conftest import add_server_user, start_server, stop_server
from tests.server.test_protocol import error_code, login, query, read_until

psycopg = pytest.importorskip("psycopg")


@pytest.fixture(scope="module")
def server_db(ckm_db, tmp_path_factory, copy_database):
    """The demo as shipped (cell key method), so that server and embedded cells carry noise."""
    db = copy_database(ckm_db, tmp_path_factory.mktemp("redteam_s30"))
    add_server_user(db)
    return db


# --- closed: the catalog shadow cannot be made to build huge strings --------------------------


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT length(lpad('x', 2000000000, 'y')) AS n FROM pg_catalog.pg_class",
        "SELECT length(pg_catalog.lpad('x', 2000000000, 'y')) AS n FROM pg_catalog.pg_type",
        "SELECT length(rpad(relname, 2000000000, 'y')) AS n FROM pg_class",
        "SELECT length(lpad('x', 2000000000, 'y')) AS n",
        "SELECT length(replace(replace(typname, '', ''), 'a', typname || typname)) AS n "
        "FROM pg_type",
        "SELECT length(pg_catalog.repeat('x', 2000000000)) AS n FROM pg_class",
    ],
)
def test_a_catalog_query_cannot_build_a_gigabyte_string(server, sql):
    started = time.monotonic()
    error = refusal(server, sql)
    assert error.sqlstate == "42501", (error.sqlstate, str(error))
    assert "not" in str(error) and "allowed" in str(error) or "not available" in str(error)
    assert time.monotonic() - started < 3


def test_a_catalog_answer_is_capped_in_bytes_as_well_as_rows(server):
    """99,000 rows (under the row cap) of a 1,000-character literal: 99 MB from a 1 KB query."""
    wide = "x" * 1000
    error = refusal(server, f"SELECT g, '{wide}' AS s FROM generate_series(1, 99000) t(g)")
    assert error.sqlstate == "42501" and "16 MB" in str(error)
    with connect(server) as con:  # a catalog answer of ordinary size is still answered
        rows = con.execute("SELECT g FROM generate_series(1, 5000) t(g)").fetchall()
        assert len(rows) == 5000


def test_a_long_catalog_statement_is_left_to_the_guard(server):
    """Parsing and DuckDB's planning of a long catalog query heed no timeout: 100,000 ORs over
    pg_class (2.2 MB) held a worker for 430 s. Past 64 KB a statement is the guard's, which
    refuses catalog tables and statements over its length limit at once."""
    for count in (3500, 100_000):
        sql = "SELECT 1 AS x FROM pg_class WHERE " + " OR ".join(
            f"relname = 'a{i}'" for i in range(count)
        )
        started = time.monotonic()
        error = refusal(server, sql)
        assert error.sqlstate == "42501", (error.sqlstate, str(error)[:200])
        assert "not declared" in str(error) or "characters long" in str(error)
        assert time.monotonic() - started < 5


@pytest.mark.parametrize("tail", ["", " FROM pg_class"])
def test_a_deeply_nested_catalog_statement_is_too_complex_not_an_internal_error(server, tail):
    error = refusal(server, "SELECT " + "(" * 5000 + "1" + ")" * 5000 + " AS x" + tail)
    assert error.sqlstate == "42601" and "too complex" in str(error)


# --- closed: a session statement never silently drops the statements after it ------------------


@pytest.mark.parametrize(
    "sql",
    [
        "SET application_name = 'a'; SELECT region, COUNT(*) AS n FROM persons GROUP BY region",
        "START TRANSACTION; SELECT * FROM persons",
        "DISCARD ALL; SELECT * FROM persons",
        "SAVEPOINT a; SELECT income FROM persons",
        "RESET ALL; SELECT 1",
        "SHOW search_path; SELECT 1",
    ],
)
def test_a_session_statement_followed_by_another_is_refused(server, sql):
    error = refusal(server, sql)
    assert error.sqlstate == "42501" and "exactly one is allowed" in str(error)


def test_semicolons_inside_a_set_value_or_at_the_end_are_one_statement(server):
    with connect(server) as con:
        con.execute("SET application_name = 'a;b';")
        assert con.execute("SHOW application_name").fetchall() == [("a;b",)]
        con.execute("SET search_path = public; -- a comment")
        assert con.execute("SHOW search_path").fetchall() == [("public",)]


# --- closed: a session cannot keep answers without bound in portals ---------------------------

WIDE = ("SELECT r0.region AS a, r1.region AS b, r2.region AS c, r3.region AS d, r4.region AS e, "
        "r5.region AS f FROM regions r0, regions r1, regions r2, regions r3, regions r4, "
        "regions r5")  # fmt: skip
"""8^6 rows of a public table, under the answer cap: about 11 MB of Arrow per answer."""


def _bind_execute(portal: str, statement: str = "wide") -> bytes:
    bind = codec.cstr(portal) + codec.cstr(statement) + struct.pack("!hhh", 0, 0, 0)
    execute = codec.cstr(portal) + struct.pack("!i", 1)  # one row, then PortalSuspended
    return codec.message(b"B", bind) + codec.message(b"E", execute)


def _parse(sock, name: str, sql: str) -> None:
    body = codec.cstr(name) + codec.cstr(sql) + struct.pack("!h", 0)
    sock.sendall(codec.message(b"P", body) + codec.message(b"S"))
    assert [kind for kind, _ in read_until(sock)] == [b"1", b"Z"]


def test_portals_end_with_the_implicit_transaction(server):
    """Outside a transaction block, Sync closes every portal (and frees its answer), as in
    PostgreSQL: a suspended portal was kept for the rest of the session."""
    sock, _pid, _secret = login(server)
    with sock:
        _parse(sock, "wide", WIDE)
        sock.sendall(_bind_execute("p0") + codec.message(b"S"))
        assert [kind for kind, _ in read_until(sock)] == [b"2", b"D", b"s", b"Z"]
        execute = codec.message(b"E", codec.cstr("p0") + struct.pack("!i", 1))
        sock.sendall(execute + codec.message(b"S"))
        kind, body = read_until(sock)[0]
        assert kind == b"E" and error_code(body) == "34000"


def test_suspended_portals_cannot_fill_the_servers_memory(server):
    """In a transaction block portals live on; the answers one session keeps are bounded
    (40 suspended portals of this query took 780 MB of the server's memory, 1,000 would have
    taken 20 GB), and closing portals makes room again."""
    sock, _pid, _secret = login(server)
    with sock:
        assert query(sock, "BEGIN")[-1] == (b"Z", b"T")
        _parse(sock, "wide", WIDE)
        refused_at = None
        for i in range(20):
            sock.sendall(_bind_execute(f"p{i}") + codec.message(b"S"))
            messages = read_until(sock)
            errors = [error_code(body) for kind, body in messages if kind == b"E"]
            if errors:
                assert errors == ["53400"], errors
                refused_at = i
                break
        assert refused_at is not None and 3 <= refused_at < 20, refused_at
        closes = b"".join(
            codec.message(b"C", b"P" + codec.cstr(f"p{i}")) for i in range(refused_at)
        )
        sock.sendall(closes + _bind_execute("again") + codec.message(b"S"))
        kinds = [kind for kind, _ in read_until(sock)]
        assert b"E" not in kinds and b"s" in kinds


@pytest.mark.slow  # a 20,000-term statement planned twice (~6 s of CPU) and a bound on a wait
def test_describing_statements_takes_only_the_users_share_of_the_workers(server_db):
    """Describing a parameterised statement has the guard plan it (seconds for a long one: a
    714 KB statement took 7 s); it ran outside the user's share of the thread pool, so one
    analyst describing long statements from as many sessions as there are workers made every
    other user wait."""
    add_server_user(server_db, "admin")
    running = start_server(server_db, "--insecure", "--workers", "2")
    sql = "SELECT COUNT(*) AS n FROM persons WHERE age = $1 OR " + " OR ".join(
        f"age = {i % 100}" for i in range(20000)
    )
    parse = codec.cstr("long") + codec.cstr(sql) + struct.pack("!h", 0)
    describe = codec.message(b"D", b"S" + codec.cstr("long"))
    try:
        sessions = [login(running)[0] for _ in range(2)]
        for sock in sessions:  # the plans take seconds of CPU, many more on a loaded machine
            sock.settimeout(120)
        with psycopg.connect(running.dsn(user="admin"), autocommit=True) as admin:
            for sock in sessions:
                sock.sendall(codec.message(b"P", parse) + describe + codec.message(b"S"))
            time.sleep(0.3)  # both describes are planning (or waiting for their share)
            started = time.monotonic()
            assert admin.execute("SELECT COUNT(*) AS n FROM regions").fetchall() == [(8,)]
            waited = time.monotonic() - started
        for sock in sessions:
            kinds = [kind for kind, _ in read_until(sock)]
            assert kinds == [b"1", b"t", b"T", b"Z"], kinds
            sock.close()
    finally:
        stop_server(running)
    assert waited < 1.5, waited  # 4 s before: both workers planned the analyst's statements


def test_a_dollar_number_in_a_literal_or_comment_is_no_parameter(server):
    """The server counted ``$n`` anywhere in a prepared statement, so ``WHERE municipality <>
    '$2'`` wanted two parameters and every client that prepares statements failed on it (08P01
    "bind message supplies 0 parameters, but prepared statement requires 2")."""
    with connect(server) as con:
        literal = con.execute("SELECT '$2' AS x", prepare=True).fetchall()
        assert literal == [("$2",)]
        sql = "SELECT /* $5 */ '$3' AS x, %s::int AS y -- $4"
        assert con.execute(sql, (7,), prepare=True).fetchall() == [("$3", 7)]


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT 'infinity'::DATE AS d",
        "SELECT DATE '9999-12-31' + 1 AS d",
        "SELECT TIMESTAMPTZ '0001-01-01 00:00:00+14' AS t",
    ],
)
@pytest.mark.parametrize("binary", [False, True])
def test_a_date_python_cannot_hold_fails_the_statement_not_the_session(server, sql, binary):
    """Dates and timestamps outside years 1-9999 (or infinite, as validity ends often are)
    raised OverflowError while the rows were encoded, and the session ended (FATAL XX000)."""
    with connect(server) as con:
        with pytest.raises(psycopg.Error) as caught:
            con.execute(sql, binary=binary).fetchall()
        assert caught.value.sqlstate == "22008"
        assert con.execute("SELECT COUNT(*) AS n FROM regions").fetchall() == [(8,)]


# --- closed: a CancelRequest racing the end of a statement is silent ----------------------------


def test_an_interrupt_racing_the_release_of_the_engine_is_silent(server_db):
    """The guarded connection's ``interrupt`` (a server's CancelRequest) reads the engine
    connection without the lock; when the idle release closed it in between, DuckDB raised
    ConnectionException and the server answered the canceller with a FATAL internal error
    (psycopg: "cancellation failed: unexpected response from server", about 1 cancel in 150)."""
    with sqlsdc.connect(server_db, user="analyst") as con:
        assert con.execute("SELECT COUNT(*) AS n FROM regions").fetchall() == [(8,)]
        con._db.close()  # what interrupt() read, closed by the idle release before it is used
        con.interrupt()


def test_a_cancel_that_fails_the_ledger_write_is_reported_as_a_cancel():
    """A cancel landing in the spend write fails it with "could not record the privacy spend"
    (58000, pointing at an admin); the client asked for the cancel and gets 57014."""
    from sqlsdc.errors import OperationalError
    from sqlsdc.server.sqlstate import error_fields

    failed = OperationalError("could not record the privacy spend")
    assert error_fields(failed, cancelled=True).code == "57014"
    assert error_fields(failed, cancelled=False).code == "58000"


# --- closed: SET ROLE does not pretend to change the user -------------------------------------


@pytest.mark.parametrize(
    "sql", ["SET ROLE admin", "SET SESSION AUTHORIZATION admin", "SET LOCAL role = 'admin'"]
)
def test_set_role_is_refused_not_echoed(server, sql):
    """``SET ROLE admin`` was answered SET and ``SHOW role`` then said admin, while the session
    still ran as the analyst: a client (or a BI tool's connection pool) was told it acts as
    another user. It is now refused; the user is the one who logged in."""
    with connect(server) as con:
        with pytest.raises(psycopg.Error) as caught:
            con.execute(sql)
        assert caught.value.sqlstate == "42501" and "log in as another" in str(caught.value)
        assert con.execute("SELECT current_user").fetchall() == [("analyst",)]
        assert con.execute("SET ROLE NONE").statusmessage == "SET"


# --- closed: the analyst's CLI ----------------------------------------------------------------


def test_a_query_that_is_not_utf8_is_a_syntax_error(server_db):
    """Bytes that are not UTF-8 (a UTF-16 file piped to ``sqlsdc query -``) became lone
    surrogates that the guard's parser took for a name; the engine then failed (exit 9, "the
    query failed in the engine"). It is a syntax error now (exit 6)."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "sqlsdc.cli", "query", str(server_db), "--user", "analyst", "-"],
        input=b"\xff\xfeSELECT 1 AS x", capture_output=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 6, done.stderr
    assert b"not UTF-8" in done.stderr and b"Traceback" not in done.stderr


@pytest.mark.parametrize("where", ["WHERE region <> '\udcff'", "-- \udcff"])
def test_a_python_string_with_undecodable_bytes_is_a_syntax_error(server_db, where):
    """On the Python connection too (a string read with ``surrogateescape``): a syntax error,
    audited with the bytes escaped, not an engine failure."""
    sql = f"SELECT region, COUNT(*) FROM persons {where} GROUP BY region"
    with sqlsdc.connect(server_db, user="analyst") as con:
        with pytest.raises(sqlsdc.errors.SqlSyntaxError, match="not UTF-8"):
            con.execute(sql)
    assert "\\udcff" in audit(server_db, "admin", limit=1)["sql_text"].iloc[0]


# --- closed: two publications to one release file at once --------------------------------------


def test_two_publications_to_one_file_at_once_do_not_break_each_other(fresh_demo_db, tmp_path):
    """Both wrote ``OUT.partial``: the second deleted the first's finished file before the first
    moved it into place, the first then failed after its accepted audit entry was committed and
    its "failed" entry under the same id broke the primary key (an internal error, exit 70),
    and a half-written file could be moved into place. Here the second publication runs, whole,
    while the first is recording its release (two admins, or a schedule and an admin)."""
    from sqlsdc.release import publish

    out = tmp_path / "release.duckdb"
    other = {"by_sex": "SELECT sex, COUNT(*) AS n FROM persons GROUP BY sex"}

    def meanwhile(message: str) -> None:
        if message == "recording the release" and not meanwhile.done:
            meanwhile.done = True
            publish(fresh_demo_db, out, "admin", queries=other, analyst="analyst", replace=True)

    meanwhile.done = False
    first = {"by_region": "SELECT region, COUNT(*) AS n FROM persons GROUP BY region"}
    report = publish(fresh_demo_db, out, "admin", queries=first, analyst="analyst",
                     replace=True, progress=meanwhile)  # fmt: skip
    assert meanwhile.done and [t.table for t in report.tables] == ["by_region"]
    assert not list(tmp_path.glob("*partial*"))
    with duckdb.connect(str(out), read_only=True) as release:
        assert release.sql("SELECT table_name FROM release_contents").fetchall() == [("by_region",)]
    from sqlsdc.admin import audit

    entries = audit(fresh_demo_db, "admin")
    publications = entries[entries["sql_text"].str.startswith('{"publish"')]
    assert sorted(publications["decision"]) == ["accepted", "accepted"]


# --- held --------------------------------------------------------------------------------------


def test_a_parameter_that_fails_to_convert_fails_for_every_data(server):
    """A ``$n`` typed text and cast in a branch only some rows take: the guard folds the cast
    of the bound constant and refuses it before reading a row, so whether any income passes
    the threshold cannot be told from the error."""
    sql = ("SELECT COUNT(*) AS n FROM persons WHERE CASE WHEN income > $1 THEN "
           "CAST($2::text AS INTEGER) ELSE 0 END = 0")  # fmt: skip
    outcomes = set()
    for threshold in (0, 10**12):
        with connect(server) as con, pytest.raises(psycopg.Error) as caught:
            con.execute(sql.replace("$1", "%s").replace("$2", "%s"), (threshold, "abc"))
        outcomes.add((caught.value.sqlstate, str(caught.value).replace(str(threshold), "T")))
    assert len(outcomes) == 1, outcomes
    assert next(iter(outcomes))[0] == "42501"


def test_the_servers_cells_are_the_embedded_connections(server, server_db):
    sql = ("SELECT municipality, sex, COUNT(*) AS n, AVG(income) AS a FROM persons "
           "WHERE region = 'R01' GROUP BY ALL ORDER BY 1, 2")  # fmt: skip
    with connect(server) as con:
        text = con.execute(sql).fetchall()
        binary = con.execute(sql, binary=True).fetchall()
        bound = con.execute(sql.replace("'R01'", "%s"), ("R01",), prepare=True).fetchall()
    with sqlsdc.connect(server_db, user="analyst") as embedded:
        assert embedded.execute(sql).fetchall() == text == binary == bound
    assert len(text) > 10


@pytest.mark.parametrize(
    ("sql", "sqlstate"),
    [
        ("SUMMARIZE persons", "42501"),
        ("DESCRIBE persons", "42501"),
        ("PRAGMA table_info('persons')", "42501"),
        ("CALL pragma_version()", "42501"),
        ("FROM persons", "42501"),
        ("EXPLAIN ANALYZE SELECT region, COUNT(*) AS n FROM persons GROUP BY region", "42501"),
        ("PREPARE p AS SELECT * FROM persons", "42501"),
        ("SELECT rolname, rolpassword FROM pg_catalog.pg_roles", "08P01"),
        ("SELECT * FROM pg_catalog.pg_authid", "42501"),
    ],
)
def test_duckdb_statements_and_password_views_are_refused(server, sql, sqlstate):
    error = refusal(server, sql)
    assert error.sqlstate == sqlstate, (error.sqlstate, str(error))


def test_set_global_is_a_string_never_an_engine_setting(server):
    with connect(server) as con:
        assert con.execute("SET GLOBAL threads = 1").statusmessage == "SET"
        assert con.execute("SELECT current_setting('threads')").fetchall() == [(None,)]


@pytest.mark.slow  # a server and eight sessions racing for the budget (~3-5 s of CPU)
def test_concurrent_sessions_never_spend_more_than_the_budget(ckm_db, tmp_path, sqlsdc_in_process):
    """Eight sessions of the analyst send 80 distinct DP counts (ε 0.2 each; the analyst's ε 10
    holds 50) at once over the extended protocol: every one is answered or refused with the
    budget's SQLSTATE, the ledger grows by exactly the answered ones, and never past the limit."""
    db = tmp_path / "race.duckdb"
    shutil.copy(ckm_db, db)  # other tests of the session may have spent some of it already
    add_server_user(db)
    reset = ["budget", db, "reset", "--for", "analyst", "--reason", "a race", "--as", "admin"]
    assert sqlsdc_in_process(*reset).returncode == 0

    def spent() -> Fraction:
        with sqlsdc.connect(db, user="analyst") as con:
            (status,) = [s for s in con.remaining_budget() if s.key.user == "analyst"]
        return status.spent.epsilon

    before = spent()
    assert before == 0
    running = start_server(db, "--insecure", "--workers", "8")
    outcomes, lock = Counter(), threading.Lock()

    def analyst(first: int) -> None:
        with connect(running) as con:
            for i in range(first, first + 10):
                try:
                    con.execute("SELECT COUNT(*) AS n FROM benefits WHERE amount > %s",
                                (7000 + i,)).fetchall()  # fmt: skip
                    outcome = "answered"
                except psycopg.Error as e:
                    outcome = e.sqlstate
                with lock:
                    outcomes[outcome] += 1

    try:
        threads = [threading.Thread(target=analyst, args=(10 * k,)) for k in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        stop_server(running)
    assert set(outcomes) <= {"answered", "53S01"} and sum(outcomes.values()) == 80, outcomes
    after = spent()
    assert 0 < outcomes["answered"] <= (10 - before) / Fraction(1, 5)
    assert after - before == outcomes["answered"] * Fraction(1, 5) and after <= 10


def test_unauthenticated_startups_do_not_starve_logged_in_users(server):
    """Each startup makes the server look its user up in the database (in the thread pool)
    before any password: 300 of them at once leave a logged-in analyst's query served."""

    def startup(user: str) -> bytes:
        body = struct.pack("!i", codec.PROTOCOL_3_0) + b"user\0" + user.encode() + b"\0\0"
        return struct.pack("!i", len(body) + 4) + body

    with connect(server) as con:
        sockets = []
        try:
            for i in range(300):
                sock = socket.create_connection((server.host, server.port), timeout=10)
                sock.sendall(startup(f"nobody{i}"))
                sockets.append(sock)
            started = time.monotonic()
            con.execute("SELECT region, COUNT(*) AS n FROM persons GROUP BY region").fetchall()
            assert time.monotonic() - started < 2
        finally:
            for sock in sockets:
                sock.close()
