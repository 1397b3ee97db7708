"""The cache of DP cells already released: every noisy value a user was given, and every
statistic a user has paid for, per (user, policy version, cell hash) in ``dp_cells``.

Consistent noise: a cell asked again gets the value it was given, and costs nothing. A
*statistic* is the identity of one statistic over all cells of a canonical population, value 0
(:func:`sqlsdc.mechanisms.dp_cells.statistic_identity`). The guard charges a query's
statistics that were not paid before *before* it computes any exact cell
(:func:`sqlsdc.catalog.budget.charge`), so a query that then fails or times out has paid; the
cells drawn afterwards are cached with :func:`cache_cells`, in the transaction that records
the query's answer, and the statistics with them: a statistic is cached, and so paid for a
later asking, only once its cells are. A query stopped between its charge and that caching
leaves no statistic here, and the next asking pays again (never a free computation of the
same exact cells, red team s41b). :func:`cached_cells` looks both up.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from contextlib import contextmanager
from fractions import Fraction
from typing import TYPE_CHECKING

import pyarrow as pa

from sqlsdc.catalog.budget_tables import S, has_budget_tables
from sqlsdc.catalog.store import dp_cell_entry, now
from sqlsdc.engines.duckdb import EngineError, one, parsed
from sqlsdc.mechanisms.dp_cells import CellRecord

if TYPE_CHECKING:
    from sqlsdc.catalog.budget import Charge


def insert_cells(
    con,
    user,
    policy_version,
    query_id,
    at,
    cells: list[CellRecord],
    *,
    skip_cached: bool,
    returning: bool = False,
    spend: list | None = None,
) -> list[tuple]:
    """Cache the new cells. A concurrent query of the same user may have cached some of them
    since they were looked up (with the same values: the noise is a function of the cell);
    the retry after that key conflict (``skip_cached``) leaves those out. With ``returning``
    cells cached before are skipped, and the entries inserted are returned. ``spend``
    (``[cells, seq]``, not with ``returning``): the ledger row ``seq``'s cell count is set in
    the same statement (one statement fewer in the transaction that records an answer)."""
    if spend is not None and returning:
        raise ValueError("a cell count is set with cells inserted, not with returned entries")
    if skip_cached:
        have = cached_cells(con, user, policy_version, [c.identity.digest for c in cells])
        cells = [c for c in cells if c.identity.digest not in have]
    digests = [c.identity.digest for c in cells]
    columns = [[dp_cell_entry(user, policy_version, d) for d in digests], digests,
               [c.identity.text for c in cells], [c.column for c in cells],
               [c.statistic.value for c in cells], [str(c.value) for c in cells]]  # fmt: skip
    if len(cells) == 1:  # a charge's one statistic: a row of values, no unnest (0.2 ms less)
        insert = _INSERT_CELL_RETURNING if returning else _INSERT_CELL
        entry, *rest = (column[0] for column in columns)
        params = [entry, user, policy_version, *rest, query_id, at]
        result = con.execute(*_with_spend(insert, params, spend))
        return result.fetchall() if returning else []
    if len(cells) <= _LISTED_ENTRIES:
        insert = _INSERT_CELLS_RETURNING if returning else _INSERT_CELLS
        entry, *rest = columns
        params = [entry, user, policy_version, *rest, query_id, at]
        result = con.execute(*_with_spend(insert, params, spend))
        return result.fetchall() if returning else []
    names = ("entry", "cell_hash", "cell", "column_name", "statistic", "value")
    table = pa.table([pa.array(c, type) for c, type in zip(columns, _CELL_TYPES, strict=True)],
                     names=names)  # fmt: skip
    insert = _INSERT_VIEW_RETURNING if returning else _INSERT_VIEW
    with _registered(con, _CELLS_VIEW, table):
        result = con.execute(*_with_spend(insert, [user, policy_version, query_id, at], spend))
        return result.fetchall() if returning else []


def _with_spend(insert: str, params: list, spend: list | None) -> tuple:
    """The parsed statement and parameters of ``insert``, followed in the same statement by the
    ledger row's cell count (``spend``) when given: DuckDB runs a data-modifying CTE once,
    read or not, and the two writes succeed or fail together."""
    if spend is None:
        return parsed(insert), params
    return parsed(f"WITH cached AS ({insert}) {_SPEND_CELLS}"), [*params, *spend]


_CELL_VALUES = (
    "SELECT unnest(?::BLOB[]), ?, ?, unnest(?), unnest(?), unnest(?), unnest(?), unnest(?), ?, ?"
)
_INSERT_CELLS = f"INSERT INTO {S}.dp_cells {_CELL_VALUES}"
_INSERT_CELLS_RETURNING = f"INSERT OR IGNORE INTO {S}.dp_cells {_CELL_VALUES} RETURNING entry"
_CELL_ROW = "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"  # the same columns, one row
_INSERT_CELL = f"INSERT INTO {S}.dp_cells {_CELL_ROW}"
_INSERT_CELL_RETURNING = f"INSERT OR IGNORE INTO {S}.dp_cells {_CELL_ROW} RETURNING entry"

# More than _LISTED_ENTRIES cells go to the cache as a registered Arrow table: binding a list
# parameter converts it value by value (58 ms for 9,456 cells, 21 ms from Arrow; the same rows)
_CELLS_VIEW = "__sqlsdc_cached_cells"
_CELL_TYPES = (pa.binary(), pa.string(), pa.string(), pa.string(), pa.string(), pa.string())
_VIEW_VALUES = (
    f"SELECT entry, ?, ?, cell_hash, cell, column_name, statistic, value, ?, ? FROM {_CELLS_VIEW}"
)
_INSERT_VIEW = f"INSERT INTO {S}.dp_cells {_VIEW_VALUES}"
_INSERT_VIEW_RETURNING = f"INSERT OR IGNORE INTO {S}.dp_cells {_VIEW_VALUES} RETURNING entry"
_WANTED_VIEW = "__sqlsdc_wanted_cells"


@contextmanager
def _registered(con, name: str, table: pa.Table):
    """``table`` registered on ``con`` as ``name`` while the block runs. A statement that
    fails inside a transaction aborts it, and DuckDB then refuses the unregistration too: the
    statement's own error is the one raised (the next registration of ``name`` replaces the
    table, and closing the connection drops it)."""
    con.register(name, table)
    try:
        yield
    finally:
        with contextlib.suppress(EngineError):
            con.unregister(name)


def cache_cells(
    con,
    *,
    user: str,
    policy_version: int,
    query_id: int,
    cells: Iterable[CellRecord],
    paid_by: Charge | None = None,
    again: bool = False,
    releases: Iterable[tuple[str, str]] = (),
    statistics: Iterable[CellRecord] = (),
) -> None:
    """Cache the cells a query drew after its statistics were charged (nothing is spent here:
    the statistics are paid); ``paid_by``'s ledger row then counts them. ``releases``:
    (digest, keys) of the groups private selections released
    (:func:`sqlsdc.guard.dp_reuse.release_digest`), read back by :func:`released_groups`.
    ``statistics``: those the query's charge paid for (value 0), cached with the cells, from
    when on they count as paid (not counted on the ledger row).

    Runs inside the caller's transaction, the one that records the query's audit entry, so
    that the cells, the answer's record and the answer go together. The cells are those the
    query did not find cached; one cached meanwhile by a concurrent query of the same user
    makes the transaction conflict (:func:`sqlsdc.catalog.budget.is_conflict`), and the caller
    runs it ``again``: cells cached by then are left as they are (the values are equal: the
    noise is a function of the cell; INSERT OR IGNORE, 1 ms dearer than the first attempt's
    plain INSERT). On the first attempt the count is known, and the ledger row's is set in the
    statement that caches the cells; ``again``, it is counted from what was inserted."""
    cells = list({c.identity.digest: c for c in cells}.values())
    statistics = list({c.identity.digest: c for c in statistics}.values())
    inserted, counted = 0, False
    if cells or statistics:  # one statement for both, and for the count when it is known
        spend = None
        if paid_by is not None and not again:
            spend, counted = [len(cells), paid_by.seq], True
        entries = insert_cells(con, user, policy_version, query_id, now(), cells + statistics,
                               skip_cached=False, returning=again, spend=spend)  # fmt: skip
        inserted = len(cells)
        if again:  # those cached by then were left as they are
            kept = {bytes(entry) for (entry,) in entries}
            inserted = sum(dp_cell_entry(user, policy_version, c.identity.digest) in kept
                           for c in cells)  # fmt: skip
    if paid_by is not None and not counted:
        con.execute(parsed(_SPEND_CELLS), [inserted, paid_by.seq])
    for digest, keys in releases:
        entry = dp_cell_entry(user, policy_version, digest)
        con.execute(parsed(_INSERT_RELEASE),
                    [entry, user, policy_version, digest, keys, query_id, now()])  # fmt: skip


_SPEND_CELLS = f"UPDATE {S}.budget_spend SET cells = ? WHERE seq = ?"
_INSERT_RELEASE = (
    f"INSERT OR IGNORE INTO {S}.dp_cells VALUES (?, ?, ?, ?, ?, 'released groups', 'release', "
    "'0', ?, ?)"
)


def released_groups(con, user: str, policy_version: int, digest: str) -> str | None:
    """The keys of the groups a private selection released to ``user`` under
    ``policy_version`` (:func:`cache_cells`' ``releases``), or None."""
    if not has_budget_tables(con):
        return None
    row = one(con, f"SELECT cell FROM {S}.dp_cells WHERE entry = ?",
              [dp_cell_entry(user, policy_version, digest)])  # fmt: skip
    return None if row is None else row[0]


def cached_cells(
    con, user: str, policy_version: int, digests: Iterable[str]
) -> dict[str, Fraction]:
    """Noisy values already released to ``user`` under ``policy_version``, by cell digest."""
    digests = list(dict.fromkeys(digests))
    if not digests or not has_budget_tables(con):
        return {}
    entries = [dp_cell_entry(user, policy_version, d) for d in digests]
    if len(entries) <= _LISTED_ENTRIES:  # a list of constants: a filter, no join over the cache
        listed = f"{_LOOK_UP} ({', '.join('?' * len(entries))})"
        rows = con.execute(parsed(listed), entries).fetchall()
    else:
        with _registered(con, _WANTED_VIEW, pa.table({"entry": pa.array(entries, pa.binary())})):
            rows = con.execute(parsed(_LOOK_UP_VIEW)).fetchall()
    return {h: _value(v) for h, v in rows}


def _value(text: str) -> Fraction:
    """``Fraction(text)`` of a cached value, which :func:`insert_cells` wrote as
    ``str(Fraction)``: an integer's digits are read as an ``int``, four times faster than
    the general parse (a repeated query of thousands of cells reads thousands)."""
    if text.isdecimal() or (text[:1] == "-" and text[1:].isdecimal()):
        return Fraction(int(text))
    return Fraction(text)


_LISTED_ENTRIES = 256
"""Up to this many cells, :func:`cached_cells` lists the keys as constants, which DuckDB
filters the cache with (about 1 ms at 300,000 cached cells, against 3.4 ms for the semi-join
that larger look-ups use), and :func:`insert_cells` sends them as list parameters. More are
looked up and cached through a registered Arrow table: a list parameter is converted value
by value (a look-up of 9,456 cells: 28 against 13 ms)."""
_LOOK_UP = f"SELECT cell_hash, value FROM {S}.dp_cells WHERE entry IN"
_LOOK_UP_VIEW = f"{_LOOK_UP} (SELECT entry FROM {_WANTED_VIEW})"
