"""Dominance rules for the magnitudes of the threshold rule and of rounding, in SQL.

The frequency rule counts a magnitude's non-zero contributors
(:func:`sqlsdc.rewrite.cells.frequency_count`): counting zeros, it would let ``SUM(income)
WHERE (municipality = M AND age = 94) OR income = 0`` pass on the demo's 1,877 zero incomes
and publish one person's income, exact under the threshold rule and within 50 rounded (red
team s38e). But rows of other values still pad a cell, and one contribution may dominate
many. Magnitude tables need a rule on the contributions
themselves (Hundepool et al.,
*Statistical Disclosure Control*, 2012, §4.2.2; τ-ARGUS manual §2.2; digest
``seed_2006_tabular.md`` §2), with the definitions of :mod:`sqlsdc.tabular.rules` (strict
inequalities, as τ-ARGUS and sdcTable), x1 ≥ x2 ≥ … the largest contributions and T the total:

* ``p:P`` (p%-rule): sensitive when ``T − x1 − x2 < P/100 · x1``: the second largest
  contributor would estimate the largest to within P percent;
* ``pq:P,Q``: sensitive when ``Q/100 · (T − x1 − x2) < P/100 · x1``;
* ``nk:N,K``: sensitive when ``x1 + … + xN > K/100 · T`` (and T > 0).

A contribution is a unit's total in the cell (Hundepool et al.: "the contributions of
respondents"), of absolute values for a measure with signs (GaussSuppression's choice;
τ-ARGUS and sdcTable refuse negative contributions, which a query cannot do), computed in
DOUBLE (so that ``ABS`` of a type's smallest integer cannot fail). Where every row is its own
unit (one row per unit, or a join whose rows are the driver's units) the contributions are the
rows' values, read in the aggregation itself: ``SUM(ABS(x))`` and the largest by ``MAX(ABS(x))``
and ``MAX(ABS(x), n)[j]`` (one aggregate per cell in every grouping set, no sort). Where a unit
has several rows (a unit's benefits by month), a second aggregation sums each unit's rows per
cell first (``GROUP BY unit, <the query's GROUP BY>``: a unit appended to every grouping set)
and takes T and the largest unit totals per cell; it is joined to the query's aggregation on
the cell's keys and grouping. A sum of DISTINCT values reads its distinct values as the
contributions (``SUM(DISTINCT ABS(x))``, the largest with repeats): a total no larger and
largest values no smaller than the distinct values', so the rule fires at least as often.
A unit whose rows in a cell are +5 and −5 passes the frequency rule as a contributor (one of
its rows is non-zero) and contributes its total, 0, here: beside two others T − x1 − x2 = 0,
and the p%-rule fires.

A cell that fails a rule is suppressed (NULL, as the frequency rule suppresses), its status
``suppressed``. T and the largest contributions stay in the frame's inner layers, never in what
the outer query reads. Rounding rounds what is published: a rounded sum (mean before sum) of a
dominated cell is still within the base of one person's value, so the rule reads the exact
contributions under both methods. The comparisons are of DOUBLE sums; only a cell within a
DOUBLE's relative precision of a boundary can be decided otherwise than exact arithmetic would.
"""

from __future__ import annotations

from sqlglot import exp

from sqlsdc.engines.trees import copy_tree
from sqlsdc.errors import PolicyViolation
from sqlsdc.policy import AggregateKind, Method
from sqlsdc.policy.rule_syntax import rule_arguments
from sqlsdc.rewrite.cells import Cells
from sqlsdc.rewrite.sql import cast, number

CONTRIBUTIONS = "__dm"  # the per-cell contributions of units with several rows
UNIT_TOTALS = "__du"  # each unit's totals per cell
UNIT_ROWS = "__dr"  # the same, a row per copy of a repeated grouping set
UNIT = "__duid"  # the unit of a row of UNIT_ROWS
AGGREGATED = "__c0"  # the query's aggregation, under the join with the contributions
GROUPING_ID = "__gid"


def rules(spec) -> list[tuple[str, dict]]:
    """The dominance rules of a protected aggregate: those of a magnitude under the threshold
    rule or rounding (policy ``dominance``), none otherwise."""
    if spec.kind is not AggregateKind.MAGNITUDES:
        return []
    if spec.rule.method not in (Method.THRESHOLD, Method.ROUND):
        return []
    return [rule_arguments(text) for text in spec.rule.dominance]


def largest_needed(parsed: list[tuple[str, dict]]) -> int:
    """How many largest contributions the rules read (two for p% and pq, N for nk)."""
    return max((arguments["n"] if name == "nk" else 2 for name, arguments in parsed), default=0)


def columns(i: int, count: int) -> list[str]:
    """The frame's columns of aggregate i's contributions: the total and the largest."""
    return [f"__t{i}", *(f"__x{i}_{j}" for j in range(1, count + 1))]


