"""Minimum-frequency suppression: cells with fewer than k units become NULL.

The ``__cells`` frame (see :mod:`sqlsdc.rewrite.cells`) computes, next to every aggregate
``__a<i>``, the number of units behind it ``__n<i>``; the protected value is
``CASE WHEN __cells.__n<i> >= k THEN __cells.__a<i> END``. The rule is the threshold (minimum
frequency) rule of official statistics: Hundepool et al., *Statistical Disclosure Control*
(2012), §4.2.1; the units behind a cell are its contributors (rows whose aggregated value is not
NULL), counted per privacy unit, and for joins the smallest count over the joined confidential
tables.
"""

from __future__ import annotations

from sqlglot import exp

from sqlsdc.rewrite.cells import CELLS, Cells, Frame, cell_column, inner_select, unit_count

MECHANISM = "threshold"


def threshold_frame(cells: Cells, twin: dict[int, exp.Expr]) -> Frame:
    plan = cells.plan
    inner = inner_select(cells)
    add_keys(inner, cells)
    for i, aggregate in enumerate(cells.aggregates):
        inner.append("expressions", exp.alias_(aggregate.copy(), f"__a{i}"))
        count = unit_count(cells.argument(i, twin), plan.units)
        inner.append("expressions", exp.alias_(count, f"__n{i}"))

    def published(i: int) -> exp.Expr:
        return at_least(f"__n{i}", plan.aggregates[i].min_frequency)

    def value(i: int) -> exp.Expr:
        return exp.Case(ifs=[exp.If(this=published(i), true=cell_column(f"__a{i}"))])

    group = group_condition(inner, cells)
    return Frame(inner.subquery(CELLS), value, published, group)


def add_keys(inner: exp.Select, cells: Cells) -> None:
    for i, key in enumerate(cells.keys):
        inner.append("expressions", exp.alias_(key.copy(), f"__g{i}"))
    for i, grouping in enumerate(cells.groupings):
        inner.append("expressions", exp.alias_(grouping.copy(), f"__gg{i}"))


def group_condition(inner: exp.Select, cells: Cells) -> exp.Expr | None:
    """Groups of fewer than k units are dropped where the group's existence is the release."""
    k = cells.plan.group_min_frequency
    if k is None:
        return None
    inner.append("expressions", exp.alias_(unit_count(None, cells.plan.units), "__n"))
    return at_least("__n", k)


def at_least(column: str, k: int) -> exp.Expr:
    return exp.GTE(this=cell_column(column), expression=exp.Literal.number(k))
