"""Cell suppression in the query path: cells are read from the table's protected universe.

Under ``method: suppress`` a query never aggregates the confidential rows itself. Its cells are
cells of the table's suppression universe (:mod:`sqlsdc.tabular.universe`), protected once by
primary and secondary suppression and audited, and stored in the catalog as
``sqlsdc.suppressed__<table>``. The ``__cells`` frame selects them: one branch per grouping set
of the query, each reading the universe cells at the level that grouping set and the WHERE
filters fix (``GROUP BY nace WHERE region = 'R01'`` reads the cells ``(nace, R01)``).
Suppressed cells hold NULL, so HAVING, ORDER BY and LIMIT only see published values, and no
pair of queries can be differenced into a suppressed cell: they all come from one pattern.

That shape is what the frame can map onto universe cells, and everything else is refused:
one confidential table, GROUP BY over universe columns (ROLLUP, CUBE and GROUPING SETS
included), WHERE as ``column = constant`` conditions joined by AND, and the aggregates
COUNT(*) (one row per unit), COUNT(DISTINCT unit), SUM(measure) and AVG(measure).
"""

from __future__ import annotations

import itertools

from sqlglot import exp

from sqlsdc.catalog.store import pattern_table
from sqlsdc.errors import PolicyViolation
from sqlsdc.policy import ColumnRole, Method, Policy
from sqlsdc.rewrite.cells import CELLS, Cells, Frame, cell_column
from sqlsdc.tabular.universe import CONTRIBUTORS, COUNT, EVERY, LEVEL, STATUS, VALUE, universe_of

MECHANISM = "suppress"
SOURCE = "__sup"
MAX_GROUPING_SETS = 256
SHAPE = (
    "under suppression ask: SELECT <dimensions>, COUNT(*) | SUM(m) | AVG(m) FROM <table> "
    "[WHERE dimension = value AND ...] GROUP BY <dimensions> (ROLLUP, CUBE, GROUPING SETS allowed)"
)


def suppress_frame(policy: Policy):
    """Frame builder for aggregations whose aggregates are all protected by suppression."""

    def build(cells: Cells, _twin) -> Frame:
        select = cells.select
        table = _source_table(cells, policy)
        universe = universe_of(policy, table.name)
        positions = {c: j for j, c in enumerate(universe.columns)}
        keys = [_universe_column(k, positions, select, "group by") for k in cells.keys]
        filters = _filters(select.args.get("where"), positions, select)
        aggregates = [_aggregate(a, table, cells, select) for a in cells.aggregates]
        if any(a != COUNT for a, _avg in aggregates) and universe.magnitudes is None:
            _refuse(select, f"{table.name} does not protect magnitudes by suppression")
        if any(a == COUNT or avg for a, avg in aggregates) and universe.counts is None:
            _refuse(select, f"{table.name} does not protect counts by suppression")
        branches = [
            _branch(cells, universe, keys, filters, aggregates, present)
            for present in grouping_sets(select, cells.keys)
        ]
        union = branches[0]
        for branch in branches[1:]:
            union = exp.Union(this=union, expression=branch, distinct=False)
        source = exp.Subquery(this=union, alias=exp.TableAlias(this=exp.to_identifier(CELLS)))
        return Frame(
            source,
            value=lambda i: cell_column(f"__a{i}"),
            published=lambda i: cell_column(f"__p{i}"),
        )

    return build


def grouping_sets(select: exp.Select, keys: list[exp.Expr]) -> list[frozenset[int]]:
    """The grouping sets of a GROUP BY, as sets of positions in ``keys``."""
    group = select.args.get("group")
    if group is None:
        return [frozenset()]
    factors = [_sets(node, keys) for node in group.expressions]
    combined = {frozenset().union(*choice) for choice in itertools.product(*factors)}
    if len(combined) > MAX_GROUPING_SETS:
        _refuse(select, f"more than {MAX_GROUPING_SETS} grouping sets")
    return sorted(combined, key=lambda s: (-len(s), sorted(s)))


