"""Minimum-frequency suppression as a rewrite: cells with fewer than k units become NULL.

Each aggregation over confidential rows is split in two (the baseline protection of the
foundation, to be replaced per aggregate kind by CKM, DP or secondary suppression):

    SELECT <projection over protected cells>              -- HAVING, ORDER BY, LIMIT, DISTINCT
    FROM (SELECT <keys> AS __g0, ..., <aggregate> AS __a0, <units behind it> AS __n0, ...
          FROM ... WHERE ... GROUP BY ...) AS __cells     -- the original FROM / WHERE / GROUP BY
    WHERE <HAVING over protected cells>

where every aggregate the query mentions is replaced by
``CASE WHEN __cells.__n0 >= k THEN __cells.__a0 END``. HAVING, ORDER BY, LIMIT, window
functions and any arithmetic on aggregates therefore only ever see protected values. The rule is
the threshold (minimum frequency) rule of official statistics: Hundepool et al., *Statistical
Disclosure Control* (2012), §4.2.1; the units behind a cell are its contributors (rows whose
aggregated value is not NULL), counted per privacy unit, and for joins the smallest count over
the joined confidential tables.
"""

from __future__ import annotations

from sqlglot import exp

from sqlsdc.errors import PolicyViolation
from sqlsdc.guard.analyze import own_nodes
from sqlsdc.guard.plan import CellPlan, QueryPlan

CELLS = "__cells"
STATUS_PREFIX = "__sdc_status_"
PUBLISHED, SUPPRESSED = "published", "suppressed"
MECHANISM = "threshold"


def suppress_small_cells(tree: exp.Expr, plan: QueryPlan) -> exp.Expr:
    """Return a protected copy of ``tree``; ``plan`` refers to nodes of ``tree``, left unchanged."""
    copy = tree.copy()
    twin = {id(a): b for a, b in zip(tree.walk(), copy.walk(), strict=True)}
    for exposure in plan.exposures:
        select = twin[id(exposure.select)]
        select.append("expressions", exp.alias_(exposure.expression.copy(), exposure.alias))
    for cells in plan.cells:
        protected = _protect(cells, twin)
        original = twin[id(cells.select)]
        if original is copy:
            copy = protected
        else:
            original.replace(protected)
    return copy


def _protect(plan: CellPlan, twin: dict[int, exp.Expr]) -> exp.Select:
    select: exp.Select = twin[id(plan.select)]
    keys = [twin.get(id(k), k) for k in plan.keys]
    groupings = [twin[id(g)] for g in plan.groupings]
    aggregates = [twin[id(a.node)] for a in plan.aggregates]

    inner = exp.Select()
    for i, key in enumerate(keys):
        inner.append("expressions", exp.alias_(key.copy(), f"__g{i}"))
    for i, grouping in enumerate(groupings):
        inner.append("expressions", exp.alias_(grouping.copy(), f"__gg{i}"))
    for i, (aggregate, spec) in enumerate(zip(aggregates, plan.aggregates, strict=True)):
        argument = twin.get(id(spec.argument), spec.argument) if spec.argument is not None else None
        inner.append("expressions", exp.alias_(aggregate.copy(), f"__a{i}"))
        inner.append("expressions", exp.alias_(_unit_count(argument, plan.units), f"__n{i}"))
    for key in ("from_", "joins", "where", "group"):
        value = select.args.get(key)
        if value is not None:
            inner.set(key, [v.copy() for v in value] if isinstance(value, list) else value.copy())

    def protected_value(i: int) -> exp.Expr:
        return exp.Case(ifs=[exp.If(this=_enough(i, plan), true=exp.column(f"__a{i}", CELLS))])

    def lift(node: exp.Expr) -> exp.Expr:
        return _replace_own(node, keys, groupings, aggregates, protected_value)

    conditions = []
    if plan.group_min_frequency is not None:
        inner.append("expressions", exp.alias_(_unit_count(None, plan.units), "__n"))
        conditions.append(
            exp.GTE(
                this=exp.column("__n", CELLS),
                expression=exp.Literal.number(plan.group_min_frequency),
            )
        )
    if select.args.get("having") is not None:
        conditions.append(lift(select.args["having"].this))
    outer = exp.Select(expressions=[lift(p) for p in select.expressions])
    outer.set("from_", exp.From(this=inner.subquery(CELLS)))
    if conditions:
        outer.set("where", exp.Where(this=exp.and_(*conditions)))
    for key in ("order", "limit", "offset", "distinct", "with_"):
        value = select.args.get(key)
        if value is not None:
            outer.set(key, lift(value) if key == "order" else value.copy())
    _check_lifted(outer, select)
    if plan.with_status:  # one per position, so that branches of a set operation line up
        for position, projection in enumerate(select.expressions):
            used = [i for i, a in enumerate(aggregates) if _inside(a, projection)]
            status = _status(used, plan) if used else exp.cast(exp.null(), "VARCHAR")
            outer.append("expressions", exp.alias_(status, f"{STATUS_PREFIX}{position}"))
    return outer


