"""A suppression job of a whole table whose only cell in the live pattern is its grand total.

A job of a table under ``suppression:`` that groups by dimensions outside the universe
(persons by education, enterprises' turnover by size_class) over every row shares one cell
with the guard's pattern: the grand total, the same units. The live-cell check
(:mod:`sqlsdc.jobs.live_cells`) refused such a job (since red team s30f), because a cell one
pattern hides and another publishes recomputes the first's primaries. When the live pattern
*publishes* that total (exactly: suppression perturbs nothing) and the job publishes it too,
the two tables are linked by a known constant only: for any table of the job and any of the
pattern that agree with their published cells, the cross-classification whose margins they are
exists (a transportation problem with equal totals, integral for integral margins), so no
reader learns of either table's hidden cells more than from that table alone, under the
linked audit's model (:mod:`sqlsdc.jobs.linked_audit`: every combination of codes possible
unless a table's listing rules it out). Not modelled, as there: a reader who knows from
elsewhere that a category of the job lies in one cell of the pattern (every member of the
armed forces in one municipality) reads the job's published count as a lower bound of that
cell.

That argument fails when the job's cells are tied to the universe otherwise, so
:func:`public_grand_total` allows the job only when all of this holds (else the refusal
stays):

* the job is a suppression job (exact values: a rounded or adjusted total beside the exact
  one tells the sum of its perturbations);
* it keeps every row of the table, and groups by no universe column;
* no cell of it but the total, nor any union of its cells, is one of the pattern's or a union
  of its inner cells: a dimension that the universe columns determine (a county of the
  municipalities) would make its cells sums of live cells, and the cells the live pattern
  hides in them would be read off (:func:`_ties`: the job's and the universe's inner cells,
  linked by the rows they share, are one connected whole);
* the pattern, computed now as a query would compute it (:func:`ensure_patterns`), publishes
  the grand total with the job's value. Later patterns keep it published while its value
  stands (:func:`sqlsdc.tabular.universe_pattern._carried_over`); a policy applied afterwards is
  checked against the stored pattern the same way (:func:`stored_total_published`).

The job then publishes its total (a cell forced published, :mod:`sqlsdc.jobs.protect`).
"""

from __future__ import annotations

import math

from sqlglot import exp

from sqlsdc.catalog.store import pattern_table
from sqlsdc.engines import duckdb as engine
from sqlsdc.engines.duckdb_schema import table_columns
from sqlsdc.engines.duckdb_sql import to_sql
from sqlsdc.jobs.exact_release import kept
from sqlsdc.jobs.patterns import ensure_patterns
from sqlsdc.jobs.stored_tables import same_rows
from sqlsdc.jobs.tabulation import JobSpec, job_source, measure_sum
from sqlsdc.policy import Policy
from sqlsdc.tabular.universe import COUNT, STATUS, VALUE, Universe, universe_of


def public_grand_total(con, policy: Policy, spec: JobSpec, method: str, version: int) -> bool:
    """Whether the ``method`` job ``spec`` may share its grand total with the live suppression
    pattern of its table (the module's conditions), computing the pattern if it is stale."""
    if method != "suppress":
        return False
    universe = _shaped(con, policy, spec)
    if universe is None or _ties(con, spec, universe):
        return False
    con.execute("BEGIN TRANSACTION")
    try:
        ensure_patterns(con, policy, version, [universe.table])
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    return _published(con, spec, universe)


def stored_total_published(con, policy: Policy, spec: JobSpec) -> bool:
    """Whether a stored suppression output ``spec`` shares only its grand total with the
    pattern of its table, and the pattern stored now publishes that total with its value: the
    pattern a new policy protects carries it over, published (read when a policy is applied,
    before its own pattern exists)."""
    universe = _shaped(con, policy, spec)
    return universe is not None and not _ties(con, spec, universe) and _published(
        con, spec, universe)  # fmt: skip


def _shaped(con, policy: Policy, spec: JobSpec) -> Universe | None:
    """The universe of the job's table when the job has the shape this module allows (every
    row, no universe column among its dimensions, an aggregate the pattern protects)."""
    declared = policy.table(spec.table)
    if declared is None or declared.suppression is None:
        return None
    universe = universe_of(policy, declared.name)
    columns = {c.lower() for c in universe.columns}
    if (spec.measure or COUNT) not in universe.aggregates or not spec.dims:
        return None
    if any(d.lower() in columns for d in spec.dims):
        return None
    if not same_rows(con, spec.table, spec.where, None):
        return None
    return universe


def _ties(con, spec: JobSpec, universe: Universe) -> bool:
    """Whether some cells of the job other than its grand total hold exactly the units of some
    inner cells of the universe: whether the job's inner cells and the universe's, linked where
    a row that adds (a sum's non-zero ones) lies in both, fall apart into several connected
    parts. Each part's job cells add up to its universe cells, a sum of live cells (one of them
    hidden, then read off); one part is the grand total alone.

    A union of cells, not a cell (red team s40i): a job by a district of three cells that
    cross (R02-M002, F), a secondary of 7 persons, and halves of two large women's cells of
    R02 passed a check of single cells, and the three cells less the two published cells gave
    the 7."""
    dims = [exp.column(d) for d in spec.dims]
    cols = [exp.column(c) for c in universe.columns]
    adds = _adds(spec)
    pairs = exp.select(*dims, *cols).distinct().from_(spec.table)
    pairs = pairs.where(exp.and_(kept(spec.where), adds) if spec.where is not None else adds)
    parent: dict = {}

    def root(node):
        while parent.setdefault(node, node) != node:
            parent[node] = parent[parent[node]]
            node = parent[node]
        return node

    n = len(dims)
    for row in engine.run(con, to_sql(pairs)).to_pylist():
        values = list(row.values())
        mine, theirs = root(("job", *values[:n])), root(("universe", *values[n:]))
        parent[mine] = theirs
    return len({root(node) for node in list(parent)}) > 1


def _published(con, spec: JobSpec, universe: Universe) -> bool:
    """Whether the stored pattern publishes the grand total with the job's value."""
    aggregate = spec.measure or COUNT
    table = pattern_table(universe.table)
    stored = {c.lower() for c in table_columns(con, table.db, table.name)}
    wanted = {f"{aggregate}{STATUS}", f"{aggregate}{VALUE}", *universe.columns}
    if not {c.lower() for c in wanted} <= stored:
        return False  # none stored, or one of another universe (a policy about to change it)
    found = exp.select(exp.column(f"{aggregate}{STATUS}"), exp.column(f"{aggregate}{VALUE}"))
    found = found.from_(table)
    found = found.where(exp.and_(*[exp.column(c).is_(exp.null()) for c in universe.columns]))
    rows = engine.run(con, to_sql(found)).to_pylist()
    if len(rows) != 1:
        return False
    status, value = rows[0].values()
    if status != "published" or value is None:
        return False
    total = (exp.Count(this=exp.Distinct(expressions=[exp.column(spec.unit)]))
             if spec.measure is None else measure_sum(spec))  # fmt: skip
    ours = job_source(exp.select(total), spec).where(_adds(spec))
    (mine,) = engine.run(con, to_sql(ours)).to_pylist()[0].values()
    return mine is not None and math.isclose(float(value), float(mine), rel_tol=1e-12)


def _adds(spec: JobSpec) -> exp.Expr:
    """The rows that add to the job's cells: every row of a count, a sum's non-zero ones."""
    if spec.measure is None:
        return exp.true()
    nonzero = exp.column(spec.measure).neq(exp.Literal.number(0))
    return exp.Coalesce(this=nonzero, expressions=[exp.false()])
