"""Outputs that hold a cell of the guard's suppression pattern: refused.

A table whose aggregate the policy suppresses (``suppression:``) has its cells released from one
pattern, live to analysts and by ``sqlsdc publish``. Another output holding one of those cells
exactly releases it a second time: a job's table protects it with another pattern (two patterns
of one table are linked tables protected separately: a cell one hides and the other publishes
recomputes the first's primaries, red team s30f), and an anonymised file that keeps the
dimensions exact shows it as it is, the suppressed ones included. The differencing check
(:mod:`sqlsdc.jobs.differencing`) lets an output through that differs from the pattern by no
unit in a cell (two exact tables of one cell agree); against the pattern, that cell is the leak.

Red team s39b: a job over four whole regions of enterprises, written ``region IN (...) AND
employees >= 0`` (a WHERE on another column kept the check of the time out), shared 72 cells
with the live pattern, and its own pattern with the live one gave two hidden counts of 1
exactly; an anonymised file of every enterprise with ``nace`` and ``region`` exact (turnover
microaggregated), published with ``--include``, counted every cell the release's own
``suppressed_enterprises`` hid. Red team s39c: the same file of persons with its dimensions
spelt as expressions (``municipality || '' AS m``, ``CASE WHEN sex = 'F' THEN 1 ELSE 2 END AS
s``) was compared by its plain columns only, none, and stored and published: its records
counted the 74 cells of 1-4 persons that ``suppressed_persons`` hid. A file is counted by
every exact column that reads a universe column (its cuts, as the differencing check reads
them), whatever it is named or computed from.

A synthesis is such a file only when it may hold its source's counts exactly: ``cart`` with
balanced draws (opt-in), checked here as a file with every column exact
(:mod:`sqlsdc.jobs.synthesis_files`); drawn with replacement (every method's default) its counts
carry the draws' noise and it has no exact column (red team s39c).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from sqlglot import exp

from sqlsdc.errors import TabularError
from sqlsdc.jobs.cell_unions import union_of_cells
from sqlsdc.jobs.tabulation import JobSpec
from sqlsdc.tabular.universe import COUNT, universe_of

if TYPE_CHECKING:
    from sqlsdc.jobs.exact_release import Release
    from sqlsdc.policy import Policy


def refuse_live_cells(
    con, policy: Policy, spec: JobSpec, label: str, error=TabularError, *, total: bool = False
) -> None:
    """Refuse the job ``spec`` (``label`` names it) when one of its cells is a cell of the
    policy's suppression pattern of its table (:func:`_live_cell`): every cell of a job
    without WHERE, of one whose WHERE reads universe columns only (``nace = 'C'``), or keeps
    every row of some cell. One whose every cell lacks some unit of the live cell it lies in
    (``age >= 90``) is not refused. ``total``: the job's grand total is left out, a cell the
    pattern publishes (:func:`sqlsdc.jobs.live_total.public_grand_total`)."""
    keys = [(d, exp.column(d)) for d in spec.dims]
    _refuse(con, policy, spec.table, keys, spec.measure, spec.where, label, error, total, True)
    if not total:  # a job of every row by other dimensions: sqlsdc.jobs.live_total's sums
        _refuse_sums_of_cells(con, policy, spec, label, error)


def _refuse_sums_of_cells(con, policy: Policy, spec: JobSpec, label: str, error) -> None:
    """Refuse the job ``spec`` when a cell of it is the sum of inner cells of the policy's
    pattern, or a cell of the pattern the sum of the job's inner cells
    (:func:`~sqlsdc.jobs.cell_unions.union_of_cells`), for its aggregate or, of a sum, the
    counts of its units (a suppression job publishes them as ``n``).

    Red team s45f: the suppression demo's pattern of enterprises by nace x region hides (R04,
    H); a job of turnover over ``nace IN ('A','B','D','F','G','H')`` by region shares no cell
    with it, and its R04 cell less the five published activities of R04 was (R04, H)'s
    23,879,637 exactly."""
    if policy.table(spec.table).suppression is None:
        return
    universe = universe_of(policy, spec.table)
    for measure in dict.fromkeys([spec.measure, None]):
        if (measure or COUNT) not in universe.aggregates:
            continue
        job = replace(spec, measure=measure)
        if union_of_cells(con, job, _pattern(policy, spec.table, measure)):
            raise error(_sums_refusal(spec.table, label, universe.columns))


def _pattern(policy: Policy, table: str, measure: str | None) -> JobSpec:
    """The policy's suppression pattern of ``table`` and ``measure`` (None: counts) as a job
    of every row by the universe's columns."""
    universe = universe_of(policy, table)
    return JobSpec(policy.table(table).name, tuple(universe.columns), measure, universe.unit, None)


