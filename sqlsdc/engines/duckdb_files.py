"""What a path holds when DuckDB will not open it as a database, and sqlsdc's words for that.

A policy YAML, a CSV or a SQLite file named where the database belongs is told apart by its first
bytes before the file's lock is taken (no ``<file>.lock`` is left beside it), and each refusal
of the engine (a lock held too long, no permission, another DuckDB version) becomes an error
that says what to do; the engine's text, which names the file, stays in ``detail``. Used by
:func:`sqlsdc.engines.duckdb.open_database`.
"""

from __future__ import annotations

import re
from pathlib import Path

from sqlsdc.errors import Error, NotFoundError, OperationalError


def without_path(text: str, path: Path) -> str:
    """The engine's message without the file's path, whose words ("lock", "sqlite") are not
    the engine's reason."""
    for spelling in sorted({str(path.resolve()), str(path)}, key=len, reverse=True):
        text = text.replace(spelling, "<database>")
    return text


SQLITE_HEADER = b"SQLite format 3\x00"
DUCKDB_MAGIC = (8, b"DUCK")  # where every DuckDB file says what it is: after an 8-byte checksum


def foreign_file(path: Path) -> bool:
    """Whether ``path`` is a file that is no DuckDB database by its first bytes (a policy
    YAML, a CSV or a SQLite file named by mistake), known without opening it: opening it took
    the lock first and left ``<file>.lock`` beside it. An empty file is left to
    DuckDB: a database another process is creating is empty for a moment (its first write is a
    whole header block)."""
    offset, magic = DUCKDB_MAGIC
    try:
        with open(path, "rb") as file:
            head = file.read(offset + len(magic))
    except OSError:  # absent, a folder, unreadable: the open says what it is
        return False
    return bool(head) and head[offset:] != magic


def open_failure(path: Path, text: str, wait: float) -> Error:
    """sqlsdc's error for a database file DuckDB would not open (``text``: the engine's last
    message, lower case, which is not shown: it is not sqlsdc's to word). A file that is not a
    DuckDB database (a text file, a SQLite database, an empty file) is a database not found
    at that path (:class:`NotFoundError`, the CLI's exit code 8): the remedy is the right
    path, as for a missing file. A lock held too long, no permission, a read-only file system
    or another DuckDB version are the engine's or the file system's (:class:`OperationalError`)."""
    if "not a valid duckdb database" in text or "sqlite" in text:
        data = _data_file(path)
        if data:  # microdata named where the database belongs: say how to load it
            table = re.sub(r"\W", "_", path.stem) or "data"
            return NotFoundError(
                f"{path} is a {data} file, not a database; load it into a DuckDB database "
                f"first (in DuckDB: CREATE TABLE {table} AS FROM '{path.name}'; README, \"Your "
                'own data") and name that database'
            )
        return NotFoundError(
            f"{path} {_what_file(path)}; name the database file made by `sqlsdc init` or "
            "`sqlsdc demo`"
        )
    if "lock" in text:
        why = (
            f"another process has held a lock on it for {wait:g} s (a guarded connection "
            "running statements, or an admin command); try again, or close that process"
        )
    elif "permission denied" in text or "read-only file system" in text:
        why = (
            "it cannot be written here (a read-only file system or no permission); "
            "choose another place or ask for write access"
        )
    elif "version" in text:
        why = "it was written by another DuckDB version than this one"
    elif "configuration" in text:
        return Error(f"cannot open database {path}: it is open in this process with other "
                     "settings")  # fmt: skip
    else:
        why = "the engine refused to open it"
    return OperationalError(f"cannot open database {path}: {why}", detail=text)


_DATA_SUFFIXES = {".csv": "CSV", ".tsv": "CSV", ".parquet": "Parquet", ".json": "JSON",
                  ".jsonl": "JSON", ".ndjson": "JSON", ".xlsx": "Excel"}  # fmt: skip


def _data_file(path: Path) -> str | None:
    """The kind of data file ``path`` is by its name (or a Parquet file by its first bytes),
    or None: a new user's ``sqlsdc init businesses.csv`` was told to name the database made
    by `sqlsdc init` (new user s38)."""
    try:
        with open(path, "rb") as file:
            if file.read(4) == b"PAR1":
                return "Parquet"
    except OSError:
        return None
    return _DATA_SUFFIXES.get(path.suffix.lower())


def _what_file(path: Path) -> str:
    """What a file that DuckDB does not open is, in words, from its first bytes."""
    try:
        with open(path, "rb") as file:
            head = file.read(len(SQLITE_HEADER))
    except OSError:
        head = b"?"
    if not head:
        return "is an empty file, not a DuckDB database"
    if head == SQLITE_HEADER:
        return "is a SQLite database, not a DuckDB one (sqlsdc works on DuckDB files)"
    return "is not a DuckDB database file"
