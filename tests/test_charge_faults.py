"""Every DP charge has its audit entry, whatever stops the statement that made it: a server
killed with SIGKILL while statements are in flight, Ctrl-C as the charge commits or as the
answer commits, a cancel after the charge. Real DuckDB files, real processes and signals (the
processes forked with sqlsdc imported, :mod:`cli_fork`).

The charge writes the query's audit entry (``failed``, ``store.CHARGED_PENDING``) in its own
transaction, and the outcome replaces it; before, a kill after the charge left a ledger row
whose query id no audit entry named (one per statement in flight in a server), and Ctrl-C as
the charge returned audited the statement under another id than its charge.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import textwrap
import threading
from pathlib import Path

import cli_fork
import dp_persons
import pytest

import sqlsdc
from sqlsdc.catalog.store import CHARGED_PENDING
from sqlsdc.engines.duckdb import open_database

PASSWORD = "correct horse 42"
IN_FLIGHT = 3  # statements the server runs when it is killed


def by_region(age: int) -> str:
    return f"SELECT region, COUNT(*) FROM persons WHERE age >= {age} GROUP BY region"


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    """The DP persons database, built once for the module: each test changes a copy."""
    return dp_persons.build(tmp_path_factory.mktemp("charges") / "charges.duckdb")


@pytest.fixture
def db(template, tmp_path) -> Path:
    path = tmp_path / template.name
    shutil.copy(template, path)
    return path


def charges_and_entries(db: Path) -> tuple[list[tuple], dict[int, tuple]]:
    """The ledger's ``(query_id, epsilon)`` rows and the audit log by query id."""
    con = open_database(db, read_only=True)
    try:
        ledger = con.execute(
            "SELECT query_id, epsilon FROM sqlsdc.budget_spend ORDER BY seq"
        ).fetchall()
        audit = con.execute("SELECT query_id, decision, reason, sql_text FROM sqlsdc.audit")
        return ledger, {q: (d, r, s) for q, d, r, s in audit.fetchall()}
    finally:
        con.close()


# --- a server killed with statements in flight ------------------------------------------------

SERVER = textwrap.dedent(
    """
    import os
    import sys
    import time
    from sqlsdc.guard import connection

    def in_flight(*args, **kwargs):  # the statements' answers: the test kills us here
        os.write(2, b"in flight\\n")  # one write: print's two (text, end) of two sessions'
        time.sleep(600)  # threads interleaved ("in flightin flight"), and the test waited forever

    connection._run_over = in_flight
    sys.argv = ["sqlsdc", "serve", sys.argv[1], "--port", "0", "--insecure"]
    from sqlsdc.cli.main import main
    main()
    """
)


