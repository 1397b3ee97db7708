"""``sqlsdc publish --force OUT`` replaces OUT only when no other process has it open
read-write (session 46, left by s46i): replaced under such a process, that process's next
commit went into a write-ahead log beside the NEW file, and the release could not be opened
("WAL does not match database file"). The publication waits for it before anything is charged
or recorded, then fails (exit code 9) with nothing charged; readers do not stop it."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap

import duckdb
import pytest

import sqlsdc
import sqlsdc.release as release
from sqlsdc.errors import OperationalError

QUERIES = {"by_region": "SELECT region, COUNT(*) AS n FROM persons GROUP BY region"}

HOLDER = textwrap.dedent(
    """
    import sys, duckdb
    con = duckdb.connect(sys.argv[1], read_only=sys.argv[2] == "read")
    print("open", flush=True)
    sys.stdin.readline()  # replaced meanwhile?
    if sys.argv[2] == "write":
        con.execute("PRAGMA disable_checkpoint_on_shutdown")
        con.execute("CREATE TABLE main.zz AS SELECT 42 AS a")  # a commit: into its WAL
    print("done", flush=True)
    import os; os._exit(9)  # ended before a checkpoint: its WAL stays
    """
)


def _holder(path, mode: str) -> subprocess.Popen:
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(path), mode],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert holder.stdout.readline().strip() == "open"
    return holder


def _finish(holder: subprocess.Popen) -> None:
    holder.stdin.write("\n")
    holder.stdin.flush()
    assert holder.stdout.readline().strip() == "done"
    holder.wait(60)


def _tables(path) -> set[str]:
    with duckdb.connect(str(path), read_only=True) as con:
        return {
            name for (name,) in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()
        }


def test_a_release_another_process_has_open_read_write_is_not_replaced(
    suppress_template, tmp_path, monkeypatch
):
    db, out = tmp_path / "demo.duckdb", tmp_path / "release.duckdb"
    shutil.copy(suppress_template, db)
    release.publish(db, out, "admin")
    before = sqlsdc.admin.audit(db, "admin", limit=1000)
    holder = _holder(out, "write")
    try:
        monkeypatch.setattr(release, "REPLACE_WAIT_SECONDS", 0.5)
        with pytest.raises(OperationalError, match="another process has held a lock on it"):
            release.publish(db, out, "admin", queries=QUERIES, analyst="analyst", replace=True)
        _finish(holder)  # main: its commit went into a WAL beside the new release
    finally:
        holder.kill()
        holder.wait()
    after = sqlsdc.admin.audit(db, "admin", limit=1000)
    new = after[~after["query_id"].isin(before["query_id"])]
    assert new[["user_name", "decision"]].values.tolist() == [["admin", "failed"]]  # no query
    assert "zz" in _tables(out)  # the old file, whole, with the holder's commit
    assert not list(tmp_path.glob("*.partial*"))
    # once nobody has it open, it is replaced, and the killed writer's WAL does not meet it
    assert out.with_name(out.name + ".wal").exists()
    release.publish(db, out, "admin", queries=QUERIES, analyst="analyst", replace=True)
    assert "by_region" in _tables(out) and "zz" not in _tables(out)


def test_readers_of_the_release_do_not_stop_its_replacement(suppress_template, tmp_path):
    db, out = tmp_path / "demo.duckdb", tmp_path / "release.duckdb"
    shutil.copy(suppress_template, db)
    release.publish(db, out, "admin")
    reader = _holder(out, "read")  # a BI tool, read-only as the README says
    try:
        release.publish(db, out, "admin", queries=QUERIES, analyst="analyst", replace=True)
        _finish(reader)
    finally:
        reader.kill()
        reader.wait()
    assert "by_region" in _tables(out)


def test_a_damaged_release_is_replaced(suppress_template, tmp_path):
    """A release the engine will not open (another file's WAL beside it) is replaced by
    ``--force``, as before: only a lock stops the replacement."""
    from test_demo_replace import damage

    db, out = tmp_path / "demo.duckdb", tmp_path / "release.duckdb"
    shutil.copy(suppress_template, db)
    release.publish(db, out, "admin")
    damage(out)
    release.publish(db, out, "admin", queries=QUERIES, analyst="analyst", replace=True)
    assert "by_region" in _tables(out)
