"""The tabular job outputs readers hold, read back from the catalog as parsed jobs.

A job is checked against what was released before it: :func:`stored_outputs` (the outputs in
``protected`` with their SQL parsed again, whatever the policy now says of their columns),
:func:`earlier_job_versions` (versions replaced or dropped since, which their readers keep:
:mod:`sqlsdc.jobs.output_history`), :func:`exact_tables` (those of them, and the guard's
suppression pattern, that publish exact values), and :func:`outputs_of_the_same_cells` (those
that share a cell with a job: the same table and aggregate over the same rows,
:func:`same_rows`, or over other rows that keep a whole cell, matched by fingerprints of its
units or rows), and :func:`count_tables_of_the_same_cells` (those that publish the same counts:
a count job's, or a suppression job of a sum's ``n``).
"""

from __future__ import annotations

import dataclasses

from sqlglot import exp

from sqlsdc.errors import SqlSyntaxError, TabularError
from sqlsdc.jobs.cell_unions import union_of_cells
from sqlsdc.jobs.exact_release import kept
from sqlsdc.jobs.output_history import earlier_versions, stored_output_tables
from sqlsdc.jobs.tabulation import JobSpec, parse_job, table_dims
from sqlsdc.policy import Policy
from sqlsdc.tabular.universe import COUNT, universe_of

TABULAR_METHODS = ("suppress", "round", "cta", "ipf")  # jobs that store a table of cells
# jobs that publish cells with their exact values (CTA: the cells it did not have to move; IPF:
# its given margins, exact when written from the data); two of them over populations that
# differ by a few units tell those units' values apart (red team s37c: IPF's grand total less a
# suppression job's of the same people but one gave that person's income)
EXACT_METHODS = ("suppress", "cta", "ipf")


def exact_method(method: str, spec: JobSpec) -> bool:
    """Whether a ``method`` job of ``spec`` publishes its cells as exact for the differencing
    check: a job of :data:`EXACT_METHODS`, or a rounding of a sum. Two roundings of sums over
    populations a few units apart tell those units' total within twice the base, which for a
    base below their values is their value (red team s41a: incomes of everyone aged 85 or over
    by region, and of R01's less its top earner by sex, both to base 5, gave that person's
    380,856.41 as 380,860). A rounded count stays the rounding's: its base is the protection."""
    return method in EXACT_METHODS or (method == "round" and spec.measure is not None)


def outputs_of_the_same_cells(
    con, policy: Policy, spec: JobSpec, own: str
) -> list[tuple[str, str, list[str], bool]]:
    """``(name, method, dimension columns, same rows)`` of the stored job outputs that share
    cells with a job of ``spec`` storing ``own``: ``own`` itself (when replaced), and every
    other one that tabulates the same table and aggregate over the same rows
    (:func:`same_rows`: however its WHERE is written), whatever its dimensions (tables of
    other dimensions share their totals), or over other rows of which some cell is one of the
    job's (:func:`_share_a_cell`)."""
    found = []
    for name, method, theirs in stored_outputs(con, policy):
        if _shape(theirs) != _shape(spec):
            if name == own:
                found.append((name, method, table_dims(theirs, policy), False))
            continue
        alike = same_rows(con, spec.table, theirs.where, spec.where)
        if name == own or alike or _linked(con, theirs, spec):
            found.append((name, method, table_dims(theirs, policy), alike))
    return found


def earlier_versions_of_the_same_cells(con, policy: Policy, spec: JobSpec) -> list[tuple]:
    """``(Version, same rows)`` of the tabular job outputs replaced or dropped since
    (:func:`~sqlsdc.jobs.output_history.earlier_versions`: their readers keep them) that share
    cells with a job of ``spec``, as :func:`outputs_of_the_same_cells` finds the current ones
    (red team s41k: a rounding to base 3 replaced by one of another population, or dropped,
    then the same cells rounded to base 5 under another name, left readers both roundings)."""
    found = []
    for version in earlier_versions(con):
        if version.method not in TABULAR_METHODS:
            continue
        try:
            theirs = parse_job(version.sql, policy, stored=True)
        except (TabularError, SqlSyntaxError):  # a table or column the policy no longer declares
            continue
        if _shape(theirs) != _shape(spec):
            continue
        alike = same_rows(con, spec.table, theirs.where, spec.where)
        if alike or _linked(con, theirs, spec):
            found.append((version, alike))
    return found


