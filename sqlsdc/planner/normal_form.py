"""Normalise SUM and AVG to protected aggregates of stored columns with constants outside.

From the :class:`~sqlsdc.planner.linear.LinearForm` ``a·x + b`` of the argument (rows where the
filter ``c`` holds, written ``x_c = CASE WHEN c THEN x END``):

=====================  ====================================================================
``SUM(a·x + b)``       ``a·SUM(x_c) + b·COUNT(x_c)``
``AVG(a·x + b)``       ``a·AVG(x_c) + b``
``SUM(b)`` (no x)      ``b·COUNT(c)`` — the protected count itself (0, not NULL, if it is 0)
``AVG(b)`` (no x)      ``CASE WHEN COUNT(c) > 0 THEN b END``
``SUM(NULL)``          ``CAST(NULL AS DOUBLE)``
=====================  ====================================================================

``COUNT(c)`` is ``COUNT(x_c)`` when a column whose coefficient cancelled (``income * 0``)
decides which rows are defined, ``COUNT(CASE WHEN c THEN 1 END)`` or ``COUNT(*)`` otherwise.
The mechanisms then protect only ``SUM(x_c)``, ``AVG(x_c)`` (the protected sum over the
protected count) and counts, so ``SUM(1)`` is exactly ``COUNT(*)``'s protected value, a scale
cannot move values across the flex function's threshold, and ``SUM(income + 1) − SUM(income)``
is a protected count, not the exact one.
"""

from __future__ import annotations

from fractions import Fraction

from sqlglot import exp

from sqlsdc.planner.linear import LinearForm

STATISTIC = "sqlsdc_statistic"  # meta key: the base columns whose value an aggregate protects
SUMMED = "sqlsdc_summed"  # meta key: the floating-point base columns a SUM/AVG adds up


def normal_form(aggregate: exp.AggFunc, form: LinearForm) -> tuple[exp.Expr, list[exp.AggFunc]]:
    """The expression replacing ``aggregate`` (``aggregate`` itself when already normal) and the
    aggregates in it."""
    if form.null:
        return exp.cast(exp.null(), "DOUBLE"), []
    condition = exp.and_(*[c.copy() for c in form.conditions]) if form.conditions else None
    core = form.core
    if core is not None:
        argument = _filtered(core, condition)
        a, b = form.scale, form.offset
        if a == 1 and b == 0 and argument == _unwrap(aggregate.this):
            return aggregate, [aggregate]
        main = aggregate.__class__(this=argument)
        value = _times(a, main)
        aggregates = [main]
        if b != 0 and isinstance(aggregate, exp.Sum):
            count = exp.Count(this=argument.copy())
            value = exp.Add(this=value, expression=_times_count(b, count))
            aggregates.append(count)
        elif b != 0:
            value = exp.Add(this=value, expression=_number(b))
        return exp.Paren(this=value), aggregates
    present = form.present
    if present:
        counted: exp.Expr = _filtered(present[0], condition)
    elif condition is not None:
        counted = exp.Case(ifs=[exp.If(this=condition, true=exp.Literal.number(1))])
    else:
        counted = exp.Star()
    count = exp.Count(this=counted)
    if isinstance(aggregate, exp.Sum):
        value = _times_count(form.offset, count)
    else:
        positive = exp.GT(this=count, expression=exp.Literal.number(0))
        value = exp.Case(ifs=[exp.If(this=positive, true=_number(form.offset))])
    return exp.Paren(this=value), [count]


def _filtered(core: exp.Expr, condition: exp.Expr | None) -> exp.Expr:
    if condition is None:
        return core.copy()
    return exp.Case(ifs=[exp.If(this=condition.copy(), true=core.copy())])


def _times(factor: Fraction, value: exp.Expr) -> exp.Expr:
    if factor == 1:
        return value
    return exp.Mul(this=_number(factor), expression=value)


def _times_count(factor: Fraction, count: exp.Count) -> exp.Expr:
    """``factor·count`` with an integer factor of 2³¹ or more as a DOUBLE, so that its product
    with the protected count (a BIGINT) cannot overflow: ``SUM(income + 1e18)`` is
    ``SUM(income) + 1e18·COUNT(income)``, and 10¹⁸ written as an integer times a count of ten
    failed in the engine ("Overflow in multiplication of INT64") where DuckDB adds ``income +
    1e18`` as a DOUBLE (red team s47a; under DP the query was charged and never answered)."""
    if factor.denominator != 1 or abs(factor) < _EXACT_FACTOR:
        return _times(factor, count)
    literal = exp.Literal.number(f"{float(abs(factor)):.17e}")  # a DOUBLE, not a DECIMAL
    number = exp.Paren(this=exp.Neg(this=literal)) if factor < 0 else literal
    return exp.Mul(this=number, expression=count)


_EXACT_FACTOR = 2**31  # an integer factor below it times a count under 2³² stays within INT64


def _number(value: Fraction) -> exp.Expr:
    """A literal: an integer as such, anything else as the nearest DOUBLE."""
    magnitude = abs(value)
    text = str(magnitude.numerator) if magnitude.denominator == 1 else repr(float(magnitude))
    literal = exp.Literal.number(text)
    return exp.Paren(this=exp.Neg(this=literal)) if value < 0 else literal


def _unwrap(node: exp.Expr) -> exp.Expr:
    while isinstance(node, exp.Paren):
        node = node.this
    return node