def _sets(node: exp.Expr, keys: list[exp.Expr]) -> list[frozenset[int]]:
    if isinstance(node, exp.Paren):
        return _sets(node.this, keys)
    if isinstance(node, exp.Tuple):
        return [frozenset().union(*(s for part in node.expressions for s in _sets(part, keys)))]
    if isinstance(node, exp.Rollup):
        parts = [frozenset().union(*_sets(part, keys)) for part in node.expressions]
        return [frozenset().union(*parts[:n]) for n in range(len(parts) + 1)]
    if isinstance(node, exp.Cube):
        parts = [frozenset().union(*_sets(part, keys)) for part in node.expressions]
        return [
            frozenset().union(*chosen)
            for n in range(len(parts) + 1)
            for chosen in itertools.combinations(parts, n)
        ]
    if isinstance(node, exp.GroupingSets):
        return [s for part in node.expressions for s in _sets(part, keys)]
    return [frozenset({keys.index(node)})]


def _source_table(cells: Cells, policy: Policy):
    select = cells.select
    methods = {a.rule.method for a in cells.plan.aggregates}
    if not methods <= {Method.SUPPRESS}:  # none: a group-only query, whose cells are these
        _refuse(
            select,
            "this query mixes aggregates protected by suppression with others; ask them in "
            "separate queries",
        )
    if not cells.plan.with_status:
        _refuse(select, "a suppressed table can only be the query's result, not feed another query")
    source = select.args.get("from_")
    if select.args.get("joins") or source is None or not isinstance(source.this, exp.Table):
        _refuse(select, "suppressed cells come from one table, without joins or subqueries")
    return policy.table(source.this.name)


def _universe_column(node: exp.Expr, positions: dict[str, int], select, where: str) -> str:
    if isinstance(node, exp.Column) and node.name.lower() in positions:
        return node.name.lower()
    _refuse(
        select,
        f"{where} {node.sql('duckdb')}: only the columns of the suppression universe "
        f"({', '.join(positions)}) can be used",
    )


def _filters(where: exp.Where | None, positions, select) -> dict[str, exp.Expr]:
    """``{column: constant}`` from ``col = constant AND ...``; any other condition is refused."""
    if where is None:
        return {}
    condition = where.this
    conjuncts = condition.flatten() if isinstance(condition, exp.And) else [condition]
    filters: dict[str, exp.Expr] = {}
    for conjunct in conjuncts:
        while isinstance(conjunct, exp.Paren):
            conjunct = conjunct.this
        if isinstance(conjunct, exp.EQ):
            column, constant = conjunct.left, conjunct.right
            if not isinstance(column, exp.Column):
                column, constant = constant, column
            if isinstance(column, exp.Column) and isinstance(constant, exp.Literal):
                name = _universe_column(column, positions, select, "WHERE")
                if name in filters and filters[name] != constant:
                    filters[name] = exp.null()  # two values: no cell matches
                else:
                    filters[name] = constant
                continue
        _refuse(
            select,
            f"WHERE {conjunct.sql('duckdb')}: under suppression only `dimension = value` "
            "conditions joined by AND select cells of the protected table",
        )
    return filters


def _aggregate(node: exp.AggFunc, table, cells: Cells, select) -> tuple[str, bool]:
    """``(universe aggregate, is AVG)`` for COUNT(*), COUNT(DISTINCT unit), SUM/AVG(measure)."""
    argument = node.this
    if isinstance(node, exp.Count):
        if isinstance(argument, exp.Star) and cells.plan.units is None:
            return COUNT, False
        if (
            isinstance(argument, exp.Distinct)
            and len(argument.expressions) == 1
            and isinstance(argument.expressions[0], exp.Column)
            and argument.expressions[0].name.lower() == table.privacy_unit
        ):
            return COUNT, False
    elif isinstance(node, (exp.Sum, exp.Avg)) and isinstance(argument, exp.Column):
        column = table.column(argument.name)
        if column is not None and column.role is ColumnRole.MEASURE:
            return column.name, isinstance(node, exp.Avg)
    _refuse(select, f"{node.sql('duckdb')} is not a protected aggregate of the suppressed table")


