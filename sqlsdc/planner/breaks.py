"""Class breaks: the only values a condition on confidential rows may compare a measure with.

A condition on a measure at any cut point (``income > x``) is a yes/no question about one
person once the cell around them is padded with known others: the published counts of the cell
with and without the person differ, whatever the noise, because consistent noise gives the same
population the same answer every time. Bisection on x then finds the person's income to the
cent in about 30 queries. Tables published by statistics offices answer the same need with
size classes; so do we: a measure (or weight) may only be compared with its class breaks —
those the policy declares (``breaks:``), else 0 and 1, 2, 5 times the powers of ten within the
column's bounds — as a plain column, so that the most a bisection can learn is the class.
Tables whose counts and magnitudes are both protected by differential privacy need no breaks:
their noise is fresh per population and every question is charged (a table whose magnitudes
alone use DP answers counts by another method, exact or keyed and free: red team s36b).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from contextvars import ContextVar

from sqlglot import exp

from sqlsdc.engines.trees import of_kind
from sqlsdc.errors import PolicyViolation
from sqlsdc.planner.scopes import NESTED, own_nodes
from sqlsdc.policy import Column, ColumnRole

COMPARISONS = (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.NullSafeEQ, exp.NullSafeNEQ)
_COMPARED = (*COMPARISONS, exp.Between, exp.In)
CLASSED_ROLES = {ColumnRole.MEASURE, ColumnRole.WEIGHT}
MANTISSAS = (1, 2, 5)
DEFAULT_RANGE = (0.0, 1e15)
UNBOUND_META = "sqlsdc_unbound"
"""Marks the NULL a parameter not sent yet is bound as, while a statement is described
(:mod:`sqlsdc.guard.unbound`): taken for a break, as its value is not known; the Execute is
checked again with the value bound."""
DESCRIBING: ContextVar[bool] = ContextVar("sqlsdc_describing", default=False)
"""Set while a statement is described: only then is a marked NULL taken for a break. An
analyst can mark a NULL too (sqlglot reads ``NULL /* sqlglot.meta sqlsdc_unbound */`` as
one), so outside a describe the mark is ignored (s50m)."""


def class_breaks(column: Column) -> tuple[float, ...]:
    """The declared breaks of ``column``, or 0 and ±{1, 2, 5}·10^k within its bounds."""
    if column.breaks is not None:
        return column.breaks
    low, high = column.bounds or DEFAULT_RANGE
    largest = max(abs(low), abs(high), 1.0)
    values = {0.0}
    for power in range(-6, int(math.log10(largest)) + 2):
        for mantissa in MANTISSAS:
            for value in (mantissa * 10.0**power, -mantissa * 10.0**power):
                if low <= value <= high:
                    values.add(round(value, 6))
    return tuple(sorted(values))


Resolve = Callable[[exp.Column], Column | None]  # the classed column a row-level column is
Plain = Callable[[exp.Expr], bool]  # an operand is a stored column as it is


def check_classed_comparisons(
    nodes: Iterable[exp.Expr], resolve: Resolve, plain: Plain, sql: str
) -> None:
    """Refuse a comparison of a row-level measure or weight with anything but its breaks.
    ``nodes`` are the nodes of one scope (nested scopes are checked as their own)."""
    nodes = list(nodes)
    if not any(_classed(resolve(c)) for c in of_kind(nodes, exp.Column)):
        return  # the columns an operand reads are among the scope's: none is classed
    for comparison in of_kind(nodes, _COMPARED):
        operands = _operands(comparison)
        classed = [(o, c) for o in operands for c in _row_columns(o, resolve)]
        if not classed:
            continue
        operand, column = classed[0]
        others = [o for o in operands if o is not operand]
        breaks = class_breaks(column)
        if not plain(operand) or not all(_is_break(o, breaks) for o in others):
            raise PolicyViolation(
                f"{comparison.sql('duckdb')[:80]}: a condition on the {column.role.value} "
                f"{column.name} may compare the column as it is with one of its class breaks "
                "(a condition at any value would answer a yes/no question about one person)",
                f"use a class break of {column.name}: {_describe(breaks)}",
                sql,
            )


LINEAR = (exp.Add, exp.Sub, exp.Mul, exp.Div, exp.Neg, exp.Cast, exp.TryCast)


def check_classed_positions(nodes: Iterable[exp.Expr], resolve: Resolve, sql: str) -> None:
    """A measure or weight read row by row may only stand where it cannot become a condition
    at an arbitrary value: as an operand of a comparison (checked against the breaks by
    :func:`check_classed_comparisons`), under ``IS [NOT] NULL``, as a plain projection passed
    to an outer aggregation, as the argument of COUNT, or in the linear argument of SUM/AVG
    (checked by the linear form). ``NULLIF(LEAST(income, x), x) IS NULL``, ``SIGN(income -
    x)``, ``CAST(income AS VARCHAR) LIKE '3%'`` or ``COUNT(NULLIF(income, x))`` would each ask
    about one value at any cut point, so any other place is refused."""
    for column in of_kind(list(nodes), exp.Column):
        declared = resolve(column)
        if declared is None or declared.role not in CLASSED_ROLES:
            continue
        if not _allowed_position(column):
            raise PolicyViolation(
                f"{_context(column).sql('duckdb')[:80]}: the {declared.role.value} "
                f"{declared.name} may be compared with one of its class breaks, tested with IS "
                "NULL, or aggregated; a function of it in a condition would answer a yes/no "
                "question about one person",
                f"compare {declared.name} as it is with a class break: "
                + _describe(class_breaks(declared)),
                sql,
            )


def _allowed_position(column: exp.Column) -> bool:
    node, linear = column, False
    while True:
        parent = node.parent
        if isinstance(parent, (exp.Paren, exp.Alias)):
            node = parent
            continue
        if parent is None or isinstance(parent, exp.Select):
            return parent is not None and not linear
        if isinstance(parent, (exp.Sum, exp.Avg)) and not isinstance(parent.parent, exp.Window):
            return True
        if linear:  # a linear value must end in SUM or AVG
            if isinstance(parent, LINEAR) or _is_branch_value(parent, node):
                node = parent
                continue
            return False
        if isinstance(parent, _COMPARED):
            return any(o is node for o in _operands(parent))
        if isinstance(parent, exp.Is):
            return parent.this is node
        if isinstance(parent, exp.Count) or (
            isinstance(parent, exp.Distinct) and isinstance(parent.parent, exp.Count)
        ):
            return True
        if isinstance(parent, LINEAR) or _is_branch_value(parent, node):
            node, linear = parent, True
            continue
        return False


def _is_branch_value(parent: exp.Expr, node: exp.Expr) -> bool:
    """``node`` is the value a CASE or IF branch yields, not its condition."""
    if isinstance(parent, exp.If):
        return parent.args.get("true") is node or parent.args.get("false") is node
    if isinstance(parent, exp.Case):
        return parent.args.get("default") is node or any(i is node for i in parent.args["ifs"])
    return False


def _context(column: exp.Column) -> exp.Expr:
    node = column
    while node.parent is not None and not isinstance(node.parent, (exp.Select, exp.Where)):
        node = node.parent
    return node


def _operands(comparison: exp.Expr) -> list[exp.Expr]:
    if isinstance(comparison, exp.Between):
        return [comparison.this, comparison.args["low"], comparison.args["high"]]
    if isinstance(comparison, exp.In):
        if comparison.args.get("query") is not None:
            return [comparison.this, comparison.args["query"]]
        return [comparison.this, *comparison.expressions]
    return [comparison.left, comparison.right]


def _row_columns(operand: exp.Expr, resolve: Resolve) -> list[Column]:
    """Classed columns read row by row in ``operand`` (not inside an aggregate), in the
    comparison's own scope: a nested query (``IN (SELECT ...)``, a scalar subquery) is
    checked as its own scope, and its names are not this scope's (``p`` of ``FROM regions
    AS p`` inside it is not the ``p`` of ``FROM persons AS p`` around it)."""
    if isinstance(operand, NESTED) or type(operand) is exp.Literal:  # a literal: no column
        return []
    found = []
    for column in own_nodes(operand) if type(operand) is not exp.Column else [operand]:
        if not isinstance(column, exp.Column) or _inside_aggregate(column, operand):
            continue
        declared = resolve(column)
        if declared is not None and declared.role in CLASSED_ROLES:
            found.append(declared)
    return found


def _classed(declared: Column | None) -> bool:
    return declared is not None and declared.role in CLASSED_ROLES


def _inside_aggregate(node: exp.Expr, stop: exp.Expr) -> bool:
    current = node.parent
    while current is not None and current is not stop.parent:
        if isinstance(current, exp.AggFunc) and not isinstance(current.parent, exp.Window):
            return True
        current = current.parent
    return False


def _is_break(operand: exp.Expr, breaks: tuple[float, ...]) -> bool:
    operand = _unparen(operand)
    if isinstance(operand, exp.Null) and operand.meta.get(UNBOUND_META) and DESCRIBING.get():
        return True
    negative = isinstance(operand, exp.Neg)
    literal = operand.this if negative else operand
    if not isinstance(literal, exp.Literal) or literal.is_string:
        return False
    try:
        value = float(literal.this) * (-1 if negative else 1)
    except ValueError:
        return False
    return any(math.isclose(value, b, rel_tol=1e-12, abs_tol=1e-12) for b in breaks)


def _unparen(node: exp.Expr) -> exp.Expr:
    while isinstance(node, exp.Paren):
        node = node.this
    return node


def _describe(breaks: tuple[float, ...]) -> str:
    shown = [f"{b:g}" for b in breaks]
    return ", ".join(shown if len(shown) <= 12 else [*shown[:6], "...", *shown[-4:]])
