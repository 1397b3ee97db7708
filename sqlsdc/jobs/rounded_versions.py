"""Every earlier rounding of a job's cells, read with the rounding now: a cell whose units did not
change since a version published it is rounded to that version's multiple again.

A reader of a controlled rounding to base ``b`` knows the original of a cell published as ``R``
lies strictly within ``b`` of it (:mod:`sqlsdc.tabular.rounding_audit`). Readers keep every
version of a job's table (``--replace`` overwrites none of theirs): a cell of the same units
published as ``R`` by one version and ``R + b`` by another lies strictly between the two, a
window of ``b`` instead of ``2b``. :func:`sqlsdc.jobs.replaced_sides.published_before` keeps
each cell on the multiple the *latest* version published while that is still adjacent, which
holds the versions together only while no cell changes and changes back. Red team s44c: 85+
persons by region x education rounded to base 12 (kept: 2,280 in the grand total); ten persons
of one cell made 85 (2,292), the table stored again, replaced by another population, the ten
persons' ages restored and the table stored again: the latest version's 2,292 was adjacent
again, so 4 cells of the first version's units (the cell, its row and column totals and the
grand total) were published both ways, 11 candidate counts left of 23.

So the catalog keeps every version's values (:func:`sqlsdc.jobs.kept_cells.record` no longer
overwrites them), and a rounding reads each version of its name, table and aggregate whose
units were kept (``sqlsdc.job_units``), of its own rows or others (the same rounding stored
as ``WHERE age >= 85 AND person_id NOT IN (...)`` of the ten persons, another population, did
the same): a cell unchanged since one (no unit entered, left or changed its
contribution) is kept on that version's multiple (:func:`keep`, the latest such version first),
and a rounding that still publishes such a cell at another multiple is refused
(:func:`refuse_other_multiples`): the windows of two versions of the same original give less
than either. Versions whose units were not kept are refused when a cell moves
(:func:`sqlsdc.jobs.adjusted_revisions.unkept_versions`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from sqlsdc.errors import TabularError
from sqlsdc.jobs.kept_cells import Cells, versions_of
from sqlsdc.jobs.revisions import Units, version_changes
from sqlsdc.tabular.model import Table

if TYPE_CHECKING:
    from sqlsdc.jobs.job import Job


@dataclass(frozen=True)
class Version:
    """One earlier version of the job's population: ``query_id``, the ``values`` it published
    per cell of the table (NaN where it held no such cell) and ``unchanged``: the cells whose
    units and contributions are those it tabulated."""

    query_id: int
    values: np.ndarray
    unchanged: np.ndarray


def earlier_versions(job: Job, table: Table, cells: Cells, units: Units) -> list[Version]:
    """The versions of ``job`` (name, method; the same table and aggregate, any rows) whose
    values and units were kept, oldest first."""
    found = []
    for query_id, values in versions_of(job, cells):
        changes = version_changes(job, table, query_id, units)
        if changes is None:
            continue  # units not kept: a moved cell is refused (adjusted_revisions)
        net, gained, lost = changes
        unchanged = np.isclose(net, 0.0, rtol=0.0, atol=1e-9) & ~gained & ~lost
        found.append(Version(query_id, values, unchanged & np.isfinite(values)))
    return found


def keep(before: np.ndarray, versions: list[Version]) -> np.ndarray:
    """``before`` (the latest published values, :func:`~sqlsdc.jobs.replaced_sides.
    published_before`) with each cell unchanged since some version set to the latest such
    version's value: the multiple the rounding keeps."""
    kept = np.array(before, dtype=np.float64, copy=True)
    for version in versions:  # oldest first: the latest unchanged version wins
        kept = np.where(version.unchanged, version.values, kept)
    return kept


def refuse_other_multiples(table: Table, rounded: np.ndarray, versions: list[Version]) -> None:
    """Refuse ``rounded`` when it publishes a cell at another value than a version that
    tabulated the same units in it (see the module); the refusal names one such cell (its codes,
    no value)."""
    now = np.asarray(rounded, dtype=np.float64)
    other = np.zeros(now.size, dtype=bool)
    for version in versions:
        other |= version.unchanged & ~np.isclose(now, version.values, rtol=1e-12, atol=1e-9)
    if not other.any():
        return
    cell = table.cells.iloc[int(np.flatnonzero(other)[0])][list(table.dims)].astype(str)
    raise TabularError(
        f"--method round would publish {int(other.sum())} cell(s) at another multiple than an "
        f"earlier version of this table published for the same units, e.g. {cell.to_dict()}: "
        "readers keep every version, and a count published as two adjacent multiples lies "
        "between them, within half the window either gives. Nothing was stored; round to "
        "a larger base, protect the table with --method suppress, or tabulate the new data as "
        "a population of its own (WHERE year = 2026)"
    )