def _branch(cells, universe, keys, filters, aggregates, present: frozenset[int]) -> exp.Select:
    """Cells of one grouping set: the universe level it fixes, keys NULL where rolled up."""
    source = exp.column
    fixed = {keys[i] for i in present} | set(filters)
    level = 0
    bit = 0
    for _name, levels in universe.groups:
        deepest = max((d for d, c in enumerate(levels) if c in fixed), default=-1)
        for depth in range(len(levels)):
            if depth > deepest:
                level |= 1 << bit
            bit += 1
    conditions = [exp.EQ(this=source(LEVEL, SOURCE), expression=exp.Literal.number(level))]
    for name, constant in filters.items():
        conditions.append(exp.EQ(this=source(name, SOURCE), expression=constant.copy()))
    projections = []
    for i, key in enumerate(keys):
        value = source(key, SOURCE) if i in present else exp.null()
        projections.append(exp.alias_(value, f"__g{i}"))
    for j, grouping in enumerate(cells.groupings):
        projections.append(exp.alias_(_grouping_value(grouping, cells.keys, present), f"__gg{j}"))
    empty = not present  # a grand total exists even when no row matches, as in SQL
    for i, (aggregate, avg) in enumerate(aggregates):
        value, published = _protected(aggregate, avg, empty, _every_value(universe, aggregate))
        projections += [exp.alias_(value, f"__a{i}"), exp.alias_(published, f"__p{i}")]
    pattern = pattern_table(universe.table)
    pattern.set("alias", exp.TableAlias(this=exp.to_identifier(SOURCE)))
    if not empty:
        return exp.select(*projections).from_(pattern).where(exp.and_(*conditions))
    one = exp.select(exp.alias_(exp.Literal.number(1), "__one")).subquery("__one")
    join = exp.Join(this=pattern, side="LEFT", on=exp.and_(*conditions))
    return exp.select(*projections).from_(one).join(join)


def _grouping_value(grouping: exp.Grouping, keys, present: frozenset[int]) -> exp.Expr:
    """``GROUPING(a, b, ...)``: bit set (first argument highest) for each rolled-up key."""
    value = 0
    for argument in grouping.expressions:
        value = value * 2 + (0 if keys.index(argument) in present else 1)
    return exp.Literal.number(value)


def _every_value(universe, aggregate: str) -> exp.Expr:
    """Whether every unit of the table has a value of the measure ``aggregate`` (its
    contributors are the units at the grand total, every bit of ``__level`` set), one fact
    about the whole table that the pattern keeps whatever the grand total's status: read off
    the published total, every AVG went NULL once a revision hid it (red team s43e: one new
    enterprise, AVG(turnover) published in 69 cells, then in none)."""
    bits = sum(len(levels) for _name, levels in universe.groups)
    whole = exp.select(exp.column(f"{aggregate}{EVERY}"))
    whole = whole.from_(pattern_table(universe.table)).where(
        exp.EQ(this=exp.column(LEVEL), expression=exp.Literal.number((1 << bits) - 1))
    )
    return exp.func("COALESCE", whole.subquery(), exp.false())


def _protected(aggregate: str, avg: bool, empty: bool, every_value: exp.Expr
               ) -> tuple[exp.Expr, exp.Expr]:  # fmt: skip
    """Value and published-condition of one aggregate in a universe row.

    An AVG is its published sum over its published count, so it is published only where the
    measure's contributors are the cell's units; that is asked of the whole table
    (``every_value``), never of the cell: per cell, a NULL AVG next to a published SUM and
    COUNT told that someone in it has no value (red team s32b: 130 of the demo's 272
    published municipality x sex cells, each "one of these persons has no income")."""

    def col(suffix: str, name: str = aggregate) -> exp.Column:
        return exp.column(f"{name}{suffix}", SOURCE)

    def is_published(name: str) -> exp.Expr:
        return exp.EQ(this=col(STATUS, name), expression=exp.Literal.string("published"))

    missing = exp.Is(this=exp.column(LEVEL, SOURCE), expression=exp.null())
    if aggregate == COUNT:
        value, published = col(VALUE), is_published(COUNT)
        if empty:  # no cell: the count is 0, as SQL says; a suppressed cell stays NULL
            value = exp.Case(ifs=[exp.If(this=missing.copy(), true=exp.Literal.number(0))])
            value.set("default", col(VALUE))
            published = exp.or_(missing, published)
        return value, published
    if not avg:
        published = is_published(aggregate)
        return col(VALUE), exp.or_(missing, published) if empty else published
    published = exp.and_(is_published(aggregate), is_published(COUNT), every_value)
    value = exp.Div(this=col(VALUE), expression=col(CONTRIBUTORS), typed=False, safe=True)
    value = exp.Case(ifs=[exp.If(this=published.copy(), true=value)])
    return value, exp.or_(missing, published) if empty else published


def _refuse(select: exp.Select, what: str):
    raise PolicyViolation(what, SHAPE, select.sql("duckdb"))
