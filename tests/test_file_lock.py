"""The OS lock around every open of a database file (sqlsdc.engines.file_lock): held from the
open until the last connection of the process closes, exclusive for writers and shared for
readers, let go when a process dies; other processes wait for it within the open's time."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import textwrap

import duckdb
import pytest

import sqlsdc
from sqlsdc.engines import file_lock
from sqlsdc.engines.duckdb import open_database


@pytest.fixture
def path(tmp_path):
    path = tmp_path / "locked.duckdb"
    duckdb.connect(str(path)).close()
    return path


def other_process_gets(path, *, shared: bool) -> bool:
    """Whether another process could take the file's lock now (it lets it go at once)."""
    code = textwrap.dedent(f"""
        from sqlsdc.engines import file_lock
        hold = file_lock.try_acquire({str(path)!r}, shared={shared})
        print(hold is not None)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return done.stdout.strip() == "True"


def test_a_writer_holds_the_file_until_its_last_connection_closes(path):
    first = open_database(path)
    second = open_database(path)  # the same process: one lock, held twice
    assert (path.parent / "locked.duckdb.lock").is_file()
    assert not other_process_gets(path, shared=False)
    assert not other_process_gets(path, shared=True)
    first.close()
    assert not other_process_gets(path, shared=False)
    second.close()
    assert other_process_gets(path, shared=False)


def test_readers_share_the_file_and_keep_writers_out(path):
    reader = open_database(path, read_only=True)
    try:
        assert other_process_gets(path, shared=True)
        assert not other_process_gets(path, shared=False)
    finally:
        reader.close()
    assert other_process_gets(path, shared=False)


def test_a_connection_dropped_without_close_lets_the_lock_go(path):
    con = open_database(path)
    con.execute("SELECT 1")
    del con
    gc.collect()
    assert other_process_gets(path, shared=False)


def test_closing_twice_lets_the_lock_go_once(path):
    con = open_database(path)
    con.close()
    con.close()
    other = open_database(path)
    try:
        assert not other_process_gets(path, shared=False)  # still held by ``other``
    finally:
        other.close()


def test_a_release_while_another_thread_asks_whether_it_is_held_is_applied(path, monkeypatch):
    """A release finds the registry taken by another thread and is queued for whichever
    thread leaves the registry next: ``held`` (asked by every waiting guarded opening) left
    it queued, so the process kept the file with no connection open until something else
    touched the registry (red team s37)."""
    import threading

    hold = file_lock.try_acquire(path, shared=False)

    class ClosedMeanwhile(dict):
        def __contains__(self, key):  # another thread closes as held() looks
            closing = threading.Thread(target=hold.release)
            closing.start()
            closing.join()
            return dict.__contains__(self, key)

    monkeypatch.setattr(file_lock, "_held", ClosedMeanwhile(file_lock._held))
    assert file_lock.held(path)
    assert other_process_gets(path, shared=False)


def test_an_open_waits_for_another_process_and_says_why_it_gave_up(path):
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import sys
            from sqlsdc.engines.duckdb import open_database
            con = open_database({str(path)!r})
            print("open", flush=True)
            sys.stdin.readline()
            con.close()
        """)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "open"
        with pytest.raises(  # exit status 9 in the CLI, as its help says for a locked database
            sqlsdc.OperationalError, match="another process has held a lock on it for 0.3 s"
        ):
            open_database(path, wait=0.3)
        holder.stdin.write("\n")
        holder.stdin.flush()
        con = open_database(path, wait=30)  # waits for the holder to close
        con.close()
    finally:
        holder.kill()
        holder.wait()


def test_a_killed_holder_never_blocks_the_others(path):
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import time
            from sqlsdc.engines.duckdb import open_database
            con = open_database({str(path)!r})
            con.execute("CREATE TABLE t AS SELECT 1 AS x")
            print("open", flush=True)
            time.sleep(600)
        """)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert holder.stdout.readline().strip() == "open"
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    con = open_database(path, wait=30)
    try:
        assert con.execute("SELECT x FROM t").fetchall() == [(1,)]  # committed before the kill
    finally:
        con.close()


def test_a_reader_that_cannot_make_the_lock_file_holds_nothing_and_a_writer_refuses(
    path, monkeypatch
):
    """A read-only folder: readers go on without the lock (nobody can write the database
    there); a writer never opens without it."""
    real_open = os.open

    def no_new_files(name, flags, *args):
        if flags & os.O_CREAT:
            raise PermissionError(13, "Permission denied", name)
        return real_open(name, flags, *args)

    monkeypatch.setattr(file_lock.os, "open", no_new_files)
    hold = file_lock.try_acquire(path, shared=True)
    assert hold is not None and hold.handle is None
    hold.release()
    with pytest.raises(sqlsdc.OperationalError, match=r"lock cannot be taken .*Permission denied"):
        open_database(path)


def test_something_else_at_the_lock_path_is_refused_not_ignored(path):
    file_lock.lock_path(path).mkdir()
    for read_only in (False, True):
        with pytest.raises(sqlsdc.OperationalError, match=r"is not a lock file sqlsdc made"):
            open_database(path, read_only=read_only)


def test_the_lock_file_is_no_more_reachable_than_the_database(path):
    os.chmod(path, 0o600)
    open_database(path).close()
    assert os.stat(file_lock.lock_path(path)).st_mode & 0o777 == 0o600
