"""DuckDB's grand totals of grouping sets over no rows, on Spark (a pass of
:mod:`sqlsdc.engines.spark_translate`, before :mod:`sqlsdc.engines.spark_semantics`).

Over no input rows, DuckDB answers one row for every empty grouping set ``()`` that a
``ROLLUP``, ``CUBE`` or ``GROUPING SETS`` expands to (keys NULL, ``COUNT(*)`` 0, ``GROUPING``
all ones): the SQL standard's grand total, which exists over no rows, as ``GROUP BY ()`` does.
Spark expands the sets into rows (``Expand``) and groups them by a grouping id, so no input
rows make no groups: ``ROLLUP (region)`` over no rows is no row at all (red team s45i; 3 of 3
shapes on the threshold demo). Spark answers a lone ``GROUPING SETS (())`` as a global
aggregate (one row, as DuckDB), and every other set the same as DuckDB, duplicates included
(both engines tested).

So a SELECT whose sets include ``()`` runs on Spark as itself ``UNION ALL`` a global
aggregate over the same FROM and WHERE, ``HAVING COUNT(*) = 0`` (and the SELECT's HAVING):
the second branch answers exactly when the first has no input rows, once per empty set the
first answered none for, with the grouping keys NULL and ``GROUPING(...)`` all ones, as
DuckDB's grand-total row. Since one branch is always empty, window functions, DISTINCT and
HAVING mean what they mean in the SELECT; its ORDER BY, LIMIT and OFFSET move to the union
(by output position).
"""

from __future__ import annotations

from sqlglot import exp

from sqlsdc.engines.spark_semantics import GROWTH, SLACK
from sqlsdc.errors import NotSupportedError

MAX_EMPTY_SETS = 8
"""The most empty grouping sets one SELECT may expand to on Spark (each is a copy of the
SELECT; DuckDB's ``GROUPING SETS ((), ())`` answers two grand totals)."""


def keep_grand_totals(tree: exp.Expr) -> exp.Expr:
    """The tree with every SELECT whose grouping sets include ``()`` answering DuckDB's grand
    totals over no rows on Spark (mutates ``tree``; returns its root).

    Raises:
        NotSupportedError: the grand total's row cannot be built from the SELECT (a key that
            is not a column, a value that reads a column other than a key, an ORDER BY term
            that is not an output column), or it expands to more than
            :data:`MAX_EMPTY_SETS` empty sets.
    """
    root = tree
    nodes = list(tree.walk(bfs=False))
    budget = [GROWTH * len(nodes) + SLACK]  # the nodes the copies may add, as they go
    for select in reversed([n for n in nodes if isinstance(n, exp.Select)]):
        missing = spark_missing_totals(select.args.get("group"))  # inner SELECTs first: a
        if not missing:  # copy of an outer one holds their unions
            continue
        if select is root:
            root = _with_grand_totals(select, missing, budget)
            continue
        branch = isinstance(select.parent, exp.SetOperation)
        hole = exp.Null()
        select.replace(hole)  # before the union adopts it
        union = _with_grand_totals(select, missing, budget)
        hole.replace(exp.Subquery(this=union) if branch else union)
    return root


def empty_sets(group: exp.Group | None) -> int:
    """How many empty grouping sets ``()`` DuckDB expands ``group`` to: the product, over the
    clause's items, of each one's (a key: none; ``()``: one; ROLLUP, CUBE: one; GROUPING SETS:
    the sum over its elements). 0 without a GROUP BY."""
    if group is None:
        return 0
    count = 1
    for item in _items(group):
        count *= _empty_sets_of(item)
    return count


