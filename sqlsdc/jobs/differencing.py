"""Two releases of one table over populations that differ by a few units in a cell.

A job's table and another release of the same table and aggregate (the guard's suppression
pattern, which ``sqlsdc publish`` releases, a stored job output, or an anonymised file of the
table, whose records add up to any table over its columns) share the cells whose dimensions
both group by. Where both publish exact values (suppression; the cells CTA did not
move; the margins an IPF job was given, which are the true ones when the admin wrote them from
the data) and a shared cell's two populations overlap, a few units one holds and the other lacks —
with none the other way — are exactly the difference of the two values: their count, or their
sum. Red team s36c: on the suppression demo a job by geography x sex over ``WHERE age >= 1``,
published next to the live pattern of every person, gave 144 cells of counts 1-4 of the 144
persons aged 0 (one girl aged 0 in R01-M001), cells the policy's ``freq:5`` hides; a job of
``WHERE employees >= 10`` over enterprises does the same to the turnover of a cell's few small
enterprises. Red team s37c: an IPF job of income by region x education over ``age >= 85``,
raked to its true margins, next to a suppression job by sex over the same people but the one
of a municipality, gave that person's income as the difference of the two grand totals.

:func:`refuse_small_differences` refuses such a job before it computes anything: in every
grouping of the dimensions the two tables have in common, a cell whose populations overlap
must differ by none or by at least the minimum frequency of units on the side that differs
(differences on both sides mix what the two groups add up to). Not covered: a rounded or raked
table next to another (their difference bounds those units' sum within the two
perturbations; red team s33c keeps that allowed), and the two patterns together (a cell hidden
in one table and published in the other, the attacker LP over both with non-negative
differences): protecting linked tables of different populations needs one covering universe
(red team s30f).
"""

from __future__ import annotations

from sqlglot import exp

from sqlsdc.errors import TabularError
from sqlsdc.policy import Policy
from sqlsdc.tabular.rules import FrequencyRule, parse_rule

# (label, population WHERE or None, dimension columns) of a release the job's cells meet
Other = tuple[str, exp.Expr | None, tuple[str, ...]]


def refuse_small_differences(con, policy: Policy, spec, others: list[Other]) -> None:
    """Refuse the job ``spec`` (a :class:`~sqlsdc.jobs.protect.JobSpec`) when one of
    ``others`` (same table and aggregate) shares a cell with it whose populations overlap and
    differ, on one side only, by fewer units than the table's minimum frequency."""
    least = min_frequency(policy, spec.table)
    for label, where, dims in others:
        common = [d for d in spec.dims if d in dims]
        found = _smallest_difference(con, spec, where, common, least)
        if found is None:
            continue
        cell, units = found
        named = ", ".join(f"{d} = {v!r}" for d, v in cell.items() if v is not None) or "total"
        raise TabularError(
            f"the job's population and that of {label} overlap and differ by only {units} "
            f"unit(s) of {spec.table} in a cell both tables hold ({named}): the difference of "
            "the two values would show what those units add up to, which no cell of fewer "
            f"than {least} units (the policy's minimum frequency) may show. Tabulate a "
            "population that differs from it by none or by at least that many units in every "
            "cell they share"
        )


def min_frequency(policy: Policy, table: str) -> int:
    """The largest minimum frequency the policy sets for ``table``: any aggregate kind's
    ``min_frequency`` and any ``freq:N`` suppression rule."""
    rules = policy.table(table).protection.values()
    found = [r.min_frequency for r in rules]
    for rule in rules:
        for text in rule.rules:
            parsed = parse_rule(text)
            if isinstance(parsed, FrequencyRule):
                found.append(int(parsed.min_freq))
    return max(found)


def _smallest_difference(con, spec, where, common: list[str], least: int):
    """``(cell, units)`` of a shared cell whose populations overlap and differ on one side
    only, by ``0 < units < least``, or None."""
    mine, theirs = _kept(spec.where), _kept(where)
    member = exp.column(spec.unit)  # a job's rows are its units' rows
    both = exp.and_(mine, theirs)
    only_mine = exp.and_(mine, exp.not_(theirs))
    only_theirs = exp.and_(theirs, exp.not_(mine))

    def units(condition: exp.Expr, alias: str) -> exp.Expr:
        counted = exp.Count(this=exp.Distinct(expressions=[member.copy()]))
        return exp.alias_(exp.Filter(this=counted, expression=exp.Where(this=condition)), alias)

    cells = exp.select(
        *(exp.column(d) for d in common),
        units(both, "i"),
        units(only_mine, "a"),
        units(only_theirs, "b"),
    ).from_(spec.table)
    if spec.measure is not None:  # rows that add nothing to a sum are no part of a difference
        nonzero = exp.column(spec.measure).neq(exp.Literal.number(0))
        cells = cells.where(exp.Coalesce(this=nonzero, expressions=[exp.false()]))
    if common:
        cells = cells.group_by(exp.Cube(expressions=[exp.column(d) for d in common]))
    one_side = exp.or_(
        exp.and_(exp.column("b").eq(0), exp.column("a").between(1, least - 1)),
        exp.and_(exp.column("a").eq(0), exp.column("b").between(1, least - 1)),
    )
    select = (
        exp.select(*(exp.column(d) for d in common), exp.column("a"), exp.column("b"))
        .from_(cells.subquery("c"))
        .where(exp.and_(exp.GT(this=exp.column("i"), expression=exp.Literal.number(0)), one_side))
        .limit(1)
    )
    row = con.execute(select.sql("duckdb")).fetchone()
    if row is None:
        return None
    return dict(zip(common, row[: len(common)], strict=True)), max(row[-2:])


def _kept(where: exp.Expr | None) -> exp.Expr:
    if where is None:
        return exp.true()
    return exp.paren(exp.Coalesce(this=where.copy(), expressions=[exp.false()]))