def _sums_refusal(table: str, label: str, columns) -> str:
    return (
        f"{table} is protected by suppression in the policy and the guard releases its cells "
        f"from one pattern (published by `sqlsdc publish`); cells of {label} add up to cells "
        "of that pattern, or its cells to a cell of the pattern, and a reader of both could "
        "take the published cells of the pattern from such a sum to recompute a suppressed "
        f"one. Take a population that holds no whole cell of the policy's cells over "
        f"{', '.join(columns)} (or every row, by other dimensions), or publish the policy's "
        "pattern"
    )


def refuse_live_file_cells(con, policy: Policy, table: str, release: Release, error) -> None:
    """Refuse the anonymised file ``release`` of ``table`` when its records, counted (or
    summed, for a suppressed measure it holds exactly) by its exact columns that read a
    universe column (its cuts ``release.exact``, plain or computed: ``municipality || ''``
    counts as municipality does), give a cell of the policy's suppression pattern (those
    cuts are enough: a file's finer cells add up to them)."""
    declared = policy.table(table)
    if declared.suppression is None:
        return
    universe = universe_of(policy, table)
    cuts = release.exact if release.exact is not None else [
        (d, exp.column(d)) for d in release.dims]  # fmt: skip
    columns = {c.lower() for c in universe.columns}
    keys = [(name, expression) for name, expression in cuts
            if {c.name.lower() for c in expression.find_all(exp.Column)} & columns]  # fmt: skip
    for aggregate in universe.aggregates:
        if aggregate == COUNT or release.holds(aggregate):
            measure = None if aggregate == COUNT else aggregate
            _refuse(con, policy, table, keys, measure, release.where, release.label, error)
            if not keys:
                continue
            pattern = _pattern(policy, table, measure)
            file = replace(pattern, dims=tuple(n for n, _e in keys), where=release.where)
            if union_of_cells(con, file, pattern, first_keys=[e for _n, e in keys]):
                raise error(_sums_refusal(table, release.label, universe.columns))


def _refuse(con, policy, table, keys, measure, where, label, error, total=False, job=False):
    """``keys``: ``(name, expression on the table's rows)`` of the output's cuts; ``total``:
    its grand total is no cell to refuse; ``job``: a table job's (a refused total tells when
    one may be shared)."""
    if policy.table(table).suppression is None:
        return
    universe = universe_of(policy, table)
    if (measure or COUNT) not in universe.aggregates or not keys:
        return
    exprs = [expression for _name, expression in keys]
    found = _live_cell(table, exprs, measure, where, universe.columns, total=total)
    found = con.execute(found.sql("duckdb"))
    found = found.fetchall()
    if not found:
        return
    cell = ", ".join(f"{name} = {v!r}" for (name, _e), v in zip(keys, found[0], strict=True)
                     if v is not None) or "the total"  # fmt: skip
    raise error(
        f"{table} is protected by suppression in the policy and the guard releases its "
        f"cells from one pattern (published by `sqlsdc publish`); the cell {cell} of {label} "
        f"holds the same units as a cell of that pattern, which it would release a second "
        f"way (another pattern, or exactly), and the two together could recompute suppressed "
        f"cells. Take another population (one that differs from the policy's cells over "
        f"{', '.join(universe.columns)} in every cell) or publish the policy's pattern"
        + (_TOTAL_ONLY if job and cell == "the total" else "")
    )