def spark_missing_totals(group: exp.Group | None) -> int:
    """How many grand-total rows Spark leaves out over no rows, of those DuckDB answers: all of
    them, but a lone ``()`` (``GROUP BY ()``, ``GROUPING SETS (())``), which Spark answers as
    a global aggregate (``()`` beside other items is dropped for Spark: it changes nothing)."""
    count = empty_sets(group)
    if group is None or not count:
        return 0
    items = [item for item in _items(group) if not _is_empty(item)]
    lone = not items or (
        len(items) == 1
        and isinstance(items[0], exp.GroupingSets)
        and len(items[0].expressions) == 1
        and _is_empty(items[0].expressions[0])
    )
    return 0 if count == 1 and lone else count


def _items(group: exp.Group) -> list[exp.Expr]:
    """The items of a GROUP BY: keys, ``()``, ROLLUP, CUBE, GROUPING SETS (sqlglot keeps the
    last three in ``expressions``; older versions in arguments of their own)."""
    items = list(group.expressions)
    for kind in ("grouping_sets", "cube", "rollup"):
        items += group.args.get(kind) or []
    return items


def _is_empty(node: exp.Expr) -> bool:
    return isinstance(node, exp.Tuple) and not node.expressions


def _empty_sets_of(item: exp.Expr) -> int:
    if _is_empty(item) or isinstance(item, (exp.Cube, exp.Rollup)):
        return 1
    if isinstance(item, exp.GroupingSets):
        return sum(_empty_sets_of(e) for e in item.expressions)
    return 0


def _with_grand_totals(select: exp.Select, missing: int, budget: list[int]) -> exp.Expr:
    """``select UNION ALL`` its grand total, ``missing`` times (``select`` is reused); the
    copies' nodes are taken from ``budget[0]``: nested grouping sets copy the copies, and
    five levels of eight empty sets would be 9^5 copies of the innermost (as nested divisions
    grew, red team s44k)."""
    if missing > MAX_EMPTY_SETS:
        raise _refuse(f"its grouping sets expand to {missing} empty sets")
    budget[0] -= missing * sum(1 for _ in select.walk())
    if budget[0] < 0:
        raise _refuse(f"its grand totals would pass {GROWTH} times the query's size")
    keys = _keys(select.args["group"])
    moved = {k: select.args.get(k) for k in ("with_", "order", "limit", "offset")}
    for name in moved:
        select.set(name, None)
    order = _by_position(moved["order"], select) if moved["order"] is not None else None
    total = _grand_total(select, keys)
    union: exp.Expr = select
    for _ in range(missing):
        union = exp.Union(this=union, expression=total.copy(), distinct=False)
    for name, value in {**moved, "order": order}.items():
        if value is not None:
            union.set(name, value)
    return union


def _keys(group: exp.Group) -> list[exp.Expr]:
    """The grouping key expressions of a GROUP BY (in ROLLUP, CUBE, GROUPING SETS and their
    tuples), each a column or a computation over columns."""
    keys: list[exp.Expr] = []

    def add(node: exp.Expr) -> None:
        if isinstance(node, (exp.Tuple, exp.Paren, exp.Cube, exp.Rollup, exp.GroupingSets)):
            for inner in node.expressions if not isinstance(node, exp.Paren) else [node.this]:
                add(inner)
            return
        if node.find(exp.Column) is None:
            raise _refuse(f"its group key {node.sql('duckdb')[:40]} is not a column")
        if node not in keys:
            keys.append(node)

    for item in _items(group):
        add(item)
    return keys


def _grand_total(select: exp.Select, keys: list[exp.Expr]) -> exp.Select:
    """DuckDB's grand-total row of ``select`` over no rows, and no row otherwise: the same
    values over ``GROUP BY ()``, keys NULL, ``GROUPING`` all ones, ``HAVING COUNT(*) = 0``."""
    total = select.copy()
    total.set("group", exp.Group(expressions=[exp.Tuple()]))
    for name in ("expressions", "having", "qualify", "windows"):
        value = total.args.get(name)
        for node in value if isinstance(value, list) else [value] if value else []:
            _check_rolled_up(_roll_up(node, keys))
    empty = exp.EQ(this=exp.Count(this=exp.Star()), expression=exp.Literal.number(0))
    having = total.args.get("having")
    condition = exp.and_(empty, exp.Paren(this=having.this)) if having else empty
    total.set("having", exp.Having(this=condition))
    return total