def add_contributions(inner: exp.Select, cells: Cells, twin) -> exp.Select:
    """The aggregation ``inner`` with, for each aggregate under a dominance rule, its total of
    contributions ``__t<i>`` and largest contributions ``__x<i>_<j>``: in ``inner`` itself
    where every row is its own unit (or the sum is of distinct values), else through a join
    of ``inner`` with the units' totals per cell (a new SELECT whose projections are aliased
    columns, in the order of ``inner``'s and then the contributions')."""
    plan = cells.plan
    by_unit = []
    for i, spec in enumerate(plan.aggregates):
        count = largest_needed(rules(spec))
        if not count:
            continue
        argument = cells.argument(i, twin)
        distinct = isinstance(cells.aggregates[i].this, exp.Distinct)
        if plan.units is None or plan.rows_are_units or distinct:
            value = exp.Distinct(expressions=[_magnitude(argument)]) if distinct else None
            total = exp.Sum(this=value or _magnitude(argument))
            inner.append("expressions", exp.alias_(total, f"__t{i}"))
            for j, top in enumerate(_largest(_magnitude(argument), count), start=1):
                inner.append("expressions", exp.alias_(top, f"__x{i}_{j}"))
        else:
            by_unit.append((i, count, argument))
    if not by_unit:
        return inner
    return _joined(inner, cells, by_unit)


def sensitive(spec, read) -> exp.Expr | None:
    """Whether the cell of ``spec`` fails one of its dominance rules (None: it has none);
    ``read(0)`` is the frame's column of the total, ``read(j)`` of the j-th largest
    contribution (:func:`contribution_reader`). A contribution past those kept reads 0: a cell
    of fewer than N contributors is dominated by them (nk)."""
    parsed = rules(spec)
    if not parsed:
        return None
    conditions = []
    for name, arguments in parsed:
        if name == "nk":
            tops = _sum([_zero(read(j)) for j in range(1, arguments["n"] + 1)])
            total = _zero(read(0))
            dominant = exp.GT(
                this=exp.Mul(this=number(100), expression=exp.Paren(this=tops)),
                expression=exp.Mul(this=_literal(arguments["k"]), expression=total),
            )
            conditions.append(exp.and_(exp.GT(this=total.copy(), expression=number(0)), dominant))
            continue
        p, q = arguments["p"], arguments.get("q", 100.0)
        x1 = _zero(read(1))
        rest = exp.Sub(
            this=exp.Sub(this=_zero(read(0)), expression=x1.copy()), expression=_zero(read(2))
        )
        conditions.append(
            exp.LT(
                this=exp.Mul(this=_literal(q), expression=exp.Paren(this=rest)),
                expression=exp.Mul(this=_literal(p), expression=x1),
            )
        )
    return exp.or_(*conditions) if len(conditions) > 1 else conditions[0]


def contribution_reader(i: int, count: int, table: str | None):
    """``read`` for :func:`sensitive`: position 0 is the total ``__t<i>``, j the j-th largest
    ``__x<i>_<j>`` (NULL past the ``count`` kept), in ``table``."""
    names = columns(i, count)

    def read(j: int) -> exp.Expr:
        if j >= len(names):
            return exp.null()
        return exp.column(names[j], table) if table else exp.column(names[j])

    return read


# -- helpers --------------------------------------------------------------------------------


def _magnitude(argument: exp.Expr) -> exp.Expr:
    """``ABS(CAST(x AS DOUBLE))``: DOUBLE first, as ABS of a type's smallest integer fails."""
    return exp.Abs(this=exp.cast(copy_tree(argument), exp.DataType.Type.DOUBLE))


def _largest(value: exp.Expr, count: int) -> list[exp.Expr]:
    """The ``count`` largest values of ``value`` in the cell (NULL past the last): ``MAX`` and
    the elements of ``MAX(value, count)`` (ties kept, NULLs ignored; portable to Spark at
    constant positions, :mod:`sqlsdc.engines.spark`)."""
    tops: list[exp.Expr] = [exp.Max(this=value)]
    for j in range(2, count + 1):
        top = exp.Max(this=value.copy(), count=number(count))
        tops.append(exp.Bracket(this=top, expressions=[number(j)], offset=1, safe=True))
    return tops


def _zero(value: exp.Expr) -> exp.Expr:
    return exp.Coalesce(this=value, expressions=[number(0)])


def _sum(parts: list[exp.Expr]) -> exp.Expr:
    total = parts[0]
    for part in parts[1:]:
        total = exp.Add(this=total, expression=part)
    return total


def _literal(value: float) -> exp.Expr:
    return number(int(value)) if float(value).is_integer() else exp.Literal.number(repr(value))


def _grouped(cells: Cells) -> bool:
    """Whether the GROUP BY has several grouping sets (ROLLUP, CUBE, GROUPING SETS)."""
    group = cells.select.args.get("group")
    if group is None:
        return False
    kinds = (exp.Rollup, exp.Cube, exp.GroupingSets)
    return any(isinstance(node, kinds) for node in group.expressions)


def _unit(cells: Cells, i: int) -> exp.Expr:
    """The units whose totals are aggregate i's contributions: those of the table the join's
    rows are (:attr:`CellPlan.row_source`), or of the one confidential table."""
    plan = cells.plan
    if plan.row_source is not None:
        return plan.units[plan.row_source]
    if len(plan.units) == 1:
        return plan.units[0]
    raise PolicyViolation(
        "the dominance rule cannot tell whose contributions this sum or average adds up "
        f"({cells.aggregates[i].sql('duckdb')})",
        "join the other tables many-to-one onto their keys (e.g. persons p JOIN households h "
        "ON p.household_id = h.household_id)",
        cells.text(),
    )