def count_tables_of_the_same_cells(
    con, policy: Policy, spec: JobSpec
) -> list[tuple[str, str, bool]]:
    """``(label, method, of a sum, same rows)`` of the count tables readers hold that share a
    cell with
    the count table ``spec`` (a count job's, or the counts ``n`` a suppression job of a sum
    publishes, ``measure`` None): every stored output and every version replaced or dropped
    since (:func:`earlier_job_versions`) that is a count job, or a suppression job of a sum,
    whose counts are a table of their own (``of a sum`` True), over the same rows
    (:func:`same_rows`) or rows of which some cell is one of ``spec``'s, or a sum of its inner
    cells (:func:`_linked`).

    Red team s42c: a suppression job of incomes lists every non-empty cell with its ``n`` (NULL
    where hidden), and a rounding of the same persons' COUNT(*) leaves out the cells it rounds
    to 0 so that they read as empty; matched by aggregate, SUM against COUNT, the two were
    stored side by side, in either order, and a hidden cell missing from a rounding to base 3
    held 1 or 2 persons (10 of them on the test demo; at base 2, 5 cells of one person)."""
    found = []
    for label, method, theirs in stored_outputs(con, policy) + earlier_job_versions(con, policy):
        of_a_sum = theirs.measure is not None
        if of_a_sum and method != "suppress":
            continue  # a rounded or adjusted sum publishes no counts
        counts = dataclasses.replace(theirs, measure=None)
        if counts.table.lower() != spec.table.lower():
            continue
        alike = same_rows(con, spec.table, counts.where, spec.where)
        if alike or _linked(con, counts, spec):
            found.append((label, method, of_a_sum, alike))
    return found


def pattern_label(table: str) -> str:
    return f"the suppression pattern of {table}"


def exact_tables(
    con, policy: Policy, table: str, *, rounded_counts: bool = False
) -> list[tuple[str, JobSpec]]:
    """``(label, JobSpec)`` of the tables of ``table`` that readers hold with exact values: the
    guard's suppression pattern (the whole table, one per aggregate it suppresses), every
    stored output of an exact job (:func:`exact_method`), and every earlier version of one
    replaced or dropped since (:func:`earlier_job_versions`: their readers keep them).

    ``rounded_counts``: roundings of counts too, for the checks of a file (anonymised, or a
    synthesis that counts as exact), whose counts are exact: the difference of a file's cell
    and a rounded one of a few more units is those units' count within the base, and at the
    window's edge their presence (red team s44c: every person aged 85+ but one in a file beside
    85+ by region x education rounded to base 5 left 4 of the 32 cells for 231 of the 2,283
    persons, their region). Two roundings of counts stay unchecked (:func:`exact_method`). A
    suppression job of a sum also releases the counts of its cells' units, in its ``n``
    column, a table of counts of its own (red team s38b: a count job of everyone aged 85 or
    over by sex, and a suppression job of their incomes less the tertiary-educated of one
    municipality, gave that group's count by sex, 1 and 1, from the release database
    alone)."""
    found = []
    declared = policy.table(table)
    if declared.suppression is not None:
        universe = universe_of(policy, declared.name)
        label = pattern_label(declared.name)
        for aggregate in universe.aggregates:
            measure = None if aggregate == COUNT else aggregate
            pattern = JobSpec(declared.name, universe.columns, measure, universe.unit, None)
            found.append((label, pattern))
    for name, method, theirs in stored_outputs(con, policy) + earlier_job_versions(con, policy):
        exact = exact_method(method, theirs) or (rounded_counts and method == "round")
        if not exact or theirs.table.lower() != declared.name.lower():
            continue
        found.append((name, theirs))
        if method == "suppress" and theirs.measure is not None:
            found.append((f"{name} (its counts n)", dataclasses.replace(theirs, measure=None)))
    return found


def earlier_job_versions(con, policy: Policy) -> list[tuple[str, str, JobSpec]]:
    """``(label, method, parsed SQL)`` of the tabular job outputs stored once and replaced or
    dropped since (:func:`~sqlsdc.jobs.output_history.earlier_versions`, from the jobs'
    audit entries): a release file or a reader holds them still. Red team s38b: ``--replace``
    compared a job with the version it replaced only, so incomes by sex of everyone aged 85
    or over, replaced by the same less a region, then by the same less one municipality's
    person (each step hundreds of people from the one before), put that person's income
    between the first and third versions."""
    found = []
    for version in earlier_versions(con):
        if version.method not in TABULAR_METHODS:
            continue
        try:
            spec = parse_job(version.sql, policy, stored=True)
        except (TabularError, SqlSyntaxError):  # a table or column the policy no longer declares
            continue
        found.append((version.label, version.method, spec))
    return found


def stored_outputs(con, policy: Policy) -> list[tuple[str, str, JobSpec]]:
    """``(name, method, parsed SQL)`` of the stored tabular job outputs whose SQL the policy
    still reads."""
    existing = stored_output_tables(con)
    rows = con.execute(
        "SELECT name, method, sql_text FROM sqlsdc.outputs WHERE method IN (?, ?, ?, ?) "
        "ORDER BY name",
        list(TABULAR_METHODS),
    ).fetchall()
    found = []
    for name, method, sql in rows:
        if name.lower() not in existing:
            continue
        try:
            found.append((name, method, parse_job(sql, policy, stored=True)))
        except (TabularError, SqlSyntaxError):  # a table or column the policy no longer declares
            continue
    return found