def _roll_up(node: exp.Expr, keys: list[exp.Expr], window: bool = False) -> exp.Expr:
    """``node`` (mutated) as the grand total's row computes it: a key (outside aggregates, as
    DuckDB binds an expression equal to a key to the key) is NULL, ``GROUPING(a, b)`` is 3."""
    if node in keys:
        return _replaced(node, exp.Null())
    if isinstance(node, exp.Grouping):
        ones = exp.Literal.number(2 ** len(node.expressions) - 1)
        return _replaced(node, exp.Cast(this=ones, to=exp.DataType.build("BIGINT")))
    if _aggregate(node) and not window or isinstance(node, (exp.Query, exp.Subquery)):
        return node  # over the rows (none), or a scope of its own
    for child in list(node.iter_expressions()):
        into = isinstance(node, exp.Window) and child is node.this
        _roll_up(child, keys, window=into or (window and isinstance(node, exp.Filter)))
    return node


def _replaced(node: exp.Expr, new: exp.Expr) -> exp.Expr:
    if node.parent is not None:
        node.replace(new)
    return new


def _aggregate(node: exp.Expr) -> bool:
    """An aggregate call: ``COUNT(x)``, ``COUNT(*) FILTER (WHERE c)`` (or a window's)."""
    return isinstance(node, exp.AggFunc) or (
        isinstance(node, exp.Filter) and isinstance(node.this, exp.AggFunc)
    )


def _check_rolled_up(node: exp.Expr) -> None:
    """Refuse a grand-total value that still reads a column outside an aggregate: DuckDB reads
    a key there (an alias or a position Spark would not read alike)."""
    stack = [node]
    while stack:
        current = stack.pop()
        if isinstance(current, (exp.Column, exp.Star)) and not _in_aggregate(current, node):
            raise _refuse(
                f"its value {current.sql('duckdb')[:40]} reads a column that is not a group key"
            )
        if not isinstance(current, (exp.Query, exp.Subquery)):
            stack.extend(current.iter_expressions())


def _in_aggregate(node: exp.Expr, top: exp.Expr) -> bool:
    """Whether ``node`` is an argument of an aggregate of the grouping (not a window's)."""
    while node is not top and node.parent is not None:
        parent = node.parent
        if _aggregate(parent):
            holder = parent.parent
            if holder is not None and _aggregate(holder):  # the call of a FILTER
                holder = holder.parent
            if not isinstance(holder, exp.Window):
                return True
        node = parent
    return False


def _by_position(order: exp.Order, select: exp.Select) -> exp.Order:
    """``order`` over the union: each term as the position of the output column it names (a
    position, an output name, or an expression equal to an output column's)."""
    projections = select.expressions
    terms = []
    for ordered in order.expressions:
        term = ordered.this
        position = None
        if isinstance(term, exp.Literal) and term.is_int:
            position = int(term.this)
        else:
            for i, projection in enumerate(projections, start=1):
                named = isinstance(term, exp.Column) and not term.table
                if projection.unalias() == term or (named and projection.alias == term.name):
                    position = i
                    break
        if position is None:
            raise _refuse(f"its ORDER BY term {term.sql('duckdb')[:40]} is not an output column")
        new = ordered.copy()
        new.set("this", exp.Literal.number(position))
        terms.append(new)
    return exp.Order(expressions=terms)


def _refuse(why: str) -> NotSupportedError:
    return NotSupportedError(
        "a ROLLUP, CUBE or GROUPING SETS with an empty set () answers DuckDB's grand total over "
        f"no rows on Spark as a separate aggregate, and {why}: not portable to Spark; run this "
        "query on DuckDB"
    )