def _joined(inner: exp.Select, cells: Cells, by_unit: list) -> exp.Select:
    """``inner`` joined with the contributions of units with several rows, per cell."""
    grouped = _grouped(cells)
    keys = [exp.column(f"__g{k}") for k in range(len(cells.keys))]
    if grouped:
        inner.append("expressions", exp.alias_(_grouping(cells), GROUPING_ID))
    totals = cells.rows()
    if grouped:
        totals.append("expressions", exp.alias_(_grouping(cells), GROUPING_ID))
    units = {_unit(cells, i).sql("duckdb"): _unit(cells, i) for i, _count, _a in by_unit}
    if len(units) != 1:  # pragma: no cover - one row source per aggregation
        raise PolicyViolation("the dominance rule needs one unit per aggregation", "", cells.text())
    (unit,) = units.values()
    group = cells.clause("group")
    elements = [copy_tree(unit)] + (list(group.expressions) if group is not None else [])
    totals.set("group", exp.Group(expressions=elements))  # the unit in every grouping set
    per_cell = exp.Select()
    cell_names = [f"__g{k}" for k in range(len(cells.keys))] + ([GROUPING_ID] if grouped else [])
    for name in cell_names:
        per_cell.append("expressions", exp.alias_(exp.column(name, UNIT_TOTALS), name))
    for i, count, argument in by_unit:
        totals.append("expressions", exp.alias_(exp.Sum(this=copy_tree(argument)), f"__s{i}"))
        value = exp.Abs(this=cast(exp.column(f"__s{i}", UNIT_TOTALS), "DOUBLE"))
        per_cell.append("expressions", exp.alias_(exp.Sum(this=value), f"__t{i}"))
        for j, top in enumerate(_largest(value.copy(), count), start=1):
            per_cell.append("expressions", exp.alias_(top, f"__x{i}_{j}"))
    if grouped:
        totals = _once(totals, unit, cell_names, [i for i, _c, _a in by_unit])
    per_cell.set("from_", exp.From(this=totals.subquery(UNIT_TOTALS, copy=False)))
    cell_keys = [exp.column(name, UNIT_TOTALS) for name in cell_names]
    if cell_keys:
        per_cell.set("group", exp.Group(expressions=cell_keys))
    names = [k.alias for k in inner.expressions]
    joined = exp.Select(expressions=[exp.alias_(exp.column(n, AGGREGATED), n) for n in names])
    for i, count, _argument in by_unit:
        for name in columns(i, count):
            joined.append("expressions", exp.alias_(exp.column(name, CONTRIBUTIONS), name))
    joined.set("from_", exp.From(this=inner.subquery(AGGREGATED, copy=False)))
    matched = [
        exp.NullSafeEQ(
            this=exp.column(k.name, AGGREGATED), expression=exp.column(k.name, CONTRIBUTIONS)
        )
        for k in keys + ([exp.column(GROUPING_ID)] if grouped else [])
    ]
    on = exp.and_(*matched) if matched else exp.true()
    joined.append(
        "joins",
        exp.Join(this=per_cell.subquery(CONTRIBUTIONS, copy=False), side="LEFT", on=on),
    )
    return joined


def _once(totals: exp.Select, unit: exp.Expr, cell_names: list[str], aggregates) -> exp.Select:
    """Each unit's totals once per cell: a GROUP BY whose grouping sets repeat (``GROUPING
    SETS ((k), (k))``, ``k, ROLLUP (k)``) makes a row per copy, which ``GROUP BY unit, <the
    query's GROUP BY>`` repeats too; read as they came, a unit's total was added to T once per
    copy and was its own second largest, so that three copies (T − x1 − x2 = 3·T − 2·x1 ≥ x1)
    switched the p%-rule off (red team s40b). The copies share their keys and ``GROUPING()``,
    so the rows are grouped by unit and cell, keeping one total (``MAX``: the copies are sums
    of the same rows)."""
    totals.append("expressions", exp.alias_(copy_tree(unit), UNIT))
    once = exp.Select(
        expressions=[exp.alias_(exp.column(n, UNIT_ROWS), n) for n in cell_names]
        + [
            exp.alias_(exp.Max(this=exp.column(f"__s{i}", UNIT_ROWS)), f"__s{i}")
            for i in aggregates
        ]
    )
    once.set("from_", exp.From(this=totals.subquery(UNIT_ROWS, copy=False)))
    keys = [exp.column(UNIT, UNIT_ROWS)] + [exp.column(n, UNIT_ROWS) for n in cell_names]
    once.set("group", exp.Group(expressions=keys))
    return once


def _grouping(cells: Cells) -> exp.Expr:
    """``GROUPING(k1, …, kn)`` of the query's keys: which grouping set a row is of."""
    return exp.Grouping(expressions=[copy_tree(key) for key in cells.keys])
