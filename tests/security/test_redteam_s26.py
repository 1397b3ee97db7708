"""Red-team round of session 26 against the day's changes: the OS lock on ``<db>.lock`` around
every open, answers streamed with ``_submit``, ledger rows written with list parameters, DP
cells cached in the answer's transaction, scalar samplers for small batches. Every test
asserts the SAFE behaviour. Each docstring tells the hole as the red team found it; all were
closed in the same session (the README's "Many users" section and the test names say how)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import cli_fork
import pytest

import sqlsdc
from sqlsdc.engines import file_lock
from sqlsdc.engines.duckdb import open_database
from sqlsdc.errors import Error, QueryCanceled


def _read(db, sql: str, params=None) -> list[tuple]:
    """The rows of a catalog read, on a connection of its own."""
    con = open_database(db, read_only=True)
    try:
        return con.execute(sql, params).fetchall()
    finally:
        con.close()


def _audit(db) -> list[tuple]:
    """(query_id, decision, sql_text) of every audit entry, oldest first."""
    return _read(db, "SELECT query_id, decision, sql_text FROM sqlsdc.audit ORDER BY query_id")


def _ledger_cells(db, query_id) -> list[str]:
    sql = "SELECT DISTINCT cell FROM sqlsdc.ledger WHERE query_id = ? ORDER BY cell"
    return [r[0] for r in _read(db, sql, [query_id])]


# --- 1. the streamed answer: engine errors raised while reading batches ------------------------

# 8^5 rows of a public table: the first batches stream out before the row of R08 x R08 x ...
# fails its cast, so DuckDB reports the error from the Arrow reader, not from the statement.
LATE_ERROR = (
    "SELECT CASE WHEN a.region = 'R08' AND b.region = 'R08' AND c.region = 'R08' "
    "AND d.region = 'R08' AND f.region = 'R08' THEN CAST(a.name AS INTEGER) ELSE 0 END AS x "
    "FROM regions a, regions b, regions c, regions d, regions f"
)


def test_an_engine_error_while_the_answer_streams_is_withheld_and_audited(fresh_demo_db):
    """An error raised by the engine after the first batch reaches ``run`` as pyarrow's
    ``OSError`` (not ``duckdb.Error``): it escapes every ``except EngineError``, so the analyst
    gets a traceback whose message is the engine's own text (the failing value and the SQL
    rewritten by the guard), the CLI says ``failed: oserror``, and the query leaves no audit
    entry (the transaction is rolled back by ``except BaseException``). Safe: sqlsdc's
    withheld-message error, and a ``failed`` audit entry."""
    with sqlsdc.connect(fresh_demo_db, user="analyst") as con:
        with pytest.raises(Error) as caught:
            con.execute(LATE_ERROR).fetchall()
        assert "Conversion Error" not in str(caught.value)
        assert "withheld" in str(caught.value)
    entries = [e for e in _audit(fresh_demo_db) if e[2] == LATE_ERROR]
    assert [e[1] for e in entries] == ["failed"]


# 8^10 rows of a public table filtered by arithmetic: a few rows of every batch pass, so the
# answer starts streaming at once and the statement runs for several seconds.
SLOW_STREAM = (
    "SELECT a.region FROM regions a, regions b, regions c, regions d, regions e, regions f, "
    "regions g, regions h, regions i, regions j WHERE (a.population + b.population + "
    "c.population + d.population + e.population + f.population + g.population + h.population "
    "+ i.population + j.population) % 10000 = 0"
)


@pytest.mark.slow
def test_a_timeout_while_the_answer_streams_is_a_query_canceled(fresh_demo_db):
    """The statement timeout interrupts the engine while batches are being read: DuckDB's
    ``INTERRUPT Error`` then comes out of the Arrow reader as an ``OSError`` with the engine's
    text instead of :class:`QueryCanceled`, and the query is not audited. Safe: the timeout's
    own error, audited."""
    with sqlsdc.connect(fresh_demo_db, user="analyst", timeout=1.0) as con:
        started = time.monotonic()
        with pytest.raises(QueryCanceled):
            con.execute(SLOW_STREAM).fetchall()
        assert time.monotonic() - started < 10
    assert [e[1] for e in _audit(fresh_demo_db) if e[2] == SLOW_STREAM] == ["failed"]


def test_an_engine_error_naming_a_conflict_is_not_run_again(fresh_demo_db, monkeypatch):
    """The answer's transaction is retried when ``is_conflict`` finds "conflict", "duplicate
    key" or "constraint violat" in the engine's message, and that message quotes the value that
    failed and the SQL: a failing query that mentions "conflict" (in a literal or an alias) is
    run 20 times with 0.95 s of pauses (0.99 s instead of 0.02 s), each run taking up to the
    rest of the statement timeout; an analyst multiplies the engine time of a failing query by
    20. Safe: an error of the analyst's own query is never retried (conflicts are told by the
    exception's type, on sqlsdc's own catalog statements)."""
    from sqlsdc.guard import connection

    runs = []
    real = connection._run_over

    def counted(*args, **kwargs):
        runs.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(connection, "_run_over", counted)
    with sqlsdc.connect(fresh_demo_db, user="analyst") as con:
        with pytest.raises(Error, match="withheld"):
            con.execute("SELECT CAST(name || 'conflict' AS INTEGER) FROM regions").fetchall()
    assert len(runs) == 1


# --- 2. ledger rows written with list parameters -----------------------------------------------


def test_a_nanosecond_timestamp_key_keeps_its_identity_in_the_ledger(fresh_demo_db):
    """A result of at most 1,024 rows is written to the ledger from Python values of its
    columns (``to_pylist``): a TIMESTAMP_NS key comes back as a pandas ``Timestamp`` and is
    bound as a microsecond TIMESTAMP, so the identity drops the nanoseconds, while the same
    cell written through the registered view (results of more than 1,024 rows) keeps them:
    two identities for one cell, and keys that differ by nanoseconds collapse into one.
    Safe: the identity reads the key as DuckDB writes it."""
    sql = (
        "SELECT region, CAST('2024-01-01 00:00:00.123456789' AS TIMESTAMP_NS) AS d, "
        "COUNT(*) AS n FROM persons GROUP BY region, d"
    )
    with sqlsdc.connect(fresh_demo_db, user="analyst") as con:
        cursor = con.execute(sql)
        assert len(cursor.fetchall()) == 8
        query_id = cursor.query_id
    cells = _ledger_cells(fresh_demo_db, query_id)
    assert cells, "the query's cells are in the ledger"
    keys = {json.loads(c)["keys"]["d"] for c in cells}
    assert keys == {"2024-01-01 00:00:00.123456789"}


def test_a_key_beyond_pythons_dates_is_answered_or_refused_and_audited(fresh_demo_db):
    """A DATE key that DuckDB holds and Python cannot (``'infinity'``, year 10000 or BC) makes
    the list-parameter ledger path raise ``OverflowError`` from ``to_pylist``: a traceback for
    the analyst, and the query is rolled back without an audit entry (its id is lost). Safe: a
    sqlsdc error or an answer, and an audit entry either way."""
    sql = (
        "SELECT region, CAST('infinity' AS DATE) AS d, COUNT(*) AS n FROM persons "
        "GROUP BY region, d"
    )
    with sqlsdc.connect(fresh_demo_db, user="analyst") as con:
        try:
            con.execute(sql)
        except Error:
            pass  # refused or failed, in sqlsdc's words
    assert [e[2] for e in _audit(fresh_demo_db)].count(sql) == 1


def test_every_paid_dp_query_has_an_audit_entry(tmp_path):
    """The same ``OverflowError`` in a DP query (a constant column is a key of its ledger rows)
    comes after the charge committed: the spend ledger holds a charge whose query id never
    reaches the audit log, as many as the analyst asks (``load_test.py`` allows one, for a
    process killed between the two). Safe: every charge's query id is in the audit log."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from test_dp_query import dp_document, make_db

    path = tmp_path / "dp.duckdb"
    make_db(path, dp_document())
    sql = "SELECT sex, CAST('infinity' AS DATE) AS d, SUM(income) FROM persons GROUP BY sex"
    with sqlsdc.connect(path, user="ana") as con:
        try:
            con.execute(sql)
        except Error:
            pass  # refused or failed, in sqlsdc's words
    unaudited = _read(
        path,
        "SELECT s.query_id FROM sqlsdc.budget_spend s "
        "LEFT JOIN sqlsdc.audit a ON a.query_id = s.query_id WHERE a.query_id IS NULL",
    )
    assert unaudited == []


