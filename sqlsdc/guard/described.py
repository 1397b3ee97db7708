"""The column types of a protected query's answer, from binding its SQL only: what a server
describes for a statement before its parameters are bound (asyncpg, pgjdbc's and psycopg's
prepared statements, Npgsql), so that numbers arrive as numbers.

Binding reads the catalog, never a row, and charges nothing. Where binding alone cannot give
the answer's types, there are none (the caller describes the columns as text): an answer
over DP cells (their noisy relations exist once charged), over a suppression pattern (made
when the query runs), or with a column that binding types NULL (a parameter bound as NULL,
whose value will have a type of its own).
"""

from __future__ import annotations

import pyarrow as pa

from sqlsdc.engines import duckdb as engine
from sqlsdc.guard.pipeline import ProtectedQuery
from sqlsdc.guard.postprocess import without_dictionaries


def answer_schema(con, query: ProtectedQuery) -> pa.Schema | None:
    """The Arrow schema of the visible columns of ``query``'s answer as the guard returns it
    (:func:`~sqlsdc.guard.postprocess.values_of`: no dictionary), or None (module doc)."""
    whole = described_result(con, query)
    if whole is None:
        return None
    visible = whole.select(list(range(len(query.columns))))
    return without_dictionaries(visible).schema


def described_result(con, query: ProtectedQuery) -> pa.Table | None:
    """The protected SQL's whole result with no row (its hidden status and accuracy columns
    included), of the types binding gives it, or None (module doc)."""
    if query.dp_stages or query.suppressed:
        return None
    try:
        schema = engine.result_schema(con, query.sql)
    except engine.EngineError:
        return None
    if any(pa.types.is_null(schema.field(i).type) for i in range(len(query.columns))):
        return None
    return schema.empty_table()
