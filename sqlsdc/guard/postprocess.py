"""Post-process step: split a protected result into values and per-cell status, record it.

Works on the engine's Arrow result with vectorised compute; nothing here loops over rows.
"""

from __future__ import annotations

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from sqlsdc.catalog import store
from sqlsdc.guard.pipeline import ProtectedQuery
from sqlsdc.rewrite.threshold import MECHANISM, PUBLISHED, SUPPRESSED

RELEASED = (MECHANISM, "derived")


def values_of(result: pa.Table, query: ProtectedQuery) -> pa.Table:
    """The user-visible columns (the hidden status columns follow them)."""
    return result.select(list(range(len(query.columns))))


def cell_status(result: pa.Table, query: ProtectedQuery) -> pd.DataFrame:
    """Status of every result cell, as a DataFrame shaped like the result.

    ``published``/``suppressed`` for protected aggregates and values derived from them (a
    derived NULL is suppressed), ``key`` for group keys, ``public`` for public values.
    """
    columns = []
    for i, column in enumerate(query.columns):
        if i in query.status_columns:
            status = pc.fill_null(result.column(query.status_columns[i]), "key")
        elif column.mechanism in RELEASED:
            status = pc.if_else(pc.is_null(result.column(i)), SUPPRESSED, PUBLISHED)
        else:
            status = pa.array([column.mechanism] * result.num_rows, pa.string())
        columns.append(status)
    frame = pa.table(columns, names=[f"c{i}" for i in range(len(columns))]).to_pandas()
    frame.columns = [c.name for c in query.columns]
    return frame


def record_release(con, result: pa.Table, query: ProtectedQuery, query_id: int, user: str) -> None:
    """Write one ledger row per released protected cell (identity: the row's key values)."""
    keys = tuple((c.name, i) for i, c in enumerate(query.columns) if c.mechanism not in RELEASED)
    status_positions = {i: result.column_names.index(c) for i, c in query.status_columns.items()}
    cells = tuple(
        (c.name, i, c.mechanism, status_positions.get(i))
        for i, c in enumerate(query.columns)
        if c.mechanism in RELEASED
    )
    if not cells:
        return
    statement = store.ledger_insert(query.tables, keys, cells)
    store.record_release(
        con, result, statement, query_id=query_id, user=user, fingerprint=query.fingerprint
    )
