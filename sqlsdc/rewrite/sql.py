"""Small builders of SQL expressions shared by the rewrite modules (sqlglot AST, no strings)."""

from __future__ import annotations

from sqlglot import exp

from sqlsdc.engines.trees import copy_tree


def missing(alias: str) -> exp.Expr:
    return exp.Is(this=exp.column("lo", alias), expression=exp.null())


def any_(conditions: list[exp.Expr]) -> exp.Expr:
    return exp.or_(*conditions) if conditions else exp.false()


def at_least_column(column: exp.Expr, k: int) -> exp.Expr:
    return exp.GTE(this=column.copy(), expression=exp.Literal.number(k))


def number(value: float) -> exp.Expr:
    """A numeric literal: integers as such, other numbers as DOUBLE (exponent notation)."""
    magnitude = abs(value)
    if float(magnitude).is_integer() and magnitude < 2**53:
        literal = exp.Literal.number(int(magnitude))
    else:
        literal = exp.Literal.number(f"{float(magnitude):.17e}")
    return exp.Neg(this=literal) if value < 0 else literal


def lt(value: exp.Expr, bound: float) -> exp.Expr:
    return exp.LT(this=value.copy(), expression=number(bound))


def mul(value: exp.Expr, factor: float) -> exp.Expr:
    return mul_expr(value.copy(), number(factor))


def mul_expr(a: exp.Expr, b: exp.Expr) -> exp.Expr:
    return exp.Mul(this=paren(a), expression=paren(b))


def div(value: exp.Expr, divisor: float) -> exp.Expr:
    return exp.Div(this=paren(value.copy()), expression=number(divisor))


def paren(node: exp.Expr) -> exp.Expr:
    if isinstance(node, (exp.Column, exp.Literal, exp.Paren, exp.Func)):
        return node
    return exp.Paren(this=node)


def copy_clause(value: exp.Expr | list[exp.Expr]) -> exp.Expr | list[exp.Expr]:
    """:func:`copy_tree` of a clause of a SELECT (a node, or a list of nodes)."""
    return [copy_tree(v) for v in value] if isinstance(value, list) else copy_tree(value)
