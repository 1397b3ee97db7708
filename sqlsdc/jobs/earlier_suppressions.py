"""A suppression job kept consistent with the suppression outputs stored before it.

Suppression jobs of the same table, aggregate and rows may all be stored (other methods may
not: :func:`sqlsdc.jobs.refusals.refuse_job`), so each keeps what the others did: the cells
they suppressed stay suppressed, the cells they published stay published
(:func:`earlier_suppressions`), on every cell two tables share, and its pattern is audited
together with theirs (:func:`audit_with_earlier`, over
:func:`~sqlsdc.jobs.linked_audit.audit_linked`). A sum job's unit counts ``n`` are the cells
of a count job of the same rows, so the two keep each other's suppressions too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from sqlsdc.jobs.linked_audit import audit_linked
from sqlsdc.jobs.session import OUTPUT_SCHEMA
from sqlsdc.jobs.stored_tables import outputs_of_the_same_cells, same_rows, stored_outputs
from sqlsdc.jobs.tabulation import table_dims
from sqlsdc.tabular.model import TOTAL, Table

if TYPE_CHECKING:
    from sqlsdc.jobs.job import Job


def earlier_suppressions(
    job: Job, table: Table
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | tuple[None, None, None]:
    """The cells earlier suppression jobs suppressed, as primary and as secondary, and those
    they published with the value the cell has now, in ``table``'s cell order:
    ``protected.<into>`` itself (replaced) and every other suppression output of the same
    table, aggregate and rows (:func:`_same_cells`), on the cells the two tables share
    (:func:`_shared_status`: a table by nace x region x size_class holds the nace x region
    table as its size_class total). The job keeps the first suppressed and the last
    published, as the query path keeps its earlier pattern
    (:func:`sqlsdc.tabular.universe_pattern._carried_over`), so it publishes none of the cells they
    hid and hides none they published.

    Red team s30f: re-run after two enterprises were added to a hidden cell of 2, the job
    published it as 4, and with the row and column totals up by 2 the old release's 2 was
    read off; the new secondaries then pinned another primary of the old release exactly.
    Red team s32b: a second job of the same SQL under another name (``--method hitas`` next to
    ``gauss``) hid other secondaries; ``sqlsdc publish`` released both tables, and together
    they pinned eight primaries of the demo's nace x region counts exactly; a job by nace x
    region x size_class published a (nace, region) cell the nace x region job hid, and a
    count of 1 was pinned.

    Red team s36c: cells an earlier job published, the job hid as secondaries and audited as
    hidden; after the nace x region job, the nace x region x size_class job hid nine (nace,
    region) totals the first had published, and the two tables together pinned eleven of its
    primaries, (M, R01, micro) at exactly 1. The job now publishes them (``forced``, the query
    path's ``known`` cells), and a primary they already reveal is no primary of the job.
    """
    primary = secondary = shown = None
    counted = [(name, theirs, "n") for name, theirs in _counted_cells(job)]
    for name, theirs, column in [(n, t, "value") for n, t in _same_cells(job)] + counted:
        before = job.con.sql(f"SELECT * FROM {name}").df()
        if (
            "status" not in before.columns
            or column not in before.columns
            or not set(theirs) <= set(before.columns)
        ):
            continue
        mine = table.cells[list(table.dims)]
        status = _shared_status(mine, before, theirs)
        value = pd.to_numeric(_shared_status(mine, before, theirs, column), errors="coerce")
        if column == "n":  # a sum published with its n hidden (revision (n)): a hidden count
            status = status.where(~((status == "published") & value.isna()), "primary")
        # a sum job's counts tell a count job's cells; a count table's counts no sum's
        ours = table.values if job.spec.measure is None or column == "value" else np.nan
        same = np.isclose(value.to_numpy(np.float64), ours, rtol=1e-12, atol=0.0)
        found = (
            (status == "primary").to_numpy(),
            (status == "secondary").to_numpy(),
            (status == "published").to_numpy() & same,
        )
        if primary is None:
            primary, secondary, shown = found
        else:
            primary, secondary, shown = (a | b for a, b in zip((primary, secondary, shown), found,
                                                               strict=True))  # fmt: skip
    if primary is None:
        return None, None, None
    return primary, secondary & ~primary, shown & ~primary & ~secondary


def changed_published(job: Job, table: Table, column: str = "value") -> np.ndarray | None:
    """Per cell of ``table``, its value now less the value an earlier suppression output of
    the same cells published (NaN where none published it, 0 where unchanged), or None when
    there is no such output: the differences of a catalog that kept no units of them
    (:func:`sqlsdc.jobs.revisions.unknown_revisions`). ``column="n"``: a sum's unit counts
    (a published sum's NULL ``n`` is no published count)."""
    found = None
    mine = table.cells[list(table.dims)]
    now = table.values if column == "value" else table.n.astype(np.float64)
    for name, theirs in _same_cells(job):
        before = job.con.sql(f"SELECT * FROM {name}").df()
        if not {"status", column} <= set(before.columns) or not set(theirs) <= set(before.columns):
            continue
        shown = (_shared_status(mine, before, theirs) == "published").to_numpy()
        value = pd.to_numeric(_shared_status(mine, before, theirs, column), errors="coerce")
        difference = np.where(shown, now - value.to_numpy(np.float64), np.nan)
        if found is None:
            found = difference
        else:  # the largest change any of them shows
            found = np.where(np.isnan(found) | (np.abs(difference) > np.abs(found)), difference,
                             found)  # fmt: skip
    return found


def same_versions(job: Job, table: Table) -> list[tuple[str, pd.Series]]:
    """``(name, status)`` per cell of ``table`` of the stored suppression outputs of
    its cells and dimensions (the version ``--replace`` overwrites among them): the earlier
    versions :func:`sqlsdc.jobs.revision_audit.audit_revisions` reads with this one."""
    found = []
    mine = table.cells[list(table.dims)]
    for name, theirs in _same_cells(job):
        if sorted(theirs) != sorted(table.dims):
            continue
        before = job.con.sql(f"SELECT * FROM {name}").df()
        if not {"status", "value"} <= set(before.columns) or not set(theirs) <= set(before.columns):
            continue
        found.append((name, _shared_status(mine, before, theirs)))
    return found


def _counted_cells(job: Job) -> list[tuple[str, list[str]]]:
    """The stored suppression outputs of the job's table and rows that count its units with
    the other aggregate, with their dimension columns: a count job's beside a sum job's, whose
    ``n`` column publishes the same unit counts exactly. Red team s38b: after a count job of
    enterprises with 10 or more employees by nace x region (``freq:10``; R08's total of 9 a
    primary, R01's a secondary), a sum job of their turnover published R01's ``n``, 22, and
    the count table's published totals then gave R08's 9 exactly. A job keeps hidden what
    such an output hid, and a count job publishes the counts a sum job published. A sum job's
    row published with its ``n`` NULL (rule ``revision (n)``: its sum known, its count
    revised by too few units, :func:`sqlsdc.jobs.sum_counts.audit_counts`) is a hidden count."""
    own = job.spec
    found = []
    for name, method, theirs in stored_outputs(job.con, job.policy):
        if (
            method == "suppress"
            and theirs.table == own.table
            and (theirs.measure is None) != (own.measure is None)
            and name != f"{OUTPUT_SCHEMA}.{job.into}"
            and same_rows(job.con, own.table, theirs.where, own.where)
        ):
            found.append((name, table_dims(theirs, job.policy)))
    return found


def audit_with_earlier(job: Job, table: Table, result, found, known, time_limit) -> None:
    """The job's pattern audited together with the suppression outputs of the same rows it
    shares cells with (:func:`~sqlsdc.jobs.linked_audit.audit_linked`; red team s36c). An
    output of the job's own dimensions is left out: each of its cells is one of the job's,
    kept suppressed or published by :func:`earlier_suppressions`, so the job's own audit
    reads it already."""
    earlier = []
    for name, theirs in _same_cells(job):
        if list(theirs) == list(table.dims):
            continue
        before = job.con.sql(f"SELECT * FROM {name}").df()
        if "status" in before.columns and "value" in before.columns:
            earlier.append((name, before))
    if not earlier:
        return
    columns = job.policy.table(job.spec.table).columns
    levels = {c: (c,) for c in columns}
    levels.update({h: tuple(lv) for h, lv in job.policy.table(job.spec.table).hierarchies.items()})
    values = table.values
    lower = np.zeros_like(values) if bool((values >= 0).all()) else np.full_like(values, -np.inf)
    upper = None
    if known is not None:  # a count's known lower bounds; a sum's measure bounds (s44o, s44q)
        lower = known[0]
        upper = None if np.isscalar(known[1]) else known[1]
    audit_linked(job.con, job.spec, levels,
                 table.cells[list(table.dims)].astype(str).reset_index(drop=True), earlier,
                 values=values, suppressed=result["status"].to_numpy() != "published",
                 primary=found.primary, upl=found.upl, lpl=found.lpl, lower=lower,
                 upper=upper, time_limit=time_limit)  # fmt: skip


def _shared_status(
    mine: pd.DataFrame, before: pd.DataFrame, theirs: list[str], column: str = "status"
) -> pd.Series:
    """Per cell of ``mine`` (its dimension columns), the status (or another ``column``) of the
    same cell in ``before`` (a stored output with dimensions ``theirs``), or NaN where it has
    none: a cell is shared when the dimensions of one table only are at their total in both."""
    dims = list(mine.columns)
    common = [d for d in dims if d in theirs]
    left = mine.astype(str).reset_index(drop=True)
    right = before[theirs].astype(str).assign(__before=before[column].to_numpy())
    only_mine = [d for d in dims if d not in common]
    only_theirs = [d for d in theirs if d not in common]
    at_total = (left[only_mine] == TOTAL).all(axis=1) if only_mine else None
    if only_theirs:
        right = right[(right[only_theirs] == TOTAL).all(axis=1)]
    right = right[[*common, "__before"]].assign(__shared=1)
    left = left[common].assign(__shared=1)
    status = left.merge(right, on=[*common, "__shared"], how="left",
                        validate="many_to_one")["__before"]  # fmt: skip
    return status.where(at_total, None) if at_total is not None else status


def _same_cells(job: Job) -> list[tuple[str, list[str]]]:
    """The stored suppression outputs (``protected.<name>``) that share cells with the job, with
    their dimension columns (:func:`outputs_of_the_same_cells`)."""
    own = f"{OUTPUT_SCHEMA}.{job.into}"
    return [
        (name, dims)
        for name, method, dims, alike in outputs_of_the_same_cells(
            job.con, job.policy, job.spec, own
        )
        if method == "suppress" and (alike or name == own)
    ]
