"""Record keys: a secret uniform integer in [0, 2^32) per unit of every confidential table.

The cell key method (Geyer et al. 2022, digest ``seed_2022_part1.md`` §6) derives a cell's noise
from ``SUM(__rkey) % 2^32`` over its units; integer keys make that sum exact and the same on
every engine. Keys come from the operating system's CSPRNG (``os.urandom``), are written once and
are never visible to users (``__`` columns are hidden by the guard).

All rows of one unit share its key and no two units of a table share one, so ``SUM(DISTINCT
__rkey)`` over any set of rows is the sum over its distinct units: the same cell key whether a
query counts rows of a one-row-per-unit table or distinct units through a join.
"""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa

from sqlsdc.engines.duckdb import one

RKEY = "__rkey"


def materialise_record_keys(con, table: str, unit: str) -> int:
    """Add ``__rkey`` to ``table`` if missing and key every row that has none.

    Rows of a unit that already has a key get that key; new units get fresh keys distinct from
    every key in use. Returns the number of rows keyed. Existing keys never change (re-keying is
    the separate, recorded :func:`rekey`), so running this after new rows arrive is safe.
    """
    columns = {r[0].lower() for r in con.execute(f'DESCRIBE "{table}"').fetchall()}
    if RKEY not in columns:
        con.execute(f'ALTER TABLE "{table}" ADD COLUMN {RKEY} UINTEGER')
    (missing,) = one(con, f'SELECT count(*) FROM "{table}" WHERE {RKEY} IS NULL')
    if missing == 0:
        return 0
    con.execute(
        f"""UPDATE "{table}" SET {RKEY} = known.k
        FROM (SELECT "{unit}" AS u, min({RKEY}) AS k FROM "{table}"
              WHERE {RKEY} IS NOT NULL GROUP BY "{unit}") AS known
        WHERE "{table}".{RKEY} IS NULL AND "{table}"."{unit}" = known.u"""
    )
    units = con.sql(
        f'SELECT DISTINCT "{unit}" AS u FROM "{table}" WHERE {RKEY} IS NULL'
    ).to_arrow_table()
    if units.num_rows:
        used = con.execute(
            f'SELECT DISTINCT {RKEY} FROM "{table}" WHERE {RKEY} IS NOT NULL'
        ).fetchnumpy()[RKEY]
        fresh = units.append_column("k", pa.array(fresh_keys(units.num_rows, used)))
        con.register("__sqlsdc_new_keys", fresh)
        try:
            con.execute(
                f"""UPDATE "{table}" SET {RKEY} = n.k FROM __sqlsdc_new_keys AS n
                WHERE "{table}".{RKEY} IS NULL AND "{table}"."{unit}" = n.u"""
            )
        finally:
            con.unregister("__sqlsdc_new_keys")
    return missing


def fresh_keys(count: int, used: np.ndarray) -> np.ndarray:
    """``count`` distinct uniform keys in [0, 2^32), none of them in ``used``, in random order."""
    used = np.asarray(used, dtype=np.uint32)
    keys = np.empty(0, dtype=np.uint32)
    while len(keys) < count:
        draw = np.frombuffer(os.urandom(4 * (count - len(keys))), dtype=np.uint32)
        keys = np.sort(np.concatenate([keys, draw]))  # shuffled below
        keys = keys[np.concatenate([[True], keys[1:] != keys[:-1]])]  # distinct
        keys = keys[~np.isin(keys, used)]
    order = np.frombuffer(os.urandom(8 * len(keys)), dtype=np.uint64).argsort()
    return keys[order][:count]


def rekey(con, table: str, unit: str) -> int:
    """Give every unit of ``table`` a new key: all CKM noise on the table changes."""
    con.execute(f'UPDATE "{table}" SET {RKEY} = NULL')
    return materialise_record_keys(con, table, unit)