def _unit_count(argument: exp.Expr | None, units: list[exp.Expr] | None) -> exp.Expr:
    """Number of units contributing to a cell: rows where ``argument`` is not NULL."""
    if units is None:
        return exp.Count(this=exp.Star() if argument is None else argument.copy())
    counts = []
    for unit in units:
        counted = unit.copy()
        if argument is not None:
            condition = exp.Not(this=exp.Is(this=argument.copy(), expression=exp.null()))
            counted = exp.Case(ifs=[exp.If(this=condition, true=counted)])
        counts.append(exp.Count(this=exp.Distinct(expressions=[counted])))
    return counts[0] if len(counts) == 1 else exp.Least(this=counts[0], expressions=counts[1:])


def _enough(i: int, plan: CellPlan) -> exp.Expr:
    k = plan.aggregates[i].min_frequency
    return exp.GTE(this=exp.column(f"__n{i}", CELLS), expression=exp.Literal.number(k))


def _status(used: list[int], plan: CellPlan) -> exp.Expr:
    condition = exp.and_(*[_enough(i, plan) for i in used])
    return exp.Case(
        ifs=[exp.If(this=condition, true=exp.Literal.string(PUBLISHED))],
        default=exp.Literal.string(SUPPRESSED),
    )


def _inside(node: exp.Expr, container: exp.Expr) -> bool:
    return any(n is node for n in container.walk())


def _replace_own(node, keys, groupings, aggregates, protected_value) -> exp.Expr:
    """Copy of ``node`` with this scope's aggregates, GROUPING() calls and keys replaced."""
    aggregate_ids = {id(a): i for i, a in enumerate(aggregates)}
    grouping_ids = {id(g): i for i, g in enumerate(groupings)}

    def rebuild(current: exp.Expr) -> exp.Expr:
        if id(current) in aggregate_ids:
            return protected_value(aggregate_ids[id(current)])
        if id(current) in grouping_ids:
            return exp.column(f"__gg{grouping_ids[id(current)]}", CELLS)
        if isinstance(current, (exp.Subquery, exp.Select)):
            return current.copy()
        if (
            not isinstance(current, (exp.Alias, exp.Ordered, exp.Order, exp.Window, exp.WindowSpec))
            and current in keys
        ):
            return exp.column(f"__g{keys.index(current)}", CELLS)
        clone = current.__class__(
            **{
                k: (
                    [rebuild(v) if isinstance(v, exp.Expr) else v for v in value]
                    if isinstance(value, list)
                    else rebuild(value)
                    if isinstance(value, exp.Expr)
                    else value
                )
                for k, value in current.args.items()
            }
        )
        return clone

    return rebuild(node)


def _check_lifted(outer: exp.Select, original: exp.Select) -> None:
    """Every column the outer query reads must come from the protected cells."""
    aliases = {p.alias for p in outer.expressions if isinstance(p, exp.Alias)}
    for part in (*outer.expressions, outer.args.get("where"), outer.args.get("order")):
        if part is None:
            continue
        for n in own_nodes(part):
            if not isinstance(n, exp.Column) or n.table == CELLS:
                continue
            if part is not outer.args.get("order") or n.table or n.name not in aliases:
                raise PolicyViolation(
                    f"column {n.sql('duckdb')} must appear in GROUP BY or inside an aggregate",
                    "group by it, or aggregate it with COUNT, SUM or AVG",
                    original.sql("duckdb"),
                )
