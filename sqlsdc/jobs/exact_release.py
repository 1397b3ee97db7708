"""Another release of a table as the exact cells it gives, and the SQL of its population.

The checks of :mod:`sqlsdc.jobs.differencing` compare a job's table with other releases of
the same table and aggregate: the guard's suppression pattern, stored job outputs, anonymised
files (:mod:`sqlsdc.jobs.record_files` writes a file down as a :class:`Release`). This module
holds what they all read: the :class:`Release` itself, a population's WHERE as a condition
that is never NULL (:func:`kept`), and whether a file's exact columns tell of each of its
records whether a job counts it (:func:`tells`, :func:`held_cuts`), in which case its records
outside the job are counts of its own cells and no difference.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from sqlglot import exp


@dataclass(frozen=True)
class Release:
    """Another release of a table, as the exact cells it gives.

    Attributes:
        label: how messages name it (an output, the suppression pattern).
        where: its population, a condition on the table's rows (None: every row).
        dims: the table's columns it cuts cells by as they are.
        exact: an anonymised file's columns that no perturbative step changed and that cut
            cells (those that read a dimension, and any recoded column), as ``(name in the file,
            expression on the table)`` (a recoded column is its bands); every combination of
            their values is a cell. None for a table, whose cells are the groupings of
            ``dims``.
        held: the table's columns a file holds unperturbed, coarsened or not (it gives their
            sums; a top-coded one counts, which errs on the safe side).
        blanked: the table's columns a file's local suppression blanked in some records:
            counted as they were (more cells, the safe side), they tell nobody which records
            a table counts.
        records: a file's records as it shows them (a stored table, or the new file
            registered for the check), read for the cells its blanked values leave short.
        drawn: the table's columns a perturbative step changed in a file (PRAM, noise,
            swapping, ...: drawn anew by each file's seed); two files of the same rows that
            both draw one are two draws readers average (red team s42c).
        sums: a stored file's exact columns that read one column of the table, as ``(name in
            the file, expression on the table as the file holds it)``: with ``exact`` and
            ``records``, what tells whether its records are still the data under its
            population (:mod:`sqlsdc.jobs.stale_releases`, red team s47c). None: not known.
        links: a stored file's exact columns whatever they read, as ``(name in the file,
            expression on the table as the file holds it)``: what two files link record by
            record by (:mod:`sqlsdc.jobs.linked_files`; ``weight + 0 * income`` reads two
            columns and links as ``weight`` does, red team s48q). None: ``sums``.
        totals: the table's columns a file holds perturbed by steps that keep their total
            over the file exact (microaggregation, exact-moment noise, shuffling, rank
            swapping: :func:`sqlsdc.jobs.record_files.kept_totals`).
        grouped: the table's columns a file holds microaggregated: each value its group's
            mean, the group a run of near values that a file holding the column exactly
            rebuilds (:func:`sqlsdc.jobs.file_pairs.refuse_file_pairs`, red team s49b).
    """

    label: str
    where: exp.Expr | None
    dims: tuple[str, ...]
    exact: tuple[tuple[str, exp.Expr], ...] | None = None
    held: frozenset[str] = frozenset()
    blanked: frozenset[str] = frozenset()
    records: exp.Table | None = None
    drawn: frozenset[str] = frozenset()
    sums: tuple[tuple[str, exp.Expr], ...] | None = None
    totals: frozenset[str] = frozenset()
    links: tuple[tuple[str, exp.Expr], ...] | None = None
    grouped: frozenset[str] = frozenset()

    def holds(self, column: str) -> bool:
        """Whether its cells give sums of ``column``."""
        return self.exact is None or column.lower() in self.held


def total_releases(files: Iterable[Release], measure: str | None) -> list[Release]:
    """Each of ``files`` whose total of ``measure`` is exact though a step perturbed it
    (:func:`sqlsdc.jobs.record_files.kept_totals`), as the exact table of one cell it gives:
    its population's total."""
    if measure is None:
        return []
    return [Release(f"{file.label} (its total of {measure})", file.where, ())
            for file in files if measure.lower() in file.totals]  # fmt: skip


def kept(where: exp.Expr | None) -> exp.Expr:
    """``where`` as a condition that is false, not NULL, for rows it does not hold (true for
    a release of every row)."""
    if where is None:
        return exp.true()
    return exp.paren(exp.Coalesce(this=where.copy(), expressions=[exp.false()]), copy=False)


def tells(con, spec, other: Release) -> bool:
    """Whether a file's exact columns tell of each of its records whether the job counts it:
    the job's WHERE reads only columns of the table that the file holds (as they are or
    coarsened, never blanked by a local suppression), and within each combination of their
    released values it is the same for every record of the file. Then the file's records
    outside the job, in any cell, are a count of the file's own cells."""
    if other.exact is None:
        return False
    return spec.where is None or bool(held_cuts(con, spec, other))


def held_cuts(con, spec, other: Release) -> list[tuple[str, exp.Expr]]:
    """The file's cuts that tell whether the job (whose WHERE is not None) counts a record
    (:func:`tells`); empty when they do not."""
    if spec.where.find(exp.Query, exp.Subquery):  # a lookup elsewhere: not a function of them
        return []
    read = columns_read(spec.where)
    held = [(n, e) for n, e in other.exact
            if (cut := columns_read(e)) and cut <= read and not cut & other.blanked]  # fmt: skip
    if not held or set().union(*(columns_read(e) for _n, e in held)) != read:
        return []
    mine = kept(spec.where)
    mixed = (
        exp.select(exp.Literal.number(1))
        .from_(spec.table)
        .where(kept(other.where))
        .group_by(*(e.copy() for _n, e in held))
        .having(
            exp.NEQ(this=exp.func("bool_or", mine.copy()), expression=exp.func("bool_and", mine))
        )
        .limit(1)
    )
    return [] if con.execute(mixed.sql("duckdb")).fetchall() else held


def columns_read(expression: exp.Expr) -> set[str]:
    return {c.name.lower() for c in expression.find_all(exp.Column)}
