"""What tests read back from a database file, each read on a read-only connection of its own:
the rows of a statement (:func:`read`), and the tables stored in the ``protected`` schema, where
jobs write their outputs (:func:`protected_tables`): a refused or failed job must store none.

A plain DuckDB connection, not sqlsdc's: it reads what is in the file whatever the catalog says.
DuckDB refuses it while this process holds the file with sqlsdc's settings, so tests read after
closing their own connections.
"""

from __future__ import annotations

from pathlib import Path

import duckdb


def read(path: str | Path, sql: str, params=None) -> list[tuple]:
    """The rows of ``sql`` (with ``params``) in the database file ``path``."""
    con = duckdb.connect(str(path), read_only=True)
    try:
        return con.execute(sql, list(params or ())).fetchall()
    finally:
        con.close()


def protected_tables(path: str | Path) -> list[str]:
    """The names of the tables stored in the ``protected`` schema of ``path``, in order."""
    sql = "SELECT table_name FROM duckdb_tables() WHERE schema_name = 'protected' ORDER BY 1"
    return [name for (name,) in read(path, sql)]
