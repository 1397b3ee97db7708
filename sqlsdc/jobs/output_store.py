"""A job's output table written all or nothing, together with what records it.

Every job that stores records or cells (:meth:`sqlsdc.jobs.job.Job.store`,
:func:`sqlsdc.jobs.anonymize.store_file`, which synthesis uses too) writes
``protected.<into>`` in one transaction with its ``sqlsdc.outputs`` record, its ledger rows
and its ``accepted`` audit entry: :func:`storing_output` opens that transaction, writes the
table (keeping a replaced file's records first when the differencing check needs them,
:func:`~sqlsdc.jobs.output_history.keep_records`), lets the job add the rest, and commits, or
rolls everything back when anything fails, so a failed job leaves no table and no ledger rows.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import pandas as pd
from sqlglot import exp

from sqlsdc.catalog import store
from sqlsdc.engines import duckdb as engine
from sqlsdc.jobs.output_history import keep_records
from sqlsdc.jobs.session import OUTPUT_SCHEMA


@contextmanager
def storing_output(con, into: str, frame: pd.DataFrame, dates: Sequence[str] = ()) -> Iterator[str]:
    """Write ``frame`` as ``protected.<into>`` inside a transaction that the ``with`` block
    completes (its record, ledger rows, audit entry) and that commits when the block ends;
    yields the table's quoted name. Any failure rolls the whole transaction back.

    ``dates`` names the columns that were DATE in the source: pandas holds them as
    timestamps, and a file of records stored its source's dates as TIMESTAMP columns (an
    anonymised file's untouched ``founded`` too; new user s48e); they are stored as DATE."""
    name = exp.to_identifier(into).sql("duckdb")
    select = _restoring_dates(frame, dates)
    con.register("__job_output", frame)
    con.execute("BEGIN TRANSACTION")
    try:
        store.ensure_catalog(con)  # catalogs made before jobs were recorded
        con.execute(f"CREATE SCHEMA IF NOT EXISTS {OUTPUT_SCHEMA}")
        keep_records(con, into)  # a replaced file's, when the check needs them
        con.execute(f"CREATE OR REPLACE TABLE {OUTPUT_SCHEMA}.{name} AS {select}")
        yield name
        con.execute("COMMIT")
    except BaseException:
        engine.rollback(con)
        raise
    finally:
        con.unregister("__job_output")


def _restoring_dates(frame: pd.DataFrame, dates: Sequence[str]) -> str:
    """The ``SELECT`` of the stored table: ``__job_output`` with its timestamp columns named in
    ``dates`` cast back to DATE (a value drawn between midnights is cut to its day)."""
    casts = [
        f"CAST({q} AS DATE) AS {q}"
        for column in frame.columns
        if column in dates and pd.api.types.is_datetime64_any_dtype(frame[column])
        for q in [exp.to_identifier(str(column), quoted=True).sql("duckdb")]
    ]
    replace = f" REPLACE ({', '.join(casts)})" if casts else ""
    return f"SELECT *{replace} FROM __job_output"


def date_columns(con, sql: str) -> list[str]:
    """The columns of ``sql``'s result that are DATE (bound, not run)."""
    relation = con.sql(sql)
    return [c for c, t in zip(relation.columns, relation.types, strict=True) if str(t) == "DATE"]