def test_a_failed_dp_answer_keeps_the_engines_reason_for_the_admin(tmp_path):
    """In a DP query the noisy cells are registered for the answer's statement and
    unregistered in a ``finally`` inside the answer's transaction: after any engine error
    there, ``unregister`` raises "Current transaction is aborted", which replaces the error.
    The admin's audit reason is lost, and a timeout there is told to the analyst as an engine
    failure instead of :class:`QueryCanceled`. Safe: the engine's own reason is audited."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from test_dp_query import dp_document, make_db

    path = tmp_path / "dp.duckdb"
    make_db(path, dp_document())
    sql = "SELECT region, CAST(COUNT(*) AS TINYINT) FROM persons GROUP BY region"
    with sqlsdc.connect(path, user="ana") as con:
        with pytest.raises(Error, match="withheld"):
            con.execute(sql)
    ((reason,),) = _read(path, "SELECT reason FROM sqlsdc.audit WHERE sql_text = ?", [sql])
    assert "aborted" not in reason, reason


# --- 3. the OS lock on <db>.lock ----------------------------------------------------------------


def test_the_lock_file_is_no_more_readable_than_the_database(fresh_demo_db):
    """The lock file is created with the process umask (0644) whatever the database's own mode:
    on a database only its service user may read (0600, served with ``sqlsdc serve``), every
    local user can still open ``<db>.lock`` read-only and ``flock`` it exclusively, and every
    open of the database by the service then waits 60 s and fails (a denial of service that
    needed read access to the database file before the lock existed). Safe: the lock file is
    made with the database's permissions (or none broader)."""
    os.chmod(fresh_demo_db, 0o600)
    lock = file_lock.lock_path(fresh_demo_db)
    assert not lock.exists()
    sqlsdc.connect(fresh_demo_db, user="analyst").close()
    database_mode = stat.S_IMODE(os.stat(fresh_demo_db).st_mode)
    lock_mode = stat.S_IMODE(os.stat(lock).st_mode)
    assert lock_mode & ~database_mode == 0, f"lock {oct(lock_mode)}, database {oct(database_mode)}"