def _shape(spec: JobSpec) -> tuple:
    """What a job tabulates besides its rows and dimensions: table and aggregate."""
    return spec.table, spec.measure


def same_rows(con, table: str, first: exp.Expr | None, second: exp.Expr | None) -> bool:
    """Whether two WHERE conditions keep the same rows of ``table`` (in its data now): two
    spellings of one population (``age >= 85``, ``85 <= age``, none and a tautology) are one
    set of cells."""
    if first is None and second is None:
        return True
    differ = exp.select(exp.Count(this=exp.Star())).from_(table)
    differ = differ.where(exp.NEQ(this=kept(first), expression=kept(second)))
    return con.execute(differ.sql("duckdb")).fetchall()[0][0] == 0


def share_rows(con, table: str, first: exp.Expr | None, second: exp.Expr | None) -> bool:
    """Whether two WHERE conditions keep some row of ``table`` both (in its data now): two
    populations that overlap, the same rows among them."""
    both = exp.select(exp.Count(this=exp.Star())).from_(table)
    both = both.where(exp.and_(kept(first), kept(second)))
    return con.execute(both.sql("duckdb")).fetchall()[0][0] > 0


def share_cells(con, first: JobSpec, second: JobSpec) -> bool:
    """Whether two jobs of one table and aggregate share cells in the data now: the same rows
    (:func:`same_rows`) or some cell of one holding what a cell of the other holds
    (:func:`_share_a_cell`), as :func:`outputs_of_the_same_cells` pairs outputs."""
    return same_rows(con, first.table, first.where, second.where) or _share_a_cell(
        con, first, second
    )


def _linked(con, first: JobSpec, second: JobSpec) -> bool:
    """Whether two jobs over other rows share a cell (:func:`_share_a_cell`) or a cell of one
    is the sum of inner cells of the other (:func:`~sqlsdc.jobs.cell_unions.union_of_cells`;
    red team s45f: turnover over six activities by region, beside turnover by region x nace
    suppressed, gave a hidden cell as its region's cell less the five published ones)."""
    return _share_a_cell(con, first, second) or union_of_cells(con, first, second)


def _share_a_cell(con, first: JobSpec, second: JobSpec) -> bool:
    """Whether a cell of one job's table, inner or margin, holds what a cell of the other's
    holds, in the table's data now: the same units (a count) or the same rows with a non-zero
    measure (a sum), so the same value. Populations that differ in rows may share cells: a
    WHERE on a dimension (``region = 'R01'``, ``region = 'R01' OR age > 100``) keeps whole
    cells of the other table, and rows outside a cell (``income IS NOT NULL`` where a cell has
    none) leave it as it was. Cells are compared by fingerprints (number and sum of hashes of
    their units or rows) over every grouping of the dimensions (red team s33c: a rounding to
    base 5 of ``... AND region = 'R01'`` was stored next to one to base 3 of the whole table)."""
    a = _fingerprints(first).subquery("a")
    b = _fingerprints(second).subquery("b")
    same = exp.and_(
        exp.column("n", "a").eq(exp.column("n", "b")),
        exp.column("h", "a").eq(exp.column("h", "b")),
    )
    shared = exp.select(exp.Count(this=exp.Star())).from_(a).join(b, on=same)
    return con.execute(shared.sql("duckdb")).fetchall()[0][0] > 0


def _fingerprints(spec: JobSpec) -> exp.Select:
    """``(n, h)`` per cell of a job's table (every grouping of its dimensions): the number of
    its units (a count) or of its rows with a non-zero measure (a sum), and the sum of their
    hashes (of the whole row: rows alike in every column are kept or dropped together by any
    WHERE, and the record key tells rows apart)."""
    if spec.measure is None:
        member, rows = exp.column(spec.unit), kept(spec.where)
    else:
        member = exp.column(spec.table)  # the row as a struct (a view has no rowid)
        nonzero = exp.column(spec.measure).neq(exp.Literal.number(0))
        nonzero = exp.Coalesce(this=nonzero, expressions=[exp.false()])
        rows = exp.and_(kept(spec.where), nonzero)
    hashed = exp.Anonymous(this="hash", expressions=[member])
    distinct = exp.Distinct(expressions=[hashed])
    cube = exp.Cube(expressions=[exp.column(d) for d in spec.dims])
    return (
        exp.select(
            exp.Count(this=distinct).as_("n"),
            exp.Sum(this=distinct.copy()).as_("h"),
        )
        .from_(spec.table)
        .where(rows)
        .group_by(cube)
    )
