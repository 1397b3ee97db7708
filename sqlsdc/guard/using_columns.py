"""A column that ``JOIN ... USING`` merges is one column, however the analyst writes it.

DuckDB binds ``region`` of ``persons p JOIN regions r USING (region)`` to the merged column and
accepts ``SELECT region ... GROUP BY p.region`` as well as ``SELECT p.region ... GROUP BY
region``. sqlglot's ``qualify`` writes the merged column as ``COALESCE(p.region, r.region)``,
which the guard's grouping check cannot match with ``p.region``, so those queries were refused
for a column they group by.

Where the join makes the two the same value, the COALESCE is written back as its first
column: :func:`merge` after :func:`mark`. That holds for an inner or LEFT join whose
``USING`` equality ties every other argument to the first (the left side, which sqlglot puts
first): in a row where the equality held the columns are equal, and in a row where it did not
(a LEFT join's unmatched row, or a row a later outer join padded) every other argument is
NULL, so the COALESCE is the first argument. Only columns of declared tables with one type are
merged, so the column keeps the type DuckDB gives the merged one. RIGHT and FULL joins, derived
tables, and COALESCEs an analyst writes in another order, are left as they are.
"""

from __future__ import annotations

from sqlglot import exp

_USING = "sqlsdc_using"


def mark(joins: list[exp.Join]) -> bool:
    """Mark the joins written with ``USING`` (``qualify`` turns them into ``ON``); whether
    there is any."""
    marked = False
    for join in joins:
        if join.args.get("using"):
            join.meta[_USING] = True
            marked = True
    return marked


def merge(tree: exp.Expr, schema: dict[str, dict[str, str]]) -> None:
    """Write each COALESCE of a marked join's merged column (:mod:`this module
    <sqlsdc.guard.using_columns>`) as its first column, in place; ``schema``: the analyst's
    ``{table: {column: type}}``."""
    for coalesce in list(tree.find_all(exp.Coalesce)):
        columns = [coalesce.this, *coalesce.expressions]
        select = coalesce.find_ancestor(exp.Select)
        if select is None or not all(isinstance(c, exp.Column) and c.table for c in columns):
            continue
        first = columns[0]
        tied = _tied_to(first, select)
        types = {_declared_type(c, select, schema) for c in columns}
        if all(c.table in tied for c in columns[1:]) and len(types) == 1 and None not in types:
            coalesce.replace(first.copy())


def _tied_to(first: exp.Column, select: exp.Select) -> set[str]:
    """The tables of ``select`` that an inner or LEFT ``USING`` join ties to ``first`` by
    ``first = <table>.<same name>``."""
    tied = set()
    for join in select.args.get("joins") or ():
        if not join.meta.get(_USING) or join.side not in ("", "LEFT"):
            continue
        if join.kind not in ("", "INNER", "OUTER"):
            continue
        on = join.args.get("on")
        for equality in on.flatten() if isinstance(on, exp.And) else [on]:
            if isinstance(equality, exp.EQ) and _is_tie(equality, first, join.alias_or_name):
                tied.add(join.alias_or_name)
    return tied


def _is_tie(equality: exp.EQ, first: exp.Column, table: str) -> bool:
    left, right = equality.this, equality.expression
    return (
        isinstance(left, exp.Column)
        and isinstance(right, exp.Column)
        and (left.table, left.name) == (first.table, first.name)
        and (right.table, right.name) == (table, first.name)
    )


def _declared_type(
    column: exp.Column, select: exp.Select, schema: dict[str, dict[str, str]]
) -> str | None:
    """The declared type of ``column`` when it reads a declared table of ``select``'s FROM
    or joins (not a derived table, nor a CTE of that name)."""
    sources = [select.args.get("from_"), *(select.args.get("joins") or ())]
    for source in sources:
        table = source.this if source is not None else None
        if isinstance(table, exp.Table) and table.alias_or_name == column.table:
            if table.db or _names_a_cte(table):
                return None
            columns = schema.get(table.name) or {}
            return columns.get(column.name)
    return None


def _names_a_cte(table: exp.Table) -> bool:
    name = table.name.lower()
    return any(
        cte.alias_or_name.lower() == name
        for with_ in (node.args.get("with_") for node in _ancestors(table))
        if isinstance(with_, exp.With)
        for cte in with_.expressions
    )


def _ancestors(node: exp.Expr):
    while node.parent is not None:
        node = node.parent
        yield node