def test_a_writer_does_not_run_unlocked_when_the_lock_file_is_taken(tmp_path):
    """Whoever can create files in the database's folder can put a directory (or a file the
    service cannot open) at ``<db>.lock`` before it exists: ``_open`` then returns None and
    every writer gets "a hold on nothing", so processes taking turns lose commits again
    (``benchmarks/duckdb_handover.py --sqlsdc`` with a directory at ``handover.duckdb.lock``:
    957 of 960 acknowledged commits in the file, 3 ids handed out twice). Safe: a writer that
    cannot take the lock in a folder where it can write refuses to open, saying why."""
    import duckdb

    path = tmp_path / "taken.duckdb"
    duckdb.connect(str(path)).close()
    file_lock.lock_path(path).mkdir()
    try:
        con = open_database(path, wait=0.5)
    except Error as refused:
        assert ".lock" in str(refused)
        return
    con.close()
    pytest.fail("the database was opened for writing without its lock")


# --- 4. the answer caps bound memory, not only the answer --------------------------------------


@pytest.mark.slow
def test_the_answer_byte_cap_bounds_the_memory_one_query_takes(demo_db):
    """``run`` checks MAX_ANSWER_BYTES after each Arrow batch of 131,072 rows, so one batch is
    built whole first: a string literal of 4 KB over a cross join of a public table (8^6 rows)
    takes about 1 GB before the 64 MiB cap refuses it, and 100 KB would take about 26 GB (one
    analyst brings down a ``sqlsdc serve`` process shared by every session). Measured: 4 KB ->
    1.2 GB peak, 8 KB -> 2.2 GB, 16 KB -> 4.2 GB. Safe: the peak stays within a few times the
    cap."""
    code = textwrap.dedent(f"""
        import resource, sqlsdc
        from sqlsdc.errors import AnswerTooLarge
        con = sqlsdc.connect({str(demo_db)!r}, user="analyst")
        con.execute("SELECT COUNT(*) FROM regions").fetchall()
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        literal = "x" * 4000
        try:
            con.execute(f"SELECT '{{literal}}' || a.name AS s FROM regions a, regions b, "
                        "regions c, regions d, regions e, regions f").fetchall()
        except AnswerTooLarge:
            pass
        print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    grown_mib = int(done.stdout.split()[-1])
    assert grown_mib < 4 * 64, f"{grown_mib} MiB taken to refuse a 64 MiB answer"


def test_a_lock_held_by_another_user_gives_the_documented_exit_code(tmp_path):
    """An analyst who can read ``<db>.lock`` holds it (``flock`` on a read-only descriptor):
    the open gives up after its wait with a clear message, but as sqlsdc's base ``Error``, so
    the CLI exits 1 ("other error") where its help documents 9 for a lock. Safe: an
    :class:`OperationalError` (exit 9)."""
    import duckdb

    from sqlsdc.errors import OperationalError

    path = tmp_path / "held.duckdb"
    duckdb.connect(str(path)).close()
    file_lock.lock_path(path).touch()
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import fcntl, sys
            handle = open({str(file_lock.lock_path(path))!r}, "r")
            fcntl.flock(handle, fcntl.LOCK_EX)
            print("held", flush=True)
            sys.stdin.readline()
        """)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(Error, match="held a lock on it for 0.3 s") as caught:
            open_database(path, wait=0.3)
        assert isinstance(caught.value, OperationalError)
    finally:
        holder.stdin.write("\n")
        holder.stdin.flush()
        holder.wait()


