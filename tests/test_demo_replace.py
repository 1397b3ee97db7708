"""``sqlsdc demo --force`` replaces a database only when no other process has it open (session
46, new user s46i): replaced under a process that had it open, that process's next commit went
into a write-ahead log beside the NEW file, and the new demo database could not be opened
("WAL does not match database file", exit code 9 on every command)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import duckdb
import pytest

from sqlsdc.demo import build
from sqlsdc.errors import OperationalError

HOLDER = textwrap.dedent(
    """
    import sys, duckdb
    con = duckdb.connect(sys.argv[1])
    print("open", flush=True)
    sys.stdin.readline()  # replaced meanwhile?
    con.execute("PRAGMA disable_checkpoint_on_shutdown")
    con.execute("CREATE TABLE main.zz AS SELECT 42 AS a")  # a commit: into its WAL, by name
    print("committed", flush=True)
    import os; os._exit(9)  # ended before a checkpoint: its WAL stays
    """
)


def test_a_database_another_process_has_open_is_not_replaced(tmp_path, monkeypatch):
    path = tmp_path / "demo.duckdb"
    build.build_demo_database(path, persons=100)
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(path)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "open"
        monkeypatch.setattr(build, "REPLACE_WAIT_SECONDS", 0.5)
        with pytest.raises(OperationalError, match="another process has held a lock on it"):
            build.build_demo_database(path, persons=200, seed=7)  # main: replaced it
        holder.stdin.write("\n")
        holder.stdin.flush()
        assert holder.stdout.readline().strip() == "committed"
    finally:
        holder.kill()
        holder.wait()
    assert not list(tmp_path.glob(".*.building*"))  # nothing half-built left
    with duckdb.connect(str(path), read_only=True) as con:  # main: "WAL does not match"
        assert con.execute("SELECT a FROM main.zz").fetchall() == [(42,)]  # the old file, whole
        assert con.execute("SELECT COUNT(*) FROM main.persons").fetchone()[0] > 0
    # once nobody has it open, it is replaced
    build.build_demo_database(path, persons=200, seed=7)
    with duckdb.connect(str(path), read_only=True) as con:
        assert con.execute("SELECT COUNT(*) FROM main.persons").fetchone()[0] == 200


FOREIGN_WAL = textwrap.dedent(
    """
    import sys, os, duckdb
    con = duckdb.connect(sys.argv[1])
    con.execute("PRAGMA disable_checkpoint_on_shutdown")
    con.execute("CREATE TABLE t AS SELECT 1 AS a")
    con.execute("CHECKPOINT")
    con.execute("INSERT INTO t VALUES (2)")  # into its WAL, left by the exit below
    os._exit(0)
    """
)


def damage(path) -> None:
    """Put the write-ahead log of another database beside ``path``, as a process that had the
    old file open left it (the state this module's first test prevents)."""
    other = path.with_name("other.duckdb")
    subprocess.run([sys.executable, "-c", FOREIGN_WAL, str(other)], check=True, timeout=60)
    other.with_name(other.name + ".wal").replace(path.with_name(path.name + ".wal"))
    with pytest.raises(duckdb.Error):
        duckdb.connect(str(path)).close()


def test_a_damaged_database_is_replaced(tmp_path):
    """``demo --force`` is the remedy for a database the engine will not open; it failed
    itself, exit code 9, "the engine refused to open it" (s46l)."""
    path = tmp_path / "demo.duckdb"
    build.build_demo_database(path, persons=100)
    damage(path)
    build.build_demo_database(path, persons=200, seed=7)  # main: OperationalError
    with duckdb.connect(str(path), read_only=True) as con:
        assert con.execute("SELECT COUNT(*) FROM main.persons").fetchone()[0] == 200
