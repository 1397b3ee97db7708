"""Cells a protected query computes but does not release one by one: what a cell limit must
count beyond the ledger's rows.

The ledger holds one row per released value. A query whose answer is a function of more cells
than it shows tells about all of them: a HAVING over protected values hides the groups it
filters out and says on which side of its bound each lies (``HAVING COUNT(*) >= 5`` over many
groups, none shown, costs nothing in released cells), so do a LIMIT, a DISTINCT, a join of the
cells with a public table, an outer query or derived table over them (``SUM(c)`` of a derived
table of counts) and an output column combining several aggregates (``c1 + 1000 * c2`` carries
two counts in one value). Under a cell limit (:mod:`sqlsdc.catalog.cell_limits`) such a query is
charged every cell of its ``__cells`` frames: their groups (counted by running the frame once
more in the answer's transaction, so the extra engine time falls on these shapes only) times
their protected aggregates.

A frame is *plain* when the SELECT reading it is the statement
itself (or a branch of a UNION ALL that is) with no condition but the mechanism's own group
condition (``__cells.x > 0 OR __cells.x IS NULL``: a group whose count is published as 0 is
left out, as if published), no LIMIT, OFFSET, DISTINCT, QUALIFY, join or window, no output
column reading two aggregates, and no ORDER BY of an aggregate no output column shows as it is
(the order of the groups by it tells about every one of them). Its cells are all in the
ledger but those of the groups its group condition left out (a count published as 0 leaves no
row, and says so): a total (no GROUP BY) missing from the answer is one group of hidden cells,
a GROUP BY's are counted.
"""

from __future__ import annotations

import re

from sqlglot import exp

from sqlsdc.rewrite.cells import CELLS

_AGGREGATE = re.compile(r"^__y\d+$")


def _aggregates(frame: exp.Subquery) -> int:
    """The protected aggregates of a frame: its ``__y<i>`` outputs (at least one)."""
    inner = frame.this
    names = {e.alias_or_name for e in inner.expressions} if isinstance(inner, exp.Select) else set()
    return max(1, sum(1 for n in names if _AGGREGATE.match(n)))


def _group_condition(where: exp.Expr) -> bool:
    """Whether ``where`` is the mechanism's own ``__cells.x > 0 OR __cells.x IS NULL``."""
    where = where.unnest()
    if not isinstance(where, exp.Or):
        return False
    left, right = where.this.unnest(), where.expression.unnest()
    if not (isinstance(left, exp.GT) and isinstance(right, exp.Is)):
        return False
    column, zero = left.this, left.expression
    return (isinstance(column, exp.Column) and column.table == CELLS
            and isinstance(zero, exp.Literal) and zero.this == "0"
            and isinstance(right.expression, exp.Null)
            and right.this == column)  # fmt: skip


def _at_top(select: exp.Select, root: exp.Expr) -> bool:
    node = select
    while node is not root:
        parent = node.parent
        if not (isinstance(parent, exp.Union) and parent.args.get("distinct") is False):
            return False
        node = parent
    return True


def _plain(select: exp.Select, root: exp.Expr) -> bool:
    if any(select.args.get(k) for k in ("limit", "offset", "distinct", "qualify", "having",
                                        "group", "joins", "laterals")):  # fmt: skip
        return False
    where = select.args.get("where")
    if where is not None and not _group_condition(where.this):
        return False
    if not _at_top(select, root):
        return False
    shown = set()  # the aggregates an output column shows as they are
    for projection in select.expressions:
        if projection.find(exp.Window, exp.Subquery) is not None:
            return False
        read = {c.name for c in projection.find_all(exp.Column) if _AGGREGATE.match(c.name)}
        if len(read) > 1:
            return False
        bare = projection.unalias()
        if isinstance(bare, exp.Column) and _AGGREGATE.match(bare.name):
            shown.add(bare.name)
    # an ORDER BY of an aggregate not shown as it is ranks every group by it: 8 regions by
    # SUM(income), a municipality's ages by a count of any subset, none in the ledger (s49n)
    order = select.args.get("order")
    ordered = {c.name for c in order.find_all(exp.Column)} if order is not None else set()
    return not {name for name in ordered if _AGGREGATE.match(name)} - shown


def _keyed(frame: exp.Subquery) -> bool:
    """Whether the frame's aggregation has a GROUP BY (its outer layers read ``__s.*``, so
    the keys are not named there): without, it is one group, the total."""
    return frame.find(exp.Group) is not None


def _groups(frame: exp.Subquery) -> exp.Expr:
    """What has one row per group of the frame, cheapest: the aggregation under its layers
    (each reads the one below ``FROM (...) AS __s`` and LEFT JOINs perturbation-table rows,
    one per cell, keeping its rows), else the frame itself."""
    node = frame.this
    while isinstance(node, exp.Select) and not node.args.get("group"):
        source = node.args.get("from_") or node.args.get("from")
        if node.args.get("where") is not None or source is None:
            return frame
        inner = source.this
        if not isinstance(inner, exp.Subquery) or any(
            join.side != "LEFT" for join in node.args.get("joins") or []
        ):
            return frame
        node = inner.this
    return node.parent if isinstance(node, exp.Select) and node.parent is not None else frame


def opaque_frames(tree: exp.Expr | None) -> list[tuple[exp.Expr | None, int, bool]]:
    """The frames of ``tree`` whose cells the answer may not show one by one: each as a
    statement counting its groups (the frame under the statement's WITH; None for a plain
    total, one group), its number of aggregates, and whether it is plain (then only the
    groups its group condition left out, published as 0, are hidden). ``tree`` is not
    changed."""
    if tree is None:
        return []
    found = []
    for frame in tree.find_all(exp.Subquery):
        if frame.alias != CELLS:
            continue
        select = frame.parent.parent if isinstance(frame.parent, exp.From) else None
        plain = isinstance(select, exp.Select) and _plain(select, tree)
        if plain and select.args.get("where") is None:
            continue  # every group shown
        count = None
        if not plain or _keyed(frame):
            count = exp.select(exp.Count(this=exp.Star())).from_(_groups(frame).copy())
            with_ = tree.args.get("with_")  # the statement's CTEs, which the frame may read
            if with_ is not None:  # (WITH r(a) AS ..., AS MATERIALIZED: kept by the guard)
                count.set("with_", with_.copy())
        found.append((count, _aggregates(frame), plain))
    return found


def hidden_cells(con, tree: exp.Expr | None, to_sql, run, shown: int) -> tuple[int, bool]:
    """The cells of ``tree``'s frames that its answer of ``shown`` rows does not show one by
    one (0 when there are none): of a frame that is not plain its groups times aggregates; of
    a plain one (the statement itself) the groups left out as published 0. Groups are counted
    with ``run`` (SQL text → Arrow table) in the caller's transaction; the second value says
    whether any was (else the cells were known from the answer alone, at no cost)."""
    total, counted = 0, False
    for count, aggregates, plain in opaque_frames(tree):
        groups = 1 if count is None else int(run(to_sql(count)).column(0)[0].as_py() or 0)
        counted = counted or count is not None
        total += (max(groups - shown, 0) if plain else groups) * aggregates
    return total, counted
