"""The whole process gives other processes a turn of the database file
(:mod:`sqlsdc.guard.turns`): a process whose guarded connections keep running statements used
to keep the file as long as they overlapped (red team s32c: an admin command waited 47 s
behind a server's sessions)."""

from __future__ import annotations

import gc
import subprocess
import threading
import time

import sqlsdc
from sqlsdc.engines import duckdb as engine
from sqlsdc.guard import holding
from sqlsdc.guard.turns import ProcessTurns

COUNT = "SELECT region, COUNT(*) AS n FROM persons GROUP BY region"


class _Waiter:
    """Another live process marked as waiting for the file, as ``open_database`` marks it."""

    def __init__(self, db):
        self.process = subprocess.Popen(["sleep", "60"])
        folder = db.with_name(db.name + ".waiting")
        folder.mkdir(exist_ok=True)
        self.marker = folder / str(self.process.pid)
        self.marker.touch()

    def leave(self):
        self.marker.unlink(missing_ok=True)
        self.process.kill()
        self.process.wait()


def _opens_at_once_with_a_waiter(db) -> None:
    """With another process waiting and no holder left in this process, an opening does not
    wait for a turn of its own process (the bound is 3 s in these tests)."""
    waiter = _Waiter(db)
    try:
        started = time.monotonic()
        with sqlsdc.Connection(db, "analyst") as con:
            assert time.monotonic() - started < 1.5
            assert con.execute(COUNT).fetchall()
    finally:
        waiter.leave()


def _open_in_a_thread(db, opened: list):
    def run():
        con = sqlsdc.Connection(db, "analyst")
        opened.append((time.monotonic(), con))

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_an_opening_waits_while_the_process_keeps_the_file_from_a_waiting_process(
    fresh_demo_db, monkeypatch
):
    monkeypatch.setattr(holding.TURNS, "hold", 0.0)  # the process held it long
    holder = sqlsdc.Connection(fresh_demo_db, "analyst", idle_release=None)
    assert holder.execute(COUNT).fetchall()
    waiter = _Waiter(fresh_demo_db)
    opened: list = []
    try:
        thread = _open_in_a_thread(fresh_demo_db, opened)
        time.sleep(0.5)
        assert thread.is_alive() and not opened  # waits for the process's holders
        released = time.monotonic()
        holder.close()  # the last holder lets go: the waiting process's turn, then this one
        thread.join(10)
        assert not thread.is_alive()
        ((at, con),) = opened
        assert at - released >= holding.TURN_SECONDS * 0.9
        assert con.execute(COUNT).fetchall()
        con.close()
    finally:
        waiter.leave()
        holder.close()


def test_the_turn_begins_once_the_file_is_let_go(fresh_demo_db, monkeypatch):
    """The other process's turn is counted from the moment the process has let the file go,
    not from the moment its last connection begins to close it: closing the file (DuckDB's
    checkpoint) took longer than the turn on a busy machine, so the process's next opening
    joined a lock still held and the waiting process never got in (red team s37: a process of
    four threads with a connection each kept the file 25-61 s from a waiting one)."""
    from sqlsdc.engines import file_lock

    monkeypatch.setattr(holding.TURNS, "hold", 0.0)
    held_at_turn = []
    closed = holding.TURNS.closed

    def watching(key, con):
        closed(key, con)
        if key in holding.TURNS._until:  # the last holder after a yield
            held_at_turn.append(file_lock.held(fresh_demo_db))

    monkeypatch.setattr(holding.TURNS, "closed", watching)
    holder = sqlsdc.Connection(fresh_demo_db, "analyst", idle_release=None)
    assert holder.execute(COUNT).fetchall()
    waiter = _Waiter(fresh_demo_db)
    opened: list = []
    try:
        thread = _open_in_a_thread(fresh_demo_db, opened)
        time.sleep(0.5)  # waits for the process's holders: a turn is due
        holder.close()
        thread.join(10)
        assert held_at_turn == [False]
        opened[0][1].close()
    finally:
        waiter.leave()
        holder.close()


def test_an_opening_waits_no_longer_than_its_bound(fresh_demo_db, monkeypatch):
    """A connection of the process left open and idle delays an opening, never stops it."""
    monkeypatch.setattr(holding.TURNS, "hold", 0.0)
    monkeypatch.setattr(engine, "LOCK_WAIT_SECONDS", 0.4)
    holder = sqlsdc.Connection(fresh_demo_db, "analyst", idle_release=None)
    assert holder.execute(COUNT).fetchall()
    waiter = _Waiter(fresh_demo_db)
    try:
        started = time.monotonic()
        with sqlsdc.Connection(fresh_demo_db, "analyst") as con:
            assert 0.35 <= time.monotonic() - started < 5
            assert con.execute(COUNT).fetchall()
    finally:
        waiter.leave()
        holder.close()


def test_without_a_waiting_process_nothing_waits(fresh_demo_db, monkeypatch):
    monkeypatch.setattr(holding.TURNS, "hold", 0.0)
    with sqlsdc.Connection(fresh_demo_db, "analyst", idle_release=None) as holder:
        assert holder.execute(COUNT).fetchall()
        started = time.monotonic()
        with sqlsdc.Connection(fresh_demo_db, "analyst") as con:
            assert con.execute(COUNT).fetchall()
        assert time.monotonic() - started < 5  # no turn to give: joins the process's hold


class _Engine:
    """A stand-in engine connection: only its identity and lifetime matter to the turns."""


def test_a_holder_dropped_without_closing_stops_counting():
    turns = ProcessTurns(hold=0.0, turn=0.05)
    held = _Engine()
    turns.held("db", held)
    started = time.monotonic()
    turns.wait("db", lambda: True, bound=0.3)
    assert time.monotonic() - started >= 0.25  # a holder, another process waiting: bounded
    del held
    gc.collect()
    started = time.monotonic()
    turns.wait("db", lambda: True, bound=5)
    assert time.monotonic() - started < 0.2


def test_a_close_after_the_working_folder_changed_lets_the_file_go(fresh_demo_db, monkeypatch):
    """The key a holder is counted under is the one its opening used: a relative path resolved
    again at close, after a chdir, named another file and left the holder counted (red team
    s32: every opening of the process then waited its whole bound while another waited)."""
    monkeypatch.setattr(holding.TURNS, "hold", 0.0)
    monkeypatch.setattr(engine, "LOCK_WAIT_SECONDS", 3.0)
    monkeypatch.chdir(fresh_demo_db.parent)
    holder = sqlsdc.Connection(fresh_demo_db.name, "analyst", idle_release=None)
    assert holder.execute(COUNT).fetchall()
    kept = holder._db  # still referenced (a cursor, a traceback): the weak set keeps it
    monkeypatch.chdir(fresh_demo_db.parent.parent)
    holder.close()
    _opens_at_once_with_a_waiter(fresh_demo_db)
    del kept


def test_an_opening_that_fails_before_reading_the_catalog_lets_the_file_go(
    fresh_demo_db, monkeypatch
):
    """Whatever fails after the engine connection is counted closes it and stops counting."""
    monkeypatch.setattr(holding.TURNS, "hold", 0.0)
    monkeypatch.setattr(engine, "LOCK_WAIT_SECONDS", 3.0)

    def interrupted(path):
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(engine, "data_writers", interrupted)
        try:
            sqlsdc.Connection(fresh_demo_db, "analyst")
        except KeyboardInterrupt as stopped:
            kept = stopped  # its traceback keeps the opening's frame, and its connection
    _opens_at_once_with_a_waiter(fresh_demo_db)
    del kept
