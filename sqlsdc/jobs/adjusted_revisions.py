"""Revisions of a rounding, CTA or IPF job: a cell whose published value changed since an
earlier version, while fewer units than the job's rules allow changed in it, is refused.

A rounded or adjusted table is not exact, but two versions of it are differenced as exact
tables are (:mod:`sqlsdc.jobs.revisions`): a cell that CTA leaves where it is (it is not
sensitive, or additivity needs no move there) is published at its original in both versions,
and their difference is the contribution of the units that changed in between. Red team s43d:
one new enterprise (turnover 1,234,567 in (C, R02)) and a CTA of turnover by nace x region
stored again with ``--replace``: (C, R02) and R02's total went up by exactly 1,234,567. A
rounding keeps each cell on the multiple it was published with while that is still adjacent
(:mod:`sqlsdc.jobs.replaced_sides`), so the cells whose multiple moves are those a unit
entered: of six updates of one person turning 80 (85+ by region x education, base 5), one
moved the four cells that hold the person's region and education, and nothing else, which
tells a reader who knows the person turned 80 their education; the region's total went from
570 to 575, its count exactly. Raked twice to the same public margins (education) after one
income of (R04, primary) grew by 50,000, the column's raked cells were all scaled by one ratio
``(X + d) / X`` and its sensitive cells, fixed at their safe values, did not move: a reader
who knew ``d`` had ``X`` and the originals of the column's 3 other raked cells exactly.

The rule is the suppression jobs' (Hundepool et al. 2012, 4.5: a cell derivable by
subtraction is protected as a cell of the difference table): the units now are kept in
``sqlsdc.job_units`` as a suppression job keeps them, and the difference from every kept
version of the population (and of other populations or aggregates sharing its cells) gets the
job's rules (:func:`sqlsdc.jobs.revisions.revision_rule`; a rounding of counts, which has no
rules of its own, the policy's frequency rule). These methods cannot hide a cell, and a cell
moved by a level drawn for the new value is not protected as a difference (the level is a
share of the value, not of the change). Nor are the other cells: the adjustments move with
the data (in the s43d CTA, (C, R03), where nothing changed, went down by the same 1,234,567
to keep C's total). So the job fails closed: when some cell is flagged, a version that
publishes any cell with another value than the latest version before it (0 where it was not
published) is refused, naming a flagged cell. The same table published again is allowed: it
tells nothing new. What to do instead: protect the table with ``--method
suppress``, whose revisions are protected, or tabulate the new data as a population of its
own (``WHERE year = 2026``).

A version whose units were not kept (a rounding, CTA or IPF stored by a catalog that did not
keep them yet) cannot be compared so: a CTA stored then, replaced after one
new firm, would move (C, R02) and R02's total by exactly its turnover
(tests/security/test_redteam_s43l.py). Its changes are unknown, so the job fails closed:
while some stored or earlier version of the same cells kept no units, a version that
publishes any cell with another value than the latest before it is refused, naming that
version (as :func:`sqlsdc.jobs.revisions.unknown_revisions` treats a suppression job's
changed cells).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sqlsdc.errors import TabularError
from sqlsdc.jobs.job import Job, job_rules
from sqlsdc.jobs.kept_cells import Cells
from sqlsdc.jobs.replaced_sides import published_before
from sqlsdc.jobs.revisions import Units, job_units, revision_rule
from sqlsdc.jobs.stored_tables import (
    earlier_versions_of_the_same_cells,
    share_cells,
    stored_outputs,
)
from sqlsdc.tabular.model import Table
from sqlsdc.tabular.rules import FrequencyRule


def revision_units(job: Job, identities: Cells) -> Units:
    """The job's units now, under its population's canonical identity (kept at store)."""
    return job_units(job, identities.population)


def refuse_published_revisions(
    job: Job,
    table: Table,
    rules: Sequence,
    identities: Cells,
    units: Units,
    published: np.ndarray,
    method: str,
) -> None:
    """Refuse ``published`` when some cell's difference from a kept version fails ``rules``
    (the policy's frequency rule when there are none: a rounding of counts) and some cell is
    published with another value than the latest version before it (see the module)."""
    before = np.nan_to_num(published_before(job, table, identities), nan=0.0)
    now = np.asarray(published, dtype=np.float64)
    moved = ~np.isclose(now, before, rtol=1e-12, atol=1e-9)
    if not moved.any():
        return
    unkept = unkept_versions(job)
    if unkept:
        raise TabularError(
            f"--method {method} would publish {int(moved.sum())} cell(s) with another value than "
            f"a version its readers hold, and {unkept[0]} kept no units (stored before they "
            "were kept): what changed since is unknown, and the versions' differences could "
            "give a few units' contribution. "
            "Protect a table whose data changed with --method suppress (it protects revisions), "
            "or tabulate the new data as a population of its own (WHERE year = 2026)"
        )
    rules = list(rules) or [r for r in job_rules(job, None) if isinstance(r, FrequencyRule)]
    revised = revision_rule(job, table, rules, units)
    if revised is None or not revised.cells.any():
        return
    named = revised.cells & moved if (revised.cells & moved).any() else revised.cells
    cell = table.cells.iloc[int(np.flatnonzero(named)[0])][list(table.dims)].astype(str)
    raise TabularError(
        f"--method {method} would publish {int(moved.sum())} cell(s) with another value than "
        f"a version its readers hold, and in {int(revised.cells.sum())} cell(s) fewer units "
        f"changed than the rules allow, e.g. {cell.to_dict()}: the versions' differences give "
        "those units' contribution. "
        "Protect a table whose data changed with --method suppress (it protects revisions), "
        "or tabulate the new data as a population of its own (WHERE year = 2026)"
    )


def unkept_versions(job: Job) -> list[str]:
    """How messages name the versions readers hold of the job's cells (stored outputs of the
    same table and aggregate that share cells with it, and versions replaced or dropped since)
    whose units ``sqlsdc.job_units`` does not keep."""
    con, spec = job.con, job.spec
    kept = {q for (q,) in con.execute("SELECT DISTINCT query_id FROM sqlsdc.job_units").fetchall()}
    ids = dict(con.execute("SELECT name, query_id FROM sqlsdc.outputs").fetchall())
    found = []
    for name, _method, theirs in stored_outputs(con, job.policy):
        same = (theirs.table.lower(), theirs.measure) == (spec.table.lower(), spec.measure)
        if same and ids.get(name) not in kept and share_cells(con, theirs, spec):
            found.append(f"protected.{name}")
    for version, _alike in earlier_versions_of_the_same_cells(con, job.policy, spec):
        if version.query_id not in kept:
            found.append(version.label)
    return found
