"""Minimum-frequency suppression: cells with fewer than k units become NULL.

The ``__cells`` frame (see :mod:`sqlsdc.rewrite.cells`) computes, next to every aggregate
``__a<i>``, the number of units behind it ``__n<i>``; the protected value is
``CASE WHEN __cells.__n<i> >= k THEN __cells.__a<i> END``. The rule is the threshold (minimum
frequency) rule of official statistics: Hundepool et al., *Statistical Disclosure Control*
(2012), §4.2.1; the units behind a cell are its contributors (rows whose aggregated value is not
NULL, and for a SUM or AVG not 0: :func:`~sqlsdc.rewrite.cells.frequency_count`), counted per
privacy unit, and for joins the smallest count over the joined confidential tables.

A magnitude is also suppressed when its dominance rules find its cell sensitive
(:mod:`sqlsdc.rewrite.dominance`; the p%-rule by default): its contributions ``__t<i>``,
``__x<i>_<j>`` are computed in the aggregation ``__c`` and a layer over it publishes
``__y<i>`` with the verdict ``__p<i>``, so that they never reach the outer query.
"""

from __future__ import annotations

import re

from sqlglot import exp

from sqlsdc.catalog.ptables import KEY_MODULUS
from sqlsdc.engines.trees import copy_tree
from sqlsdc.rewrite.cells import (
    CELLS,
    Cells,
    Frame,
    cell_column,
    frequency_count,
    inner_select,
    unit_count,
    when_present,
)
from sqlsdc.rewrite.dominance import (
    add_contributions,
    contribution_reader,
    largest_needed,
    rules,
    sensitive,
)

MECHANISM = "threshold"
AGGREGATION = "__c"  # the aggregation, under the layer of a dominance rule's verdicts
CONTRIBUTION = re.compile(r"__t\d+|__x\d+_\d+|__gid")  # what stays in the aggregation


def threshold_frame(cells: Cells, twin: dict[int, exp.Expr]) -> Frame:
    plan = cells.plan
    inner = inner_select(cells)
    add_keys(inner, cells)
    for i, aggregate in enumerate(cells.aggregates):
        inner.append("expressions", exp.alias_(aggregate.copy(), f"__a{i}"))
        count = frequency_count(plan.aggregates[i], cells.argument(i, twin), plan.units)
        inner.append("expressions", exp.alias_(count, f"__n{i}"))

    group = group_condition(inner, cells)
    dominated = [i for i, spec in enumerate(plan.aggregates) if largest_needed(rules(spec))]
    if dominated:
        inner = _dominance_layer(add_contributions(inner, cells, twin), cells, dominated)

    def published(i: int) -> exp.Expr:
        if i in dominated:
            return cell_column(f"__p{i}")
        return at_least(f"__n{i}", plan.aggregates[i].min_frequency)

    def value(i: int) -> exp.Expr:
        if i in dominated:
            return cell_column(f"__y{i}")
        return exp.Case(ifs=[exp.If(this=published(i), true=cell_column(f"__a{i}"))])

    return Frame(inner.subquery(CELLS, copy=False), value, published, group)


def _dominance_layer(inner: exp.Select, cells: Cells, dominated: list[int]) -> exp.Select:
    """A layer over the aggregation ``__c`` that publishes each aggregate under a dominance
    rule as ``__y<i>`` (its exact value where the frequency rule passes and the rule does not
    fire, else NULL) with the verdict ``__p<i>``; the contributions stay in ``__c``."""
    layer = exp.Select(
        expressions=[
            exp.alias_(exp.column(p.alias, AGGREGATION), p.alias)
            for p in inner.expressions
            if not CONTRIBUTION.fullmatch(p.alias)
        ]
    )
    layer.set("from_", exp.From(this=inner.subquery(AGGREGATION, copy=False)))
    for i in dominated:
        spec = cells.plan.aggregates[i]
        counted = exp.GTE(
            this=exp.column(f"__n{i}", AGGREGATION),
            expression=exp.Literal.number(spec.min_frequency),
        )
        shown = without_dominance(counted, spec, i, AGGREGATION)
        value = exp.Case(ifs=[exp.If(this=shown, true=exp.column(f"__a{i}", AGGREGATION))])
        layer.append("expressions", exp.alias_(value, f"__y{i}"))
        layer.append("expressions", exp.alias_(shown.copy(), f"__p{i}"))
    return layer


