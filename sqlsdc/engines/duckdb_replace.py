"""Replacing a DuckDB file that other processes may have open read-write (``publish --force``).

A file renamed over a database that another process has open read-write does not stop that
process: its next commit goes into ``<file>.wal`` by name, beside the NEW file, and the next
opening of the new file fails ("WAL does not match database file"). :func:`hold_for_replacing`
waits for such a process before anything else is done (a publication's queries are charged
after it), then keeps the old file open read-only, so that no process opens it read-write
until the new file is in place; readers (a BI tool) neither block nor are blocked: they go on
reading the old file. :func:`drop_old_wal` removes a write-ahead log left by a writer that
was killed, which would otherwise meet the new file.
"""

from __future__ import annotations

from pathlib import Path

from sqlsdc.engines import duckdb as engine
from sqlsdc.engines.duckdb_files import foreign_file
from sqlsdc.errors import OperationalError


def hold_for_replacing(
    path: Path, wait: float, *, readers_too: bool = False
) -> engine.LockedConnection | None:
    """Open the database at ``path`` read-only, waiting up to ``wait`` seconds for processes
    that have it open read-write (``readers_too``: open at all, the connection then read-write)
    (OperationalError, exit code 9, after that), and return the connection, to be closed once
    the file is replaced. None when there is nothing to hold: no file, a file that is no DuckDB
    database or is empty, or one the engine will not open for another reason than a lock: a
    damaged file (a write-ahead log of another file beside it) is what ``--force`` replaces;
    it failed with exit code 9, "the engine refused to open it" (s46l)."""
    if not path.is_file() or foreign_file(path) or path.stat().st_size == 0:
        return None
    try:
        return engine.open_database(path, read_only=not readers_too, wait=wait,
                                    writes_data=False)  # fmt: skip
    except OperationalError as failure:
        if failure.detail is None or "lock" in failure.detail:
            raise  # held read-write by another process all along
        return None


def drop_old_wal(path: Path) -> None:
    """Delete the write-ahead log of the file about to be replaced at ``path``."""
    path.with_name(path.name + ".wal").unlink(missing_ok=True)