def test_a_server_killed_with_statements_in_flight_leaves_every_charge_audited(db):
    """Three sessions' DP statements have been charged and are computing their answers when
    the server is killed with SIGKILL: each charge has its audit entry (``failed``: the
    process stopped), under the charge's query id. Nothing of them was released, so each is
    charged again when asked again (once), and then no more."""
    psycopg = pytest.importorskip("psycopg")
    added = cli_fork.run(["server-user", "add", db, "ana", "--password-stdin"],
                         input=PASSWORD + "\n", timeout=120)  # fmt: skip
    assert added.returncode == 0, added.stderr
    server = cli_fork.popen([db], code=SERVER, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)  # fmt: skip
    failures: list[BaseException] = []
    try:
        host, port = server.stdout.readline().strip().rsplit(":", 1)
        dsn = f"host={host} port={port} user=ana password='{PASSWORD}' dbname=d sslmode=disable"

        def ask(age: int) -> None:
            try:
                with psycopg.connect(dsn, autocommit=True) as con:
                    con.execute(by_region(age)).fetchall()
            except BaseException as error:  # the server died under it
                failures.append(error)

        sessions = [threading.Thread(target=ask, args=(age,)) for age in range(IN_FLIGHT)]
        for session in sessions:
            session.start()
        said = []  # the server's lines: it is listening, then every statement is charged
        while said.count("in flight\n") < IN_FLIGHT:  # and its answer under way
            said.append(server.stderr.readline())
            assert said[-1], said  # the server ended
    finally:
        server.kill()
        server.wait(timeout=60)
    for session in sessions:
        session.join(timeout=60)
    assert server.returncode == -signal.SIGKILL
    assert len(failures) == IN_FLIGHT  # no session got an answer
    ledger, audit = charges_and_entries(db)
    assert len(ledger) == IN_FLIGHT
    for query_id, epsilon in ledger:
        decision, reason, sql = audit[query_id]
        assert (decision, reason, epsilon) == ("failed", CHARGED_PENDING, "1/2")
    assert sorted(audit[q][2] for q, _ in ledger) == sorted(map(by_region, range(IN_FLIGHT)))
    with sqlsdc.connect(db, "ana") as con:  # not released: asked again, paid again
        for age in range(IN_FLIGHT):
            con.execute(by_region(age)).fetchall()
    again = charges_and_entries(db)[0]
    with sqlsdc.connect(db, "ana") as con:  # answered: paid from then on
        for age in range(IN_FLIGHT):
            con.execute(by_region(age)).fetchall()
    assert again[:IN_FLIGHT] == ledger and len(again) == 2 * IN_FLIGHT
    assert {epsilon for _, epsilon in again} == {"1/2"}
    assert charges_and_entries(db)[0] == again


def test_a_process_killed_after_the_charge_leaves_its_audit_entry(db):
    """The guarded connection's own path: SIGKILL while the answer is computed."""
    script = textwrap.dedent(
        f"""
        import os, signal
        import sqlsdc
        from sqlsdc.guard import connection

        def die(*args, **kwargs):
            os.kill(os.getpid(), signal.SIGKILL)

        connection._run_over = die
        sqlsdc.connect({str(db)!r}, "ana").execute({by_region(5)!r})
        """
    )
    done = cli_fork.run([], code=script, timeout=120)
    assert done.returncode == -signal.SIGKILL
    ledger, audit = charges_and_entries(db)
    ((query_id, _),) = ledger
    assert audit == {query_id: ("failed", CHARGED_PENDING, by_region(5))}


# --- Ctrl-C and cancels after a commit --------------------------------------------------------

INTERRUPTED = textwrap.dedent(
    """
    import signal, sys
    import sqlsdc
    from sqlsdc.engines import duckdb as engine
    from sqlsdc.guard import connection, dp_charge

    where, db, sql = sys.argv[1:4]
    con = sqlsdc.connect(db, "ana")
    real_charge, real_record, real_execute = (dp_charge.charge, connection.record_release,
                                              engine.LockedConnection.execute)
    armed = []

    def charge(*args, **kwargs):  # Ctrl-C as the charge returns, after its COMMIT
        paid = real_charge(*args, **kwargs)
        if where == "charge":
            signal.raise_signal(signal.SIGINT)
        elif where == "cancel":
            con.interrupt()  # a server's CancelRequest
        return paid

    def record_release(*args, **kwargs):  # the last write before the answer's COMMIT
        armed.append(where == "answer")
        return real_record(*args, **kwargs)

    def execute(self, *args, **kwargs):
        result = real_execute(self, *args, **kwargs)
        if args and getattr(args[0], "query", args[0]) == "COMMIT" and armed and armed.pop():
            signal.raise_signal(signal.SIGINT)  # Ctrl-C as the answer's COMMIT returns
        return result

    dp_charge.charge, connection.record_release = charge, record_release
    engine.LockedConnection.execute = execute
    try:
        con.execute(sql).fetchall()
        print("answered")
    except KeyboardInterrupt as stopped:
        print("KeyboardInterrupt", *getattr(stopped, "__notes__", []), sep="\\n")
    except sqlsdc.Error as error:
        print(type(error).__name__, error, sep="\\n")
    where = ""
    con.execute(sql).fetchall()  # asked again
    con.close()
    """
)