@pytest.mark.slow
def test_a_busy_analyst_cannot_keep_the_file_when_the_waiting_folder_is_taken(fresh_demo_db):
    """A busy connection lets the file go only when ``<db>.waiting/`` names a live waiter;
    whoever can create files in the database's folder can put a plain file there first, so
    ``mark_waiting`` fails silently and one analyst running queries back to back keeps the
    database for as long as they like: every other user's open waits its 60 s and fails
    (measured: an admin's open took 19.6 s, the length of the analyst's loop). Safe: the other
    process gets its turn within a few seconds."""
    waiting = fresh_demo_db.with_name(fresh_demo_db.name + ".waiting")
    waiting.touch()
    busy = cli_fork.popen([], code=textwrap.dedent(f"""
            import time, sqlsdc
            con = sqlsdc.connect({str(fresh_demo_db)!r}, user="analyst")
            print("busy", flush=True)
            end = time.monotonic() + 20
            while time.monotonic() < end:
                con.execute("SELECT region, COUNT(*) FROM persons GROUP BY region").fetchall()
        """), stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert busy.stdout.readline().strip() == "busy"
        time.sleep(0.5)
        con = open_database(fresh_demo_db, read_only=True, wait=8)
        con.close()
    finally:
        busy.kill()
        busy.wait()


# --- 5. what held: a DP query killed after its charge ------------------------------------------


def test_a_dp_query_killed_after_its_charge_answers_later_with_everyones_noise(tmp_path):
    """A process killed after the charge committed and before the answer (and the cells'
    cache) was written: asked again, the query is charged again (nothing of it was released,
    and a free asking would compute the exact cells again: red team s41b), once, and gives
    exactly the cells another analyst is shown (the noise is a function of the cell, not of
    the query or the user), for DP sums over a public domain and for private groups alike."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from test_dp_query import dp_document, make_db, spend_rows

    path = tmp_path / "killed.duckdb"
    make_db(path, dp_document())
    queries = [
        "SELECT sex, SUM(income) FROM persons WHERE age < 30 GROUP BY sex",
        "SELECT clinic, COUNT(*) FROM visits WHERE cost > 20 GROUP BY clinic",
    ]
    for sql in queries:
        script = textwrap.dedent(f"""
            import os, signal
            import sqlsdc
            from sqlsdc.guard import connection

            def die(*args, **kwargs):
                os.kill(os.getpid(), signal.SIGKILL)

            connection._run_over = die  # after the charge, before the answer is recorded
            sqlsdc.connect({str(path)!r}, "ana").execute({sql!r})
        """)
        done = cli_fork.run([], code=script, timeout=120)  # its own process, forked
        assert done.returncode == -9
    paid = spend_rows(path, "ana")
    assert len(paid) == 2
    with sqlsdc.connect(path, "ana") as ana, sqlsdc.connect(path, "bob") as bob:
        for sql in queries:
            assert sorted(ana.execute(sql).fetchall()) == sorted(bob.execute(sql).fetchall())
            assert sorted(ana.execute(sql).fetchall()) == sorted(bob.execute(sql).fetchall())
    again = spend_rows(path, "ana")
    assert again[:2] == paid and [r[:3] for r in again[2:]] == [r[:3] for r in paid]