_TOTAL_ONLY = (
    ". A grand total may be shared when the pattern publishes it and the job is a suppression "
    "job of every row by no dimension of the pattern, none of whose other cells, alone or "
    "added up, holds whole cells of the pattern (a rounded or adjusted total next to the exact "
    "one tells the sum of its perturbations)"
)


def _live_cell(
    table: str, dims: Sequence[exp.Expr], measure: str | None, where: exp.Expr | None,
    columns: Sequence[str], *, total: bool = False,
) -> exp.Select:  # fmt: skip
    """The values of ``dims`` (expressions on the rows of ``table``) of one cell of the table
    of ``measure`` (None: counts) over the rows that ``where`` keeps, by any grouping of
    ``dims`` (NULL for a total; the grand total left out when ``total``), whose rows that add
    to its aggregate are exactly the rows of a cell of the universe over ``columns``; no row if
    there is none.

    Rows that add to a sum are those with a non-zero value (a row of 0 or NULL changes no
    sum, so ``WHERE income > 0`` tabulates the live sums); a count counts every row. A cell
    lies in the universe cell fixed by the universe columns constant over its rows; the two
    are one when they hold as many rows.
    """
    adds = (exp.true() if measure is None
            else exp.column(measure).neq(exp.Literal.number(0)))  # fmt: skip
    kept = exp.Coalesce(this=where.copy(), expressions=[exp.false()]) if where else None
    n = exp.Count(this=exp.Star()).as_("__n")
    fixed, values, universe_flags, universe_values = [], [], [], []
    for i, c in enumerate(columns):
        col = exp.column(c)
        one = exp.and_(
            exp.Count(this=col.copy()).eq(exp.Count(this=exp.Star())),
            exp.Min(this=col.copy()).eq(exp.Max(this=col.copy())),
        )
        fixed.append(exp.Coalesce(this=one, expressions=[exp.false()]).as_(f"__f{i}"))
        values.append(exp.Min(this=col.copy()).as_(f"__v{i}"))
        grouped = exp.Anonymous(this="GROUPING", expressions=[col.copy()]).eq(0)
        universe_flags.append(grouped.as_(f"__f{i}"))
        universe_values.append(col.copy().as_(f"__v{i}"))
    keys = [f"__d{k}" for k in range(len(dims))]
    cube = exp.Group(cube=[exp.Cube(expressions=[d.copy() for d in dims])])
    cells = exp.select(*[exp.alias_(d.copy(), k) for d, k in zip(dims, keys, strict=True)],
                       n, *fixed, *values)  # fmt: skip
    cells = cells.from_(table).where(exp.and_(kept, adds) if kept else adds)
    cells.set("group", cube)
    if total:
        level = exp.Anonymous(this="GROUPING", expressions=[d.copy() for d in dims])
        cells = cells.having(level.neq(exp.Literal.number((1 << len(dims)) - 1)))
    universe_cube = exp.Group(cube=[exp.Cube(expressions=[exp.column(c) for c in columns])])
    live = exp.select(n.copy(), *universe_flags, *universe_values).from_(table).where(adds)
    live.set("group", universe_cube)
    same = [exp.column("__n", "j").eq(exp.column("__n", "u"))]
    for i in range(len(columns)):
        flag_j, flag_u = exp.column(f"__f{i}", "j"), exp.column(f"__f{i}", "u")
        value_j, value_u = exp.column(f"__v{i}", "j"), exp.column(f"__v{i}", "u")
        same.append(flag_j.eq(flag_u))
        same.append(exp.or_(exp.not_(flag_j.copy()), value_j.eq(value_u)))
    return (
        exp.select(*[exp.column(k, "j") for k in keys])
        .from_(cells.subquery("j"))
        .join(live.subquery("u"), on=exp.and_(*same))
        .order_by(*[exp.column(k, "j").is_(exp.null()) for k in keys])  # finest cells first
        .limit(1)
    )
