"""The suppression versions of a job's cells that readers keep although no stored output holds
them any more: replaced by a table of other cells (``--replace``), or dropped.

:func:`sqlsdc.jobs.earlier_suppressions.earlier_suppressions` keeps what the stored outputs of
the same rows hid and published, and :mod:`sqlsdc.jobs.revision_audit` audits the new version
with them; a version no longer stored was left out of both. Red team s43c: enterprise counts by
nace x region suppressed by ``gauss`` (``freq:3``), the output replaced by a table of persons
(or dropped), then the same cells suppressed by ``hitas`` under another name: the second
pattern published 4 cells the first hid, and the two together pinned 4 of its 12 primaries,
3 at exactly 1 enterprise (s32b's two patterns of one table, with the first one forgotten).

A version's statuses are read from the ledger (its cells' identities under its own WHERE and
dimensions, as :meth:`sqlsdc.jobs.job.Job.store` recorded them) and its values from its kept
units (``sqlsdc.job_units``): a cell it suppressed stays suppressed, a cell it published with
the value the cell has now is public (forced), as for a stored output.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from sqlglot import exp

from sqlsdc.catalog.identity_text import identities
from sqlsdc.errors import SqlSyntaxError, TabularError
from sqlsdc.jobs.revisions import Units, version_changes
from sqlsdc.jobs.stored_tables import earlier_versions_of_the_same_cells
from sqlsdc.jobs.tabulation import parse_job, population_where, table_dims
from sqlsdc.tabular.model import Table

if TYPE_CHECKING:
    from sqlsdc.jobs.job import Job


@dataclass(frozen=True)
class Replaced:
    """A suppression version no output holds now: ``label``, ``query_id``, ``status`` per cell
    of the job's table (``published``, ``suppressed``, or NaN where it has no such cell) and
    ``unchanged``: the cells whose units and values are those it tabulated (all False when its
    units were not kept)."""

    label: str
    query_id: int
    status: pd.Series
    unchanged: np.ndarray


def replaced_suppressions(job: Job, table: Table, units: Units) -> list[Replaced]:
    """The suppression versions of the job's rows and dimensions replaced or dropped since
    (:func:`~sqlsdc.jobs.stored_tables.earlier_versions_of_the_same_cells`), oldest first."""
    dims = list(table.dims)
    found = []
    for version, alike in earlier_versions_of_the_same_cells(job.con, job.policy, job.spec):
        if version.method != "suppress" or not alike:
            continue  # other methods and rows: refused (jobs/refusals._refuse_earlier_protection)
        try:
            spec = parse_job(version.sql, job.policy, stored=True)
        except (TabularError, SqlSyntaxError):
            continue
        theirs = list(table_dims(spec, job.policy))
        if sorted(theirs) != sorted(dims):
            continue
        status = _ledger_status(job, table, version.query_id, spec, theirs)
        if status is None:
            continue
        changes = version_changes(job, table, version.query_id, units)
        unchanged = np.zeros(len(table.cells), dtype=bool)
        if changes is not None:
            net, gained, lost = changes
            unchanged = np.isclose(net, 0.0, rtol=0.0, atol=1e-9) & ~gained & ~lost
        found.append(Replaced(version.label, version.query_id, status, unchanged))
    return found


def carried(
    replaced: list[Replaced], kept, held, shown, count: int
) -> tuple[np.ndarray | None, np.ndarray | None, np.ndarray | None]:
    """``kept``, ``held`` and ``shown`` (those of
    :func:`~sqlsdc.jobs.earlier_suppressions.earlier_suppressions`) with what ``replaced``
    did: a cell one suppressed is held suppressed, a cell one published with the value it has
    now is shown (unless some version suppressed it)."""
    if not replaced:
        return kept, held, shown
    none = np.zeros(count, dtype=bool)
    kept = none.copy() if kept is None else kept
    held = none.copy() if held is None else held
    shown = none.copy() if shown is None else shown
    for version in replaced:
        held = held | (version.status == "suppressed").to_numpy()
        shown = shown | ((version.status == "published").to_numpy() & version.unchanged)
    held = held & ~kept
    return kept, held, shown & ~kept & ~held


def _ledger_status(
    job: Job, table: Table, query_id: int, spec, dims: list[str]
) -> pd.Series | None:
    """Per cell of ``table``, the status the ledger recorded for the version ``query_id``
    (its cells' identities under its table, WHERE and dimension order).

    Identities that are no plain text (a WHERE with a quoted name or a non-ASCII literal, a
    key value so written) are written by DuckDB, as the ledger wrote them: skipped, such a
    version was forgotten (red team s43l: ``WHERE nace <> 'Ü'``, then the same cells by
    ``hitas`` beside it published cells it had hidden)."""
    where = population_where(spec)  # as the ledger names it (:meth:`Job._record_cells`)
    population = None if where is None else where.sql("duckdb")
    keys = table.cells[dims].astype(str)
    names = identities((spec.table,), population, dims, [keys[d].tolist() for d in dims], len(keys))
    if names is None:  # not plain text: as DuckDB wrote it into the ledger
        names = _written_identities(job.con, spec.table, population, keys[dims])
    rows = job.con.execute(
        "SELECT cell, max(status) FROM sqlsdc.ledger WHERE query_id = ? AND column_name = 'value' "
        "GROUP BY cell",
        [query_id],
    ).fetchall()
    return pd.Series(names).map(dict(rows))


def _written_identities(con, table: str, population: str | None, keys: pd.DataFrame) -> list[str]:
    """The ledger identity of each row of ``keys`` (text columns named as the ledger's keys),
    written by DuckDB as :func:`sqlsdc.catalog.store.ledger_insert` writes it."""
    scope: list[exp.Expr] = [
        exp.Literal.string("tables"),
        exp.func("to_json", exp.Array(expressions=[exp.Literal.string(table)])),
    ]
    if population is not None:
        scope += [exp.Literal.string("population"), exp.Literal.string(population)]
    pairs = [a for name in keys.columns for a in (exp.Literal.string(name), exp.column(
        name, quoted=True))]  # fmt: skip
    identity = exp.func("json_object", *scope, exp.Literal.string("keys"),
                        exp.func("json_object", *pairs))  # fmt: skip
    query = exp.select(exp.cast(identity, "VARCHAR")).from_("__replaced_keys").order_by("__row")
    con.register("__replaced_keys", keys.reset_index(drop=True).assign(__row=range(len(keys))))
    try:
        return [row[0] for row in con.execute(query.sql("duckdb")).fetchall()]
    finally:
        con.unregister("__replaced_keys")
