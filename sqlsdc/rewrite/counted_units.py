"""The key of a distinct count of units: the counted units' own record keys, however the query
reaches them.

``COUNT(DISTINCT persons.household_id)`` counts households, as ``COUNT(DISTINCT
h.household_id)`` over persons ⋈ households and ``COUNT(*)`` of households do. The cell key
method (and rounding's coin) must give one set of households one key whichever of these an
analyst writes, or each spelling draws its own noise of one number and their average converges
on it (red team s29b). Rows that carry the counted unit's record key (a one-row-per-unit table
counting its own unit, or a unit the plan exposes: :attr:`CellPlan.units`) are keyed as they
are; otherwise the units' keys are looked up with a LEFT JOIN of the counted table on the
counted column (``ON persons.household_id = __ref0.__ru``), one row per unit, so the join never
repeats the query's rows. The value joined is a stored identifier passed through unchanged (the
guard refuses computed identifiers), never a value the analyst chooses.

A value that matches no unit (an orphan reference) is still counted, as SQL counts it. Its
part of the key is the rows' own key of the orphan rows rotated by 16 bits: a cell with orphans
then gets other noise than the same units without them (a different count, whose equal key
would make the difference of the two exact), and not the noise of its persons' ``COUNT(*)``.
"""

from __future__ import annotations

from collections.abc import Callable

from sqlglot import exp

from sqlsdc.catalog.keys import RKEY
from sqlsdc.catalog.ptables import KEY_MODULUS
from sqlsdc.planner.plan import CellPlan, CountedUnits
from sqlsdc.policy import Method
from sqlsdc.rewrite.threshold import rotated

LOOKUP, UNIT = "__ref", "__ru"  # a lookup of record keys, its unit column


def unit_lookups(
    plan: CellPlan, arguments: list[exp.Expr | None], method: Method
) -> dict[int, int]:
    """The aggregates of ``method`` that count units whose record keys the rows do not carry,
    each mapped to its lookup (one per counted table and column). ``arguments``: the
    aggregates' arguments in the tree being rewritten."""
    found: list[tuple[str, exp.Expr]] = []
    lookups: dict[int, int] = {}
    for i, spec in enumerate(plan.aggregates):
        counted = spec.counted
        if counted is None or spec.rule.method is not method:
            continue
        if plan.units is None and not counted.referenced:
            continue  # one row per unit, counting its own unit: the rows' keys
        if plan.units is not None and spec.argument in plan.units:
            continue  # a unit the rows carry, with its key
        key = (counted.table, arguments[i])
        if key not in found:
            found.append(key)
        lookups[i] = found.index(key)
    return lookups


def join_unit_keys(
    select: exp.Select, plan: CellPlan, arguments: list[exp.Expr | None], lookups: dict[int, int]
) -> list[exp.Column]:
    """Append one ``LEFT JOIN`` of record keys per lookup to ``select`` (mutated: a select the
    caller built) and return each lookup's key column."""
    columns = []
    for j in sorted(set(lookups.values())):
        i = min(i for i, looked_up in lookups.items() if looked_up == j)
        alias = f"{LOOKUP}{j}"
        lookup = unit_keys(plan.aggregates[i].counted).subquery(alias)
        on = exp.EQ(this=arguments[i].copy(), expression=exp.column(UNIT, alias))
        select.append("joins", exp.Join(this=lookup, side="LEFT", on=on))
        columns.append(exp.column(RKEY, alias))
    return columns


def unit_keys(counted: CountedUnits) -> exp.Select:
    """One row per unit of the counted table with its record key (all rows of a unit share
    one): ``SELECT unit AS __ru, __rkey FROM table``, grouped by the unit unless the table has
    one row per unit."""
    unit = exp.column(counted.column, "__t")
    key = exp.column(RKEY, "__t")
    select = exp.Select(
        expressions=[
            exp.alias_(unit, UNIT),
            exp.alias_(key if counted.unique else exp.Min(this=key), RKEY),
        ]
    )
    table = exp.Table(this=exp.to_identifier(counted.table)).as_("__t")
    select.set("from_", exp.From(this=table))
    return select if counted.unique else select.group_by(unit.copy(), copy=False)


def counted_units_key(
    looked_up: exp.Expr, argument: exp.Expr, rows_key: Callable[[exp.Expr], exp.Expr]
) -> exp.Expr:
    """``(SUM(DISTINCT key) + rotate16(orphans' rows key)) % 2^32`` over a cell's rows, with
    ``looked_up`` the rows' looked-up unit key, ``argument`` the counted column and
    ``rows_key(argument)`` the mechanism's key of the rows where ``argument`` is not NULL."""
    matched = exp.Coalesce(
        this=exp.Sum(this=exp.Distinct(expressions=[looked_up.copy()])),
        expressions=[exp.Literal.number(0)],
    )
    missing = exp.Is(this=looked_up.copy(), expression=exp.null())
    orphan = exp.Case(ifs=[exp.If(this=missing, true=argument.copy())])
    total = exp.Add(this=matched, expression=rotated(rows_key(orphan), 16))
    return exp.Mod(this=exp.Paren(this=total), expression=exp.Literal.number(KEY_MODULUS))