def without_dominance(counted: exp.Expr, spec, i: int, table: str) -> exp.Expr:
    """``counted`` (the frequency rule passed), and aggregate i's cell not sensitive by its
    dominance rules (:mod:`sqlsdc.rewrite.dominance`), its contributions read from ``table``."""
    count = largest_needed(rules(spec))
    if not count:
        return counted
    fired = sensitive(spec, contribution_reader(i, count, table))
    return exp.and_(counted, exp.Not(this=exp.Paren(this=fired)))


def add_keys(inner: exp.Select, cells: Cells) -> None:
    """The keys and GROUPING() values as the frame's columns: one copy of each, types shared
    (``alias_`` copies what it is given unless told not to)."""
    for i, key in enumerate(cells.keys):
        inner.append("expressions", exp.alias_(copy_tree(key), f"__g{i}", copy=False))
    for i, grouping in enumerate(cells.groupings):
        inner.append("expressions", exp.alias_(copy_tree(grouping), f"__gg{i}", copy=False))


def group_condition(inner: exp.Select, cells: Cells) -> exp.Expr | None:
    """Where the group's existence is the release (no aggregate, or rows an outer query counts
    or tests), a group appears when its units reach the minimum frequency: exactly what the
    query's own result tells by a count published or NULL, and nothing more.

    Keyed noise on this decision told more (red team s39a): a group of n units appeared when
    n + noise reached k (noise uniform on [−w, w]), so next to the own result, where a count is
    NULL exactly when n < k, a group hidden there but present as data had n ≥ k − w, and one
    published there but absent as data n < k + w: under rounding's k = 3 (w = 1) exact counts
    of 2 and 3 behind a NULL and a rounded 0 or 5 (59 and 47 groups of municipality x age aged
    80+, all right); under the threshold rule 6 to 9 persons where NULL says 1 to 9. Group
    presence in the own result keeps the threshold rule's documented behaviour (a row with
    NULL values), a known limit of this baseline (README, threat model)."""
    k = cells.plan.group_min_frequency
    if k is None:
        return None
    inner.append("expressions", exp.alias_(unit_count(None, cells.plan.units), "__n"))
    return at_least("__n", k)


def records_key(plan, argument: exp.Expr | None, spec_argument: exp.Expr | None) -> exp.Expr:
    """``SUM(rkey) % 2^32`` over the records behind a cell (as :mod:`sqlsdc.rewrite.ckm`): the
    rows of a single table, of the table whose rows the join's rows are
    (:attr:`CellPlan.row_source`), or the distinct units of the counted unit
    (``COUNT(DISTINCT unit)``) or, failing those, the distinct records of every table."""
    counted = [t for t, unit in enumerate(plan.units or []) if unit == spec_argument]
    if plan.units is None:
        total = exp.Sum(this=when_present(plan.rkeys[0], argument))
    elif not counted and plan.row_source is not None:
        total = exp.Sum(this=when_present(plan.rkeys[plan.row_source], argument))
    else:
        distinct = [
            exp.Sum(this=exp.Distinct(expressions=[when_present(plan.rkeys[t], argument)]))
            for t in counted or range(len(plan.rkeys))
        ]
        parts = [exp.Coalesce(this=d, expressions=[exp.Literal.number(0)]) for d in distinct]
        total = parts[0]
        for part in parts[1:]:
            total = exp.Add(this=total, expression=part)
    total = exp.Coalesce(this=total, expressions=[exp.Literal.number(0)])
    return exp.Mod(this=exp.Paren(this=total), expression=exp.Literal.number(KEY_MODULUS))


def at_least(column: str, k: int) -> exp.Expr:
    return exp.GTE(this=cell_column(column), expression=exp.Literal.number(k))
