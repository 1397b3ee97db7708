"""A CTA or IPF job stored with ``--replace`` keeps each sensitive cell on the side of its
original that the version it replaces published it on.

Readers keep the version a replacement overwrites (a release database, an analyst's copy).
CTA and IPF's safe values publish a sensitive cell at its original plus or minus its protection
level enlarged by a secret factor, and that factor is keyed by the job's name and SQL
(:func:`sqlsdc.jobs.adjust._secret_levels`): a job run again after new data draws the same
factor for a cell whose contributions did not change. Which way the cell moves is not keyed:
the fixed-direction LP alternates down, up, … over the sensitive cells by decreasing value,
so one cell that becomes or stops being sensitive turns every smaller one round, and IPF moves
a cell the way a plain raking to the new margins does. The two versions then hold
``x − f·L`` and ``x + f·L``, and their mean is the original ``x`` (red team s40d: one
enterprise's turnover revised, then the demo's nace x region CTA replaced, gave 38 of the 39
cells that turned round exactly). So a replacement moves each sensitive cell the way the
replaced version did (:func:`sides`, :func:`directions`), and a result that still crosses
one (the free-direction MILP takes no directions; a bound that leaves no room) is refused
(:func:`refuse_crossed`).

Only the version being replaced is read: the catalog keeps no values of earlier ones. Each
replacement keeps its predecessor's sides, so the versions agree as long as a cell stays
sensitive; a cell that is sensitive, then not (other rules), then sensitive again is not
held to its first side.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from sqlsdc.errors import TabularError
from sqlsdc.jobs.session import OUTPUT_SCHEMA
from sqlsdc.tabular.model import Table

_FLAGS = ("lower_bound", "upper_bound")  # CTA's intervals, stored beside the value


def sides(job, table: Table, sensitive: np.ndarray) -> np.ndarray:
    """Per cell of ``table``: +1 where the output ``job`` replaces published a sensitive cell
    above its original (as it is now), −1 below, 0 elsewhere (not sensitive, published at the
    original, no such output, or one of other dimensions). A cell the output leaves out was
    published as 0 (readers read it so)."""
    found = np.zeros(table.values.size)
    earlier = _replaced_values(job, table)
    if earlier is None:
        return found
    found[sensitive] = np.sign(earlier - table.values)[sensitive]
    return found


def directions(table: Table, sensitive: np.ndarray, kept: np.ndarray) -> np.ndarray:
    """The LP's fixed directions: the sides ``kept`` where they are set, elsewhere the CTA's
    default rule (:func:`~sqlsdc.tabular.cta.choose_directions`, ``alternate``: by decreasing
    value, down, up, …)."""
    values = table.values
    s = np.flatnonzero(sensitive)
    order = s[np.lexsort((s, -values[s]))]
    found = np.zeros(values.size)
    found[order] = np.where(np.arange(order.size) % 2 == 0, -1.0, 1.0)
    return np.where(kept != 0, kept, found)


def refuse_crossed(table: Table, published: np.ndarray, kept: np.ndarray, method: str) -> None:
    """Refuse a result that publishes a sensitive cell on the other side of its original from
    the version it replaces: the mean of the two versions would be the original."""
    now = np.sign(np.asarray(published, dtype=np.float64) - table.values)
    crossed = (kept != 0) & (now != 0) & (now != kept)
    if not crossed.any():
        return
    cells = table.cells.loc[crossed, list(table.dims)].astype(str).head(3).to_dict("records")
    raise TabularError(
        f"{int(crossed.sum())} sensitive cell(s) would be published on the other side of its "
        f"original from the version this job replaces, e.g. {cells}; readers keep that "
        "version, and the mean of a cell moved up in one and down in the other by the same "
        f"secret level is its original. Nothing was stored; {method}"
    )


def _replaced_values(job, table: Table) -> np.ndarray | None:
    """The values the output ``job`` replaces published, in ``table``'s cell order, or None."""
    con = job.con
    known = con.execute(
        "SELECT 1 FROM sqlsdc.outputs WHERE name = ? AND method = ?", [job.name, job.method]
    ).fetchall()
    if not known:
        return None
    frame = con.sql(f'SELECT * FROM {OUTPUT_SCHEMA}."{job.into}"').df()
    dims = list(table.dims)
    if set(frame.columns) - {"value", *_FLAGS} != set(dims):
        return None  # other dimensions: no cell of the two tables is matched here
    cells = table.cells[dims].astype(str).reset_index(drop=True)
    theirs = frame[dims].astype(str).assign(value=frame["value"].astype(np.float64))
    merged = cells.merge(theirs, on=dims, how="left", validate="one_to_one")
    return pd.to_numeric(merged["value"]).fillna(0.0).to_numpy(np.float64)
