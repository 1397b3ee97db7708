"""The budget tables in the catalog: whether they exist in their current layout, creating
them in a catalog that predates them, and the counter of writes that every charge and every
administrator's event bumps.

Every charge, cache look-up and listing of :mod:`sqlsdc.catalog.budget`,
:mod:`sqlsdc.catalog.dp_cache` and :mod:`sqlsdc.catalog.budget_admin` asks first whether the
tables are there (a catalog written before budgets existed has none, a read-only connection to
one from before delta was accounted cannot bring it up to date): asked once per connection.
"""

from __future__ import annotations

import weakref

from sqlsdc.catalog.schema import CATALOG_SCHEMA
from sqlsdc.catalog.store import ensure_catalog
from sqlsdc.engines.duckdb import EngineError, one, parsed, rollback
from sqlsdc.engines.duckdb_schema import described

S = CATALOG_SCHEMA
SPEND_COLUMNS = ("seq", "query_id", "charged_at", "user_name", "tables", "epsilon", "rho",
                 "delta", "cells", "policy_version")  # fmt: skip
"""The columns of ``budget_spend``, the ledger, in order."""

_WITH_BUDGET_TABLES: weakref.WeakSet = weakref.WeakSet()


def has_budget_tables(con, *, in_transaction: bool = True) -> bool:
    """Whether the catalog has the budget tables in their current layout (``dp_cells`` keyed by
    ``entry``, a ``delta`` column in the ledger and the events); remembered per connection once
    true (the tables are never dropped), since every charge and cache look-up asks.
    ``in_transaction`` False: the tables are described one by one (1-2 ms) instead of listing
    the engine's columns (~12 ms on a newly opened database), which only a statement outside a
    transaction may do (:func:`~sqlsdc.engines.duckdb_schema.described`)."""
    if con in _WITH_BUDGET_TABLES:
        return True
    if in_transaction:
        (found,) = one(
            con,
            "SELECT count(*) FROM duckdb_columns() WHERE database_name = current_database() "
            "AND schema_name = ? AND ((table_name = 'dp_cells' AND column_name = 'entry') OR "
            "(table_name IN ('budget_spend', 'budget_events') AND column_name = 'delta'))",
            [S],
        )
        current = found == 3
    else:
        tables = described(con, ["dp_cells", "budget_spend", "budget_events"], S)
        columns = {table: {c for c, _type, _key in rows} for table, rows in tables.items()}
        current = "entry" in columns.get("dp_cells", ()) and all(
            "delta" in columns.get(table, ()) for table in ("budget_spend", "budget_events")
        )
    if current:
        _WITH_BUDGET_TABLES.add(con)
    return current


def remember_budget_tables(con) -> None:
    """Note that ``con``'s catalog has the budget tables in their current layout: an earlier
    opening of the same file found or made them (:func:`ensure_budget_catalog`), and they are
    never dropped. (Were the file replaced by one of an older layout, a charge's statements
    fail, and the query with them.)"""
    _WITH_BUDGET_TABLES.add(con)


def delta_of(con) -> str | None:
    """How the ledger's and events' delta is read: ``"delta"``; ``"'0'"`` in a catalog from
    before delta was accounted (a read-only connection cannot bring it up to date, and its rows
    spent no delta); None if the catalog has no budget tables at all."""
    if has_budget_tables(con):
        return "delta"
    (tables, deltas) = one(
        con,
        "SELECT count(DISTINCT table_name), count(*) FILTER (column_name = 'delta') "
        "FROM duckdb_columns() WHERE database_name = current_database() AND schema_name = ? "
        "AND table_name IN ('budget_spend', 'budget_events')",
        [S],
    )
    if tables < 2:
        return None
    return "delta" if deltas == 2 else "'0'"


def ensure_budget_catalog(con) -> None:
    """Create the budget tables if this catalog predates them (needs a writable connection;
    called outside a transaction)."""
    if not has_budget_tables(con, in_transaction=False):
        try:
            con.execute("BEGIN TRANSACTION")
            try:
                ensure_catalog(con)
                con.execute("COMMIT")
            except BaseException:
                rollback(con)
                raise
        except EngineError:  # another connection created them at the same moment
            if not has_budget_tables(con, in_transaction=False):
                raise


def bump(con) -> int:
    """Count one write of the budget tables on ``budget_lock``'s row; the new count. The first
    write creates the row; two first writes conflict on its key."""
    bumped = con.execute(parsed(BUMP)).fetchall()
    if bumped:
        return bumped[0][0]
    con.execute(f"INSERT INTO {S}.budget_lock VALUES (1, 1)")
    return 1


BUMP = f"UPDATE {S}.budget_lock SET charges = charges + 1 WHERE id = 1 RETURNING charges"
"""The statement of :func:`bump` (also the first part of a charge made in one statement)."""
