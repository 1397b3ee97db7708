"""What keeps a guarded query's fixed cost low, without changing what it records or enforces:
one watchdog thread for statement timeouts and idle releases (no thread per query), the query
id drawn by the audit entry in the same transaction as the ledger rows, and the cell status
made only when asked. Timings are in ``benchmarks/bench_guard.py --fixed-cost``."""

from __future__ import annotations

import threading
import time

import duckdb
import pytest

import sqlsdc
from sqlsdc.engines import watchdog
from sqlsdc.engines.duckdb import LockedConnection, memory_database, open_database, run
from sqlsdc.guard import holding

COUNT = "SELECT region, COUNT(*) AS n FROM persons GROUP BY region"


def _wait(condition, seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return condition()


def test_alarm_runs_when_due_and_not_when_cancelled():
    fired, cancelled = threading.Event(), threading.Event()
    started = time.monotonic()
    watchdog.after(0.05, fired.set)
    watchdog.after(0.05, cancelled.set).cancel()
    assert fired.wait(5)
    assert time.monotonic() - started >= 0.05
    time.sleep(0.1)
    assert not cancelled.is_set()


def test_alarms_run_in_time_order_and_many_cancelled_ones_are_dropped():
    order: list[int] = []
    done = threading.Event()
    for _ in range(500):  # the pattern of statement interrupts: set, then cancelled
        watchdog.after(300, done.set).cancel()
    watchdog.after(0.06, lambda: (order.append(2), done.set()))
    watchdog.after(0.03, lambda: order.append(1))
    assert done.wait(5)
    assert order == [1, 2]
    assert len(watchdog._state.heap) < 500  # compacted, not kept for 300 s


def test_a_failing_action_is_reported_and_the_watchdog_goes_on(monkeypatch):
    seen, after = [], threading.Event()
    monkeypatch.setattr(threading, "excepthook", lambda args: seen.append(args.exc_type))
    watchdog.after(0.01, lambda: 1 / 0)
    watchdog.after(0.02, after.set)
    assert after.wait(5)
    assert seen == [ZeroDivisionError]


def test_queries_start_no_thread(analyst, monkeypatch):
    analyst.execute(COUNT).fetchall()  # the watchdog exists from here on
    starts = []
    original = threading.Thread.start
    monkeypatch.setattr(threading.Thread, "start", lambda self: (starts.append(self.name),
                                                                 original(self)))  # fmt: skip
    for _ in range(20):
        analyst.execute(COUNT).fetchall()
    assert starts == []


def test_idle_connection_releases_the_file_and_opens_it_again(fresh_demo_db):
    con = sqlsdc.Connection(fresh_demo_db, "analyst", idle_release=0.1)
    try:
        first = con.execute(COUNT).fetchall()
        assert _wait(lambda: con._db is None)
        other = open_database(fresh_demo_db)  # the file is free: this process opens it again
        other.close()
        assert sorted(con.execute(COUNT).fetchall()) == sorted(first)  # no ORDER BY: any order
    finally:
        con.close()


LISTINGS = ("duckdb_tables", "duckdb_columns", "duckdb_constraints", "duckdb_views",
            "information_schema")  # fmt: skip


def test_opening_and_querying_list_none_of_the_engines_catalogs(ckm_db, tmp_path, monkeypatch):
    """The engine's catalog listings first build and bind every system view of a newly opened
    database (7-13 ms each): a guarded connection's opening, its first CKM and DP queries and
    its openings again after an idle release describe the tables they need instead (the
    demo policy: no stored release, no PRIMARY KEY or UNIQUE constraint)."""
    path = tmp_path / "demo.duckdb"
    path.write_bytes(ckm_db.read_bytes())
    statements: list[str] = []
    execute = LockedConnection.execute
    monkeypatch.setattr(LockedConnection, "execute", lambda self, sql, *rest, **named: (
        statements.append(str(sql)), execute(self, sql, *rest, **named))[1])  # fmt: skip
    con = sqlsdc.Connection(path, "analyst")
    try:
        for _ in range(2):
            assert con.execute(COUNT).fetchall()
            assert con.execute("SELECT scheme, COUNT(*) FROM benefits GROUP BY scheme").fetchall()
            con._close_engine()  # as an idle release does
    finally:
        con.close()
    assert any("DESCRIBE" in s for s in statements)
    assert [s for s in statements if any(name in s for name in LISTINGS)] == []


def test_busy_connection_keeps_the_file_and_releases_it_once_idle(fresh_demo_db):
    con = sqlsdc.Connection(fresh_demo_db, "analyst", idle_release=0.05)
    try:
        con.execute(COUNT).fetchall()
        opened = con._held_since
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline:  # back to back: never idle for 50 ms
            con.execute(COUNT).fetchall()
        assert con._held_since == opened  # not released (nor opened again) meanwhile
        assert _wait(lambda: con._db is None)
    finally:
        con.close()


def test_statement_timeout_still_interrupts_the_engine():
    con = memory_database()
    try:
        started = time.monotonic()
        with pytest.raises(duckdb.InterruptException):
            run(con, "SELECT sum(hash(i)) FROM range(100000000000) t(i)", timeout=0.2)
        assert time.monotonic() - started < 10
        assert run(con, "SELECT 42 AS x", timeout=5).column("x").to_pylist() == [42]
    finally:
        con.close()


def test_audit_entry_and_ledger_rows_share_the_drawn_query_id(fresh_demo_db):
    with sqlsdc.connect(fresh_demo_db, user="analyst") as con:
        first = con.execute(COUNT)
        rows = first.fetchall()
        with pytest.raises(sqlsdc.PolicyViolation):
            con.execute("SELECT income FROM persons")
        second = con.execute(COUNT)
    assert second.query_id > first.query_id
    raw = open_database(fresh_demo_db)
    try:
        audit = dict(raw.execute("SELECT query_id, decision FROM sqlsdc.audit").fetchall())
        ledger = raw.execute(
            "SELECT count(*) FROM sqlsdc.ledger WHERE query_id = ?", [first.query_id]
        ).fetchone()[0]
    finally:
        raw.close()
    assert audit[first.query_id] == audit[second.query_id] == "accepted"
    assert sorted(audit.values()).count("refused") == 1
    assert ledger == len(rows)  # one released count per region


def test_cell_status_is_made_when_asked_and_matches_the_result(analyst):
    cursor = analyst.execute(COUNT)
    assert cursor._status is None
    status = cursor.cell_status()
    assert list(status.columns) == ["region", "n"]
    assert set(status["region"]) == {"key"}
    assert len(status) == cursor.rowcount
    assert cursor.cell_status() is status


def test_a_nested_use_gives_no_turn_while_the_outer_one_runs(fresh_demo_db, monkeypatch):
    """The Spark path explains and charges while it holds the connection; a busy holder's
    turn given at the end of such a nested use closed the engine connection the outer use
    still ran on ("Connection already closed" under load). Only the outermost end gives it."""
    monkeypatch.setattr(holding, "MAX_TURN_SECONDS", 0.0)  # every hold is "long"
    con = sqlsdc.Connection(fresh_demo_db, "analyst")
    try:
        with con._holding() as outer:
            con.explain(COUNT)
            assert outer.execute("SELECT 1").fetchall() == [(1,)]
        assert con._db is None  # the outermost end gave the turn
        assert sorted(con.execute(COUNT).fetchall())  # and the next statement opens again
    finally:
        con.close()
