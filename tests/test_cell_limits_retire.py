"""``cell_limits.retire_cells`` (``sqlsdc rekey``) renames a table's allowance entries in the
database, set-based: the review of s50d found every allowance row of the table fetched into
Python and inserted back from lists (a slow rekey, and a table's whole history in memory)."""

from __future__ import annotations

import duckdb
import pytest

from sqlsdc.catalog import cell_limits
from sqlsdc.catalog.schema import CATALOG_SCHEMA, CELL_ALLOWANCE_DDL

SALT = bytes(range(16))
ROWS = 5000


class _Counting:
    """A DuckDB connection that counts the rows its results hand to Python."""

    def __init__(self, con):
        self.con, self.fetched = con, 0

    def execute(self, *args):
        self.con.execute(*args)
        return self

    def fetchone(self):
        row = self.con.fetchone()
        self.fetched += row is not None
        return row

    def fetchall(self):
        rows = self.con.fetchall()
        self.fetched += len(rows)
        return rows


@pytest.fixture
def catalog():
    con = duckdb.connect()
    con.execute(f"CREATE SCHEMA {CATALOG_SCHEMA}")
    con.execute(CELL_ALLOWANCE_DDL)
    con.execute(  # a tenth of the rows: periods ended (cells 0, no hash)
        f"INSERT INTO {CATALOG_SCHEMA}.cell_allowance SELECT 'e' || i, 'u' || i % 3, "
        "CASE WHEN i % 4 THEN 'persons' ELSE 'benefits' END, "
        "CASE WHEN i % 10 THEN 'h' || i END, CASE WHEN i % 10 THEN 1 ELSE 0 END, "
        "TIMESTAMP '2026-11-29 10:00:00.123456', i // 7 FROM range($1) r(i)",
        [ROWS],
    )
    yield con
    con.close()


def test_retiring_renames_a_tables_cells_in_the_database(catalog, monkeypatch):
    """Fails on int50: the 3,375 renamed rows of persons came through Python (fetched: 3,375,
    now 2, the counts of the INSERT and the DELETE). The result is the same: each cell row of
    persons renamed with the salt (entry and hash), every other row as it was."""
    monkeypatch.setattr(cell_limits.os, "urandom", lambda n: SALT[:n])
    before = catalog.execute(f"SELECT * FROM {CATALOG_SCHEMA}.cell_allowance").fetchall()
    sep, salt = chr(31), SALT.hex()
    expected = catalog.execute(
        f"SELECT CASE WHEN table_name = 'persons' AND cell_hash IS NOT NULL "
        f"THEN sha256(entry || '{sep}' || $1) ELSE entry END, user_name, table_name, "
        f"CASE WHEN table_name = 'persons' THEN sha256(cell_hash || '{sep}' || $1) "
        f"ELSE cell_hash END, cells, released_at, query_id "
        f"FROM {CATALOG_SCHEMA}.cell_allowance ORDER BY ALL",
        [salt],
    ).fetchall()
    counting = _Counting(catalog)
    catalog.execute("BEGIN TRANSACTION")
    retired = cell_limits.retire_cells(counting, "Persons")
    catalog.execute("COMMIT")
    after = catalog.execute(
        f"SELECT * FROM {CATALOG_SCHEMA}.cell_allowance ORDER BY ALL"
    ).fetchall()
    renamed = sum(1 for r in before if r[2] == "persons" and r[3] is not None)
    assert retired == renamed == 3500
    assert after == expected and len(after) == ROWS
    assert counting.fetched <= 2


def test_retiring_a_table_without_cells_changes_nothing(catalog):
    before = catalog.execute(f"SELECT * FROM {CATALOG_SCHEMA}.cell_allowance ORDER BY ALL")
    before = before.fetchall()
    assert cell_limits.retire_cells(catalog, "regions") == 0
    after = catalog.execute(f"SELECT * FROM {CATALOG_SCHEMA}.cell_allowance ORDER BY ALL")
    assert after.fetchall() == before