def interrupted(db: Path, where: str, sql: str) -> list[str]:
    done = cli_fork.run([where, db, sql], code=INTERRUPTED, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.splitlines()


def test_ctrl_c_as_the_charge_commits_audits_the_charge_and_says_it_was_paid(db):
    """SIGINT right after the charge's COMMIT (before the connection had the charge back):
    the statement is audited under its charge's id as interrupted, the user reads that it was
    charged and that asking again is charged again (nothing of it was released), and the
    asking again is charged."""
    said = interrupted(db, "charge", by_region(7))
    ledger, audit = charges_and_entries(db)
    ((query_id, _), (again, _)) = ledger
    assert said == ["KeyboardInterrupt", f"query {query_id} was charged to the privacy budget "
                    "before it stopped, and its cells were not released: asking it again is "
                    "charged again"]  # fmt: skip
    assert audit[again] == ("accepted", None, by_region(7))
    assert audit[query_id] == ("failed", "interrupted (Ctrl-C)", by_region(7))
    assert [d for d, _, _ in audit.values()] == ["failed", "accepted"]  # and the repeat


def test_ctrl_c_as_the_answer_commits_leaves_it_answered_once(db):
    """SIGINT right after the answer's COMMIT: the answer is recorded (accepted, its cells
    cached), with no second "failed" entry; the user reads that it was answered."""
    said = interrupted(db, "answer", by_region(9))
    ledger, audit = charges_and_entries(db)
    ((query_id, _),) = ledger
    assert said == ["KeyboardInterrupt", f"query {query_id} was answered and recorded "
                    "(audited as accepted) just before the interrupt"]  # fmt: skip
    assert audit[query_id] == ("accepted", None, by_region(9))
    assert sorted(d for d, _, _ in audit.values()) == ["accepted", "accepted"]


def test_ctrl_c_as_a_ckm_answer_commits_adds_no_failed_entry(tmp_path, pristine_demo_db):
    """The same for a query that charges nothing (CKM on the demo): one accepted entry."""
    db = tmp_path / "demo.duckdb"
    shutil.copy(pristine_demo_db, db)
    sql = "SELECT region, COUNT(*) FROM persons GROUP BY region"
    script = INTERRUPTED.replace('"ana"', '"analyst"')
    done = cli_fork.run(["answer", db, sql], code=script, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    con = open_database(db, read_only=True)
    try:
        audit = con.execute("SELECT query_id, decision FROM sqlsdc.audit").fetchall()
    finally:
        con.close()
    (first, _) = min(audit)
    assert done.stdout.splitlines() == ["KeyboardInterrupt", f"query {first} was answered and "
                                        "recorded (audited as accepted) just before the "
                                        "interrupt"]  # fmt: skip
    assert [d for _, d in sorted(audit)] == ["accepted", "accepted"]


def test_a_cancel_after_the_charge_says_it_was_paid(db):
    """A cancel (the statement timeout's interrupt, a server's CancelRequest) that reaches the
    statement after its charge: QueryCanceled, saying the charge is paid and that asking
    again is charged again; audited under the charge's id. Asked again, it is charged."""
    said = interrupted(db, "cancel", by_region(11))
    ledger, audit = charges_and_entries(db)
    ((query_id, _), (again, _)) = ledger
    assert said[0] == "QueryCanceled"
    assert said[1].startswith("the query was stopped because it ran longer than the statement")
    assert said[1].endswith(f"; query {query_id} was charged to the privacy budget before it "
                            "stopped, and its cells were not released: asking it again is "
                            "charged again")  # fmt: skip
    decision, reason, _ = audit[query_id]
    assert decision == "refused" and reason.startswith("QueryCanceled")  # as cancels before
    assert len(audit) == 2 and audit[again][0] == "accepted"
