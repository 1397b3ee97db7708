"""Record keys: a secret uniform integer in [0, 2^32) per row of every confidential table.

The cell-key method (Geyer et al. 2022, digest ``seed_2022_part1.md`` §6) derives a cell's noise
from ``SUM(__rkey) % 2^32`` over its records; integer keys make that sum exact and the same on
every engine. Keys come from the operating system's CSPRNG (``os.urandom``), are written once and
are never visible to users (``__`` columns are hidden by the guard).
"""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa

from sqlsdc.engines.duckdb import one

RKEY = "__rkey"


def materialise_record_keys(con, table: str) -> int:
    """Add ``__rkey`` to ``table`` if missing and give every row without a key a fresh one.

    Returns the number of rows that received a key. Existing keys are never changed (re-keying
    is a separate, audited operation), so running this again after new rows arrive is safe.
    """
    columns = {r[0].lower() for r in con.execute(f'DESCRIBE "{table}"').fetchall()}
    if RKEY not in columns:
        con.execute(f'ALTER TABLE "{table}" ADD COLUMN {RKEY} UINTEGER')
    (missing,) = one(con, f'SELECT count(*) FROM "{table}" WHERE {RKEY} IS NULL')
    if missing == 0:
        return 0
    keys = np.frombuffer(os.urandom(4 * missing), dtype=np.uint32)
    batch = pa.table({"rn": np.arange(1, missing + 1, dtype=np.int64), "k": keys})
    con.register("__sqlsdc_new_keys", batch)
    try:
        con.execute(
            f"""UPDATE "{table}" SET {RKEY} = fresh.k
            FROM (SELECT r.rid, n.k FROM
                    (SELECT rowid AS rid, row_number() OVER (ORDER BY rowid) AS rn
                     FROM "{table}" WHERE {RKEY} IS NULL) AS r
                  JOIN __sqlsdc_new_keys AS n ON r.rn = n.rn) AS fresh
            WHERE "{table}".rowid = fresh.rid"""
        )
    finally:
        con.unregister("__sqlsdc_new_keys")
    return missing
